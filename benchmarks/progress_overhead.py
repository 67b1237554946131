#!/usr/bin/env python3
"""What `run`'s reading of verl's metrics costs a step: a trainer stand-in's work timed alone and beside the poller.

`run` polls the event files of verl's TensorBoard logger every POLL_INTERVAL_S (recipe.run.progress)
for the progress lines, and reads them once more at the end for the report. Both run in `run`'s
own process, beside the trainer's, and share the node's cores with it. This writes the event
files of a long run (STEPS steps of the ~METRICS scalars verl 0.9.1 logs a step, through verl's
own TensorBoard adapter when verl is installed), then times a fixed CPU-bound stand-in of a
trainer's work, in the same process:
- alone (the reference);
- with the progress poller reading those files every `--interval` seconds, a far shorter
  interval than `run`'s, so that the cost shows;
and prints the ratio, the cost scaled to `run`'s interval, and one full read's time (the report's)
against a step. Target: at most 1 % of a step at `run`'s interval; exits 1 above it.

    python benchmarks/progress_overhead.py [--steps 1000] [--interval 0.2]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from recipe.run.progress import POLL_INTERVAL_S, event_reader, printing_progress, read_steps  # noqa: E402
from recipe.run.verl_metrics import PHASES, READ_BACK  # noqa: E402
from recipe.run_length import StepTotal  # noqa: E402

#: Scalars verl 0.9.1 logs a step on the CPU e2e's run (its console line): the ones `run` reads and the rest.
METRICS = 180
TARGET = 0.01


def write_events(directory: Path, steps: int) -> None:
    """`steps` steps of METRICS scalars each into `directory`, as verl's TensorBoard adapter writes them."""
    os.environ["TENSORBOARD_DIR"] = str(directory)
    try:
        from verl.utils.tracking import _TensorboardAdapter

        writer = _TensorboardAdapter("bench", "bench")
        log, finish = writer.log, writer.finish
    except ImportError:  # verl absent: torch's SummaryWriter, which verl's adapter wraps
        from torch.utils.tensorboard import SummaryWriter

        summary = SummaryWriter(str(directory))

        def log(data: dict[str, float], step: int) -> None:
            for key, value in data.items():
                summary.add_scalar(key, value, step)

        finish = summary.close
    others = [f"other/metric_{index}" for index in range(METRICS - len(READ_BACK))]
    for step in range(1, steps + 1):
        values = {tag: 1.0 + step % 7 for tag in READ_BACK} | {tag: float(step) for tag in others}
        values["timing_s/step"] = 60.0
        log(values, step=step)
    finish()


def stand_in_step(rounds: int) -> float:
    """A trainer stand-in's CPU-bound work (hashing, which holds the GIL as Python code around it does): its seconds."""
    start = time.perf_counter()
    digest = b"x" * 4096
    for _ in range(rounds):
        digest = hashlib.sha256(digest).digest() * 128
    return time.perf_counter() - start


def timed_steps(rounds: int, repeat: int) -> float:
    """Median seconds of `repeat` stand-in steps."""
    return statistics.median(stand_in_step(rounds) for _ in range(repeat))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000, help="steps in the event files (a long run)")
    parser.add_argument("--interval", type=float, default=0.2, help="the poller's interval here, seconds")
    parser.add_argument("--repeat", type=int, default=9, help="stand-in steps per measurement (median taken)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        write_events(directory, args.steps)
        start = time.perf_counter()
        steps = read_steps(event_reader(directory), directory)
        full_read = time.perf_counter() - start
        assert len(steps) == args.steps and set(PHASES.values()) <= set(steps[1]), "the event files were not read back"
        rounds = 20000
        while stand_in_step(rounds) < 1.0:  # about a second of work: many polls fall inside each step
            rounds *= 2
        reference = timed_steps(rounds, args.repeat)
        lines: list[str] = []
        with printing_progress(directory, StepTotal(args.steps, False), lines.append, interval_s=args.interval):
            while not lines:  # the first poll (a full read) is done; what follows is the steady state
                time.sleep(0.01)
            polled = timed_steps(rounds, args.repeat)
        reference_again = timed_steps(rounds, args.repeat)
    reference = min(reference, reference_again)
    ratio = polled / reference
    at_run_interval = max(ratio - 1.0, 0.0) * args.interval / POLL_INTERVAL_S
    print(f"event files: {args.steps} steps x {METRICS} scalars; one full read (the report's, once at the end): {full_read:.2f} s, "
          f"{100 * full_read / 60:.2f} % of one 60 s step")  # fmt: skip
    print(f"stand-in step: {reference:.3f} s alone, {polled:.3f} s with a poll every {args.interval:g} s: ratio {ratio:.4f}")
    print(f"at run's poll interval ({POLL_INTERVAL_S:g} s): {100 * at_run_interval:.3f} % of a step (target <= {100 * TARGET:g} %)")
    print(f"threads alive: {threading.active_count()}")
    return 0 if at_run_interval <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
