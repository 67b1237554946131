"""Evidence, not a word: a report beside an export counts only when the watcher wrote it for that very export.

Issue 50, class 2. The export watcher (recipe.export.watch.check_export) writes, with its verdict, what it saw:
the step, where the export lies, each file's name, size and digest (recipe.export.evidence). Its readers (the
finished-run check, recipe.run.finish; the smoke verdict's watcher check) take the status only when that
evidence matches the export on disk now. Tested on a real export saved by transformers and a real report
written by the watcher, against generated forged, stale and foreign reports: each is "not known", so the
finished-run check checks the export itself (an empty folder then never counts as a finished run), and the
smoke verdict's watcher check fails.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings as hypothesis_settings, strategies as st

from recipe.export.evidence import trusted_status
from recipe.export.watch import REPORT_NAME, HFExport, check_export
from recipe.smoke.verdict import _watcher_report

HF = "actor/model/huggingface"


def _step(root: Path, step: int, export: Path | None) -> HFExport:
    """global_step_<step> as verl leaves it: the export (a copy of `export`, else an empty folder) and the manifest."""
    hf = root / f"global_step_{step}" / HF
    if export is None:
        hf.mkdir(parents=True)
    else:
        shutil.copytree(export, hf)
    (hf.parents[1] / "ckpt_contents.json").write_text("{}")
    return HFExport(step, hf, True)


def _trusted(export: HFExport) -> str | None:
    return trusted_status(export.directory.parent / REPORT_NAME, export.step, export.step_dir, export.directory)


def test_the_watchers_own_report_is_trusted_and_names_what_it_saw(qwen35_saved: Path, tmp_path: Path) -> None:
    export = _step(tmp_path, 7, qwen35_saved)
    report = check_export(export)
    assert report is not None and report.status in ("complete", "lenient")
    stored = json.loads((export.directory.parent / REPORT_NAME).read_text())
    files = {p.name: p.stat().st_size for p in export.directory.iterdir()}
    assert stored["evidence"]["step"] == 7 and stored["evidence"]["export"] == HF
    assert {name: seen["size"] for name, seen in stored["evidence"]["files"].items()} == files
    assert all(seen["sha256"] and len(seen["sha256"]) == 64 for seen in stored["evidence"]["files"].values())
    assert _trusted(export) == report.status
    assert _watcher_report(export).passed


#: Ways a report on disk is not the watcher's word on this export.
FORGERIES = ("status", "no evidence", "evidence of nothing", "another step", "another export place", "a file added",
             "a file removed", "a file resized", "a field of another type", "copied from another step")  # fmt: skip


def _forge(export: HFExport, how: str, value: str, tmp_path: Path) -> None:
    path = export.directory.parent / REPORT_NAME
    document = json.loads(path.read_text())
    evidence = document["evidence"]
    shard = sorted(name for name in evidence["files"] if name.endswith(".safetensors"))[0]
    if how == "status":
        document["status"] = value  # COMPLETE, "", unchecked: anything but the watcher's three words
    elif how == "no evidence":
        del document["evidence"]
    elif how == "evidence of nothing":
        evidence["files"] = {}
    elif how == "another step":
        evidence["step"] = export.step + 1
    elif how == "another export place":
        evidence["export"] = "actor/huggingface"
    elif how == "a file added":
        (export.directory / f"{value or 'x'}.bin").write_bytes(b"\0")
    elif how == "a file removed":
        (export.directory / shard).unlink()
    elif how == "a file resized":
        with open(export.directory / shard, "ab") as out:
            out.write(b"\0" * (1 + len(value)))
    elif how == "a field of another type":
        evidence["files"][shard]["size"] = str(evidence["files"][shard]["size"])
    elif how == "copied from another step":
        other = _step(tmp_path / "other", export.step + 1, export.directory)
        check_export(other)
        document = json.loads((other.directory.parent / REPORT_NAME).read_text())
    if how not in ("a file added", "a file removed", "a file resized"):
        path.write_text(json.dumps(document))


@given(how=st.sampled_from(FORGERIES), value=st.sampled_from(["COMPLETE", "", "unchecked", "Complete", "ok"]) | st.text(max_size=8))
@example(how="status", value="COMPLETE")  # the issue's: any status but "broken" finished the run
@example(how="status", value="")
@example(how="a file resized", value="")  # the export rewritten after its check
@example(how="copied from another step", value="")
@hypothesis_settings(max_examples=12, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_forged_stale_and_foreign_reports_are_not_known(
    how: str, value: str, qwen35_saved: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    tmp = tmp_path_factory.mktemp("forged")
    export = _step(tmp, 3, qwen35_saved)
    check_export(export)
    assert _trusted(export) is not None  # the control: the watcher's own report counts
    _forge(export, how, value, tmp)
    if how == "status" and value in ("complete", "lenient", "broken"):
        return  # the watcher's own words: the rest of the evidence still stands
    assert _trusted(export) is None
    assert not _watcher_report(export).passed


@pytest.mark.parametrize("status", ["COMPLETE", "", "unchecked", "complete"])
def test_a_report_beside_an_empty_export_never_finishes_a_run(tmp_path: Path, status: str) -> None:
    """The issue's case: `run` said "already finished ... (HF export COMPLETE)" beside an empty export folder."""
    from recipe.run.finish import _export_status

    export = _step(tmp_path, 2, None)
    (export.directory.parent / REPORT_NAME).write_text(json.dumps({"status": status}))
    assert _export_status(export.step_dir, 2, tmp_path) is None  # not known, and the check made now finds no export
