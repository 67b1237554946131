"""The doctor probe's event stream and a check's outcome: what every step, with or without a device, reports through.

Each check writes two JSON lines to the event stream (the probe process's original stdout):
`start` (name, timeout) before the work and `end` (status, reason, seconds) after it, so that the
parent (recipe.doctor.runner) knows which check was running when the process hung or died.
Only the standard library: the probe process imports this before any framework.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

#: Longest reason a check reports (one line).
MAX_REASON = 400


class StepFailed(Exception):
    """A check's failure whose message is already the one line to report."""


def describe(error: BaseException) -> str:
    """`Type: first line of the message`, short enough for one line."""
    if isinstance(error, StepFailed):
        text = str(error)
    else:
        first = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
        text = f"{type(error).__name__}: {first}" if first else type(error).__name__
    return one_line(text)


def one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."


class Outcome:
    """What a check found; `ok` unless the step says otherwise or raises."""

    def __init__(self) -> None:
        self.status = "ok"
        self.reason = "ok"

    def ok(self, reason: str) -> None:
        self.status, self.reason = "ok", reason

    def warn(self, reason: str) -> None:
        self.status, self.reason = "warn", reason

    def fail(self, reason: str) -> None:
        self.status, self.reason = "fail", reason


class Events:
    """The event stream to the parent: one JSON object per line, flushed at once."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def emit(self, **fields: Any) -> None:
        self.stream.write(json.dumps(fields) + "\n")
        self.stream.flush()

    @contextmanager
    def check(self, step: str, name: str, timeout_s: float) -> Iterator[Outcome]:
        """One check: `start`, the work, `end`; an exception inside is the check's `fail`."""
        self.emit(event="start", step=step, name=name, timeout_s=timeout_s)
        outcome = Outcome()
        began = time.perf_counter()
        try:
            yield outcome
        except KeyboardInterrupt:
            raise
        except BaseException as error:  # noqa: BLE001 - an import may raise anything, SystemExit too
            outcome.fail(describe(error))
        self.emit(
            event="end",
            step=step,
            name=name,
            status=outcome.status,
            reason=one_line(outcome.reason),
            seconds=round(time.perf_counter() - began, 3),
        )
