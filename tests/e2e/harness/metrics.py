"""verl's console metrics: `step:N - name:value - name:value ...` lines of the trainer's log."""

from __future__ import annotations

import re

_STEP_LINE = re.compile(r"step:(\d+) - (.*)$")
_PAIR = re.compile(r"^(.+?):(-?(?:\d+\.?\d*(?:e[-+]?\d+)?|nan|inf))$", re.IGNORECASE)


def step_metrics(log: str) -> dict[int, dict[str, float]]:
    """{step: {metric: value}} for every step line in `log` (a later line of a step wins)."""
    steps: dict[int, dict[str, float]] = {}
    for line in log.splitlines():
        match = _STEP_LINE.search(line)
        if match is None:
            continue
        values: dict[str, float] = {}
        for item in match.group(2).split(" - "):
            pair = _PAIR.match(item.strip())
            if pair:
                values[pair.group(1)] = float(pair.group(2))
        steps[int(match.group(1))] = values
    return steps
