"""verify-export's handler and exit codes, and the watcher over a verl-style checkpoint tree."""

from __future__ import annotations

import argparse
import json
import shutil
import threading
from pathlib import Path

import pytest

from recipe.export.commands import add_export_commands, run_verify_export
from recipe.export.watch import REPORT_NAME, find_hf_exports, latest_hf_export, watch_exports
from tests.unit.envtools import HANG_GUARD_S


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_export_commands(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(list(argv))


def verl_tree(root: Path, source: Path, steps: dict[int, bool]) -> dict[int, Path]:
    """global_step_N/actor/model/huggingface copies of `source`; True = save finished (manifest)."""
    dirs = {}
    for step, finished in steps.items():
        actor = root / f"global_step_{step}" / "actor"
        shutil.copytree(source, actor / "model" / "huggingface")
        (actor / "model" / "dist_ckpt").mkdir()
        if finished:
            (actor / "ckpt_contents.json").write_text("{}")
        dirs[step] = actor / "model" / "huggingface"
    return dirs


def test_verify_export_complete_exits_0(qwen35_saved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_verify_export(parse("verify-export", str(qwen35_saved))) == 0
    assert ": COMPLETE (" in capsys.readouterr().out


def test_verify_export_broken_json_exits_1(qwen35_copy: Path, rewrite_checkpoint, capsys) -> None:
    name = "model.language_model.layers.0.mlp.gate.weight"
    rewrite_checkpoint(qwen35_copy, lambda t: t.pop(name))
    assert run_verify_export(parse("verify-export", str(qwen35_copy), "--json")) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["status"] == "broken" and data["missing"] == [name]


def test_allow_flags(qwen35_copy: Path, rewrite_checkpoint, capsys) -> None:
    import torch

    rewrite_checkpoint(qwen35_copy, lambda t: t.update({"mtp.norm.weight": torch.ones(2), "aux.x": torch.ones(1)}))
    assert run_verify_export(parse("verify-export", str(qwen35_copy))) == 1
    assert run_verify_export(parse("verify-export", str(qwen35_copy), "--allow", r"^aux\.")) == 0
    capsys.readouterr()
    args = parse("verify-export", str(qwen35_copy), "--allow", r"^aux\.", "--no-default-allow", "--json")
    assert run_verify_export(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["status"] == "lenient"
    # Without the default pattern, the model class's own ignore list excuses the MTP tensor.
    assert data["allowed"] == [
        r"aux.x (allowed: ^aux\.)",
        "mtp.norm.weight (Qwen3_5MoeForConditionalGeneration ignores it on load: ^mtp.*)",
    ]


def test_unusable_directory_exits_2(tmp_path: Path, capsys) -> None:
    assert run_verify_export(parse("verify-export", str(tmp_path / "nowhere"))) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_checkpoint_root_checks_newest_finished_export(qwen35_saved: Path, tmp_path: Path, capsys) -> None:
    root = tmp_path / "checkpoints" / "project" / "experiment"
    dirs = verl_tree(root, qwen35_saved, {5: True, 10: True, 15: False})
    assert [(e.step, e.ready) for e in find_hf_exports(tmp_path / "checkpoints")] == [
        (5, True),
        (10, True),
        (15, False),
    ]
    assert latest_hf_export(tmp_path / "checkpoints").directory == dirs[10]
    assert run_verify_export(parse("verify-export", str(tmp_path / "checkpoints"), "--json")) == 0
    assert json.loads(capsys.readouterr().out)["directory"] == str(dirs[10])


def test_watch_checks_each_new_export_once_and_writes_reports(
    qwen35_saved: Path, tmp_path: Path, rewrite_checkpoint, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "experiment"
    dirs = verl_tree(root, qwen35_saved, {2: True, 4: False})
    broken = "model.language_model.norm.weight"
    rewrite_checkpoint(dirs[4], lambda t: t.pop(broken))
    seen: list[tuple[int, str | None]] = []
    stop = threading.Event()

    def on_report(export, report) -> None:
        seen.append((export.step, report.status if report else None))
        if export.step == 2:
            # verl finishes the save of step 4 while the watcher runs.
            (dirs[4].parent.parent / "ckpt_contents.json").write_text("{}")
        if export.step == 4:
            stop.set()

    with caplog.at_level("INFO", logger="recipe.export.watch"):
        thread = threading.Thread(
            target=lambda: results.update(watch_exports(root, stop, interval_s=0.05, on_report=on_report))
        )
        results: dict = {}
        thread.start()
        thread.join(timeout=HANG_GUARD_S)
    assert not thread.is_alive()
    assert seen == [(2, "complete"), (4, "broken")]
    assert sorted(results) == [2, 4]
    written = json.loads((dirs[4].parent / REPORT_NAME).read_text())
    assert written["status"] == "broken" and written["missing"] == [broken]
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "BROKEN HF export at step 4" in errors[0].getMessage()
    assert broken in errors[0].getMessage()


def test_a_link_planted_where_the_report_goes_is_replaced_not_written_through(qwen35_saved: Path, tmp_path: Path) -> None:
    """The checkpoint tree is input too: a link at the report's name must not make the watcher write elsewhere."""
    from recipe.export.watch import check_export

    root = tmp_path / "experiment"
    verl_tree(root, qwen35_saved, {2: True})
    [export] = find_hf_exports(root)
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched")
    (export.directory.parent / REPORT_NAME).symlink_to(victim)
    assert check_export(export) is not None
    assert victim.read_text() == "untouched"
    report = export.directory.parent / REPORT_NAME
    assert not report.is_symlink() and json.loads(report.read_text())["status"] == "complete"
