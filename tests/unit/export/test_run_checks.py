"""`run` end to end (tests/unit/runtools): the resume guard refuses a broken export, the watcher checks each save."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from recipe.launch import override_value
from tests.unit.runtools import cli, layout_of_one, recorded, run_environment

BROKEN_PREFIX = "model.language_model.layers.1."


def _save(root: Path, export: Path, step: int) -> Path:
    """`export` laid out as verl 0.9.1 saves step `step` under root, the tracker file last."""
    actor = root / f"global_step_{step}" / "actor"
    shutil.copytree(export, actor / "model" / "huggingface")
    (actor / "ckpt_contents.json").write_text("{}")
    (root / "latest_checkpointed_iteration.txt").write_text(str(step))
    return actor.parent


def _broken(qwen35_copy: Path, rewrite_checkpoint) -> Path:  # type: ignore[no-untyped-def]
    rewrite_checkpoint(qwen35_copy, lambda t: [t.pop(k) for k in list(t) if k.startswith(BROKEN_PREFIX)])
    return qwen35_copy


def test_run_refuses_to_resume_from_a_broken_export_and_its_advice_works(
    qwen35_saved: Path, qwen35_copy: Path, rewrite_checkpoint, tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    work = tmp_path / "run"
    work.mkdir()
    root = work / "checkpoints" / "p" / "e"
    earlier = _save(root, qwen35_saved, 20)
    _save(root, _broken(qwen35_copy, rewrite_checkpoint), 40)
    env = run_environment(work, qwen35_saved, **layout_of_one())

    done = cli(["run"], env)
    assert done.returncode == 2, done.stderr
    refusal = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(refusal) == 1, done.stderr
    assert refusal[0].startswith(
        f"error: CHECKPOINT_DIR={str(work / 'checkpoints')!r}: the checkpoint resume would load (step 40) "
        "has a broken HF export ("
    )
    assert BROKEN_PREFIX in refusal[0] and "trainer.resume_from_path" in refusal[0]
    assert recorded(work) is None, "the trainer ran although resume would load a broken export"

    advised = ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={earlier}"]
    done = cli(["run", "--", *advised], env)
    assert done.returncode == 0, done.stderr
    argv = recorded(work)["argv"]  # type: ignore[index]
    assert override_value(argv, "trainer.resume_mode") == "resume_path"
    assert override_value(argv, "trainer.resume_from_path") == str(earlier)


def test_run_checks_the_export_of_each_save_and_reports_a_broken_one(
    qwen35_saved: Path, qwen35_copy: Path, rewrite_checkpoint, tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    """The stand-in trainer saves a broken export of step 3 and exits: the watcher's last sweep catches it."""
    work = tmp_path / "run"
    work.mkdir()
    env = run_environment(work, qwen35_saved, **layout_of_one()) | {
        "STAND_IN_MODE": "save",
        "STAND_IN_EXPORT": str(_broken(qwen35_copy, rewrite_checkpoint)),
    }
    done = cli(["run"], env)
    assert done.returncode == 0, done.stderr  # a broken export is loud, but the trainer's code stands
    report = work / "checkpoints" / "p" / "e" / "global_step_3" / "actor" / "model" / "hf_export_report.json"
    assert report.is_file(), done.stderr
    written = json.loads(report.read_text())
    assert written["status"] == "broken" and written["reference"] == str(qwen35_saved)
    assert any(name.startswith(BROKEN_PREFIX) for name in written["missing"])
    assert "ERROR recipe.export.watch: BROKEN HF export at step 3" in done.stderr
