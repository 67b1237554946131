"""The signs' curves logged beside verl's metrics by verl 0.9.1's own Tracking (recipe.health_log), read back as
TensorBoard and W&B keep them, and equal to the signs `run` says from the same event files."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from recipe import health_log
from recipe.run.health import (
    CLIPPED,
    ENTROPY,
    GRAD_NORM,
    MISMATCH_ABS,
    MISMATCH_KL,
    SIGN_NAMES,
    Thresholds,
    curve_name,
    thresholds_text,
)
from recipe.run.verl_metrics import REWARD, STEP_SECONDS

tracking = pytest.importorskip("verl.utils.tracking", reason="verl is in the test venv (tests/setup.sh)")


@pytest.fixture
def patched(monkeypatch: pytest.MonkeyPatch) -> Any:
    """verl's Tracking class with the curves patch, put back as it was after the test."""
    monkeypatch.setattr(tracking.Tracking, "log", tracking.Tracking.log)
    monkeypatch.delenv(health_log.THRESHOLDS_VARIABLE, raising=False)
    assert health_log.patch_module(tracking)
    return tracking.Tracking


def _tensorboard(directory: Path, monkeypatch: pytest.MonkeyPatch, patched: Any) -> Any:
    monkeypatch.setenv("TENSORBOARD_DIR", str(directory))
    return patched("project", "experiment", default_backend="tensorboard")


def _scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(directory), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_verls_tensorboard_gets_a_curve_a_sign_beside_its_own_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, patched: Any
) -> None:
    logger = _tensorboard(tmp_path, monkeypatch, patched)
    for step, norm in ((1, 1.0), (2, math.inf), (3, 1.0)):
        logger.log(data={STEP_SECONDS: 5.0, GRAD_NORM: norm}, step=step)
    logger.log(data={"val-core/reward": 0.5}, step=3)  # validation's metrics: passed as they are
    logger.finish()
    scalars = _scalars(tmp_path)
    assert set(scalars) == {STEP_SECONDS, GRAD_NORM, "val-core/reward", *map(curve_name, SIGN_NAMES)}
    # The names users find in TensorBoard and W&B (docs/health.md).
    assert sorted(map(curve_name, SIGN_NAMES)) == [
        "recipe_health/entropy_collapse", "recipe_health/gradient_norm_not_finite", "recipe_health/mismatch_growing",
        "recipe_health/no_reward_spread", "recipe_health/responses_cut_at_the_length_limit",
        "recipe_health/reward_flat", "recipe_health/rollout_training_mismatch",
    ]  # fmt: skip
    assert scalars[curve_name("gradient norm not finite")] == [(1, 0.0), (2, 1.0), (3, 0.0)]
    assert scalars[curve_name("rollout/training mismatch")] == [(1, 0.0), (2, 0.0), (3, 0.0)]
    assert scalars[STEP_SECONDS] == [(1, 5.0), (2, 5.0), (3, 5.0)]


def test_the_workers_bounds_are_the_settings_and_unreadable_ones_fall_back_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, patched: Any, caplog: pytest.LogCaptureFixture
) -> None:
    stream = {1: {MISMATCH_KL: 0.003}, 2: {MISMATCH_KL: 0.004}}
    for name, text, on in (("default", None, 1.0), ("raised", "mismatch_kl=0.005", 0.0),
                           ("unreadable", "mismatch_kl=-1", 1.0)):  # fmt: skip
        if text is not None:
            monkeypatch.setenv(health_log.THRESHOLDS_VARIABLE, text)
        logger = _tensorboard(tmp_path / name, monkeypatch, patched)
        with caplog.at_level(logging.WARNING, logger="recipe"):
            for step, metrics in stream.items():
                logger.log(data=metrics, step=step)
        logger.finish()
        assert _scalars(tmp_path / name)[curve_name("rollout/training mismatch")] == [(1, on), (2, on)], name
    [warning] = caplog.messages
    assert warning == (f"{health_log.THRESHOLDS_VARIABLE}: mismatch_kl='-1': input should be greater than 0; "
                       "the health curves use the default bounds")  # fmt: skip


def test_a_failure_in_the_curves_logs_verls_metrics_unchanged_with_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, patched: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug of the health code (here: the curves cannot be made) costs the curves, never the step's metrics."""

    def broken(active: Any) -> dict[str, float]:
        raise RuntimeError("no curves")

    monkeypatch.setattr(health_log, "sign_curves", broken)
    logger = _tensorboard(tmp_path, monkeypatch, patched)
    with caplog.at_level(logging.WARNING, logger="recipe"):
        for step in (1, 2, 3):
            logger.log(data={GRAD_NORM: 1.0, STEP_SECONDS: 5.0}, step=step)
    logger.finish()
    assert caplog.messages == ["health curves stop at step 1: no curves"]
    assert _scalars(tmp_path) == {GRAD_NORM: [(1, 1.0), (2, 1.0), (3, 1.0)], STEP_SECONDS: [(1, 5.0), (2, 5.0), (3, 5.0)]}


