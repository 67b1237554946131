"""What a verl Megatron checkpoint holds besides the weights: the optimizer, its schedule, the data order.

verl 0.9.1 writes `global_step_N/actor/optimizer/dist_ckpt` with megatron-core's dist_checkpointing
(torch_dist: PyTorch's distributed checkpoint format): the distributed optimizer's flat fp32 buffers
(main parameters, Adam's two moments) in its "dp_reshardable" layout, the torch optimizer's
param_groups (Adam's step, lr) and the LR scheduler. PyTorch reads it without a process group.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.e2e.cpu.rollouts import BATCH_LINE

#: The distributed optimizer's flat buffers, by the name of the state they hold.
FLAT_STATE = ("param", "exp_avg", "exp_avg_sq")
_BATCH = re.compile(re.escape(BATCH_LINE).replace(r"\{step\}", r"(\d+)").replace(r"\{rows\}", r"\[([\d, ]*)\]"))


@dataclass(frozen=True)
class OptimizerState:
    """One save's optimizer: Adam's step and lr per parameter group, the scheduler's step, the flat fp32 state."""

    adam_steps: tuple[float, ...]
    learning_rates: tuple[float, ...]
    scheduler_steps: int
    flat: dict[str, Any]  # FLAT_STATE name -> 1-D fp32 tensor


def optimizer_state(step_dir: Path) -> OptimizerState:
    """The optimizer state verl saved in `step_dir` (a global_step_N directory)."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as scratch:
        target = Path(scratch) / "optimizer.pt"
        dcp_to_torch_save(str(step_dir / "actor" / "optimizer" / "dist_ckpt"), str(target))
        saved: dict[str, Any] = torch.load(target, weights_only=False)
    flat: dict[str, Any] = {}
    groups: list[dict[str, Any]] = []
    scheduler_steps = -1
    for key, value in saved.items():
        name = key.rsplit(".", 1)[-1]
        if name in FLAT_STATE:
            if name in flat:
                raise ValueError(f"{step_dir}: more than one flat buffer of {name} (the harness reads one bucket)")
            flat[name] = value
        elif key.endswith("optimizer/shard_0_1"):
            groups = value[0]["param_groups"]
        elif key.startswith("common_state/"):
            scheduler_steps = int(value[0]["lr_scheduler"]["num_steps"])
    if set(flat) != set(FLAT_STATE) or not groups or scheduler_steps < 0:
        raise ValueError(f"{step_dir}: unexpected optimizer checkpoint layout: {sorted(saved)}")
    return OptimizerState(
        adam_steps=tuple(float(group["step"]) for group in groups),
        learning_rates=tuple(float(group["lr"]) for group in groups),
        scheduler_steps=scheduler_steps,
        flat=flat,
    )


def batch_rows(log: str) -> dict[int, list[int]]:
    """{step: dataset rows of the step's prompts, in batch order}, from tests.e2e.cpu.rollouts' log lines."""
    rows: dict[int, list[int]] = {}
    for match in _BATCH.finditer(log):
        step = int(match.group(1))
        rows.setdefault(step, []).extend(int(row) for row in match.group(2).split(",") if row.strip())
    return rows


def saved_state(directory: Path) -> Any:
    """A torch distributed checkpoint folder (actor/optimizer/dist_ckpt, actor/extra/dist_ckpt) read whole."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as scratch:
        target = Path(scratch) / "state.pt"
        dcp_to_torch_save(str(directory), str(target))
        return torch.load(target, weights_only=False)


def differences(first: Any, second: Any, path: str = "") -> list[str]:
    """Where two saved states differ, to the bit: tensors by dtype, shape and every element; the rest by ==."""
    import numpy
    import torch

    if isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor):
        if (first.dtype, first.shape) != (second.dtype, second.shape):
            return [f"{path}: {first.dtype}{list(first.shape)} against {second.dtype}{list(second.shape)}"]
        if torch.equal(first, second):
            return []
        return [f"{path}: differs by up to {(first.double() - second.double()).abs().max().item():.3e}"]
    if isinstance(first, dict) and isinstance(second, dict):
        if first.keys() != second.keys():
            return [f"{path}: keys {sorted(map(str, first.keys() ^ second.keys()))} in one only"]
        return [line for key in first for line in differences(first[key], second[key], f"{path}/{key}")]
    if isinstance(first, (list, tuple)) and isinstance(second, (list, tuple)):
        if len(first) != len(second):
            return [f"{path}: {len(first)} items against {len(second)}"]
        return [line for i, pair in enumerate(zip(first, second)) for line in differences(*pair, f"{path}[{i}]")]
    if isinstance(first, numpy.ndarray) and isinstance(second, numpy.ndarray):
        return [] if numpy.array_equal(first, second) else [f"{path}: arrays differ"]
    return [] if first == second else [f"{path}: {first!r} against {second!r}"]
