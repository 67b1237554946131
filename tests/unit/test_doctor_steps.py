"""What runs inside a doctor probe process, called in this process: each step's verdict and its one line.

The device steps run on torch's CPU device and gloo where that is the same code as on cuda/npu;
where a node with accelerators answers differently (how many devices, their names, their free
memory, the driver's refusal), torch's device module is a stand-in that answers as such a node
does. Frameworks this venv lacks (Transformer Engine, torch_npu) are stand-in modules that
import, or fail to, as the real ones do. tests/unit/test_doctor_runner.py runs the same steps in
real probe processes.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import types
from collections.abc import Iterator
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from recipe.doctor import device_steps, probe, probe_events
from recipe.doctor.probe_events import Events, Outcome, StepFailed

GIB = 1 << 30


@pytest.fixture(autouse=True, scope="module")
def single_threaded_torch() -> Iterator[None]:
    """torch without its OpenMP pool here: a runner that forks this process (mutmut does, per mutant) deadlocks in
    the child's first parallel op once the parent's pool has started (GNU OpenMP is not fork-safe)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def run_check(function: Any, *args: Any, **kwargs: Any) -> tuple[str, str]:
    """(status, reason) of one check as the probe reports it: raised errors become its `fail`."""
    stream = io.StringIO()
    with Events(stream).check("step", "step", 60.0) as out:
        function(out, *args, **kwargs)
    end = json.loads(stream.getvalue().splitlines()[-1])
    return end["status"], end["reason"]


# --- one line of reason ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("plain", "plain"),
        ("  two\nlines \t and  tabs ", "two lines and tabs"),
        ("x" * 400, "x" * 400),
        ("x" * 401, "x" * 397 + "..."),
        ("y" * 1000, "y" * 397 + "..."),
    ],
)
def test_a_reason_is_one_line_of_at_most_400_characters(text: str, line: str) -> None:
    assert probe_events.one_line(text) == line


@pytest.mark.parametrize(
    ("error", "described"),
    [
        (StepFailed("no cuda.h in /x\n  (the message is the line)"), "no cuda.h in /x (the message is the line)"),
        (ImportError("\n\n  libcudart.so.13: cannot open shared object file  \nTraceback..."),
         "ImportError: libcudart.so.13: cannot open shared object file"),
        (ValueError(), "ValueError"),
        (SystemExit(3), "SystemExit: 3"),
        (RuntimeError("e" * 500), "RuntimeError: " + "e" * 383 + "..."),
    ],
)  # fmt: skip
def test_an_error_is_described_by_its_type_and_first_line(error: BaseException, described: str) -> None:
    assert probe_events.describe(error) == described


# --- the event stream ----------------------------------------------------------------------------


def events_of(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """time.perf_counter as the probe reads it: the next value of this list each time."""
    ticks: list[float] = []
    monkeypatch.setattr(probe_events, "time", types.SimpleNamespace(perf_counter=lambda: ticks.pop(0)))
    return ticks


def test_a_check_reports_start_then_end_with_its_time(clock: list[float]) -> None:
    clock += [5.0, 6.23456]
    stream = io.StringIO()
    with Events(stream).check("matmul", "matmul:cuda:0", 60.0) as out:
        out.warn("slow\ndevice")
    assert events_of(stream) == [
        {"event": "start", "step": "matmul", "name": "matmul:cuda:0", "timeout_s": 60.0},
        {"event": "end", "step": "matmul", "name": "matmul:cuda:0", "status": "warn", "reason": "slow device", "seconds": 1.235},
    ]


def test_a_check_that_says_nothing_is_ok(clock: list[float]) -> None:
    clock += [0.0, 0.0]
    stream = io.StringIO()
    with Events(stream).check("x", "x", 1.0):
        pass
    assert events_of(stream)[-1] == {"event": "end", "step": "x", "name": "x", "status": "ok", "reason": "ok", "seconds": 0.0}


@pytest.mark.parametrize(
    ("raised", "reason"),
    [(StepFailed("no device"), "no device"), (SystemExit(3), "SystemExit: 3"), (OSError("disk"), "OSError: disk")],
)
def test_what_a_check_raises_is_its_failure_and_the_probe_goes_on(raised: BaseException, reason: str) -> None:
    def step(out: Outcome) -> None:
        out.ok("not yet")
        raise raised

    assert run_check(step) == ("fail", reason)


def test_an_interrupt_is_not_a_check_failure() -> None:
    stream = io.StringIO()
    with pytest.raises(KeyboardInterrupt), Events(stream).check("x", "x", 1.0):
        raise KeyboardInterrupt
    assert [event["event"] for event in events_of(stream)] == ["start"]


@pytest.mark.parametrize(("verdict", "status"), [("ok", "ok"), ("warn", "warn"), ("fail", "fail")])
def test_an_outcome_holds_the_last_verdict(verdict: str, status: str) -> None:
    out = Outcome()
    assert (out.status, out.reason) == ("ok", "ok")
    getattr(out, verdict)("because")
    assert (out.status, out.reason) == (status, "because")


# --- imports and framework checks ------------------------------------------------------------------


def test_an_import_check_imports_every_module_and_names_them() -> None:
    assert run_check(probe.step_import, ["json", "csv"], "stdlib 3.11") == ("ok", "stdlib 3.11: import json, csv")


def test_an_import_that_fails_names_the_module_and_the_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "doctor_exits.py").write_text("raise SystemExit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert run_check(probe.step_import, ["json", "doctor_absent_module"], "x") == (
        "fail", "import doctor_absent_module: ModuleNotFoundError: No module named 'doctor_absent_module'"
    )
    assert run_check(probe.step_import, ["doctor_exits", "json"], "x") == ("fail", "import doctor_exits: SystemExit: 3")