def test_installed_once_for_the_verl_it_was_read_against(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    original = tracking.Tracking.log
    monkeypatch.setattr(tracking.Tracking, "log", original)  # put back after the test
    assert health_log.install() is True
    wrapped = tracking.Tracking.log
    assert wrapped is not original and wrapped.__wrapped__ is original  # type: ignore[attr-defined]
    assert health_log.install() is True and tracking.Tracking.log is wrapped  # not wrapped twice
    with caplog.at_level(logging.WARNING, logger="recipe"):
        assert health_log.install(versions=("0.0.1",)) is False
    assert caplog.messages == ["verl 0.9.1: the health curves not logged (checked against verl 0.0.1 only)"]


def test_a_tracking_module_without_tracking_log_is_named(caplog: pytest.LogCaptureFixture) -> None:
    import types

    with caplog.at_level(logging.WARNING, logger="recipe"):
        assert health_log.patch_module(types.ModuleType("verl.utils.tracking")) is False
    assert caplog.messages == ["verl.utils.tracking has no Tracking.log: the health curves are not logged"]


def test_wandb_gets_the_curves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, patched: Any) -> None:
    """W&B offline, as a run without a network logs it: once step 2 is logged, step 1's row is committed and the
    run's summary holds each curve's value there (W&B's in-process view of the run)."""
    wandb = pytest.importorskip("wandb", reason="wandb is in the test venv (tests/setup.sh)")
    for name, value in {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true",
                        "WANDB_DISABLE_GIT": "true", "WANDB_CONSOLE": "off"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    logger = patched("project", "experiment", default_backend="wandb")
    try:
        logger.log(data={CLIPPED: 0.9, GRAD_NORM: math.nan, STEP_SECONDS: 5.0}, step=1)
        logger.log(data={CLIPPED: 0.1, GRAD_NORM: 1.0, STEP_SECONDS: 5.0}, step=2)
        summary = dict(wandb.run.summary)
    finally:
        logger.finish()
    assert summary["_step"] == 1 and summary[STEP_SECONDS] == 5.0
    assert {key: value for key, value in summary.items() if key.startswith("recipe_health/")} == {
        curve_name(name): 1.0 if name in {"responses cut at the length limit", "gradient norm not finite"} else 0.0
        for name in SIGN_NAMES
    }


VALUES = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True, width=32),
                   st.sampled_from([0.0, 0.5, 0.9, 1e-4, 0.003, 0.2]))  # fmt: skip
STEPS = st.lists(st.dictionaries(st.sampled_from([CLIPPED, ENTROPY, GRAD_NORM, MISMATCH_KL, MISMATCH_ABS, REWARD]),
                                 VALUES, min_size=1), min_size=1, max_size=8)  # fmt: skip


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=STEPS, bounds=st.sampled_from([Thresholds(), Thresholds(flat_steps=2, mismatch_rising_steps=2)]))
@example(steps=[{MISMATCH_KL: 0.002}], bounds=Thresholds())  # at the bound: float32 keeps 0.0020000000949949
@example(steps=[{GRAD_NORM: 1e39}], bounds=Thresholds())  # past float32: TensorBoard keeps an inf
def test_the_curves_are_on_exactly_where_run_judges_a_sign_on_from_the_same_event_files(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch, patched: Any,
    steps: list[dict[str, float | None]], bounds: Thresholds,
) -> None:
    """Generated streams, NaN, inf and missing metrics included: at each step the trainer's curves (judged from the
    values verl logs) show the signs `run` judges on from what TensorBoard kept of them (float32, NaN for None)."""
    from recipe.run.health import HealthWatch
    from recipe.run.progress import event_reader, read_steps

    directory = tmp_path_factory.mktemp("events")
    monkeypatch.setenv(health_log.THRESHOLDS_VARIABLE, thresholds_text(bounds))
    logger = _tensorboard(directory, monkeypatch, patched)
    for step, metrics in enumerate(steps, 1):
        logger.log(data={STEP_SECONDS: 1.0, **{k: math.nan if v is None else v for k, v in metrics.items()}}, step=step)
    logger.finish()
    read, watch, judged = read_steps(event_reader(directory), directory), HealthWatch(bounds), {}
    for step in sorted(read):
        watch.feed(step, read[step])
        judged[step] = set(watch.active)
    scalars = _scalars(directory)
    drawn = {step: {name for name in SIGN_NAMES if dict(scalars[curve_name(name)])[step] == 1.0} for step in judged}
    assert drawn == judged
