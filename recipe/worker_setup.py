"""Runs in every Ray worker before its first task (Ray's `worker_process_setup_hook`).

It applies the allocator decision of recipe.allocator to verl's run-time switch
of expandable segments:
- disabled by the user: verl's switch becomes a no-op, so the value stays off;
- the installed torch / torch_npu cannot switch at run time: a warning naming
  the cause, once per worker, and the switch becomes a no-op. verl 0.9.1 would
  raise on gpu and, on npu, swallow the failure behind a generic message; a
  silent failure there once hid memory leaks (the seed's review).
"""

from __future__ import annotations

import logging
import os
from importlib import metadata
from typing import Callable

from recipe.allocator import RUNTIME_SWITCH_VARIABLE

logger = logging.getLogger("recipe.worker_setup")

#: torch_npu gained torch.npu.memory._set_allocator_settings in this release.
TORCH_NPU_MIN_FOR_SWITCH = "2.8.0.post2"


def runtime_switch_unsupported(device: str) -> str | None:
    """Why the installed torch cannot switch expandable segments at run time, or None when it can."""
    import torch  # lazy: torch is heavy or absent where this module is imported; loaded only here
    from packaging.version import Version  # lazy: only when the hook runs in a Ray worker (packaging comes with torch)

    if device == "npu":
        try:
            installed = metadata.version("torch_npu")
        except metadata.PackageNotFoundError:
            return "torch_npu is not installed"
        if Version(installed) < Version(TORCH_NPU_MIN_FOR_SWITCH):
            return (
                f"torch_npu {installed} lacks torch.npu.memory._set_allocator_settings "
                f"(needs >= {TORCH_NPU_MIN_FOR_SWITCH})"
            )
        import torch_npu  # noqa: F401  lazy: only on npu; importing it registers torch.npu

        memory = getattr(getattr(torch, "npu", None), "memory", None)
    else:
        memory = torch.cuda.memory
    if not hasattr(memory, "_set_allocator_settings"):
        return f"torch {torch.__version__} lacks {'torch.npu' if device == 'npu' else 'torch.cuda'}.memory._set_allocator_settings"
    return None


def _guarded_switch(original: Callable[[bool], None], active: bool) -> Callable[[bool], None]:
    """verl's switch, or a no-op when it is disabled or cannot work here."""

    def set_expandable_segments(enable: bool) -> None:
        if active:
            original(enable)

    set_expandable_segments.__wrapped__ = original  # type: ignore[attr-defined]
    return set_expandable_segments


def configure_worker() -> None:
    """Install the recipe's guards into verl in this process (called by Ray in each worker).

    The allocator decision (below), the JSON-safe writer of the transformer config
    that verl saves beside each checkpoint (recipe.export.verl_patch), the mismatch's
    mean absolute log-prob gap beside verl's off-policy metrics (recipe.mismatch), and
    the health signs' curves beside verl's step metrics (recipe.health_log).
    """
    logging.basicConfig(level=logging.INFO)
    # lazy: only when verl's worker runs the hook; the hook's module stays importable without verl
    from recipe import health_log, mismatch
    from recipe.export import verl_patch

    verl_patch.install()
    mismatch.install()
    health_log.install()
    # lazy: verl is heavy or absent where this module is imported; loaded only here
    import verl.utils.device as verl_device

    original = getattr(verl_device, "set_expandable_segments", None)
    if original is None:
        logger.warning(
            "verl %s has no verl.utils.device.set_expandable_segments; the allocator switch is left as verl does it",
            metadata.version("verl"),
        )
        return
    original = getattr(original, "__wrapped__", original)
    enabled = os.environ.get(RUNTIME_SWITCH_VARIABLE, "1") == "1"
    device = os.environ.get("RECIPE_DEVICE", "gpu")
    unsupported = runtime_switch_unsupported(device) if enabled else None
    if unsupported is not None:
        # Once per worker, at start: the cause, not a generic hint, and never silent.
        logger.warning("expandable segments stay off in this worker: %s", unsupported)
    # verl's workers import the function by name when their module loads, which is
    # after this hook runs: replacing the module attribute reaches all of them.
    verl_device.set_expandable_segments = _guarded_switch(original, enabled and unsupported is None)
