"""The mismatch in slime's unit (recipe.mismatch): the mean absolute per-token log-prob gap, added to verl's own
off-policy metrics by wrapping verl 0.9.1's compute_offpolicy_metrics, and logged with verl's prefix."""

from __future__ import annotations

import logging
import sys
import types
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from recipe import import_patch, mismatch
from tests.support.needs import TRAINER_EXTRA, needs

torch = needs("torch", install=TRAINER_EXTRA)


def _tensors(gaps: list[list[float]], mask: list[list[int]]) -> tuple[Any, Any, Any]:
    old = torch.full((len(gaps), len(gaps[0])), -2.0)
    return old, old + torch.tensor(gaps), torch.tensor(mask)


def test_gaps_of_opposite_signs_do_not_cancel_and_padding_does_not_count() -> None:
    """verl's `kl` (the signed mean) is 0 here; slime's unit is 0.1. The padded token's gap of 5 is left out, with
    the mask as 0/1 integers or as booleans."""
    old, rollout, mask = _tensors([[0.1, -0.1, 5.0], [0.1, -0.1, 0.1]], [[1, 1, 0], [1, 1, 1]])
    assert mismatch.mean_abs_gap(old, rollout, mask) == pytest.approx(0.1)
    assert mismatch.mean_abs_gap(old, rollout, mask.bool()) == pytest.approx(0.1)


@given(st.lists(st.tuples(st.floats(-3, 3), st.booleans()), min_size=1, max_size=40))
@example([(0.0, True)])  # no gap at all
@example([(2.5, True), (-7.0, False)])  # a padded token with the largest gap
def test_the_gap_is_the_mean_of_absolute_gaps_over_response_tokens(tokens: list[tuple[float, bool]]) -> None:
    tokens = [*tokens, (0.25, True)]  # at least one response token, as verl asserts
    old, rollout, mask = _tensors([[gap for gap, _ in tokens]], [[int(kept) for _, kept in tokens]])
    kept = [abs(gap) for gap, keep in tokens if keep]
    assert mismatch.mean_abs_gap(old, rollout, mask) == pytest.approx(sum(kept) / len(kept), abs=1e-5)


def _helper_module(result: dict[str, Any] | None = None) -> types.ModuleType:
    module = types.ModuleType(mismatch.TARGET_MODULE)
    seen: list[Any] = []

    def compute_offpolicy_metrics(old_log_prob: Any, rollout_log_prob: Any, response_mask: Any) -> dict[str, Any]:
        seen.append((old_log_prob, rollout_log_prob, response_mask))
        return dict(result or {"kl": 0.5})

    module.compute_offpolicy_metrics = compute_offpolicy_metrics  # type: ignore[attr-defined]
    module.seen = seen  # type: ignore[attr-defined]
    return module


def test_the_wrapper_adds_the_gap_to_verls_metrics_once_and_keeps_verls_own() -> None:
    module = _helper_module()
    verls = module.compute_offpolicy_metrics
    assert mismatch.patch_module(module) and mismatch.patch_module(module)  # a second hook run stacks nothing
    wrapped = module.compute_offpolicy_metrics
    assert wrapped is not verls and wrapped.__wrapped__ is verls
    old, rollout, mask = _tensors([[0.2, -0.4]], [[1, 1]])
    # verl passes them by keyword (rollout_corr_helper.py:881)
    metrics = wrapped(old_log_prob=old, rollout_log_prob=rollout, response_mask=mask)
    assert metrics == {"kl": 0.5, "abs_log_prob_diff": pytest.approx(0.3)}
    assert len(module.seen) == 1
    # Without the rollout's log-probs (no rollout correction data) verl computes only the training side: no gap.
    assert wrapped(old, None, mask) == {"kl": 0.5}


def test_a_verl_without_the_function_is_left_alone_and_named(caplog: pytest.LogCaptureFixture) -> None:
    module = types.ModuleType(mismatch.TARGET_MODULE)
    with caplog.at_level(logging.WARNING, logger="recipe.mismatch"):
        assert mismatch.patch_module(module) is False
    assert caplog.messages == [
        f"{mismatch.TARGET_MODULE} has no compute_offpolicy_metrics: rollout_corr/abs_log_prob_diff is not logged"
    ]


def test_install_patches_a_loaded_verl_at_once_and_another_version_not(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if not isinstance(f, import_patch.PatchOnImport)])
    module = _helper_module()
    monkeypatch.setitem(sys.modules, mismatch.TARGET_MODULE, module)
    monkeypatch.setattr(import_patch.metadata, "version", lambda name: "0.10.0")
    with caplog.at_level(logging.WARNING, logger="recipe.import_patch"):
        assert mismatch.install() is False
    assert caplog.messages == ["verl 0.10.0: rollout_corr/abs_log_prob_diff not logged (checked against verl 0.9.1 only)"]
    assert not hasattr(module.compute_offpolicy_metrics, "__wrapped__")
    monkeypatch.setattr(import_patch.metadata, "version", lambda name: "0.9.1")
    assert mismatch.install() is True
    assert module.compute_offpolicy_metrics.__wrapped__ is not None
    assert not any(isinstance(f, import_patch.PatchOnImport) for f in sys.meta_path)


def test_verls_own_rollout_correction_logs_the_gap_with_its_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    """verl 0.9.1's real path (what its trainer calls each step): the metric arrives as rollout_corr/abs_log_prob_diff
    beside rollout_corr/kl, which is the signed mean and so no larger."""
    helper = needs("verl.trainer.ppo.rollout_corr_helper", install=TRAINER_EXTRA)
    monkeypatch.setattr(helper, "compute_offpolicy_metrics", helper.compute_offpolicy_metrics)  # restored after
    assert mismatch.patch_module(helper)
    old, rollout, mask = _tensors([[0.3, -0.1, 0.2], [-0.2, 0.0, 9.0]], [[1, 1, 1], [1, 1, 0]])
    _, _, metrics = helper.compute_rollout_correction_and_rejection_mask(
        old_log_prob=old, rollout_log_prob=rollout, response_mask=mask, rollout_is="token", rollout_is_threshold=2.0
    )
    assert metrics[mismatch.METRIC] == pytest.approx(0.8 / 5)
    assert abs(metrics["rollout_corr/kl"]) <= metrics[mismatch.METRIC]
