"""The signs of a failing run as curves beside verl's own, in every tracker verl logs to (TensorBoard, W&B, ...).

verl 0.9.1's trainer logs each step's metrics once, through `Tracking.log` (verl/utils/tracking.py) in its TaskRunner,
which hands them to every backend of `trainer.logger`. `install()` wraps that method, in every Ray worker (Ray's
setup hook, recipe.worker_setup), so that a step's metrics also carry one 0/1 metric a sign
(recipe.run.health.sign_curves), judged from those same metrics with the bounds `run` judges its lines with
(HEALTH_THRESHOLDS, passed to the workers as THRESHOLDS_VARIABLE). Curves only: `run` says each sign's line, from
the event files. Health never costs the run: a failure here logs verl's metrics unchanged, with one warning.
"""

from __future__ import annotations

import functools
import logging
import os
import struct
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from recipe.import_patch import patch_when_imported, verl_is_one_of
from recipe.numbers import finite_or_none
from recipe.run.health import HEALTH_METRICS, HealthWatch, Thresholds, parse_thresholds, sign_curves

logger = logging.getLogger("recipe.health_log")

TARGET_MODULE = "verl.utils.tracking"
#: Versions whose Tracking.log was read and tested against this patch.
VERIFIED_VERL_VERSIONS: tuple[str, ...] = ("0.9.1",)
#: The workers' copy of HEALTH_THRESHOLDS: every bound, as recipe.run.health.thresholds_text writes them.
THRESHOLDS_VARIABLE = "RECIPE_HEALTH_THRESHOLDS"
_MARK = "__recipe_health_curves__"
_WATCH, _STOPPED = "_recipe_health_watch", "_recipe_health_stopped"


def worker_thresholds() -> Thresholds:
    """The bounds the plan passed to this worker; the defaults, with a warning, when they cannot be read."""
    text = os.environ.get(THRESHOLDS_VARIABLE)
    if not text:
        return Thresholds()
    try:
        return parse_thresholds(text)
    except ValueError as error:
        logger.warning("%s: %s; the health curves use the default bounds", THRESHOLDS_VARIABLE, error)
        return Thresholds()


def as_tensorboard_keeps(value: Any) -> float | None:
    """A metric as `run` reads it back from the event files (recipe.run.progress.read_steps): TensorBoard keeps a
    float32, so the curves and `run`'s lines judge the same number; None when it is not a finite one."""
    number = finite_or_none(value)
    if number is None:
        return None
    try:
        return finite_or_none(struct.unpack("f", struct.pack("f", number))[0])
    except OverflowError:  # past float32's range: TensorBoard keeps an inf
        return None


def curves_added(tracking: Any, data: Any, step: Any) -> Any:
    """A training step's metrics (a dict holding any metric a sign reads) with the curves added; others as they are."""
    if not isinstance(data, dict) or not HEALTH_METRICS & data.keys():
        return data  # validation's metrics, or a backend's own call
    watch = getattr(tracking, _WATCH, None)
    if watch is None:
        watch = HealthWatch(worker_thresholds())
        setattr(tracking, _WATCH, watch)
    watch.feed(int(step), {name: as_tensorboard_keeps(data[name]) for name in HEALTH_METRICS & data.keys()})
    return {**data, **sign_curves(watch.active)}


def with_sign_curves(original: Any) -> Any:
    """verl's Tracking.log, with curves_added; after a failure there, verl's metrics alone (one warning)."""

    @functools.wraps(original)
    def log(self: Any, data: Any, step: Any, *args: Any, **kwargs: Any) -> Any:
        if not getattr(self, _STOPPED, False):
            try:
                data = curves_added(self, data, step)
            except Exception as error:  # noqa: BLE001 - health never ends a run; verl's metrics go on unchanged
                logger.warning("health curves stop at step %s: %s", step, error)
                setattr(self, _STOPPED, True)
        return original(self, data, step, *args, **kwargs)

    setattr(log, _MARK, True)
    return log


def patch_module(module: ModuleType) -> bool:
    """Wrap Tracking.log in an imported verl.utils.tracking (once)."""
    tracking = getattr(module, "Tracking", None)
    original = getattr(tracking, "log", None)
    if original is None:
        logger.warning("%s has no Tracking.log: the health curves are not logged", module.__name__)
        return False
    if not getattr(original, _MARK, False):
        tracking.log = with_sign_curves(original)  # type: ignore[union-attr]
    return True


def install(versions: Sequence[str] = VERIFIED_VERL_VERSIONS) -> bool:
    """Log the health curves beside verl's metrics in this process; True when installed (or pending import)."""
    if not verl_is_one_of(versions, "the health curves not logged"):
        return False
    return patch_when_imported(TARGET_MODULE, patch_module)
