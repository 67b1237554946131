"""How long a run is, and where its checkpoints say it stands: the steps planned, the step a resume starts from.

`plan` says which resume `run` will make (verl's own rule: trainer.resume_mode, then the tracker
file under the checkpoint root) and `run`'s progress lines count against the same total. The
total is `trainer.total_training_steps` when the overrides set it, else what verl will compute:
the training parquet's rows // TRAIN_BATCH_SIZE (verl's loader drops the last partial batch) x
TOTAL_EPOCHS, marked "about" since verl filters overlong prompts first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipe.checkpoint_tracker import TRACKER_NAME, ResumeCheckError, tracked_step_dir


@dataclass(frozen=True)
class StepTotal:
    """How many steps the run will take, and whether that is verl's number or the recipe's estimate of it."""

    steps: int
    estimated: bool

    def __str__(self) -> str:
        return f"{'about ' if self.estimated else ''}{self.steps}"


def total_steps(configured: str | None, train_file: Path, batch_size: int, epochs: int) -> StepTotal | None:
    """The run's number of steps: `trainer.total_training_steps` when set, else from the parquet's row count."""
    if configured not in (None, "", "null"):
        try:
            return StepTotal(int(str(configured)), False)
        except ValueError:
            return None
    try:
        import pyarrow.parquet as parquet  # lazy: `plan` reads a footer only when a resume asks for the total

        rows = parquet.ParquetFile(train_file).metadata.num_rows
    except Exception:  # noqa: BLE001 - no total is a line without one, never a failed plan or run
        return None
    return StepTotal(rows // batch_size * epochs, True) if rows >= batch_size else None


@dataclass(frozen=True)
class ResumePoint:
    """What the trainer will start from: a saved step (and which), or nothing; and why."""

    #: The step verl loads; None: it starts fresh.
    step: int | None
    #: The checkpoint directory it loads (None when fresh).
    path: Path | None
    #: Why: the resume mode, the tracker, or what is missing.
    reason: str
    total: StepTotal | None = None

    @property
    def finished(self) -> bool:
        """The saved step is the run's last: there is nothing left to train."""
        return self.step is not None and self.total is not None and not self.total.estimated and self.step >= self.total.steps

    def describe(self) -> str:
        """`resumes from global_step_20 (of 300 planned): ...` or `starts fresh: ...`."""
        if self.step is None:
            return f"starts fresh: {self.reason}"
        of = f" (of {self.total} planned)" if self.total else ""
        done = "; the run already finished: nothing is left to train" if self.finished else ""
        return f"resumes from global_step_{self.step}{of}: {self.reason}{done}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form for `plan --json`."""
        return {
            "action": "fresh" if self.step is None else "resume",
            "step": self.step,
            "path": None if self.path is None else str(self.path),
            "reason": self.reason,
            "planned_steps": None if self.total is None else self.total.steps,
            "planned_steps_estimated": None if self.total is None else self.total.estimated,
            "finished": self.finished,
        }


_STEP_DIR = re.compile(r"global_step_(\d{1,18})")


def resume_point(mode: str | None, resume_from: str | None, root: Path, total: StepTotal | None) -> ResumePoint:
    """Where verl 0.9.1 will start, by its own rule (RayPPOTrainer._load_checkpoint), read without changing anything.

    `disable`: fresh. `resume_path`: the directory trainer.resume_from_path names. `auto`: the
    step the tracker under `root` names (recipe.checkpoint_tracker, as verl reads it), fresh
    without one. An unreadable tracker raises ResumeCheckError (run's resume guard refuses it).
    """
    if mode == "disable":
        return ResumePoint(None, None, "trainer.resume_mode=disable", total)
    if mode == "resume_path":
        if not resume_from:
            return ResumePoint(None, None, "trainer.resume_mode=resume_path without trainer.resume_from_path", total)
        named = _STEP_DIR.search(Path(resume_from).name)
        step = int(named.group(1)) if named else None
        if step is None:
            return ResumePoint(None, None, f"trainer.resume_from_path={resume_from} names no global_step_N directory", total)
        return ResumePoint(step, Path(resume_from), f"trainer.resume_from_path={resume_from}", total)
    tracked = tracked_step_dir(root)
    if tracked is None:
        if (root / TRACKER_NAME).exists():
            why = f"the tracker under {root} names a step directory that does not exist (verl trains afresh then)"
        else:
            why = f"nothing saved under {root} yet"
        return ResumePoint(None, None, why, total)
    step_dir, step = tracked
    return ResumePoint(step, step_dir, f"the newest save under {root} (trainer.resume_mode=auto)", total)


__all__ = ["ResumeCheckError", "ResumePoint", "StepTotal", "resume_point", "total_steps"]
