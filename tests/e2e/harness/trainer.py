"""Run the trainer in its own process group under a hard timeout, sampling its memory.

A trainer that fails inside a Ray worker can hang instead of exiting (a failed vLLM weight
sync hung 14 minutes): every run has a deadline, after which the whole process group and
every process it started are SIGKILLed, and the log's tail is raised.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

#: How often the harness polls the trainer (memory, the kill condition, the deadline).
POLL_S = 1.0


class TrainerTimeout(Exception):
    """The trainer did not finish in time (it has been killed)."""


@dataclass(frozen=True)
class TrainerRun:
    """One trainer process: how it ended, how long it took, its peak memory."""

    returncode: int
    log: Path
    seconds: float
    peak_memory_bytes: int
    killed_by_harness: bool

    def text(self) -> str:
        """The whole log."""
        return self.log.read_text(encoding="utf-8", errors="replace")

    def tail(self, lines: int = 60) -> str:
        """The last lines of the log."""
        return "\n".join(self.text().splitlines()[-lines:])


def _tree(process: psutil.Process) -> list[psutil.Process]:
    try:
        return [process, *process.children(recursive=True)]
    except psutil.Error:
        return []


def _memory(processes: Sequence[psutil.Process]) -> int:
    """Proportional set size summed over the processes (shared pages counted once), RSS where PSS is unreadable."""
    total = 0
    for process in processes:
        try:
            info = process.memory_full_info()
            total += getattr(info, "pss", info.rss)
        except psutil.Error:
            continue
    return total


def _kill(group: int, known: Sequence[psutil.Process]) -> None:
    """SIGKILL the trainer's process group, then every process it started that left the group (Ray's).

    The trainer itself (pid == group) is left for subprocess to reap: psutil.wait_procs would reap
    it first, and Popen.wait() would then report 0 instead of -SIGKILL.
    """
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        pass
    others = [process for process in known if process.pid != group]
    for process in others:
        try:
            process.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(others, timeout=30)


def run_trainer(
    argv: Sequence[str],
    env: dict[str, str],
    cwd: Path,
    log: Path,
    timeout_s: float,
    kill_when: Callable[[], bool] | None = None,
) -> TrainerRun:
    """Run `argv` to its end, or until `kill_when()` is true (then SIGKILL it).

    Raises TrainerTimeout (after killing everything) past `timeout_s`.
    """
    started = time.monotonic()
    peak = 0
    known: dict[int, psutil.Process] = {}
    with log.open("wb") as out:
        child = subprocess.Popen(
            list(argv), env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        root = psutil.Process(child.pid)
        killed = False
        try:
            while child.poll() is None:
                tree = _tree(root)
                known.update({p.pid: p for p in tree})
                peak = max(peak, _memory(tree) + _memory([psutil.Process()]))
                if kill_when is not None and not killed and kill_when():
                    _kill(child.pid, list(known.values()))
                    killed = True
                elif time.monotonic() - started > timeout_s:
                    _kill(child.pid, list(known.values()))
                    child.wait()
                    run = TrainerRun(child.wait(), log, time.monotonic() - started, peak, True)
                    why = f"trainer still running after {timeout_s:.0f} s, killed"
                    raise TrainerTimeout(f"{why}; log tail:\n{run.tail()}")
                time.sleep(POLL_S)
        finally:
            if child.poll() is None:
                _kill(child.pid, list(known.values()))
            # Ray's processes outlive a trainer that exits normally for a moment; none may outlive the test.
            leftovers = [p for p in known.values() if p.pid != child.pid and p.is_running()]
            if leftovers:
                psutil.wait_procs(leftovers, timeout=20)
                _kill(child.pid, [p for p in leftovers if p.is_running()])
    return TrainerRun(child.wait(), log, time.monotonic() - started, peak, killed)
