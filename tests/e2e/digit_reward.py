"""A reward with signal on a random model: the share of digits in the response.

The smoke data are scored by verl's gsm8k rule (1.0 for the right `#### N`), which a model
with random weights never writes: every score is 0, every GRPO advantage 0, every gradient
0, and nothing about training could be asserted. verl loads this file through
reward.custom_reward_function.path (the harness's CPU mapping says so).
"""

from __future__ import annotations

from typing import Any


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None, **_: Any) -> float:
    """Fraction of the response's characters that are digits (0.0 for an empty response)."""
    if not solution_str:
        return 0.0
    return sum(char.isdigit() for char in solution_str) / len(solution_str)
