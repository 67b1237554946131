"""The export watcher, called directly: which folders count as verl saves, what it logs and writes per save,
and that one bad save (or a failing callback) never stops the checks of the others.

The HF check itself (recipe.export.hf_check.verify_export) is replaced here by a stand-in that returns a
hand-made ExportReport and records how it was called: these tests pin the watcher's own decisions, in
milliseconds, without torch. test_commands_and_watch.py runs the watcher over real exports.
"""

from __future__ import annotations

import json

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from recipe.export import watch
from recipe.export.expected import ExportCheckError
from recipe.export.hf_check import DEFAULT_ALLOWED_PATTERNS
from recipe.export.report import ExportReport
from recipe.export.watch import (
    REPORT_NAME,
    HFExport,
    check_export,
    find_hf_exports,
    latest_hf_export,
    watch_exports,
)

Verify = Callable[..., ExportReport]


def save(
    root: Path, name: str, sub: str = "actor/model/huggingface", finished: bool = True
) -> Path:
    """A verl save folder `root/name` with an HF export at `sub`; `finished` writes verl's last file, the manifest."""
    hf_dir = root / name / sub
    hf_dir.mkdir(parents=True)
    if finished:
        (root / name / "actor" / "ckpt_contents.json").write_text("{}")
    return hf_dir


def report_for(
    directory: Path, status: str = "complete", missing: Sequence[str] = ()
) -> ExportReport:
    return ExportReport(
        str(directory),
        status,
        "Qwen3MoeForCausalLM",
        3,
        3 - len(missing),
        missing=list(missing),
    )  # type: ignore[arg-type]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Path, list[str], Path | None]]:
    """verify_export replaced by one that records (directory, patterns, reference) and calls a save broken when a
    folder above it is named 'bad' and uncheckable when one is named 'unreadable'."""
    seen: list[tuple[Path, list[str], Path | None]] = []

    def fake(
        directory: Path, patterns: Sequence[str], reference: Path | None = None
    ) -> ExportReport:
        seen.append((directory, list(patterns), reference))
        if "unreadable" in directory.parts:
            raise ExportCheckError(f"{directory}: no config.json\nforged line")
        if "bad" in directory.parts:
            return report_for(directory, "broken", ["model.norm.weight"])
        return report_for(directory)

    monkeypatch.setattr(watch, "verify_export", fake)
    return seen


@pytest.mark.parametrize(
    ("name", "is_a_save"),
    [
        ("global_step_7", True),
        ("global_step_0", True),
        ("global_step_120", True),
        ("global_step_", False),  # no step number
        ("global_step_7a", False),  # trailing junk
        ("xglobal_step_7", False),  # leading junk
        ("global_step_-7", False),
        (
            "global_step_\u0661",
            False,
        ),  # ARABIC-INDIC DIGIT ONE: a digit to Python, never written by verl
        ("Global_Step_7", False),
    ],
)
def test_only_global_step_folders_with_ascii_digits_are_saves(
    tmp_path: Path, name: str, is_a_save: bool
) -> None:
    save(tmp_path, name)
    assert [e.directory for e in find_hf_exports(tmp_path)] == (
        [tmp_path / name / "actor/model/huggingface"] if is_a_save else []
    )


@pytest.mark.parametrize(
    ("parents", "found"),
    [
        ("", True),  # the directory itself is verl's default_local_dir
        ("experiment", True),  # PROJECT_NAME/ above it
        ("project/experiment", True),  # CHECKPOINT_DIR: two levels above
        ("checkpoints/project/experiment", False),  # three levels above: out of reach
    ],
)
def test_saves_are_found_up_to_two_levels_below_the_given_directory(
    tmp_path: Path, parents: str, found: bool
) -> None:
    save(tmp_path / parents, "global_step_3")
    assert [e.step for e in find_hf_exports(tmp_path)] == ([3] if found else [])


