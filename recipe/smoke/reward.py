"""The smoke profile's reward: the share of digits in the response, a signal even a random model gets.

The smoke data are arithmetic questions in geo3k's layout that verl's geo3k rule would score (the
right `\\boxed{N}`), which a model with random weights never writes: every score would be 0, every GRPO
advantage 0, every gradient 0, the weights would never move, and a broken optimizer, weight
sync or export could not be told from a working one. Random responses differ in how many digits
they hold, so this reward varies within each prompt's group of samples. verl loads this file
through reward.custom_reward_function.path (recipe.smoke.profile.smoke_overrides).
"""

from __future__ import annotations

from typing import Any

#: The function verl calls (reward.custom_reward_function.name).
FUNCTION = "compute_score"


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None, **_: Any) -> float:
    """Fraction of the response's characters that are digits (0.0 for an empty response)."""
    if not solution_str:
        return 0.0
    return sum(char.isdigit() for char in solution_str) / len(solution_str)
