"""The rollout/training mismatch in slime's unit, beside verl's: the mean |log p_rollout - log p_train| per token.

verl 0.9.1 compares the rollout's log-probabilities (vLLM's) with the trainer's (Megatron's, before the update) in
compute_offpolicy_metrics (verl/trainer/ppo/rollout_corr_helper.py:904) and logs the result as `rollout_corr/*`:
`kl`, the mean of the signed gap (NeMo-RL's unit, which checks it below 0.002), and gaps of whole sequences'
log-perplexities, where gaps of opposite signs cancel. slime bounds the mean absolute gap per token (0.1; 0.2 to 0.4
is a broken run), which no verl metric gives. `install()` wraps that function, in every Ray worker (Ray's setup
hook, recipe.worker_setup), so that its result also holds ABS_GAP_NAME: the same tensors and response mask, one
more mean. verl prefixes it like its own, so it is logged as METRIC wherever verl's metrics go (TensorBoard, W&B,
the console). Only for the verl versions it was read against.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from recipe.import_patch import patch_when_imported, verl_is_one_of

logger = logging.getLogger("recipe.mismatch")

TARGET_MODULE = "verl.trainer.ppo.rollout_corr_helper"
#: Versions whose compute_offpolicy_metrics was read and tested against this patch.
VERIFIED_VERL_VERSIONS: tuple[str, ...] = ("0.9.1",)
#: The key added to compute_offpolicy_metrics' result, and the metric verl logs it as (its prefix).
ABS_GAP_NAME = "abs_log_prob_diff"
METRIC = f"rollout_corr/{ABS_GAP_NAME}"
_MARK = "__recipe_abs_log_prob_diff__"


def mean_abs_gap(old_log_prob: Any, rollout_log_prob: Any, response_mask: Any) -> float:
    """Mean of |rollout_log_prob - old_log_prob| over the response tokens (torch tensors of one shape)."""
    gap = (rollout_log_prob - old_log_prob).abs() * response_mask  # a bool or 0/1 mask: torch promotes it
    return float(gap.sum() / response_mask.sum())


def with_abs_gap(original: Any) -> Any:
    """verl's compute_offpolicy_metrics, its result with ABS_GAP_NAME added where the rollout's log-probs exist."""

    @functools.wraps(original)
    def compute_offpolicy_metrics(old_log_prob: Any, rollout_log_prob: Any, response_mask: Any) -> dict[str, Any]:
        metrics: dict[str, Any] = original(old_log_prob, rollout_log_prob, response_mask)
        if rollout_log_prob is not None:
            metrics[ABS_GAP_NAME] = mean_abs_gap(old_log_prob, rollout_log_prob, response_mask)
        return metrics

    setattr(compute_offpolicy_metrics, _MARK, True)
    return compute_offpolicy_metrics


def patch_module(module: ModuleType) -> bool:
    """Wrap compute_offpolicy_metrics in an imported rollout_corr_helper (once)."""
    original = getattr(module, "compute_offpolicy_metrics", None)
    if original is None:
        logger.warning("%s has no compute_offpolicy_metrics: %s is not logged", module.__name__, METRIC)
        return False
    if not getattr(original, _MARK, False):
        module.compute_offpolicy_metrics = with_abs_gap(original)  # type: ignore[attr-defined]
    return True


def install(versions: Sequence[str] = VERIFIED_VERL_VERSIONS) -> bool:
    """Log METRIC beside verl's off-policy metrics in this process; True when installed (or pending import)."""
    if not verl_is_one_of(versions, f"{METRIC} not logged"):
        return False
    return patch_when_imported(TARGET_MODULE, patch_module)
