"""What runs inside a doctor probe process: one step after another, each reported as it ends.

Started by recipe.doctor.runner as `python -c BOOTSTRAP SPEC`, where SPEC is a JSON list of
steps ({"step", "kind", "args", "timeout_s"}). Each check writes two JSON lines to the
event stream (the process's original stdout): `start` (name, timeout) before the work and
`end` (status, reason, seconds) after it, so that the parent knows which check was running
when the process hung or died. Whatever the imported libraries print goes to stderr: fd 1
is pointed there before the first step.

Only the standard library is imported at module level (and the probe's own rooms: probe_events, the
event stream; device_steps, the checks with a device); the steps import what they check.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from recipe.doctor.device_steps import (
    multi_matmul,
    step_collective,
    step_devices,
    step_expandable_segments,
    step_memory,
)
from recipe.doctor.probe_events import Events, Outcome, StepFailed, describe


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
    # lazy: megatron is heavy or absent where this module is imported; loaded only here
    from megatron.core.extensions.transformer_engine import HAVE_TE

    if HAVE_TE:
        # lazy: transformer_engine is heavy or absent where this module is imported; loaded only here
        import transformer_engine

        version = getattr(transformer_engine, "__version__", "unknown version")
        out.ok(f"megatron.core HAVE_TE is True: Transformer Engine {version}")
        return
    try:
        import torch  # noqa: F401  lazy: TE's torch extension needs torch's libraries loaded first
        # lazy: transformer_engine is heavy or absent where this module is imported; loaded only here
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
    import triton  # lazy: triton is heavy or absent where this module is imported; loaded only here
    from triton.runtime import build  # lazy: triton is heavy or absent where this module is imported; loaded only here

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
        import torch  # noqa: F401  lazy: the probe imports frameworks only in its steps
        import torch_npu  # lazy: torch_npu is heavy or absent where this module is imported; loaded only here
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
    # lazy: the probe imports only the standard library before its first step
    from recipe.worker_setup import runtime_switch_unsupported

    problem = runtime_switch_unsupported(device)
    if problem is None:
        memory = "torch.npu.memory" if device == "npu" else "torch.cuda.memory"
        out.ok(f"{memory}._set_allocator_settings exists")
    elif required:
        out.fail(f"{problem}: verl cannot switch expandable segments at run time (workers keep them off)")
    else:
        out.warn(f"{problem}; not used: EXPANDABLE_SEGMENTS=false")


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