def test_exports_come_in_step_order_with_the_step_as_a_number_and_their_readiness(
    tmp_path: Path,
) -> None:
    save(tmp_path, "global_step_10")
    save(tmp_path, "global_step_9", finished=False)
    save(tmp_path, "global_step_100")
    assert find_hf_exports(tmp_path) == [
        HFExport(9, tmp_path / "global_step_9/actor/model/huggingface", False),
        HFExport(10, tmp_path / "global_step_10/actor/model/huggingface", True),
        HFExport(100, tmp_path / "global_step_100/actor/model/huggingface", True),
    ]


def test_same_step_in_two_experiments_is_ordered_by_folder(tmp_path: Path) -> None:
    save(tmp_path / "b", "global_step_1")
    save(tmp_path / "a", "global_step_1")
    assert [
        e.directory.parent.parent.parent.parent.name for e in find_hf_exports(tmp_path)
    ] == ["a", "b"]


def test_older_verl_layout_is_found_and_the_current_one_wins_when_both_exist(
    tmp_path: Path,
) -> None:
    old = save(tmp_path, "global_step_1", sub="actor/huggingface")
    save(tmp_path, "global_step_2", sub="actor/huggingface")
    current = save(tmp_path, "global_step_2", sub="actor/model/huggingface")
    assert [(e.step, e.directory) for e in find_hf_exports(tmp_path)] == [
        (1, old),
        (2, current),
    ]


def test_a_save_without_an_hf_folder_or_a_file_named_like_a_save_is_no_export(
    tmp_path: Path,
) -> None:
    (tmp_path / "global_step_1" / "actor").mkdir(parents=True)
    (tmp_path / "global_step_1" / "actor" / "ckpt_contents.json").write_text("{}")
    (tmp_path / "global_step_2").write_text("a file, not a save")
    (tmp_path / "global_step_3" / "actor" / "model").mkdir(parents=True)
    (tmp_path / "global_step_3" / "actor" / "model" / "huggingface").write_text(
        "a file"
    )
    assert find_hf_exports(tmp_path) == []


def test_a_missing_or_unreadable_directory_has_no_exports(tmp_path: Path) -> None:
    assert find_hf_exports(tmp_path / "nowhere") == []
    (tmp_path / "a-file").write_text("")
    assert find_hf_exports(tmp_path / "a-file") == []
    assert latest_hf_export(tmp_path / "nowhere") is None


def test_latest_export_is_the_highest_finished_step(tmp_path: Path) -> None:
    save(tmp_path, "global_step_2")
    save(tmp_path, "global_step_5")
    newest_finished = save(tmp_path, "global_step_10")
    save(tmp_path, "global_step_30", finished=False)  # verl is still writing it
    assert latest_hf_export(tmp_path) == HFExport(10, newest_finished, True)


def test_no_finished_save_means_no_latest_export(tmp_path: Path) -> None:
    save(tmp_path, "global_step_2", finished=False)
    assert latest_hf_export(tmp_path) is None


def test_check_writes_the_report_json_beside_the_export_and_logs_the_status(
    tmp_path: Path, calls: list, caplog: pytest.LogCaptureFixture
) -> None:
    export = HFExport(4, save(tmp_path, "global_step_4"), True)
    reference = tmp_path / "model"
    with caplog.at_level(logging.INFO, logger="recipe.export.watch"):
        report = check_export(export, ["^x$"], reference=reference)
    assert report == report_for(export.directory)
    assert calls == [(export.directory, ["^x$"], reference)]
    written = json.loads((tmp_path / "global_step_4" / "actor" / "model" / REPORT_NAME).read_text())
    evidence = written.pop("evidence")  # what the watcher saw (recipe.export.evidence, test_report_evidence.py)
    assert written == json.loads(report.to_json())
    assert evidence == {"step": 4, "export": "actor/model/huggingface", "files": {}}
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", f"HF export at step 4: complete\n{report.summary()}")
    ]


def test_check_uses_the_default_patterns_and_no_reference_unless_told(
    tmp_path: Path, calls: list
) -> None:
    export = HFExport(4, save(tmp_path, "global_step_4"), True)
    check_export(export)
    assert calls == [(export.directory, list(DEFAULT_ALLOWED_PATTERNS), None)]


