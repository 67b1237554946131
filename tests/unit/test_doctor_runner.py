"""doctor's probe processes: real steps in real processes; hangs and crashes become fails.

The device steps run here on torch's CPU device and gloo: the same code as on cuda/npu with
NCCL/HCCL, minus the accelerator (tests/images and a node with devices cover the rest).
"""

from __future__ import annotations

import os
from pathlib import Path

from recipe.doctor.runner import CheckResult, Probe, Step, run_probe


def env_with(pythonpath: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath), env.get("PYTHONPATH")]))
    return env


def fake(root: Path, name: str, source: str) -> Path:
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text(source)
    return root


def import_step(module: str, timeout_s: float = 60.0) -> Step:
    return Step(f"import:{module}", "import", "imports", timeout_s, {"modules": [module], "what": module})


def statuses(results: list[CheckResult]) -> dict[str, tuple[str, str]]:
    return {r.name: (r.status, r.reason) for r in results}


def test_device_steps_on_the_cpu_device_with_gloo() -> None:
    steps = [
        Step("devices", "devices", "device", 60, {"device_type": "cpu", "nodes": 1}),
        Step("matmul", "matmul", "device", 60, {"device_type": "cpu"}),
        Step("collective", "collective", "device", 60, {"device_type": "cpu", "backend": "gloo"}),
    ]
    results = run_probe(Probe("device", steps, env_with(), on_hang="stop"))
    assert statuses(results) == {
        "devices": ("ok", "1 cpu device(s): cpu"),
        "matmul:cpu:0": ("ok", "512x512 float32 matmul correct"),
        "collective": ("ok", "gloo process group of one rank on cpu:0: init, all_reduce, destroy"),
    }
    assert all(r.category == "device" and r.seconds >= 0 and r.timeout_s == 60 for r in results)


def test_a_device_step_that_raises_is_a_fail_with_the_error() -> None:
    steps = [Step("collective", "collective", "device", 60, {"device_type": "cpu", "backend": "no-such-backend"})]
    (result,) = run_probe(Probe("device", steps, env_with(), on_hang="stop"))
    # torch's own words (today `AssertionError: Unknown backend type no-such-backend`), on one line.
    assert result.status == "fail" and "no-such-backend" in result.reason and "\n" not in result.reason


def test_after_a_hang_stop_fails_the_rest_unrun(tmp_path: Path) -> None:
    fakes = fake(tmp_path, "doctor_hangs", "import time\ntime.sleep(120)\n")
    steps = [import_step("doctor_hangs", timeout_s=2), Step("matmul", "matmul", "device", 60, {"device_type": "cpu"})]
    results = run_probe(Probe("device", steps, env_with(fakes), on_hang="stop"))
    assert statuses(results) == {
        "import:doctor_hangs": ("fail", "hung: no answer in 2 s, killed"),
        "matmul": ("fail", "not run: import:doctor_hangs hung before it"),
    }


def test_after_a_hang_continue_runs_the_rest_in_a_fresh_process(tmp_path: Path) -> None:
    fakes = fake(tmp_path, "doctor_hangs", "import time\ntime.sleep(120)\n")
    steps = [import_step("json"), import_step("doctor_hangs", timeout_s=2), import_step("csv")]
    results = run_probe(Probe("imports", steps, env_with(fakes), on_hang="continue"))
    assert [r.name for r in results] == ["import:json", "import:doctor_hangs", "import:csv"]
    assert [r.status for r in results] == ["ok", "fail", "ok"]


def test_a_crash_is_a_fail_naming_the_signal_and_the_rest_still_run(tmp_path: Path) -> None:
    fakes = fake(tmp_path, "doctor_crashes", "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    steps = [import_step("doctor_crashes"), import_step("csv")]
    first, second = run_probe(Probe("imports", steps, env_with(fakes), on_hang="continue"))
    assert first.status == "fail"
    assert first.reason.startswith("the probe process died (killed by SIGSEGV) during this check")
    assert (second.name, second.status) == ("import:csv", "ok")


def test_an_import_that_exits_is_a_fail_not_the_end_of_the_probe(tmp_path: Path) -> None:
    fakes = fake(tmp_path, "doctor_exits", "raise SystemExit(3)\n")
    first, second = run_probe(Probe("imports", [import_step("doctor_exits"), import_step("csv")], env_with(fakes)))
    assert (first.status, first.reason) == ("fail", "import doctor_exits: SystemExit: 3")
    assert second.status == "ok"


def test_what_libraries_print_does_not_corrupt_the_events(tmp_path: Path) -> None:
    fakes = fake(tmp_path, "doctor_chatty", "print('{\"event\": \"end\", \"step\": \"x\"}')\nprint('noise', flush=True)\n")
    (result,) = run_probe(Probe("imports", [import_step("doctor_chatty")], env_with(fakes)))
    assert (result.name, result.status) == ("import:doctor_chatty", "ok")


def test_a_probe_that_cannot_start_fails_every_step_with_the_reason() -> None:
    env = env_with()
    env["PYTHONHOME"] = "/nonexistent"  # the interpreter cannot even find its standard library
    results = run_probe(Probe("imports", [import_step("json"), import_step("csv")], env))
    assert [r.status for r in results] == ["fail", "fail"]
    assert results[0].reason.startswith("the probe process died (exit code 1)")
