"""doctor's probe processes from the parent's side: every step ends with a result, whatever its process does.

The probe process here is a small scripted stand-in for recipe.doctor.probe (runner.BOOTSTRAP
pointed at it): each step's `kind` says what that process does at that step, as a real probe
does when an import succeeds, hangs, crashes, exits, prints noise, or never starts. That makes
every way a probe can end reproducible in well under a second; tests/unit/test_doctor_runner.py
runs the real probe on real packages.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from recipe.doctor import runner
from recipe.doctor.runner import CheckResult, Probe, Step, run_probe

#: The stand-in probe: argv[1] is the steps' JSON, as recipe.doctor.probe gets it.
FAKE_PROBE = r'''
import json, os, signal, sys, time

steps = json.loads(sys.argv[1])
out = sys.stdout


def emit(**fields):
    out.write(json.dumps(fields) + "\n")
    out.flush()


first = steps[0]["kind"] if steps else ""
if first == "never_starts":  # the interpreter or an import before the first check hangs
    sys.stderr.write("loading the framework\nstill loading\n")
    sys.stderr.flush()
    time.sleep(20)
if first == "cannot_start":
    sys.stderr.write("Fatal Python error: init_fs_encoding\n\n")
    sys.exit(1)
for step in steps:
    kind, name, args = step["kind"], step["step"], step["args"]
    if kind == "echo":  # what the probe was given, and where it runs
        emit(event="start", step=name, name=name, timeout_s=step["timeout_s"])
        reason = json.dumps({"steps": steps, "env": os.environ.get("DOCTOR_FAKE"),
                             "own_session": os.getsid(0) == os.getpid(), "stdin": sys.stdin.read(), "pid": os.getpid()})
        emit(event="end", step=name, name=name, status="ok", reason=reason, seconds=0.5)
        continue
    if kind == "silent":  # reports nothing for this step
        continue
    emit(event="start", step=name, name=name, timeout_s=step["timeout_s"])
    if kind == "hang":
        time.sleep(20)
    if kind == "die":
        sys.stderr.write(args.get("stderr", ""))
        sys.stderr.flush()
        if "signal" in args:
            os.kill(os.getpid(), args["signal"])
        os._exit(args.get("code", 0))
    if kind == "close":  # closes its end of the events, still running
        sys.stderr.write("closed\n")
        sys.stderr.flush()
        os.close(1)
        time.sleep(3)
    if kind == "noise":  # what a library prints, and a line cut in two
        out.write("not json\n{\"event\": \"end\", \"step\": \"elsewhere\", \"name\": \"x\"}\n")
        out.write('{"event": "end", "step": "' + name + '", "na')
        out.flush()
        time.sleep(0.2)
        out.write('me": "' + name + '", "status": "warn", "reason": "after noise", "seconds": 0.25}\n')
        out.flush()
        continue
    if kind == "several":  # one check per device, each taking a moment
        for index, status in enumerate(args["statuses"]):
            time.sleep(0.2)
            emit(event="end", step=name, name=f"{name}:cpu:{index}", status=status, reason=f"device {index}", seconds=0.125)
        continue
    if kind == "pause_after":  # noise, its report, then longer than the bookkeeping between two checks takes
        out.write("noise from a library\n" + json.dumps(dict(event="end", step=name, name=name, status="ok",
                                                              reason="then a pause", seconds=0.0)) + "\n")
        out.flush()
        time.sleep(20)
    emit(event="end", step=name, name=name, status=args.get("status", "ok"), reason=args.get("reason", "fine"),
         seconds=args.get("seconds", 0.0))
if not (steps and steps[-1]["kind"] == "no_done"):
    emit(event="done")
if steps and steps[-1]["kind"] == "linger":  # done, then never exits (an atexit hook that hangs)
    time.sleep(20)
'''


#: Probe processes one run_probe may start: each restart needs a step done or failed, so never more than its steps.
MAX_SESSIONS = 3


@pytest.fixture
def fake_probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "fake_probe.py"
    script.write_text(FAKE_PROBE)
    monkeypatch.setattr(runner, "BOOTSTRAP", f"import runpy, sys; runpy.run_path({str(script)!r}, run_name='__main__')")
    monkeypatch.setattr(runner, "REAP_TIMEOUT_S", 2.0)
    # The stand-in starts in well under a second: a check's own timeout, not this one, must decide a hang.
    monkeypatch.setattr(runner, "STARTUP_TIMEOUT_S", 10.0)
    started: list[int] = []

    class CountedSession(runner._Session):
        def __init__(self, probe: Probe, steps: list[Step]) -> None:
            started.append(len(steps))
            assert len(started) <= MAX_SESSIONS, f"probe restarted {len(started)} times: {started}"
            super().__init__(probe, steps)

    monkeypatch.setattr(runner, "_Session", CountedSession)


def step(name: str, kind: str = "ok", timeout_s: float = 30.0, category: str = "imports", **args: Any) -> Step:
    return Step(name, kind, category, timeout_s, args)


def outcomes(results: list[CheckResult]) -> list[tuple[str, str, str]]:
    return [(r.name, r.status, r.reason) for r in results]


# --- the result types ------------------------------------------------------------------------


def test_a_result_and_a_step_as_json() -> None:
    assert CheckResult("import:torch", "imports", "ok", "fine", 1.23456, 180.0).to_dict() == {
        "name": "import:torch", "category": "imports", "status": "ok", "reason": "fine", "seconds": 1.235, "timeout_s": 180.0,
    }  # fmt: skip
    assert CheckResult("user", "environment", "warn", "root", 0.0004).to_dict()["timeout_s"] is None
    assert Step("matmul", "matmul", "device", 60.0, {"device_type": "cuda"}).spec() == {
        "step": "matmul", "kind": "matmul", "args": {"device_type": "cuda"}, "timeout_s": 60.0
    }
    assert Step("x", "import", "imports", 1.0).args == {}


@pytest.mark.parametrize(
    ("code", "description"),
    [
        (None, "did not exit"),
        (0, "exit code 0"),
        (3, "exit code 3"),
        (-9, "killed by SIGKILL"),
        (-11, "killed by SIGSEGV"),
        (-1, "killed by SIGHUP"),
        (-200, "killed by signal 200"),  # no such signal name
    ],
)
def test_how_a_probe_process_ended_is_said_in_words(code: int | None, description: str) -> None:
    assert runner._exit_description(code) == description


@pytest.mark.parametrize(
    ("written", "last"),
    [
        (b"", "no output"),
        (b"\n  \n", "no output"),
        (b"first\n  Traceback line  \n\n", "Traceback line"),
        (b"abc", "abc"),
        (b"bad \xff byte\n", "bad \ufffd byte"),
        (b"early\n" + b"x" * 2500, "x" * 2000),  # only the last 2000 bytes are read
        (b"y" * 1999 + b"\nlast", "last"),
    ],
)
def test_the_last_line_a_dead_probe_wrote_is_quoted(written: bytes, last: str) -> None:
    with tempfile.TemporaryFile() as stderr:
        stderr.write(written)  # left at the end, as the probe left it
        assert runner._tail(stderr) == last


def test_killing_a_probe_kills_its_process_group() -> None:
    process = subprocess.Popen(["sh", "-c", "sleep 60 & wait"], start_new_session=True)
    assert runner._kill(process) is True
    assert process.returncode == -signal.SIGKILL


def test_killing_a_probe_that_is_gone_is_no_error() -> None:
    process = subprocess.Popen(["true"], start_new_session=True)
    process.wait()
    assert runner._kill(process) is True


def test_a_probe_that_does_not_go_away_is_said_to_be_stuck(monkeypatch: pytest.MonkeyPatch) -> None:
    process = subprocess.Popen(["sleep", "60"], start_new_session=True)
    real_wait = process.wait

    def stuck(timeout: float | None = None) -> int:
        # As a process in uninterruptible sleep does: it never exits, so only a bounded wait comes back.
        assert timeout is not None, "waiting for a process stuck in the kernel would hang doctor with it"
        raise subprocess.TimeoutExpired(["sleep"], timeout)

    monkeypatch.setattr(process, "wait", stuck)
    assert runner._kill(process) is False
    assert real_wait(timeout=10) == -signal.SIGKILL  # it was sent SIGKILL all the same


# --- sessions: events read against per-check deadlines ---------------------------------------


def test_each_step_reports_its_own_result_in_planned_order(fake_probe: None) -> None:
    steps = [
        step("import:a", reason="a 1.0: import a", seconds=0.75),
        step("allocator_switch", category="framework", status="warn", reason="not used", timeout_s=12.0),
        step("matmul", "several", category="device", statuses=["ok", "fail"]),
    ]
    assert run_probe(Probe("imports-0", steps, dict(os.environ))) == [
        CheckResult("import:a", "imports", "ok", "a 1.0: import a", 0.75, 30.0),
        CheckResult("allocator_switch", "framework", "warn", "not used", 0.0, 12.0),
        CheckResult("matmul:cpu:0", "device", "ok", "device 0", 0.125, 30.0),
        CheckResult("matmul:cpu:1", "device", "fail", "device 1", 0.125, 30.0),
    ]


def test_the_probe_gets_its_steps_environment_own_session_and_no_stdin(fake_probe: None) -> None:
    steps = [step("import:a", "echo", timeout_s=2.0, modules=["a"])]
    terminal, writer = os.pipe()  # doctor's own stdin: open, and nobody ever types (`docker compose run` attaches one)
    saved = os.dup(0)
    os.dup2(terminal, 0)
    try:
        (result,) = run_probe(Probe("imports-0", steps, {**os.environ, "DOCTOR_FAKE": "from the probe's env"}))
    finally:
        os.dup2(saved, 0)
        for fd in (saved, terminal, writer):
            os.close(fd)
    assert result.status == "ok", result.reason
    told = json.loads(result.reason)
    assert told["steps"] == [{"step": "import:a", "kind": "echo", "args": {"modules": ["a"]}, "timeout_s": 2.0}]
    assert told["env"] == "from the probe's env"
    # Its own session: killing its process group kills what it started, and never doctor itself.
    assert told["own_session"] is True
    assert told["stdin"] == ""  # a probe that reads stdin gets nothing, it does not wait for a terminal


def test_noise_and_a_line_cut_in_two_do_not_lose_or_forge_a_result(fake_probe: None) -> None:
    steps = [step("import:chatty", "noise"), step("import:b")]
    assert outcomes(run_probe(Probe("imports-0", steps, dict(os.environ)))) == [
        ("import:chatty", "warn", "after noise"), ("import:b", "ok", "fine")
    ]


def test_a_hung_check_fails_after_its_timeout_and_the_rest_run_in_a_fresh_process(fake_probe: None) -> None:
    steps = [step("import:a"), step("import:hangs", "hang", timeout_s=0.3), step("import:c")]
    results = run_probe(Probe("imports-0", steps, dict(os.environ), on_hang="continue"))
    assert outcomes(results) == [
        ("import:a", "ok", "fine"), ("import:hangs", "fail", "hung: no answer in 0.3 s, killed"), ("import:c", "ok", "fine")
    ]
    hung = results[1]
    assert (hung.category, hung.timeout_s) == ("imports", 0.3)
    # Measured from its own start; killed at its own timeout, not at the (10 s) startup one.
    assert 0.3 <= hung.seconds < 10


def test_after_a_hang_on_a_device_the_rest_fail_unrun(fake_probe: None) -> None:
    steps = [step("devices", category="device"), step("matmul", "hang", 0.3, "device"), step("collective", category="device")]
    results = run_probe(Probe("device", steps, dict(os.environ), on_hang="stop"))
    assert outcomes(results) == [
        ("devices", "ok", "fine"), ("matmul", "fail", "hung: no answer in 0.3 s, killed"),
        ("collective", "fail", "not run: matmul hung before it"),
    ]
    assert (results[2].category, results[2].seconds, results[2].timeout_s) == ("device", 0.0, 30.0)


def test_a_kill_that_does_not_take_is_named(fake_probe: None, monkeypatch: pytest.MonkeyPatch) -> None:
    real_kill = runner._kill
    monkeypatch.setattr(runner, "_kill", lambda process: real_kill(process) and False)
    (result,) = run_probe(Probe("device", [step("matmul", "hang", 0.3, "device")], dict(os.environ), on_hang="stop"))
    assert result.reason == (
        "hung: no answer in 0.3 s, killed; the process did not exit after SIGKILL (stuck in the kernel: a driver?)"
    )


def test_a_crash_fails_the_running_check_naming_the_signal_and_the_rest_go_on(fake_probe: None) -> None:
    steps = [step("import:a"), step("import:crashes", "die", signal=int(signal.SIGSEGV), stderr="Segmentation fault\n"),
             step("import:c")]  # fmt: skip
    # Without PYTHONFAULTHANDLER (CI sets it): Python's own traceback would follow the probe's last words.
    environment = {name: value for name, value in os.environ.items() if name != "PYTHONFAULTHANDLER"}
    results = run_probe(Probe("imports-0", steps, environment))
    assert outcomes(results) == [
        ("import:a", "ok", "fine"),
        ("import:crashes", "fail", "the probe process died (killed by SIGSEGV) during this check: Segmentation fault"),
        ("import:c", "ok", "fine"),
    ]


def test_after_a_device_check_dies_the_rest_fail_unrun(fake_probe: None) -> None:
    steps = [step("devices", "die", category="device", code=3, stderr="CUDA error\n"), step("memory", category="device")]
    assert outcomes(run_probe(Probe("device", steps, dict(os.environ), on_hang="stop"))) == [
        ("devices", "fail", "the probe process died (exit code 3) during this check: CUDA error"),
        ("memory", "fail", "not run: devices died before it"),
    ]


def test_a_probe_that_closes_its_events_and_lingers_is_killed_and_named(
    fake_probe: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "REAP_TIMEOUT_S", 0.3)
    (result,) = run_probe(Probe("imports-0", [step("import:odd", "close")], dict(os.environ)))
    assert (result.status, result.reason) == ("fail", "the probe process died (killed by SIGKILL) during this check: closed")


def test_a_probe_that_cannot_start_fails_every_step_with_the_reason(fake_probe: None) -> None:
    steps = [step("import:a", "cannot_start"), step("import:b")]
    assert outcomes(run_probe(Probe("imports-0", steps, dict(os.environ)))) == [
        ("import:a", "fail", "the probe process died (exit code 1): Fatal Python error: init_fs_encoding"),
        ("import:b", "fail", "the probe process died (exit code 1): Fatal Python error: init_fs_encoding"),
    ]


def test_a_probe_that_never_reports_fails_every_step_after_the_startup_timeout(
    fake_probe: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "STARTUP_TIMEOUT_S", 2.0)
    steps = [step("import:a", "never_starts"), step("import:b")]
    results = run_probe(Probe("imports-0", steps, dict(os.environ)))
    reason = "the probe process gave no answer in time: still loading"
    assert outcomes(results) == [("import:a", "fail", reason), ("import:b", "fail", reason)]
    assert [(r.category, r.seconds, r.timeout_s) for r in results] == [("imports", 0.0, 30.0)] * 2


def test_a_pause_between_checks_is_not_blamed_on_a_check_and_the_rest_run_afresh(
    fake_probe: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "BETWEEN_STEPS_TIMEOUT_S", 0.3)
    steps = [step("import:a", "pause_after", timeout_s=1.0), step("import:b"), step("import:c")]
    assert outcomes(run_probe(Probe("imports-0", steps, dict(os.environ), on_hang="stop"))) == [
        ("import:a", "ok", "then a pause"), ("import:b", "ok", "fine"), ("import:c", "ok", "fine")
    ]


def test_a_probe_that_ends_without_reporting_a_step_fails_that_step(fake_probe: None) -> None:
    steps = [step("import:a"), step("import:skipped", "silent"), step("import:c")]
    assert outcomes(run_probe(Probe("imports-0", steps, dict(os.environ)))) == [
        ("import:a", "ok", "fine"), ("import:skipped", "fail", "the probe process reported no result for it"),
        ("import:c", "ok", "fine"),
    ]


def test_a_probe_that_exits_cleanly_without_done_fails_what_it_did_not_report(fake_probe: None) -> None:
    steps = [step("import:a"), step("import:gone", "silent"), step("import:last", "no_done")]
    assert outcomes(run_probe(Probe("imports-0", steps, dict(os.environ)))) == [
        ("import:a", "ok", "fine"),
        # The process ended having reported some steps: the rest are given a fresh process, which reports
        # nothing for this one either.
        ("import:gone", "fail", "the probe process reported no result for it"),
        ("import:last", "ok", "fine"),
    ]


def test_a_probe_that_lingers_after_its_last_report_is_not_left_running(fake_probe: None) -> None:
    (first, last) = run_probe(Probe("imports-0", [step("import:a", "echo"), step("import:b", "linger")], dict(os.environ)))
    assert (last.name, last.status) == ("import:b", "ok")
    with pytest.raises(ProcessLookupError):  # killed and reaped
        os.kill(int(json.loads(first.reason)["pid"]), 0)


def test_the_real_probe_runs_a_step(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The default bootstrap finds the recipe package from any working directory and any PYTHONPATH."""
    monkeypatch.chdir(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    started = time.monotonic()
    (result,) = run_probe(Probe("imports-0", [Step("import:json", "import", "imports", 60.0,
                                                   {"modules": ["json"], "what": "json"})], env))  # fmt: skip
    assert (result.name, result.status, result.reason) == ("import:json", "ok", "json: import json")
    assert 0 <= result.seconds <= time.monotonic() - started
