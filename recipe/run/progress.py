"""One progress line per training step while `run` supervises the trainer: step N of total, mean reward, time and its
split into phases, tokens per second per device, ETA; and the signs of a failing run as they start (recipe.run.health).

The numbers are verl's own, read back from the TensorBoard event files its logger writes under
TENSORBOARD_DIR (verl/utils/tracking.py, `_TensorboardAdapter`: one scalar per metric, at the global
step), with tensorboard's own reader. The total is recipe.run_length's, the one `plan` states.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from recipe.numbers import finite_or_none
from recipe.read_back import FileRefused
from recipe.run.health import HEALTH_METRICS, MISMATCH_ABS, MISMATCH_KL, HealthWatch, Thresholds
from recipe.run.verl_metrics import CAPPED_TOKENS, PHASE_SHORT, PHASES, READ_BACK, REWARD, STEP_SECONDS, THROUGHPUT
from recipe.run_length import StepTotal

logger = logging.getLogger("recipe")

#: What each progress line holds, in the words `run --help`, the README and docs/deploy.md use (a test keeps them equal).
PROGRESS_LINE = ("step of total, mean reward, s/step and its split into verl's phases, tokens/s/device, the rollout/training "
                 "mismatch in NeMo-RL's and slime's units beside their bounds and the share of tokens the correction capped, ETA")
#: A step time past this (a year) is no time of a step: left out of the ETA.
MAX_STEP_SECONDS = 365 * 86400.0
#: How often the event files are read again.
POLL_INTERVAL_S = 10.0


#: verl logs a few hundred scalars a step: a year of steps is far below this; a larger file is none of verl's.
MAX_EVENT_FILE_BYTES = 64 << 30
#: The part of a name that makes tensorboard's reader open a file (tensorboard's IsTensorFlowEventsFile).
EVENT_FILE_MARK = "tfevents"


def event_reader(directory: Path) -> Any:
    """tensorboard's reader of the event files under `directory`; each Reload() reads only what is new."""
    # lazy: tensorboard is heavy or absent where this module is imported; loaded only here
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    return EventAccumulator(str(directory), size_guidance={"scalars": 0})


def event_file_problem(directory: Path) -> str | None:
    """Why tensorboard's reader must not open the event files there: one is no regular file (a FIFO would block it)."""
    try:
        names = [entry.name for entry in os.scandir(directory) if EVENT_FILE_MARK in entry.name]
    except OSError as error:
        return f"{directory}: cannot be listed ({error.strerror or type(error).__name__})"
    for name in names:
        try:
            mode = os.stat(directory / name)
        except OSError as error:
            return f"{directory / name}: cannot be examined ({error.strerror or type(error).__name__})"
        if not stat.S_ISREG(mode.st_mode):
            return f"{directory / name}: not a regular file"
        if mode.st_size > MAX_EVENT_FILE_BYTES:
            return f"{directory / name}: {mode.st_size >> 30} GiB, above the {MAX_EVENT_FILE_BYTES >> 30} GiB an event file of a run holds"
    return None


def read_steps(events: Any, directory: Path | None = None, since: float | None = None) -> dict[int, dict[str, float | None]]:
    """step -> {tag: value} of the scalars `run` reads (verl_metrics.READ_BACK, health.HEALTH_METRICS), after reading
    what is new (an event_reader).

    A value that is no finite number (verl logs inf or NaN as they come) is None: shown as n/a. With
    `directory`, its event files are checked first (event_file_problem): FileRefused instead of a hang. With
    `since` (a time.time()), only what was logged from then on: an earlier attempt's steps are not this run's.
    """
    problem = event_file_problem(directory) if directory is not None else None
    if problem:
        raise FileRefused(problem)
    events.Reload()
    steps: dict[int, dict[str, float | None]] = {}
    available = set(events.Tags().get("scalars", []))
    for tag in sorted((READ_BACK | HEALTH_METRICS) & available):
        for event in events.Scalars(tag):
            if since is None or event.wall_time >= since:
                steps.setdefault(int(event.step), {})[tag] = finite_or_none(event.value)
    return steps


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _shown(value: float | None, form: str) -> str:
    return "n/a" if value is None else format(value, form)


