"""`run`'s preflight: what makes this machine unfit for `run` although the plan itself is sound."""

from __future__ import annotations

import logging
import os
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING

from recipe.memory_fit import GIB
from recipe.settings import Settings

if TYPE_CHECKING:  # a type only: doctor imports this room's lists without the plan
    from recipe.plan import Plan

logger = logging.getLogger("recipe")


#: Modules the trainer needs per target, and the package that provides each.
TRAINER_MODULES: dict[str, dict[str, str]] = {
    "gpu": {"verl": "verl", "vllm": "vllm", "megatron.bridge": "megatron-bridge"},
    "npu": {"verl": "verl", "vllm_ascend": "vllm-ascend", "torch_npu": "torch_npu", "megatron.bridge": "megatron-bridge"},
}


#: Without these verl fails late or quietly, and no package declares them outside verl's
#: verl-core extra: its length filter drops EVERY image row when qwen_vl_utils is missing,
#: its geo3k reward imports mathruler, its v1 TaskRunner imports transfer_queue first thing
#: (trainer.use_v1 defaults to true), and Megatron-Bridge's training config imports
#: megatron.energon on verl's Megatron path.
TRAINER_SUPPORT_MODULES = {
    "qwen_vl_utils": "qwen-vl-utils",
    "mathruler": "mathruler",
    "transfer_queue": "TransferQueue",
    "megatron.energon": "megatron-energon",
}


def _readable_file(name: str, path: Path) -> str | None:
    if not path.is_file():
        return f"{name}={str(path)!r}: file not found (run `entrypoint.py prepare-data` or set {name})"
    if not os.access(path, os.R_OK):
        return f"{name}={str(path)!r}: file is not readable by uid {os.getuid()}"
    return None


def _smoke_assets_root(settings: Settings) -> Path | None:
    if settings.profile != "smoke":
        return None
    # lazy: the smoke profile's modules import datasets and Pillow; only with PROFILE=smoke
    from recipe.smoke import assets_root

    return assets_root(settings.checkpoint_dir)


def _bench_data_dir(settings: Settings) -> Path | None:
    if settings.profile != "bench":
        return None
    from recipe.bench import bench_data_dir  # lazy: the bench profile's modules, only with PROFILE=bench

    return bench_data_dir(settings.checkpoint_dir)


def run_problems(plan: Plan) -> list[str]:
    """What makes this machine unfit for `run` although the plan itself is sound."""
    settings, device = plan.settings, plan.device
    problems: list[str] = []
    if device.visible_devices == 0:
        problems.append(f"DEVICE={settings.device}: no {device.name} device found ({device.reason}); run needs one")
    elif device.visible_devices < plan.layout.ndevices_per_node:
        problems.append(
            f"NDEVICES_PER_NODE={plan.layout.ndevices_per_node}: only {device.visible_devices} "
            f"{device.name} device(s) visible on this node"
        )
    # PROFILE=smoke builds its own model and data (under CHECKPOINT_DIR/smoke-assets), PROFILE=bench its data (under
    # CHECKPOINT_DIR/bench-data), once every check has passed: those paths cannot exist yet; paths pointed elsewhere
    # are checked.
    built = [root for root in (_smoke_assets_root(settings), _bench_data_dir(settings)) if root is not None]

    def made_by_run(path: Path) -> bool:
        return any(path.is_relative_to(root) for root in built)

    if not made_by_run(settings.model_path) and not (settings.model_path / "config.json").is_file():
        problems.append(f"MODEL_PATH={str(settings.model_path)!r}: no config.json there (download the model first)")
    for name, path in (("TRAIN_FILES", settings.resolved_train_files), ("VAL_FILES", settings.resolved_val_files)):
        problem = None if made_by_run(path) else _readable_file(name, path)
        if problem:
            problems.append(problem)
    existing = next((p for p in [settings.checkpoint_dir, *settings.checkpoint_dir.parents] if p.exists()), None)
    if existing is None or not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        problems.append(f"CHECKPOINT_DIR={str(settings.checkpoint_dir)!r}: not writable by uid {os.getuid()}")
    problem = host_memory_problem(plan, node_memory_bytes())
    if problem:
        problems.append(problem)
    needed = {**TRAINER_MODULES[device.name], **TRAINER_SUPPORT_MODULES}
    missing = [package for module, package in needed.items() if not _importable(module)]
    if missing:
        problems.append(
            f"DEVICE={device.name}: trainer packages not installed ({', '.join(missing)}); "
            f"use the {device.name} image (docker compose run --rm {device.name}), or install the packages "
            f"of docker/{device.name}/requirements.lock beside the trainer extra (pip install '.[trainer]')"
        )
    return problems


def node_memory_bytes(meminfo: Path = Path("/proc/meminfo"), limit: Path = Path("/sys/fs/cgroup/memory.max")) -> int | None:
    """This node's RAM as the trainer can use it: MemTotal, or the container's cgroup v2 limit when lower."""
    sizes = []
    try:
        for line in meminfo.read_text().splitlines():
            name, _, value = line.partition(":")
            if name == "MemTotal" and value.split()[0].isdigit():
                sizes.append(int(value.split()[0]) * 1024)  # the kernel writes kB
    except OSError:
        pass
    try:
        text = limit.read_text().strip()
        if text.isdigit():
            sizes.append(int(text))
    except OSError:
        pass  # no cgroup v2, or no limit file: MemTotal alone
    return min(sizes) if sizes else None


def host_memory_problem(plan: Plan, available: int | None) -> str | None:
    """Why this node's RAM cannot hold what the plan's estimate keeps on the host (offloaded state), or None."""
    if plan.memory is None or available is None:
        return None
    host = plan.memory.phases[-1]
    if host.total <= available:
        return None
    largest = ", ".join(f"{t.name} {t.bytes / GIB:.0f} GiB" for t in sorted(host.terms, key=lambda t: -t.bytes)[:2])
    settings, lay = plan.settings, plan.layout
    return (
        f"OFFLOAD={str(settings.offload).lower()}, NDEVICES_PER_NODE={lay.ndevices_per_node}, TP={lay.tp}, PP={lay.pp}, "
        f"EP={lay.ep}: the plan keeps {host.total / GIB:.0f} GiB on each node's host ({largest}; docs/memory.md), "
        f"and this node has {available / GIB:.0f} GiB (MemTotal, or the container's memory limit): spread the model "
        "over more nodes (NNODES), or raise the container's memory limit"
    )


def _importable(module: str) -> bool:
    try:
        return find_spec(module) is not None
    except (ImportError, ValueError):
        return False
