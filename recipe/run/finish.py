"""Whether the run has reached its end, read from what it left on disk.

`run` asks twice. Before it starts anything: a checkpoint root whose run already saved its last
step is done, and a restart (Compose's on-failure policy, the Job's backoffLimit) must not train
again, nor fail on the resume guard. And after the trainer's process died of a signal: a C++
teardown crash after the work was done (recipe.trainer_main prevents the known one) is no failed
run. Both answer from the same evidence, and only from evidence: verl's tracker names the planned
last step, verl finished that save (its manifest, written last), and that step's HF export
passed its check (the export watcher's report, when its evidence matches that export: recipe.export.evidence;
else the check made now). The planned total is
`trainer.total_training_steps`, else the row estimate (recipe.run_length), an upper bound of
verl's own count since verl only drops rows: a run that stops below it is not called finished.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from recipe.checkpoint_tracker import ResumeCheckError, tracked_step_dir
from recipe.export.evidence import trusted_status
from recipe.export.watch import HF_SUBDIRS, MANIFEST, REPORT_NAME, HFExport, check_export
from recipe.launch import override_value, planned_checkpoint_root, planned_step_total
from recipe.plan import Plan
from recipe.run_length import StepTotal

logger = logging.getLogger("recipe")

@dataclass(frozen=True)
class FinalSave:
    """The run's last step, saved and checked."""

    step: int
    total: StepTotal
    root: Path
    export_status: str

    def describe(self) -> str:
        """`step 20 of 20, saved under ... (HF export complete)`."""
        return f"step {self.step} of {self.total}, saved under {self.root} (HF export {self.export_status})"


def _export_status(step_dir: Path, step: int, reference: Path) -> str | None:
    """The step's export status: the watcher's report when its evidence matches the export, else checked now; None
    without an export, or when it cannot be checked. Nothing is written."""
    export = next((step_dir / sub for sub in HF_SUBDIRS if (step_dir / sub).is_dir()), None)
    if export is None:
        return None
    # Where the watcher writes it (recipe.export.watch); forged, stale or foreign reports are not known.
    status = trusted_status(export.parent / REPORT_NAME, step, step_dir, export)
    if status is not None:
        return status
    report = check_export(HFExport(step, export, True), reference=reference, write_report=False)
    return None if report is None else report.status


def final_save(plan: Plan) -> FinalSave | None:
    """The run's last step when the checkpoint root holds it, complete and with a sound export; None otherwise.

    Only where verl would resume from it (trainer.resume_mode=auto): with `disable` or a chosen
    step the user asked to train, and nothing here stops that.
    """
    if override_value(plan.overrides, "trainer.resume_mode") != "auto":
        return None
    total = planned_step_total(plan.settings, plan.overrides)
    root = planned_checkpoint_root(plan.settings, plan.overrides)
    try:
        tracked = tracked_step_dir(root)
    except ResumeCheckError:
        return None  # the resume guard says why
    if total is None or tracked is None or tracked[1] < total.steps:
        return None
    step_dir, step = tracked
    if not (step_dir / MANIFEST).is_file():
        return None
    status = _export_status(step_dir, step, plan.settings.model_path)
    if status is None or status == "broken":
        return None
    return FinalSave(step, total, root, status)