def test_a_broken_export_is_one_error_with_its_summary(
    tmp_path: Path, calls: list, caplog: pytest.LogCaptureFixture
) -> None:
    # The stand-in calls a save broken when a folder above it is named 'bad'.
    export = HFExport(6, save(tmp_path / "bad", "global_step_6"), True)
    with caplog.at_level(logging.INFO, logger="recipe.export.watch"):
        report = check_export(export)
    assert report is not None and report.status == "broken"
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("ERROR", f"BROKEN HF export at step 6\n{report.summary()}")
    ]


def test_without_write_report_nothing_is_written(tmp_path: Path, calls: list) -> None:
    export = HFExport(4, save(tmp_path, "global_step_4"), True)
    assert check_export(export, write_report=False) is not None
    assert not (export.directory.parent / REPORT_NAME).exists()


def test_an_uncheckable_export_is_none_and_one_error_line(
    tmp_path: Path, calls: list, caplog: pytest.LogCaptureFixture
) -> None:
    export = HFExport(8, save(tmp_path / "unreadable", "global_step_8"), True)
    with caplog.at_level(logging.INFO, logger="recipe.export.watch"):
        assert check_export(export) is None
    # The error's text comes from the files checked: its newline is escaped, never a forged log line.
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        (
            "ERROR",
            f"HF export of step 8 cannot be checked: {export.directory}: no config.json\\nforged line",
        )
    ]
    assert not (export.directory.parent / REPORT_NAME).exists()


