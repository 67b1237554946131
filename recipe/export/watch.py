"""Find the Hugging Face exports verl writes at each save, and check each new one.

verl 0.9.1 (checkpoint layout v2, MegatronCheckpointManager.save_checkpoint) writes
    <default_local_dir>/global_step_<N>/actor/model/huggingface/   config, tokenizer, safetensors
    <default_local_dir>/global_step_<N>/actor/ckpt_contents.json   written LAST: the save is complete
and older verl wrote the weights to `actor/huggingface/`. The recipe sets
default_local_dir to CHECKPOINT_DIR/PROJECT_NAME/EXPERIMENT_NAME; the search below
accepts that directory or any directory up to two levels above it.
With the recipe's settings (use_dist_checkpointing off) these HF weights are also
the only copy of the model weights that `resume_mode=auto` reloads from.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from recipe.atomic import atomic_write
from recipe.export.evidence import MAX_REPORT_BYTES, collect_evidence
from recipe.export.hf_check import DEFAULT_ALLOWED_PATTERNS, ExportCheckError, verify_export
from recipe.export.report import ExportReport, printable
from recipe.read_back import FileRefused

logger = logging.getLogger("recipe.export.watch")

STEP_DIR = re.compile(r"^global_step_([0-9]+)$")  # ASCII digits only, as verl writes them
HF_SUBDIRS: tuple[str, ...] = ("actor/model/huggingface", "actor/huggingface")
MANIFEST = "actor/ckpt_contents.json"
REPORT_NAME = "hf_export_report.json"
#: How deep below the given directory global_step_N folders are looked for.
SEARCH_DEPTH = 3


@dataclass(frozen=True)
class HFExport:
    """One HF export of a verl checkpoint; `ready` once verl has finished that save."""

    step: int
    directory: Path
    ready: bool

    @property
    def step_dir(self) -> Path:
        """The global_step_N folder the export lies in (HF_SUBDIRS below it)."""
        return next((part for part in self.directory.parents if STEP_DIR.match(part.name)), self.directory.parent)


def _step_dirs(root: Path, depth: int) -> list[Path]:
    found: list[Path] = []
    try:
        children = [child for child in root.iterdir() if child.is_dir()]
    except OSError:
        return found
    for child in children:
        if STEP_DIR.match(child.name):
            found.append(child)
        elif depth > 1:
            found.extend(_step_dirs(child, depth - 1))
    return found


def has_step_dirs(checkpoint_dir: Path) -> bool:
    """Whether a global_step_N folder lies within SEARCH_DEPTH below `checkpoint_dir`."""
    return bool(_step_dirs(Path(checkpoint_dir), SEARCH_DEPTH))


def find_hf_exports(checkpoint_dir: Path) -> list[HFExport]:
    """Every HF export under `checkpoint_dir` (verl's default_local_dir or up to two levels above), by step."""
    exports: list[HFExport] = []
    for step_dir in _step_dirs(Path(checkpoint_dir), SEARCH_DEPTH):
        for sub in HF_SUBDIRS:
            hf_dir = step_dir / sub
            if hf_dir.is_dir():
                step = int(STEP_DIR.match(step_dir.name).group(1))  # type: ignore[union-attr]
                exports.append(HFExport(step, hf_dir, (step_dir / MANIFEST).is_file()))
                break
    return sorted(exports, key=lambda e: (e.step, str(e.directory)))


def latest_hf_export(checkpoint_dir: Path) -> HFExport | None:
    """The finished HF export with the highest step, or None."""
    ready = [export for export in find_hf_exports(checkpoint_dir) if export.ready]
    return ready[-1] if ready else None


def check_export(
    export: HFExport,
    allowed_patterns: Sequence[str] = DEFAULT_ALLOWED_PATTERNS,
    reference: Path | None = None,
    write_report: bool = True,
) -> ExportReport | None:
    """Check one export, log the result (ERROR when broken), and write the JSON report beside it.

    The report goes to `<hf dir>/../hf_export_report.json`. Returns None (after logging
    an error) when the directory cannot be checked at all.
    """
    try:
        report = verify_export(export.directory, allowed_patterns, reference=reference)
    except ExportCheckError as error:
        logger.error("HF export of step %d cannot be checked: %s", export.step, printable(str(error)))
        return None
    if write_report:
        try:
            # What makes the report count for this export later, and only for it (recipe.export.evidence).
            evidence = collect_evidence(export.step, export.step_dir, export.directory)
            document = {**report.to_dict(), "evidence": evidence.model_dump()}
            text = (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()
            # Atomic, and a link planted at the report's name is replaced, never written through.
            atomic_write(export.directory.parent / REPORT_NAME, lambda out: out.write(text))
        except (OSError, FileRefused) as error:
            logger.warning("cannot write %s: %s", export.directory.parent / REPORT_NAME, error)
    if report.status == "broken":
        logger.error("BROKEN HF export at step %d\n%s", export.step, report.summary())
    else:
        logger.info("HF export at step %d: %s\n%s", export.step, report.status, report.summary())
    return report


def watch_exports(
    checkpoint_dir: Path,
    stop_event: threading.Event,
    *,
    interval_s: float = 30.0,
    allowed_patterns: Sequence[str] = DEFAULT_ALLOWED_PATTERNS,
    reference: Path | None = None,
    on_report: Callable[[HFExport, ExportReport | None], None] | None = None,
) -> dict[int, ExportReport | None]:
    """Check every HF export that becomes ready until `stop_event` is set, then once more.

    Meant for a daemon thread beside the trainer. Exports already present when it
    starts are checked too (a resumed run). Each export is checked once and alone:
    one that cannot be checked, even one whose check raises, is reported (ERROR, and
    `on_report(export, None)`) and the sweep goes on to the next. Returns
    {step: report} for all checked (None: could not be checked).
    """
    checked: dict[int, ExportReport | None] = {}
    seen: set[Path] = set()

    def check_one(export: HFExport) -> ExportReport | None:
        try:
            return check_export(export, allowed_patterns, reference)
        except Exception as error:  # noqa: BLE001 - a bug in one check must not stop the others
            logger.exception(
                "HF export of step %d could not be checked (%s: %s); later exports are still checked",
                export.step,
                type(error).__name__,
                printable(str(error)),
            )
            return None

    def sweep() -> None:
        for export in find_hf_exports(checkpoint_dir):
            if export.ready and export.directory not in seen:
                seen.add(export.directory)
                checked[export.step] = report = check_one(export)
                if on_report is not None:
                    try:
                        on_report(export, report)
                    except Exception:  # noqa: BLE001 - the callback's failure is its own
                        logger.exception("reporting the check of step %d failed", export.step)

    while True:
        try:
            sweep()
        except Exception:
            logger.exception("checking HF exports under %s failed", checkpoint_dir)
        if stop_event.wait(interval_s):
            try:
                sweep()  # the last save lands right before the trainer exits
            except Exception:
                logger.exception("checking HF exports under %s failed", checkpoint_dir)
            return checked