def module(name: str, **attributes: Any) -> types.ModuleType:
    made = types.ModuleType(name)
    for key, value in attributes.items():
        setattr(made, key, value)
    return made


@pytest.fixture
def megatron(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A megatron.core whose transformer_engine extension sets HAVE_TE (set_have_te(True/False))."""
    extension = module("megatron.core.extensions.transformer_engine", HAVE_TE=False)
    monkeypatch.setitem(sys.modules, "megatron.core.extensions.transformer_engine", extension)
    return extension


def test_transformer_engine_is_ok_when_megatron_has_it(megatron: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    megatron.HAVE_TE = True
    monkeypatch.setitem(sys.modules, "transformer_engine", module("transformer_engine", __version__="2.9.0"))
    assert run_check(probe.step_transformer_engine) == ("ok", "megatron.core HAVE_TE is True: Transformer Engine 2.9.0")
    monkeypatch.setitem(sys.modules, "transformer_engine", module("transformer_engine"))
    assert run_check(probe.step_transformer_engine) == ("ok", "megatron.core HAVE_TE is True: Transformer Engine unknown version")


def test_megatron_without_transformer_engine_fails_naming_why(megatron: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # A Transformer Engine whose torch extension cannot load its library, as with a CUDA mismatch.
    package = tmp_path / "transformer_engine"
    package.mkdir()
    (package / "pytorch.py").write_text("raise ImportError('libtransformer_engine.so: undefined symbol: cudaGetDriverEntryPoint')\n")
    monkeypatch.setitem(sys.modules, "transformer_engine", module("transformer_engine", __path__=[str(package)]))
    # An earlier import of the real one (by another test) would otherwise answer from sys.modules.
    monkeypatch.delitem(sys.modules, "transformer_engine.pytorch", raising=False)
    assert run_check(probe.step_transformer_engine) == (
        "fail", ("megatron.core HAVE_TE is False: Megatron falls back to local layers silently (import "
        "transformer_engine.pytorch: ImportError: libtransformer_engine.so: undefined symbol: cudaGetDriverEntryPoint)")
    )


def test_megatron_that_missed_a_transformer_engine_that_imports_says_so(megatron: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformer_engine", module("transformer_engine"))
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch", module("transformer_engine.pytorch"))
    assert run_check(probe.step_transformer_engine) == (
        "fail", ("megatron.core HAVE_TE is False: Megatron falls back to local layers silently "
        "(transformer_engine.pytorch imports here, so Megatron's own import of it failed)")
    )


@pytest.mark.parametrize(
    ("output", "line"),
    [
        ("", ""),
        ("In file included from x.c:1:\nx.c:2:10: fatal error: Python.h: No such file or directory\ncompilation terminated.\n",
         "x.c:2:10: fatal error: Python.h: No such file or directory"),
        ("  \n/usr/bin/ld: warning: a\n\n/usr/bin/ld: cannot find -lcuda\n", "/usr/bin/ld: cannot find -lcuda"),
        ("one ERROR\nsecond Error\n", "one ERROR"),
    ],
)  # fmt: skip
def test_the_compiler_line_quoted_is_its_first_error_else_its_last_line(output: str, line: str) -> None:
    assert probe.compiler_error(output) == line


def test_what_child_processes_write_to_stderr_meanwhile_is_captured(capfd: pytest.CaptureFixture[str]) -> None:
    os.write(2, b"before\n")
    with probe.captured_stderr() as said:
        os.write(2, b"cc: error: x\n")
        subprocess.run(["sh", "-c", "echo 'from a child' >&2"], check=True)
        os.write(2, b"\xff\n")  # not UTF-8: replaced, not a crash
        assert said() == "cc: error: x\nfrom a child\n\ufffd\n"
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "before\nafter\n"


@pytest.fixture
def triton_build(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Any]:
    """Triton with its bundled cuda.h (under tmp_path), whose launcher build does what `behaviour` says."""
    import triton
    from triton.runtime import build

    include = tmp_path / "triton" / "backends" / "nvidia" / "include"
    include.mkdir(parents=True)
    (include / "cuda.h").write_text("/* cuda.h */\n")
    monkeypatch.setattr(triton, "__file__", str(tmp_path / "triton" / "__init__.py"))
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    state: dict[str, Any] = {"include": include, "behaviour": "build"}

    def compile_module_from_src(src: str, name: str, include_dirs: list[str]) -> Any:
        state["asked"] = (src, name, include_dirs)
        state["cache"] = os.environ.get("TRITON_CACHE_DIR")
        state["cache_existed"] = Path(state["cache"]).is_dir()
        if state["behaviour"] == "compiler fails":
            os.write(2, state.get("said", b""))
            raise subprocess.CalledProcessError(1, ["/usr/bin/gcc", "-shared", "x.c"])
        if state["behaviour"] == "no compiler":
            raise FileNotFoundError(2, "No such file or directory", "/opt/no-cc")
        return module(name)

    monkeypatch.setattr(build, "compile_module_from_src", compile_module_from_src)
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.delenv("CC", raising=False)
    return state


def test_triton_builds_its_launcher_in_a_fresh_cache(triton_build: dict[str, Any]) -> None:
    assert run_check(probe.step_triton_launcher) == (
        "ok", "triton 3.6.0 built and loaded doctor_launcher with gcc/clang from PATH"
    )
    assert triton_build["asked"] == (probe.LAUNCHER_SOURCE, "doctor_launcher", [str(triton_build["include"])])
    # A fresh cache for the build (nothing cached answers for the compiler), gone afterwards, and unset again.
    assert triton_build["cache_existed"] and not Path(triton_build["cache"]).exists()
    assert Path(triton_build["cache"]).name.startswith("doctor-triton-")
    assert "TRITON_CACHE_DIR" not in os.environ


def test_triton_names_the_compiler_from_cc_and_keeps_the_users_cache_setting(
    triton_build: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CC", "/usr/bin/clang")
    monkeypatch.setenv("TRITON_CACHE_DIR", "/home/user/.triton")
    assert run_check(probe.step_triton_launcher) == ("ok", "triton 3.6.0 built and loaded doctor_launcher with /usr/bin/clang")
    assert triton_build["cache"] != "/home/user/.triton"
    assert os.environ["TRITON_CACHE_DIR"] == "/home/user/.triton"


@pytest.mark.parametrize(
    ("said", "reason"),
    [
        (b"x.c:2:10: fatal error: Python.h: No such file or directory\n",
         "the C compiler /usr/bin/gcc exited 1: x.c:2:10: fatal error: Python.h: No such file or directory"),
        (b"", "the C compiler /usr/bin/gcc exited 1: no message"),
    ],
)  # fmt: skip
def test_a_compiler_that_fails_is_named_with_its_error(
    triton_build: dict[str, Any], monkeypatch: pytest.MonkeyPatch, said: bytes, reason: str
) -> None:
    monkeypatch.setenv("TRITON_CACHE_DIR", "/home/user/.triton")
    triton_build.update(behaviour="compiler fails", said=said)
    assert run_check(probe.step_triton_launcher) == ("fail", reason)
    assert os.environ["TRITON_CACHE_DIR"] == "/home/user/.triton"


def test_no_compiler_is_named(triton_build: dict[str, Any]) -> None:
    triton_build["behaviour"] = "no compiler"
    assert run_check(probe.step_triton_launcher) == (
        "fail", "no C compiler: /opt/no-cc not found (Triton runs $CC, else gcc or clang)"
    )
    assert "TRITON_CACHE_DIR" not in os.environ


def test_a_triton_without_cuda_h_fails_naming_where_it_looked(triton_build: dict[str, Any]) -> None:
    (triton_build["include"] / "cuda.h").unlink()
    assert run_check(probe.step_triton_launcher) == ("fail", f"triton 3.6.0: no cuda.h in {triton_build['include']}")
    assert "asked" not in triton_build


LDD = """#!/bin/sh
case "$1" in
  *_C.so) printf '\\tlibascendcl.so => not found\\n\\tlibc.so.6 => /lib/libc.so.6 (0x0001)\\n';;
  *libhccl_ext.so.1) printf '\\tlibc.so.6 => /lib/libc.so.6 (0x0001)\\n\\tlibhccl.so => not found\\n'; exit 1;;
  *) echo "	not a dynamic executable"; exit 1;;