def test_a_report_that_cannot_be_written_is_a_warning_and_the_check_still_counts(
    tmp_path: Path,
    calls: list,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    export = HFExport(4, save(tmp_path, "global_step_4"), True)

    def refuse(path: Path, write: Callable[..., object]) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(watch, "atomic_write", refuse)
    with caplog.at_level(logging.INFO, logger="recipe.export.watch"):
        assert check_export(export) == report_for(export.directory)
    first = caplog.records[0]
    assert (first.levelname, first.getMessage()) == (
        "WARNING",
        f"cannot write {export.directory.parent / REPORT_NAME}: [Errno 13] Permission denied",
    )


class StopAfter(threading.Event):
    """A stop event that is set after `sweeps` waits, and records each wait's interval; no real waiting.

    `between(n)` runs at the n-th wait: what verl does on disk while the watcher sleeps."""

    def __init__(
        self, sweeps: int, between: Callable[[int], None] = lambda n: None
    ) -> None:
        super().__init__()
        self.sweeps, self.between, self.intervals = sweeps, between, []  # type: list[float]

    def wait(self, timeout: float | None = None) -> bool:
        self.intervals.append(timeout)  # type: ignore[arg-type]
        if len(self.intervals) > self.sweeps + 3:
            # A watch that ignores its stop event would sweep forever: fail now instead of hanging.
            raise AssertionError(
                f"the watch went on after the stop event was set ({len(self.intervals)} waits)"
            )
        self.between(len(self.intervals))
        return len(self.intervals) >= self.sweeps


def test_watch_checks_each_ready_export_once_including_the_one_saved_at_the_stop(
    tmp_path: Path, calls: list
) -> None:
    save(tmp_path, "global_step_1")
    save(tmp_path, "global_step_2", finished=False)

    def verl_saves(wait: int) -> None:
        if wait == 1:  # verl finishes step 2 between two sweeps
            (tmp_path / "global_step_2" / "actor" / "ckpt_contents.json").write_text(
                "{}"
            )
        if wait == 2:  # and saves step 3 just before the trainer exits
            save(tmp_path, "global_step_3")

    stop = StopAfter(2, verl_saves)
    reports: list[tuple[int, str | None]] = []
    checked = watch_exports(
        tmp_path,
        stop,
        interval_s=7.5,
        on_report=lambda e, r: reports.append((e.step, r and r.status)),
    )
    assert reports == [(1, "complete"), (2, "complete"), (3, "complete")]
    assert sorted(checked) == [1, 2, 3] and all(r is not None for r in checked.values())
    assert [c[0].parent.parent.parent.name for c in calls] == [
        "global_step_1",
        "global_step_2",
        "global_step_3",
    ]
    assert stop.intervals == [7.5, 7.5]


def test_watch_waits_thirty_seconds_by_default_and_passes_patterns_and_reference(
    tmp_path: Path, calls: list
) -> None:
    save(tmp_path, "global_step_1")
    stop = StopAfter(1)
    watch_exports(tmp_path, stop, allowed_patterns=["^p$"], reference=tmp_path / "ref")
    assert stop.intervals == [30.0]
    assert calls == [
        (tmp_path / "global_step_1/actor/model/huggingface", ["^p$"], tmp_path / "ref")
    ]


def test_watch_reports_an_uncheckable_export_as_none_and_goes_on(
    tmp_path: Path, calls: list
) -> None:
    save(tmp_path / "unreadable", "global_step_1")
    save(tmp_path, "global_step_2")
    reports: list[tuple[int, str | None]] = []
    checked = watch_exports(
        tmp_path,
        StopAfter(1),
        on_report=lambda e, r: reports.append((e.step, r and r.status)),
    )
    assert reports == [(1, None), (2, "complete")]
    assert checked[1] is None and checked[2] is not None


def test_a_check_that_raises_is_logged_with_its_error_and_the_next_export_is_still_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    save(tmp_path, "global_step_1")
    save(tmp_path, "global_step_2")

    def check(
        export: HFExport, patterns: Sequence[str], reference: Path | None
    ) -> ExportReport:
        if export.step == 1:
            raise ValueError("bad\nshard")
        return report_for(export.directory)

    monkeypatch.setattr(watch, "check_export", check)
    reports: list[tuple[int, ExportReport | None]] = []
    with caplog.at_level(logging.INFO, logger="recipe.export.watch"):
        checked = watch_exports(
            tmp_path, StopAfter(1), on_report=lambda e, r: reports.append((e.step, r))
        )
    assert [(step, r is None) for step, r in reports] == [(1, True), (2, False)]
    assert checked[1] is None and checked[2] is not None
    [record] = [r for r in caplog.records if r.levelname == "ERROR"]
    assert (
        record.getMessage()
        == "HF export of step 1 could not be checked (ValueError: bad\\nshard); later exports are still checked"
    )
    assert (
        record.exc_info is not None
    )  # the traceback goes to the log: it is a bug to find


def test_a_failing_callback_is_logged_and_the_watch_goes_on(
    tmp_path: Path, calls: list, caplog: pytest.LogCaptureFixture
) -> None:
    save(tmp_path, "global_step_1")
    save(tmp_path, "global_step_2")
    seen: list[int] = []

    def on_report(export: HFExport, report: ExportReport | None) -> None:
        seen.append(export.step)
        raise RuntimeError("the callback's own bug")

    with caplog.at_level(logging.INFO, logger="recipe.export.watch"):
        checked = watch_exports(tmp_path, StopAfter(1), on_report=on_report)
    assert seen == [1, 2] and sorted(checked) == [1, 2]
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert errors == [
        "reporting the check of step 1 failed",
        "reporting the check of step 2 failed",
    ]


@pytest.mark.parametrize("failing_sweep", [1, 2])
def test_a_sweep_that_fails_is_logged_and_the_watch_still_ends_with_what_it_checked(
    tmp_path: Path,
    calls: list,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    failing_sweep: int,
) -> None:
    save(tmp_path, "global_step_1")
    real_find = watch.find_hf_exports
    sweeps: list[int] = []

    def find(directory: Path) -> list[HFExport]:
        sweeps.append(1)
        if len(sweeps) == failing_sweep:
            raise OSError("stale NFS handle")
        return real_find(directory)

    monkeypatch.setattr(watch, "find_hf_exports", find)
    with caplog.at_level(logging.INFO, logger="recipe.export.watch"):
        checked = watch_exports(tmp_path, StopAfter(1))
    assert len(sweeps) == 2 and sorted(checked) == [1]
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert errors == [f"checking HF exports under {tmp_path} failed"]
