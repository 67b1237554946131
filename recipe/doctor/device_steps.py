"""The doctor probe's checks that need a device: count, memory, a matmul on each, expandable segments, a collective.

Run inside the probe process (recipe.doctor.probe) like its other steps; each imports torch (and
torch_npu) when it runs, since the probe imports no framework before its first step.
"""

from __future__ import annotations

import tempfile
from typing import Any

from recipe.doctor.probe_events import Events, Outcome, StepFailed

#: Bytes allocated on a device by the expandable-segments check (a fresh segment each time).
SEGMENT_BYTES = 64 << 20
#: Side of the square float32 matrix multiplied on each device: every entry must equal it.
MATMUL_SIZE = 512
#: A device with less free memory than this fraction of its total is reported (warn).
MIN_FREE_FRACTION = 0.8
#: A device's total below this share of the memory plan assumes is a warning: the driver reports a little less
#: than the marketed size (an H100 80GB: 79.2 GiB), never a tenth less.
ASSUMED_MEMORY_SHARE = 0.9


# --- checks with a device ------------------------------------------------------------------


def accelerator(device_type: str) -> Any:
    """torch.cuda, torch.npu (torch_npu loaded) or torch.cpu."""
    import torch  # lazy: torch is heavy or absent where this module is imported; loaded only here

    if device_type == "npu":
        import torch_npu  # noqa: F401  lazy: only on npu; importing it registers torch.npu

        return torch.npu
    return torch.cuda if device_type == "cuda" else torch.cpu


def device_count(device_type: str) -> int:
    return int(accelerator(device_type).device_count())


def synchronize(device_type: str, index: int) -> None:
    module = accelerator(device_type)
    if device_type == "cpu":
        return
    module.synchronize(index)


def step_devices(out: Outcome, device_type: str, nodes: int) -> None:
    """torch sees the devices whose nodes are visible; the driver's own error when it does not."""
    module = accelerator(device_type)
    init = getattr(module, "init", None)
    if device_type != "cpu" and init is not None:
        init()  # raises with the driver's message (too old, no device, ...)
    count = int(module.device_count())
    if count == 0:
        raise StepFailed(f"torch sees no {device_type} device, though {nodes} device node(s) are visible")
    names = []
    get_name = getattr(module, "get_device_name", None)
    for index in range(count):
        names.append(get_name(index) if get_name and device_type != "cpu" else device_type)
    kinds = sorted(set(names))
    summary = f"{count} {device_type} device(s): {', '.join(kinds)}"
    if count < nodes:
        out.warn(f"{summary}; {nodes} device node(s) visible (CUDA/ASCEND_RT_VISIBLE_DEVICES restricts?)")
    else:
        out.ok(summary)


def step_memory(out: Outcome, device_type: str, assumed_gib: float | None = None, assumed_source: str = "") -> None:
    """Free memory of every device, read before this process allocates anything there, and its total against the
    figure plan's memory-fit estimate assumes (a device with less is a warning naming DEVICE_MEMORY_GIB)."""
    module = accelerator(device_type)
    if not hasattr(module, "mem_get_info"):
        raise StepFailed(f"torch.{device_type} has no mem_get_info")
    gib = 1 << 30
    rows, low = [], []
    for index in range(int(module.device_count())):
        free, total = module.mem_get_info(index)
        rows.append((index, free, total))
        if total and free < MIN_FREE_FRACTION * total:
            low.append(f"{device_type}:{index} {free / gib:.1f} of {total / gib:.1f} GiB free (held by another process?)")
    if not rows:
        raise StepFailed(f"no {device_type} device")
    frees = [free / gib for _, free, _ in rows]
    totals = {round(total / gib, 1) for _, _, total in rows}
    summary = f"{min(frees):.1f}-{max(frees):.1f} GiB free of {'/'.join(str(t) for t in sorted(totals))} GiB"
    smallest = min(total for _, _, total in rows) / gib
    if assumed_gib is not None and smallest < ASSUMED_MEMORY_SHARE * assumed_gib:
        low.append(
            f"plan's memory-fit estimate assumes {assumed_gib:g} GiB ({assumed_source}), the driver reports "
            f"{smallest:.1f}: set DEVICE_MEMORY_GIB={smallest:.0f}"
        )
    if low:
        out.warn(f"{summary}; {'; '.join(low)}")
    else:
        out.ok(f"{summary} on each of {len(rows)} device(s)")


