"""Probe processes: each step bounded by its timeout; a hang or a crash becomes a `fail`.

A probe is one Python process running a list of steps (recipe.doctor.probe). It reports a
`start` event before each check and an `end` event after it. The parent waits for the next
event no longer than the running check's timeout; past it, the probe's whole process group
is killed and that check fails as hung. What then happens to the steps not yet run is the
probe's policy: `continue` starts a fresh process for them (an import that hangs says
nothing about the next one), `stop` fails them unrun (after a device hung, the next device
step would hang too, each for its whole timeout).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Status = Literal["ok", "warn", "fail"]

#: Seconds a fresh probe may take to start Python and report its first check.
STARTUP_TIMEOUT_S = 60.0
#: Seconds between one check's end and the next one's start (bookkeeping only).
BETWEEN_STEPS_TIMEOUT_S = 30.0
#: Seconds to wait for a killed probe to go away; one stuck in the kernel (a hung driver) is left.
REAP_TIMEOUT_S = 5.0
#: Last bytes of a probe's stderr quoted when it died.
STDERR_TAIL = 2000

#: Where the `recipe` package lives, so that a probe finds it whatever the working directory.
RECIPE_ROOT = Path(__file__).resolve().parents[2]
#: The probe's command line: appended (not prepended) to sys.path, so it shadows nothing.
BOOTSTRAP = (
    "import sys; sys.path.append({root!r}); from recipe.doctor.probe import main; main()"
)


@dataclass
class CheckResult:
    """One check: what, how it went, why, and how long it took."""

    name: str
    category: str
    status: Status
    reason: str
    seconds: float
    timeout_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "category": self.category,
            "status": self.status,
            "reason": self.reason,
            "seconds": round(self.seconds, 3),
            "timeout_s": self.timeout_s,
        }


@dataclass
class Step:
    """One unit of a probe: a check (or, for `matmul`, one check per device)."""

    name: str
    kind: str
    category: str
    timeout_s: float
    args: dict[str, Any] = field(default_factory=dict)

    def spec(self) -> dict[str, Any]:
        return {"step": self.name, "kind": self.kind, "args": self.args, "timeout_s": self.timeout_s}


@dataclass
class Probe:
    """Steps that share one process, in order, and what happens after one hangs."""

    name: str
    steps: list[Step]
    env: dict[str, str]
    on_hang: Literal["continue", "stop"] = "continue"


def _kill(process: subprocess.Popen[bytes]) -> bool:
    """Kill the probe and everything it started; False when it did not go away (stuck in the kernel)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        process.wait(timeout=REAP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return False
    return True


def _tail(stderr: Any) -> str:
    stderr.flush()
    stderr.seek(0, os.SEEK_END)
    size = stderr.tell()
    stderr.seek(max(0, size - STDERR_TAIL))
    text = stderr.read().decode(errors="replace")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def _exit_description(code: int | None) -> str:
    if code is None:
        return "did not exit"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class _Session:
    """One probe process and the events it sent, read against per-check deadlines."""

    def __init__(self, probe: Probe, steps: list[Step]) -> None:
        self.probe = probe
        self.stderr = tempfile.TemporaryFile()
        argv = [sys.executable, "-c", BOOTSTRAP.format(root=str(RECIPE_ROOT)), json.dumps([s.spec() for s in steps])]
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            env=probe.env,
            start_new_session=True,
        )
        self.buffer = b""
        #: When the parent stops waiting (time.monotonic()); moved on at every event.
        self.deadline = time.monotonic() + STARTUP_TIMEOUT_S

    def events(self) -> Iterator[tuple[str, dict[str, Any] | None]]:
        """Yield ("event", event); ("timeout", None) once self.deadline passes, ("eof", None) at the end."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        while True:
            while b"\n" in self.buffer:
                line, self.buffer = self.buffer.split(b"\n", 1)
                try:
                    yield "event", json.loads(line)
                except ValueError:
                    continue
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                yield "timeout", None
                return
            ready, _, _ = select.select([fd], [], [], min(remaining, 1.0))
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                yield "eof", None
                return
            self.buffer += chunk

    def close(self) -> None:
        if self.process.stdout is not None:
            self.process.stdout.close()
        self.stderr.close()


@dataclass
class _SessionEnd:
    """How a probe process ended: every step done, or a check (or no check) hung or died."""

    kind: Literal["done", "hung", "died"]
    step: Step | None = None
    reason: str = ""


def _fail_running_check(
    current: dict[str, Any],
    by_name: dict[str, Step],
    reason: str,
    started: float,
    results: dict[str, list[CheckResult]],
) -> Step:
    """Record the check that was running when its probe hung or died as failed; return its step."""
    step = by_name[current["step"]]
    results[step.name].append(
        CheckResult(current["name"], step.category, "fail", reason, time.monotonic() - started, step.timeout_s)
    )
    return step


def _run_session(probe: Probe, pending: list[Step], results: dict[str, list[CheckResult]]) -> _SessionEnd:
    """One probe process over PENDING; its results are added to RESULTS."""
    by_name = {step.name: step for step in pending}
    session = _Session(probe, pending)
    current: dict[str, Any] | None = None
    started = time.monotonic()
    try:
        for kind, event in session.events():
            if kind == "timeout":
                gone = _kill(session.process)
                stuck = "" if gone else "; the process did not exit after SIGKILL (stuck in the kernel: a driver?)"
                if current is None:
                    return _SessionEnd("hung", None, f"the probe process gave no answer in time{stuck}: {_tail(session.stderr)}")
                reason = f"hung: no answer in {float(current['timeout_s']):g} s, killed{stuck}"
                return _SessionEnd("hung", _fail_running_check(current, by_name, reason, started, results))
            if kind == "eof":
                break
            if event.get("event") == "start":
                current = event
                started = time.monotonic()
                session.deadline = started + float(event.get("timeout_s") or STARTUP_TIMEOUT_S)
            elif event.get("event") == "end" and event.get("step") in by_name:
                step = by_name[event["step"]]
                results[step.name].append(
                    CheckResult(
                        str(event["name"]), step.category, event["status"], str(event["reason"]),
                        float(event["seconds"]), step.timeout_s,
                    )
                )
                current = None
                session.deadline = time.monotonic() + BETWEEN_STEPS_TIMEOUT_S
            elif event.get("event") == "done":
                current = None
                return _SessionEnd("done")
        # The event stream ended without `done`: the process died (or closed its stdout).
        try:
            code = session.process.wait(timeout=REAP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _kill(session.process)
            code = session.process.returncode
        died = f"the probe process died ({_exit_description(code)})"
        if current is None:
            return _SessionEnd("died", None, f"{died}: {_tail(session.stderr)}")
        reason = f"{died} during this check: {_tail(session.stderr)}"
        return _SessionEnd("died", _fail_running_check(current, by_name, reason, started, results))
    finally:
        if session.process.poll() is None:
            _kill(session.process)
        session.close()


def run_probe(probe: Probe) -> list[CheckResult]:
    """Run the probe's steps; every planned step ends with at least one result, in planned order."""
    results: dict[str, list[CheckResult]] = {step.name: [] for step in probe.steps}
    pending = list(probe.steps)
    while pending:
        before = sum(len(results[step.name]) for step in pending)
        end = _run_session(probe, pending, results)
        rest = [step for step in pending if step is not end.step and not results[step.name]]
        if end.kind == "done":
            _fail_unrun(results, rest, "the probe process reported no result for it")
            break
        if end.step is None:
            progress = sum(len(results[step.name]) for step in pending) > before
            if not progress:
                _fail_unrun(results, rest, end.reason)
                break
        elif probe.on_hang == "stop":
            _fail_unrun(results, rest, f"not run: {end.step.name} {end.kind} before it")
            break
        pending = rest
    ordered: list[CheckResult] = []
    for step in probe.steps:
        ordered.extend(results[step.name])
    return ordered


def _fail_unrun(results: dict[str, list[CheckResult]], steps: list[Step], reason: str) -> None:
    for step in steps:
        if not results[step.name]:
            results[step.name].append(CheckResult(step.name, step.category, "fail", reason, 0.0, step.timeout_s))
