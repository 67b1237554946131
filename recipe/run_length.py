"""How long a run is, and where its checkpoints say it stands: the steps planned, the step a resume starts from.

`plan` says which resume `run` will make (verl's own rule: trainer.resume_mode, then the tracker
file under the checkpoint root) and `run`'s progress lines count against the same total. The
total is `trainer.total_training_steps` when the overrides set it, else what verl will compute:
the training parquet's rows // TRAIN_BATCH_SIZE (verl's loader drops the last partial batch) x
TOTAL_EPOCHS, marked "about" since verl filters overlong prompts first.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipe.checkpoint_tracker import TRACKER_NAME, ResumeCheckError, tracked_step_dir
from recipe.export.watch import MANIFEST
from recipe.hydra_text import OVERRIDE_PLACES


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
        """The saved step is the run's last: there is nothing left to train.

        An estimated total counts too: it is an upper bound of verl's own count (verl only drops rows), the same
        rule as `run`'s finish check (recipe.run.finish.final_save)."""
        return self.step is not None and self.total is not None and self.step >= self.total.steps

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
#: A save verl 0.9.1 made under the checkpoint root (ASCII digits, as verl names them).
_SAVE_NAME = re.compile(r"global_step_([0-9]+)")
#: Where verl 0.9.1's Megatron checkpoint manager loads the HF weights of a step from
#: (get_hf_model_checkpoint_path: <step>/actor/model/huggingface; the pre-v2 layout it refuses).
RESUMED_HF_DIR = "actor/model/huggingface"

#: How out of a refused resume: every refusal names these (saves are the run's most expensive data).
RESUME_WAYS_OUT = (
    "train under another EXPERIMENT_NAME, resume from a step you checked with "
    "`trainer.resume_mode=resume_path trainer.resume_from_path=<its global_step_N dir>`, "
    f"or start afresh over the saves with `trainer.resume_mode=disable` (overrides: {OVERRIDE_PLACES})"
)


def saved_steps(root: Path) -> list[str]:
    """The `global_step_N` entries under `root`, whatever each is (an empty folder, a link): lowest step first."""
    try:
        names = [entry.name for entry in os.scandir(root) if _SAVE_NAME.fullmatch(entry.name)]
    except OSError:  # no root (nothing saved), or one that cannot be listed: the plan's path check says why
        return []
    return sorted(names, key=lambda name: int(name.removeprefix("global_step_")))


def _listed(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _auto_resume(root: Path, total: StepTotal | None) -> ResumePoint:
    """`trainer.resume_mode=auto`: the one rule for every state of the tracker and the saves, for `plan` and `run` alike.

    verl resumes from the step its tracker names; it trains afresh without a tracker, or when the named step is
    not there, and fails or hangs on a tracker it cannot read. The recipe goes on only where that is safe: it
    resumes from a tracked step that verl finished saving (its manifest and HF export are there; `run` checks the
    export), and starts fresh only where nothing is saved. Everything else raises ResumeCheckError: a tracker that
    is no readable regular file (a directory, a FIFO, a dangling or looping link), contents verl cannot read, a
    tracked step that verl never finished, and a fresh start that would write over saves (no tracker, or one
    naming a step that is not there: a negative or huge number, a step past the newest save).
    """
    tracker = root / TRACKER_NAME
    unknown = "cannot tell which checkpoint verl would resume from"
    if os.path.islink(tracker) and not os.path.exists(tracker):
        # verl's os.path.exists says "no tracker" and trains afresh; the recipe reads such a link as unreadable.
        raise ResumeCheckError(f"{unknown}: {tracker} is a link that leads nowhere (dangling or looping)")
    try:
        tracked = tracked_step_dir(root)
    except ResumeCheckError as error:  # what verl would fail or wait forever on
        raise ResumeCheckError(f"{unknown}: {error}") from None
    saves = saved_steps(root)
    if tracked is None:
        if saves:
            named = "no tracker" if not os.path.lexists(tracker) else f"{tracker} names a step that is not saved"
            raise ResumeCheckError(
                f"{named}, so verl would train afresh over the saves beside it ({_listed(saves)}), "
                "overwriting or mixing them"
            )
        if os.path.lexists(tracker):
            return ResumePoint(None, None, f"the tracker under {root} names a step that is not saved, and nothing is", total)
        return ResumePoint(None, None, f"nothing saved under {root} yet", total)
    step_dir, step = tracked
    if not (step_dir / MANIFEST).is_file():
        raise ResumeCheckError(
            f"the checkpoint resume would load (step {step}) is incomplete: {step_dir / MANIFEST}, which verl writes "
            "last, is missing"
        )
    if not (step_dir / RESUMED_HF_DIR).is_dir():
        raise ResumeCheckError(
            f"the checkpoint resume would load (step {step}) has no HF export at {step_dir / RESUMED_HF_DIR} (the "
            "weights verl reloads), so it cannot be checked"
        )
    return ResumePoint(step, step_dir, f"the newest save under {root} (trainer.resume_mode=auto)", total)


def resume_point(mode: str | None, resume_from: str | None, root: Path, total: StepTotal | None) -> ResumePoint:
    """Where verl 0.9.1 will start, by its own rule (RayPPOTrainer._load_checkpoint), read without changing anything.

    `disable`: fresh. `resume_path`: the directory trainer.resume_from_path names. `auto`: the
    step the tracker under `root` names (recipe.checkpoint_tracker, as verl reads it), by the rule of
    `_auto_resume`, which raises ResumeCheckError where `run` refuses to start.
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
    return _auto_resume(root, total)


__all__ = ["RESUMED_HF_DIR", "RESUME_WAYS_OUT", "ResumeCheckError", "ResumePoint", "StepTotal", "resume_point", "saved_steps", "total_steps"]