def progress_line(
    step: int, metrics: dict[str, float | None], total: StepTotal | None, recent_seconds: list[float],
    limits: Thresholds = Thresholds(),
) -> str:
    """`step 3 of about 120, reward 0.412, 95.2 s/step (gen 14.0, old 7.3, update 70.1, sync 0.2), 29.4 tokens/s/device,
    KL 0.0012 (bound 0.002), |Δlog p| 0.011 (bound 0.1), capped 0.1 %, ETA 3h05m`: the parts verl logged, n/a where
    not finite."""
    parts = [f"step {step}" + (f" of {total}" if total else "")]
    if REWARD in metrics:
        parts.append(f"reward {_shown(metrics[REWARD], '.3f')}")
    if STEP_SECONDS in metrics:
        split = [f"{PHASE_SHORT[label]} {_shown(metrics[tag], '.1f')}" for label, tag in PHASES.items() if tag in metrics]
        parts.append(f"{_shown(metrics[STEP_SECONDS], '.1f')} s/step" + (f" ({', '.join(split)})" if split else ""))
    if THROUGHPUT in metrics:
        parts.append(f"{_shown(metrics[THROUGHPUT], '.1f')} tokens/s/device")
    # The rollout/training mismatch in each anchor's unit beside the bound its health sign starts at (docs/health.md).
    if MISMATCH_KL in metrics:
        parts.append(f"KL {_shown(metrics[MISMATCH_KL], '.2g')} (bound {limits.mismatch_kl:g})")
    if MISMATCH_ABS in metrics:
        parts.append(f"|Δlog p| {_shown(metrics[MISMATCH_ABS], '.2g')} (bound {limits.mismatch_abs:g})")
    if CAPPED_TOKENS in metrics:
        capped = metrics[CAPPED_TOKENS]
        parts.append(f"capped {_shown(None if capped is None else 100 * capped, '.1f')} %")
    if total and recent_seconds and total.steps > step:
        parts.append(f"ETA {_duration((total.steps - step) * sum(recent_seconds) / len(recent_seconds))}")
    return "progress: " + ", ".join(parts)


class ProgressPrinter:
    """Judges each step once, as soon as its scalars are in the event files: its progress line through `emit` (None:
    no progress lines), and each sign of a failing run that starts there as a warning (always).

    Only the steps logged since it was made: a resumed run's folder also holds the earlier attempts' files, whose
    steps after the save it resumed from are trained again (verl logs them anew, in a file of its own)."""

    def __init__(self, directory: Path, total: StepTotal | None, emit: Callable[[str], None] | None,
                 limits: Thresholds = Thresholds()) -> None:  # fmt: skip
        self.directory, self.total, self.emit = directory, total, emit
        self.printed: set[int] = set()
        self.seconds: dict[int, float] = {}
        self.events: Any = None
        self.since = time.time()
        self.health = HealthWatch(limits)

    def poll(self) -> None:
        """Read the event files and print the steps not printed yet (a step is printed once it has its time)."""
        if self.events is None:
            if not self.directory.is_dir():
                return  # verl creates it when its logger starts
            self.events = event_reader(self.directory)
        for step, metrics in sorted(read_steps(self.events, self.directory, self.since).items()):
            if step in self.printed or STEP_SECONDS not in metrics:
                continue
            seconds = metrics[STEP_SECONDS]
            if seconds is not None and 0 <= seconds <= MAX_STEP_SECONDS:
                self.seconds[step] = seconds
            recent = [self.seconds[s] for s in sorted(self.seconds)[-5:]]
            if self.emit is not None:
                self.emit(progress_line(step, metrics, self.total, recent, self.health.thresholds))
            for line in self.health.feed(step, metrics):
                logger.warning("%s", line)
            self.printed.add(step)


@contextmanager
def printing_progress(
    directory: Path, total: StepTotal | None, emit: Callable[[str], None] | None, limits: Thresholds = Thresholds(),
    interval_s: float = POLL_INTERVAL_S,
) -> Iterator[ProgressPrinter]:
    """While inside: a thread polls the event files every `interval_s`; one last poll on the way out."""
    printer = ProgressPrinter(directory, total, emit, limits)
    stop = threading.Event()

    def loop() -> None:
        while True:
            try:
                printer.poll()
            except Exception as error:  # noqa: BLE001 - the run goes on without progress lines
                logger.warning("progress lines stop: cannot read %s (%s)", directory, error)
                return
            if stop.wait(interval_s):
                return

    thread = threading.Thread(target=loop, name="progress", daemon=True)
    thread.start()
    try:
        yield printer
    finally:
        stop.set()
        thread.join(timeout=60)
        try:
            printer.poll()
        except Exception:  # noqa: BLE001 - already warned, or nothing more to say
            pass