def multi_matmul(events: Events, step: str, timeout_s: float, device_type: str) -> None:
    """One check per device: a float32 matmul of ones, every entry must equal the size."""
    import torch  # lazy: torch is heavy or absent where this module is imported; loaded only here

    for index in range(device_count(device_type)):
        with events.check(step, f"{step}:{device_type}:{index}", timeout_s) as out:
            device = torch.device(device_type, index)
            ones = torch.ones(MATMUL_SIZE, MATMUL_SIZE, device=device)
            product = ones @ ones
            synchronize(device_type, index)
            wrong = int((product != MATMUL_SIZE).sum().item())
            if wrong:
                raise StepFailed(f"{wrong} of {MATMUL_SIZE * MATMUL_SIZE} entries wrong in a {MATMUL_SIZE}^2 matmul")
            out.ok(f"{MATMUL_SIZE}x{MATMUL_SIZE} float32 matmul correct")


def _segments_expandable(device_type: str, index: int) -> set[bool] | None:
    """is_expandable of the device's segments, where this torch reports it (cuda only)."""
    if device_type != "cuda":
        return None
    try:
        import torch  # lazy: torch is heavy or absent where this module is imported; loaded only here

        segments = torch.cuda.memory._snapshot()["segments"]
    except Exception:  # noqa: BLE001 - reporting only
        return None
    flags = {bool(s["is_expandable"]) for s in segments if s.get("device") == index and "is_expandable" in s}
    return flags or None


def step_expandable_segments(out: Outcome, device_type: str) -> None:
    """The allocator's expandable segments switched on, used, switched off, used, at run time."""
    import torch  # lazy: torch is heavy or absent where this module is imported; loaded only here

    module = accelerator(device_type)
    memory = getattr(module, "memory", None)
    switch = getattr(memory, "_set_allocator_settings", None)
    if switch is None:
        raise StepFailed(f"torch.{device_type}.memory._set_allocator_settings does not exist")
    device = torch.device(device_type, 0)
    found = {}
    try:
        for enabled in (True, False):
            module.empty_cache()
            switch(f"expandable_segments:{enabled}")
            block = torch.empty(SEGMENT_BYTES, dtype=torch.uint8, device=device)
            block.fill_(1)
            synchronize(device_type, 0)
            found[enabled] = _segments_expandable(device_type, 0)
            del block
    finally:
        module.empty_cache()
    if found[True] is not None and True not in found[True]:
        out.warn("switched on and off without error, but no segment was expandable while on")
    else:
        out.ok(f"switched on and off at run time on {device_type}:0, {SEGMENT_BYTES >> 20} MiB allocated each way")


def step_collective(out: Outcome, device_type: str, backend: str) -> None:
    """A one-process group: init, all_reduce, destroy (the NCCL/HCCL library and its plumbing)."""
    import torch  # lazy: torch is heavy or absent where this module is imported; loaded only here
    import torch.distributed as dist  # lazy: torch is heavy or absent where this module is imported; loaded only here

    accelerator(device_type)
    device = torch.device(device_type, 0)
    if device_type != "cpu":
        accelerator(device_type).set_device(0)
    with tempfile.TemporaryDirectory(prefix="doctor-store-") as store:
        dist.init_process_group(backend, init_method=f"file://{store}/store", rank=0, world_size=1)
        try:
            tensor = torch.full((8,), 3.0, device=device)
            dist.all_reduce(tensor)
            synchronize(device_type, 0)
            values = tensor.tolist()
        finally:
            dist.destroy_process_group()
    if values != [3.0] * 8:
        raise StepFailed(f"{backend} all_reduce over one rank changed the tensor: {values[:3]}...")
    out.ok(f"{backend} process group of one rank on {device_type}:0: init, all_reduce, destroy")
