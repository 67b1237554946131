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
import os
from dataclasses import dataclass
from pathlib import Path

from recipe.checkpoint_tracker import ResumeCheckError, tracked_step_dir
from recipe.export.evidence import trusted_status
from recipe.export.watch import HF_SUBDIRS, MANIFEST, REPORT_NAME, HFExport, check_export
from recipe.launch import override_value, planned_checkpoint_root, planned_step_total
from recipe.plan import Plan
from recipe.read_back import FileRefused, parse_json, open_regular, read_bounded
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


#: The head's run report holds a row a step: a file past this is no report of ours.
MAX_RUN_REPORT_BYTES = 16 << 20

#: Which run report a worker saw when it joined (inode, mtime, size), or None: none was there.
ReportMark = tuple[int, int, int] | None


def _mark_of(info: os.stat_result) -> tuple[int, int, int]:
    return (info.st_ino, info.st_mtime_ns, info.st_size)


def report_mark(path: Path) -> ReportMark:
    """The report as it is now, to tell a report written later from it without comparing two machines' clocks."""
    try:
        return _mark_of(os.stat(path))
    except OSError:
        return None


def finished_report(path: Path, mark: ReportMark) -> str | None:
    """How the head's run report (run-report.json, written by the head's `run` when its trainer ended) says the run
    finished, when it was written after `mark` and says exit 0; None otherwise: none, the one seen before, not a
    regular file within MAX_RUN_REPORT_BYTES, not JSON, or any other end. A worker asks once its head is gone."""
    try:
        fd, info = open_regular(path, MAX_RUN_REPORT_BYTES)
    except (OSError, FileRefused):
        return None
    try:
        if _mark_of(info) == mark:
            return None  # an earlier run's report
        document = parse_json(read_bounded(fd, MAX_RUN_REPORT_BYTES), str(path))
    except (OSError, FileRefused):
        return None
    finally:
        os.close(fd)
    if not isinstance(document, dict) or document.get("outcome") != "finished":
        return None
    code = document.get("exit_code")
    if type(code) is not int or code != 0:
        return None
    return f"the head's run report ({path.name}) says it finished with exit 0"
