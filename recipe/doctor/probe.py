"""What runs inside a doctor probe process: one step after another, each reported as it ends.

(Over 400 lines on purpose: the probe process runs this one file as its script, so every step
it can take lives here.)

Started by recipe.doctor.runner as `python -c BOOTSTRAP SPEC`, where SPEC is a JSON list of
steps ({"step", "kind", "args", "timeout_s"}). Each check writes two JSON lines to the
event stream (the process's original stdout): `start` (name, timeout) before the work and
`end` (status, reason, seconds) after it, so that the parent knows which check was running
when the process hung or died. Whatever the imported libraries print goes to stderr: fd 1
is pointed there before the first step.

Only the standard library is imported at module level; the steps import what they check.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.util import find_spec
from pathlib import Path
from typing import Any, TextIO

#: Longest reason a check reports (one line).
MAX_REASON = 400
#: Bytes allocated on a device by the expandable-segments check (a fresh segment each time).
SEGMENT_BYTES = 64 << 20
#: Side of the square float32 matrix multiplied on each device: every entry must equal it.
MATMUL_SIZE = 512
#: A device with less free memory than this fraction of its total is reported (warn).
MIN_FREE_FRACTION = 0.8
#: A device's total below this share of the memory plan assumes is a warning: the driver reports a little less
#: than the marketed size (an H100 80GB: 79.2 GiB), never a tenth less.
ASSUMED_MEMORY_SHARE = 0.9


class StepFailed(Exception):
    """A check's failure whose message is already the one line to report."""


def describe(error: BaseException) -> str:
    """`Type: first line of the message`, short enough for one line."""
    if isinstance(error, StepFailed):
        text = str(error)
    else:
        first = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
        text = f"{type(error).__name__}: {first}" if first else type(error).__name__
    return one_line(text)


def one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."


class Outcome:
    """What a check found; `ok` unless the step says otherwise or raises."""

    def __init__(self) -> None:
        self.status = "ok"
        self.reason = "ok"

    def ok(self, reason: str) -> None:
        self.status, self.reason = "ok", reason

    def warn(self, reason: str) -> None:
        self.status, self.reason = "warn", reason

    def fail(self, reason: str) -> None:
        self.status, self.reason = "fail", reason


class Events:
    """The event stream to the parent: one JSON object per line, flushed at once."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def emit(self, **fields: Any) -> None:
        self.stream.write(json.dumps(fields) + "\n")
        self.stream.flush()

    @contextmanager
    def check(self, step: str, name: str, timeout_s: float) -> Iterator[Outcome]:
        """One check: `start`, the work, `end`; an exception inside is the check's `fail`."""
        self.emit(event="start", step=step, name=name, timeout_s=timeout_s)
        outcome = Outcome()
        began = time.perf_counter()
        try:
            yield outcome
        except KeyboardInterrupt:
            raise
        except BaseException as error:  # noqa: BLE001 - an import may raise anything, SystemExit too
            outcome.fail(describe(error))
        self.emit(
            event="end",
            step=step,
            name=name,
            status=outcome.status,
            reason=one_line(outcome.reason),
            seconds=round(time.perf_counter() - began, 3),
        )


# --- checks without a device -------------------------------------------------------------


def step_import(out: Outcome, modules: list[str], what: str) -> None:
    """Import each module (they stay imported: later steps of this process reuse them)."""
    for module in modules:
        try:
            importlib.import_module(module)
        except BaseException as error:  # noqa: BLE001
            raise StepFailed(f"import {module}: {describe(error)}") from None
    out.ok(f"{what}: import {', '.join(modules)}")


def step_transformer_engine(out: Outcome) -> None:
    """Megatron's own flag: False means it silently builds local layers instead of TE's."""
    from megatron.core.extensions.transformer_engine import HAVE_TE

    if HAVE_TE:
        import transformer_engine

        version = getattr(transformer_engine, "__version__", "unknown version")
        out.ok(f"megatron.core HAVE_TE is True: Transformer Engine {version}")
        return
    try:
        import torch  # noqa: F401  (TE's torch extension needs torch's libraries loaded first)
        import transformer_engine.pytorch

        why = "transformer_engine.pytorch imports here, so Megatron's own import of it failed"
    except BaseException as error:  # noqa: BLE001
        why = f"import transformer_engine.pytorch: {describe(error)}"
    out.fail(f"megatron.core HAVE_TE is False: Megatron falls back to local layers silently ({why})")


#: The smallest C extension of the kind Triton compiles at a kernel's first launch.
LAUNCHER_SOURCE = """\
#include "cuda.h"
#include <Python.h>
static struct PyModuleDef doctor_module = {PyModuleDef_HEAD_INIT, "doctor_launcher", NULL, -1, NULL};
PyMODINIT_FUNC PyInit_doctor_launcher(void) { return PyModule_Create(&doctor_module); }
"""