esac
"""


@pytest.fixture
def npu_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A torch_npu package with ELF files whose libraries the (stand-in) ldd cannot all find."""
    package = tmp_path / "site" / "torch_npu"
    (package / "lib").mkdir(parents=True)
    (package / "_C.so").write_bytes(b"")
    (package / "lib" / "libhccl_ext.so.1").write_bytes(b"")
    (package / "README.md").write_text("not a library\n")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "ldd").write_text(LDD)
    (tmp_path / "bin" / "ldd").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    return package


def spec_at(monkeypatch: pytest.MonkeyPatch, package: Path | None) -> None:
    spec = None
    if package is not None:
        spec = ModuleSpec(package.name, None, is_package=True)
        spec.submodule_search_locations = [str(package)]
    monkeypatch.setattr(probe, "find_spec", lambda name: spec)


def test_the_libraries_the_loader_cannot_find_are_named_once_each(npu_package: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec_at(monkeypatch, npu_package)
    assert probe.missing_libraries("torch_npu") == ["libascendcl.so", "libhccl.so"]


def test_no_package_or_no_ldd_names_no_library(npu_package: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    spec_at(monkeypatch, None)
    assert probe.missing_libraries("torch_npu") == []
    monkeypatch.setattr(probe, "find_spec", lambda name: ModuleSpec(name, None))  # a module, not a package
    assert probe.missing_libraries("torch_npu") == []
    spec_at(monkeypatch, npu_package)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert probe.missing_libraries("torch_npu") == []


def test_at_most_200_libraries_are_asked_about_and_one_ldd_that_fails_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch_npu ships hundreds of libraries: ldd on each would take longer than the check's timeout."""
    package = tmp_path / "big"
    package.mkdir()
    for index in range(205):
        (package / f"lib{index:03}.so").write_bytes(b"")
    spec_at(monkeypatch, package)
    asked: list[str] = []

    def ldd(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        name = Path(argv[1]).name
        asked.append(name)
        if name == "lib000.so":
            raise subprocess.TimeoutExpired(argv, 20)
        return subprocess.CompletedProcess(argv, 0, f"\tmissing-{name} => not found\n", "")

    monkeypatch.setattr(subprocess, "run", ldd)
    missing = probe.missing_libraries("big")
    assert asked == [f"lib{index:03}.so" for index in range(200)]
    assert missing == [f"missing-lib{index:03}.so" for index in range(1, 200)]


def test_torch_npu_that_cannot_load_names_the_missing_libraries(npu_package: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (npu_package / "__init__.py").write_text("raise ImportError('libhccl.so: cannot open shared object file: No such file or directory')\n")
    monkeypatch.syspath_prepend(str(npu_package.parent))
    assert run_check(probe.step_torch_npu) == (
        "fail", ("ImportError: libhccl.so: cannot open shared object file: No such file or directory; libraries not found: "
        "libascendcl.so, libhccl.so (CANN's set_env.sh sets LD_LIBRARY_PATH; the host's driver must be mounted at "
        "/usr/local/Ascend/driver)")
    )


def test_torch_npu_that_cannot_load_for_another_reason_says_only_that(npu_package: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for library in (npu_package / "_C.so", npu_package / "lib" / "libhccl_ext.so.1"):
        library.unlink()
    (npu_package / "__init__.py").write_text("raise RuntimeError('torch_npu 2.7 needs torch 2.7')\n")
    monkeypatch.syspath_prepend(str(npu_package.parent))
    assert run_check(probe.step_torch_npu) == ("fail", "RuntimeError: torch_npu 2.7 needs torch 2.7")


@pytest.mark.parametrize(("attributes", "reason"), [({"__version__": "2.7.1.post2"}, "torch_npu 2.7.1.post2 loads"), ({}, "torch_npu ? loads")])
def test_torch_npu_that_loads_is_ok_with_its_version(monkeypatch: pytest.MonkeyPatch, attributes: dict[str, str], reason: str) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", module("torch_npu", **attributes))
    assert run_check(probe.step_torch_npu) == ("ok", reason)


@pytest.mark.parametrize(
    ("device", "problem", "required", "expected"),
    [
        ("gpu", None, True, ("ok", "torch.cuda.memory._set_allocator_settings exists")),
        ("npu", None, False, ("ok", "torch.npu.memory._set_allocator_settings exists")),
        ("npu", "torch_npu is not installed", True,
         ("fail", "torch_npu is not installed: verl cannot switch expandable segments at run time (workers keep them off)")),
        ("gpu", "torch 2.5.0 lacks torch.cuda.memory._set_allocator_settings", False,
         ("warn", "torch 2.5.0 lacks torch.cuda.memory._set_allocator_settings; not used: EXPANDABLE_SEGMENTS=false")),
    ],
)  # fmt: skip
def test_the_allocator_switch_is_what_worker_setup_checks(
    monkeypatch: pytest.MonkeyPatch, device: str, problem: str | None, required: bool, expected: tuple[str, str]
) -> None:
    import recipe.worker_setup

    asked: list[str] = []
    monkeypatch.setattr(recipe.worker_setup, "runtime_switch_unsupported", lambda dev: asked.append(dev) or problem)
    assert run_check(probe.step_allocator_switch, device, required) == expected
    assert asked == [device]


# --- device checks -----------------------------------------------------------------------------


class Accelerator:
    """torch.cuda (or torch.npu) as a node with these devices answers: names, memory, the allocator switch."""

    def __init__(self, names: list[str], memory: list[tuple[float, float]] | None = None, init_error: str | None = None) -> None:
        self.names = names
        self.memory_gib = memory or [(80.0, 80.0)] * len(names)
        self.init_error = init_error
        self.calls: list[Any] = []
        self.memory = types.SimpleNamespace(_set_allocator_settings=lambda value: self.calls.append(("switch", value)))

    def init(self) -> None:
        self.calls.append("init")
        if self.init_error:
            raise RuntimeError(self.init_error)

    def device_count(self) -> int:
        return len(self.names)

    def get_device_name(self, index: int) -> str:
        return self.names[index]

    def mem_get_info(self, index: int) -> tuple[int, int]:
        free, total = self.memory_gib[index]
        return int(free * GIB), int(total * GIB)

    def synchronize(self, index: int) -> None:
        self.calls.append(("synchronize", index))

    def empty_cache(self) -> None:
        self.calls.append("empty_cache")


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Install an Accelerator as torch's module of these device types: node(Accelerator([...]), "cuda").

    Asking for another device type's module is an error: a check must ask for its own device's.
    """
    modules: dict[str, Any] = {}
    monkeypatch.setattr(device_steps, "accelerator", lambda device_type: modules[device_type])

    def install(accelerator: Any, *device_types: str) -> Any:
        modules.clear()
        modules.update(dict.fromkeys(device_types or ("cuda",), accelerator))
        return accelerator

    return install


def test_the_accelerator_module_of_each_device_type(monkeypatch: pytest.MonkeyPatch) -> None:
    assert device_steps.accelerator("cuda") is torch.cuda
    assert device_steps.accelerator("cpu") is torch.cpu
    npu = types.SimpleNamespace(device_count=lambda: 16)
    monkeypatch.setitem(sys.modules, "torch_npu", module("torch_npu"))  # importing it registers torch.npu
    monkeypatch.setattr(torch, "npu", npu, raising=False)
    assert device_steps.accelerator("npu") is npu
    assert device_steps.device_count("npu") == 16 and device_steps.device_count("cpu") == 1


def test_the_npu_accelerator_needs_torch_npu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    with pytest.raises(ImportError):
        device_steps.accelerator("npu")


def test_synchronize_waits_for_the_device_and_not_for_the_cpu(node: Any) -> None:
    accelerator = node(Accelerator(["H200", "H200"]), "cuda", "cpu")
    device_steps.synchronize("cuda", 1)
    device_steps.synchronize("cpu", 0)
    assert accelerator.calls == [("synchronize", 1)]


@pytest.mark.parametrize(
    ("names", "nodes", "expected"),
    [
        (["NVIDIA H200"] * 8, 8, ("ok", "8 cuda device(s): NVIDIA H200")),
        (["NVIDIA H200", "NVIDIA A100", "NVIDIA H200"], 2, ("ok", "3 cuda device(s): NVIDIA A100, NVIDIA H200")),
        (["NVIDIA H200"] * 2, 8, ("warn", ("2 cuda device(s): NVIDIA H200; 8 device node(s) visible "
                                          "(CUDA/ASCEND_RT_VISIBLE_DEVICES restricts?)"))),
        ([], 8, ("fail", "torch sees no cuda device, though 8 device node(s) are visible")),
    ],
)  # fmt: skip
def test_torch_sees_the_devices_whose_nodes_are_visible(
    node: Any, names: list[str], nodes: int, expected: tuple[str, str]
) -> None:
    accelerator = node(Accelerator(names))
    assert run_check(device_steps.step_devices, "cuda", nodes) == expected
    assert accelerator.calls == ["init"]  # the driver is asked first: its own error is the reason


def test_the_drivers_own_error_is_the_reason(node: Any) -> None:
    node(Accelerator(["x"], init_error="The NVIDIA driver on your system is too old (found version 11040)."))
    assert run_check(device_steps.step_devices, "cuda", 1) == (
        "fail", "RuntimeError: The NVIDIA driver on your system is too old (found version 11040)."
    )


def test_the_cpu_device_needs_no_driver_and_has_no_name(node: Any) -> None:
    node(Accelerator(["unused"], init_error="a cpu has no driver to ask"), "cpu")
    assert run_check(device_steps.step_devices, "cpu", 1) == ("ok", "1 cpu device(s): cpu")
    accelerator = node(Accelerator(["unused"]), "npu")
    accelerator.get_device_name = None  # a device module without names: its type stands in
    assert run_check(device_steps.step_devices, "npu", 1) == ("ok", "1 npu device(s): npu")
    # One with neither init nor names at all (an older torch_npu): counted all the same.
    node(types.SimpleNamespace(device_count=lambda: 2), "npu")
    assert run_check(device_steps.step_devices, "npu", 2) == ("ok", "2 npu device(s): npu")


@pytest.mark.parametrize(
    ("memory", "assumed", "expected"),
    [
        ([(79.0, 79.18)] * 2, 80, ("ok", "79.0-79.0 GiB free of 79.2 GiB on each of 2 device(s)")),
        ([(141.0, 141.0), (120.0, 141.0)], None, ("ok", "120.0-141.0 GiB free of 141.0 GiB on each of 2 device(s)")),
        ([(64.0, 80.0)], None, ("ok", "64.0-64.0 GiB free of 80.0 GiB on each of 1 device(s)")),  # 80 % free: enough
        ([(60.0, 80.0), (80.0, 80.0), (10.0, 80.0)], None,
         ("warn", ("10.0-80.0 GiB free of 80.0 GiB; cuda:0 60.0 of 80.0 GiB free (held by another process?); "
                  "cuda:2 10.0 of 80.0 GiB free (held by another process?)"))),
        ([(64.0, 64.0), (79.0, 80.0)], None, ("ok", "64.0-79.0 GiB free of 64.0/80.0 GiB on each of 2 device(s)")),
        ([(72.0, 72.0)], 80, ("ok", "72.0-72.0 GiB free of 72.0 GiB on each of 1 device(s)")),  # exactly a tenth less
        ([(39.4, 39.4)] * 8, 80,
         ("warn", ("39.4-39.4 GiB free of 39.4 GiB; plan's memory-fit estimate assumes 80 GiB (an H100 80GB), the driver "
                  "reports 39.4: set DEVICE_MEMORY_GIB=39"))),
        ([(80.0, 80.0), (39.4, 39.4)], 80,
         ("warn", ("39.4-80.0 GiB free of 39.4/80.0 GiB; plan's memory-fit estimate assumes 80 GiB (an H100 80GB), the "
                  "driver reports 39.4: set DEVICE_MEMORY_GIB=39"))),  # the smallest device decides
        ([(0.0, 0.0)], None, ("ok", "0.0-0.0 GiB free of 0.0 GiB on each of 1 device(s)")),  # no total reported: no ratio
    ],
)  # fmt: skip
def test_free_memory_of_every_device_and_its_total_against_what_plan_assumes(
    node: Any, memory: list[tuple[float, float]], assumed: float | None, expected: tuple[str, str]
) -> None:
    node(Accelerator(["d"] * len(memory), memory))
    assert run_check(device_steps.step_memory, "cuda", assumed, "an H100 80GB") == expected


def test_memory_needs_a_device_and_mem_get_info(node: Any) -> None:
    node(Accelerator([]), "npu")
    assert run_check(device_steps.step_memory, "npu") == ("fail", "no npu device")
    node(types.SimpleNamespace(device_count=lambda: 1), "npu")
    assert run_check(device_steps.step_memory, "npu") == ("fail", "torch.npu has no mem_get_info")


def test_a_matmul_per_device_on_the_cpu() -> None:
    stream = io.StringIO()
    device_steps.multi_matmul(Events(stream), "matmul", 60.0, "cpu")
    ends = [(e["name"], e["status"], e["reason"]) for e in events_of(stream) if e["event"] == "end"]
    assert ends == [("matmul:cpu:0", "ok", "512x512 float32 matmul correct")]
    # Each device's check names its step: the parent files the result under it.
    assert [(e["event"], e["step"], e.get("timeout_s")) for e in events_of(stream)] == [("start", "matmul", 60.0), ("end", "matmul", None)]


def test_a_wrong_product_or_an_error_fails_that_devices_check_only(node: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three GPUs (this CPU torch computes what they would): the second raises, the others compute wrong."""
    accelerator = node(Accelerator(["NVIDIA H200"] * 3), "cuda")
    real_ones = torch.ones
    made: list[torch.device] = []

    def ones(*size: int, device: torch.device) -> torch.Tensor:
        made.append(device)
        if device.index == 1:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        tensor = real_ones(*size)
        tensor[0] = 0  # one bad row: every entry of the product is off
        return tensor

    monkeypatch.setattr(torch, "ones", ones)
    stream = io.StringIO()
    device_steps.multi_matmul(Events(stream), "matmul", 60.0, "cuda")
    ends = [(e["name"], e["status"], e["reason"]) for e in events_of(stream) if e["event"] == "end"]
    assert ends == [
        ("matmul:cuda:0", "fail", "262144 of 262144 entries wrong in a 512^2 matmul"),
        ("matmul:cuda:1", "fail", "RuntimeError: CUDA error: an illegal memory access was encountered"),
        ("matmul:cuda:2", "fail", "262144 of 262144 entries wrong in a 512^2 matmul"),
    ]
    assert made == [torch.device("cuda", index) for index in range(3)]
    # Each product is read only after its own device is done.
    assert accelerator.calls == [("synchronize", 0), ("synchronize", 2)]


def test_expandable_segments_are_read_from_the_allocators_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    segments = [{"device": 0, "is_expandable": True}, {"device": 1, "is_expandable": False}, {"device": 0}, {"device": 2}]
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda: {"segments": segments})
    assert device_steps._segments_expandable("cuda", 0) == {True}
    assert device_steps._segments_expandable("cuda", 1) == {False}
    assert device_steps._segments_expandable("cuda", 2) is None  # this torch does not say
    assert device_steps._segments_expandable("npu", 0) is None

    def no_snapshot() -> dict[str, Any]:
        raise RuntimeError("no CUDA")

    monkeypatch.setattr(torch.cuda.memory, "_snapshot", no_snapshot)
    assert device_steps._segments_expandable("cuda", 0) is None


@pytest.mark.parametrize(
    ("while_on", "expected"),
    [
        (None, ("ok", "switched on and off at run time on cpu:0, 64 MiB allocated each way")),
        ({True}, ("ok", "switched on and off at run time on cpu:0, 64 MiB allocated each way")),
        ({False}, ("warn", "switched on and off without error, but no segment was expandable while on")),
    ],
)
def test_expandable_segments_are_switched_on_and_off_at_run_time(
    node: Any, monkeypatch: pytest.MonkeyPatch, while_on: set[bool] | None, expected: tuple[str, str]
) -> None:
    accelerator = node(Accelerator(["cpu"]), "cpu")
    seen: list[tuple[str, int]] = []
    monkeypatch.setattr(device_steps, "_segments_expandable", lambda device_type, index: seen.append((device_type, index)) or (
        while_on if len(seen) == 1 else {False}))  # fmt: skip
    assert run_check(device_steps.step_expandable_segments, "cpu") == expected
    assert accelerator.calls == ["empty_cache", ("switch", "expandable_segments:True"), "empty_cache",
                                 ("switch", "expandable_segments:False"), "empty_cache"]  # fmt: skip
    assert seen == [("cpu", 0), ("cpu", 0)]


def test_on_a_device_each_way_allocates_64_mib_on_device_0_and_waits_for_it(node: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    accelerator = node(Accelerator(["NVIDIA H200"]), "cuda")
    allocated: list[tuple[int, torch.dtype, torch.device]] = []
    real_empty = torch.empty

    def empty(size: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        allocated.append((size, dtype, device))
        return real_empty(0, dtype=dtype)  # this CPU torch stands in; nothing to fill

    monkeypatch.setattr(torch, "empty", empty)
    monkeypatch.setattr(device_steps, "_segments_expandable", lambda device_type, index: {True})
    assert run_check(device_steps.step_expandable_segments, "cuda") == (
        "ok", "switched on and off at run time on cuda:0, 64 MiB allocated each way"
    )
    assert allocated == [(64 << 20, torch.uint8, torch.device("cuda", 0))] * 2
    assert accelerator.calls == ["empty_cache", ("switch", "expandable_segments:True"), ("synchronize", 0), "empty_cache",
                                 ("switch", "expandable_segments:False"), ("synchronize", 0), "empty_cache"]  # fmt: skip


def test_expandable_segments_fail_where_the_switch_does_not_exist_and_free_the_cache(node: Any) -> None:
    accelerator = node(Accelerator(["cpu"]), "cuda", "cpu")
    accelerator.memory = types.SimpleNamespace()
    assert run_check(device_steps.step_expandable_segments, "cuda") == ("fail", "torch.cuda.memory._set_allocator_settings does not exist")
    node(types.SimpleNamespace(device_count=lambda: 1), "npu")  # a torch.npu without a memory module at all
    assert run_check(device_steps.step_expandable_segments, "npu") == ("fail", "torch.npu.memory._set_allocator_settings does not exist")
    accelerator = node(accelerator, "cuda", "cpu")

    def refuse(value: str) -> None:
        raise RuntimeError("Unrecognized CachingAllocator option: expandable_segments")

    accelerator.memory = types.SimpleNamespace(_set_allocator_settings=refuse)
    assert run_check(device_steps.step_expandable_segments, "cpu") == (
        "fail", "RuntimeError: Unrecognized CachingAllocator option: expandable_segments"
    )
    assert accelerator.calls == ["empty_cache", "empty_cache"]  # freed even when the switch refuses


def test_a_one_rank_collective_on_the_cpu_with_gloo() -> None:
    assert run_check(device_steps.step_collective, "cpu", "gloo") == (
        "ok", "gloo process group of one rank on cpu:0: init, all_reduce, destroy"
    )
    assert not dist.is_initialized()


def test_a_collective_that_changes_the_tensor_fails_showing_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dist, "all_reduce", lambda tensor: tensor.mul_(2))
    assert run_check(device_steps.step_collective, "cpu", "gloo") == (
        "fail", "gloo all_reduce over one rank changed the tensor: [6.0, 6.0, 6.0]..."
    )
    assert not dist.is_initialized()


@pytest.fixture
def cuda_collective(node: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A one-GPU node as the collective check sees it: this CPU torch makes the tensor, gloo carries it."""
    seen: dict[str, Any] = {"bound": [], "devices": [], "backends": []}
    accelerator = node(Accelerator(["NVIDIA H200"]), "cuda")
    accelerator.set_device = seen["bound"].append
    seen["accelerator"] = accelerator
    real_full = torch.full

    def full(size: tuple[int, ...], value: float, device: torch.device) -> torch.Tensor:
        seen["devices"].append(device)
        return real_full(size, value)

    def all_reduce(tensor: torch.Tensor) -> None:
        seen["backends"].append(dist.get_backend())
        if "error" in seen:
            raise RuntimeError(seen["error"])

    monkeypatch.setattr(torch, "full", full)
    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    return seen


def test_on_a_device_the_collective_runs_on_device_0_with_the_backend_named(cuda_collective: dict[str, Any]) -> None:
    assert run_check(device_steps.step_collective, "cuda", "gloo") == (
        "ok", "gloo process group of one rank on cuda:0: init, all_reduce, destroy"
    )
    assert cuda_collective["bound"] == [0]
    assert cuda_collective["devices"] == [torch.device("cuda", 0)]
    assert cuda_collective["backends"] == ["gloo"]
    assert cuda_collective["accelerator"].calls == [("synchronize", 0)]  # the result is read after the device is done
    assert not dist.is_initialized()


def test_a_collective_that_fails_destroys_its_group(cuda_collective: dict[str, Any]) -> None:
    cuda_collective["error"] = "NCCL error: unhandled system error"
    assert run_check(device_steps.step_collective, "cuda", "gloo") == ("fail", "RuntimeError: NCCL error: unhandled system error")
    assert not dist.is_initialized()


def test_the_cpu_collective_binds_no_device(node: Any) -> None:
    cpu = node(Accelerator(["cpu"]), "cpu")
    cpu.set_device = lambda index: pytest.fail("torch.cpu has no device to bind")
    assert run_check(device_steps.step_collective, "cpu", "gloo")[0] == "ok"


# --- the probe process's main loop -----------------------------------------------------------------


def test_steps_run_in_order_each_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(probe.STEPS, "doctor_no_args", (lambda out: out.ok("no arguments needed"), False))
    stream = io.StringIO()
    probe.run_steps([
        {"step": "import:json", "kind": "import", "args": {"modules": ["json"], "what": "json"}, "timeout_s": 5.0},
        {"step": "matmul", "kind": "matmul", "args": {"device_type": "cpu"}, "timeout_s": 7.0},
        {"step": "bare", "kind": "doctor_no_args", "timeout_s": 2.0},
    ], Events(stream))  # fmt: skip
    assert [(e["event"], e["step"], e["name"], e.get("status"), e.get("reason"), e.get("timeout_s")) for e in events_of(stream)] == [
        ("start", "import:json", "import:json", None, None, 5.0),
        ("end", "import:json", "import:json", "ok", "json: import json", None),
        ("start", "matmul", "matmul:cpu:0", None, None, 7.0),
        ("end", "matmul", "matmul:cpu:0", "ok", "512x512 float32 matmul correct", None),
        ("start", "bare", "bare", None, None, 2.0), ("end", "bare", "bare", "ok", "no arguments needed", None),
    ]  # fmt: skip


def test_a_per_device_step_that_fails_before_its_first_device_is_one_failed_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # no torch_npu: no device to count
    stream = io.StringIO()
    probe.run_steps([{"step": "matmul", "kind": "matmul", "args": {"device_type": "npu"}, "timeout_s": 7.0}], Events(stream))
    events = events_of(stream)
    assert [(e["event"], e["step"], e["name"], e.get("timeout_s")) for e in events] == [
        ("start", "matmul", "matmul", 7.0), ("end", "matmul", "matmul", None)
    ]
    assert events[-1]["status"] == "fail" and events[-1]["reason"].startswith("ModuleNotFoundError: import of torch_npu halted")


@pytest.fixture
def fd1_restored() -> Iterator[None]:
    """probe.main points fd 1 at stderr for good (it owns its process): this test's process gets it back."""
    saved = os.dup(1)
    try:
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


@pytest.mark.parametrize("from_sys_argv", [True, False])
def test_main_writes_events_on_stdout_and_what_libraries_print_on_stderr(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], fd1_restored: None, from_sys_argv: bool
) -> None:
    def chatty(out: Outcome) -> None:
        os.write(1, b'{"event": "end", "step": "forged"}\n')  # a C library printing on fd 1
        out.ok("printed, not reported")

    monkeypatch.setitem(probe.STEPS, "doctor_chatty", (chatty, False))
    spec = [{"step": "chatty", "kind": "doctor_chatty", "args": {}, "timeout_s": 3.0}]
    if from_sys_argv:
        monkeypatch.setattr(sys, "argv", ["-c", json.dumps(spec)])  # as the runner starts it: python -c BOOTSTRAP SPEC
        probe.main()
    else:
        monkeypatch.setattr(sys, "argv", ["pytest", "not the steps"])
        probe.main(["probe", json.dumps(spec)])
    captured = capfd.readouterr()
    events = [json.loads(line) for line in captured.out.splitlines()]
    assert [(e["event"], e.get("name"), e.get("reason")) for e in events] == [
        ("start", "chatty", None), ("end", "chatty", "printed, not reported"), ("done", None, None)
    ]
    assert captured.err == '{"event": "end", "step": "forged"}\n'