@contextmanager
def captured_stderr() -> Iterator[Callable[[], str]]:
    """Collect what child processes (the C compiler) write to fd 2 meanwhile."""
    with tempfile.TemporaryFile(mode="w+b") as sink:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield lambda: (sink.seek(0), sink.read().decode(errors="replace"))[1]
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def compiler_error(text: str) -> str:
    """The first `error:` line a C compiler printed, else its last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    return errors[0] if errors else (lines or [""])[-1]


def step_triton_launcher(out: Outcome) -> None:
    """Triton's launcher build: `cc` on a C file including Python.h and Triton's bundled cuda.h.

    A fresh TRITON_CACHE_DIR makes it compile every time (no cached module answers for it),
    and nothing is left behind. No GPU is needed: libcuda is not linked.
    """
    import triton
    from triton.runtime import build

    include = Path(triton.__file__).parent / "backends" / "nvidia" / "include"
    if not (include / "cuda.h").is_file():
        raise StepFailed(f"triton {triton.__version__}: no cuda.h in {include}")
    with tempfile.TemporaryDirectory(prefix="doctor-triton-") as cache:
        previous = os.environ.get("TRITON_CACHE_DIR")
        os.environ["TRITON_CACHE_DIR"] = cache
        try:
            with captured_stderr() as compiler_output:
                try:
                    module = build.compile_module_from_src(
                        LAUNCHER_SOURCE, "doctor_launcher", include_dirs=[str(include)]
                    )
                except subprocess.CalledProcessError as error:
                    said = compiler_error(compiler_output()) or "no message"
                    raise StepFailed(f"the C compiler {error.cmd[0]} exited {error.returncode}: {said}") from None
                except FileNotFoundError as error:
                    raise StepFailed(f"no C compiler: {error.filename} not found (Triton runs $CC, else gcc or clang)") from None
        finally:
            if previous is None:
                os.environ.pop("TRITON_CACHE_DIR", None)
            else:
                os.environ["TRITON_CACHE_DIR"] = previous
    compiler = os.environ.get("CC") or "gcc/clang from PATH"
    out.ok(f"triton {triton.__version__} built and loaded {module.__name__} with {compiler}")


def missing_libraries(package: str) -> list[str]:
    """Shared libraries the package's ELF files need that the loader cannot find (ldd)."""
    spec = find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return []
    root = Path(next(iter(spec.submodule_search_locations)))
    missing: set[str] = set()
    for library in sorted(root.rglob("*.so*"))[:200]:
        try:
            result = subprocess.run(
                ["ldd", str(library)], capture_output=True, text=True, timeout=20, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        missing.update(re.findall(r"^\s*(\S+) => not found", result.stdout, flags=re.MULTILINE))
    return sorted(missing)


def step_torch_npu(out: Outcome) -> None:
    """torch_npu loads, or the CANN/driver libraries it cannot find are named."""
    try:
        import torch  # noqa: F401
        import torch_npu
    except BaseException as error:  # noqa: BLE001
        reason = describe(error)
        missing = missing_libraries("torch_npu")
        if missing:
            reason += (
                f"; libraries not found: {', '.join(missing)} (CANN's set_env.sh sets LD_LIBRARY_PATH; "
                "the host's driver must be mounted at /usr/local/Ascend/driver)"
            )
        raise StepFailed(reason) from None
    out.ok(f"torch_npu {getattr(torch_npu, '__version__', '?')} loads")


def step_allocator_switch(out: Outcome, device: str, required: bool) -> None:
    """The check recipe.worker_setup makes in every Ray worker before verl switches segments."""
    from recipe.worker_setup import runtime_switch_unsupported

    problem = runtime_switch_unsupported(device)
    if problem is None:
        memory = "torch.npu.memory" if device == "npu" else "torch.cuda.memory"
        out.ok(f"{memory}._set_allocator_settings exists")
    elif required:
        out.fail(f"{problem}: verl cannot switch expandable segments at run time (workers keep them off)")
    else:
        out.warn(f"{problem}; not used: EXPANDABLE_SEGMENTS=false")


# --- checks with a device ------------------------------------------------------------------


def accelerator(device_type: str) -> Any:
    """torch.cuda, torch.npu (torch_npu loaded) or torch.cpu."""
    import torch

    if device_type == "npu":
        import torch_npu  # noqa: F401  (registers torch.npu)

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
    import torch

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
        import torch

        segments = torch.cuda.memory._snapshot()["segments"]
    except Exception:  # noqa: BLE001 - reporting only
        return None
    flags = {bool(s["is_expandable"]) for s in segments if s.get("device") == index and "is_expandable" in s}
    return flags or None


def step_expandable_segments(out: Outcome, device_type: str) -> None:
    """The allocator's expandable segments switched on, used, switched off, used, at run time."""
    import torch

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
    import torch
    import torch.distributed as dist

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


#: kind -> (function, whether it reports its own checks (several per step)).
STEPS: dict[str, tuple[Callable[..., None], bool]] = {
    "import": (step_import, False),
    "transformer_engine": (step_transformer_engine, False),
    "triton_launcher": (step_triton_launcher, False),
    "torch_npu": (step_torch_npu, False),
    "allocator_switch": (step_allocator_switch, False),
    "devices": (step_devices, False),
    "memory": (step_memory, False),
    "matmul": (multi_matmul, True),
    "expandable_segments": (step_expandable_segments, False),
    "collective": (step_collective, False),
}


def run_steps(steps: list[dict[str, Any]], events: Events) -> None:
    for step in steps:
        function, several = STEPS[step["kind"]]
        args = step.get("args", {})
        if several:
            try:
                function(events, step["step"], step["timeout_s"], **args)
            except Exception as error:  # noqa: BLE001 - before its first device: the step's own failure
                with events.check(step["step"], step["step"], step["timeout_s"]) as out:
                    out.fail(describe(error))
            continue
        with events.check(step["step"], step["step"], step["timeout_s"]) as out:
            function(out, **args)


def main(argv: list[str] | None = None) -> None:
    """Run the steps of argv[1] (JSON); events on the original stdout, all else to stderr."""
    argv = sys.argv if argv is None else argv
    steps = json.loads(argv[1])
    sys.stdout.flush()
    events = Events(os.fdopen(os.dup(1), "w", buffering=1))
    os.dup2(2, 1)  # anything an imported library prints goes to stderr, not into the events
    run_steps(steps, events)
    events.emit(event="done")
