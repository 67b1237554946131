"""`run` refuses to resume from a checkpoint whose HF export (the weights verl reloads) is broken."""

from __future__ import annotations

import shutil
from pathlib import Path

from recipe.run.resume_guard import resume_problem
from recipe.plan import build_plan
from recipe.settings import Settings


def _checkpoint(root: Path, export: Path, step: int) -> None:
    """Lay out `export` as verl 0.9.1 saves step `step` under root (tracker file last)."""
    actor = root / f"global_step_{step}" / "actor"
    shutil.copytree(export, actor / "model" / "huggingface")
    (actor / "ckpt_contents.json").write_text("{}")
    (root / "latest_checkpointed_iteration.txt").write_text(str(step))


def _plan(checkpoints: Path, *extra: str):  # type: ignore[no-untyped-def]
    settings = Settings.model_validate({"device": "gpu", "checkpoint_dir": checkpoints, "project_name": "p", "experiment_name": "e"})
    return build_plan(settings, {}, extra)


def test_a_complete_export_resumes(qwen35_copy: Path, tmp_path: Path) -> None:
    _checkpoint(tmp_path / "p" / "e", qwen35_copy, 20)
    assert resume_problem(_plan(tmp_path)) is None


def test_no_checkpoint_yet_is_fine(tmp_path: Path) -> None:
    assert resume_problem(_plan(tmp_path)) is None


def test_a_broken_export_blocks_resume_and_names_the_step(
    qwen35_copy: Path, tmp_path: Path, rewrite_checkpoint, tensors_of  # type: ignore[no-untyped-def]
) -> None:
    layer = next(name for name in tensors_of(qwen35_copy) if ".layers.1." in name)
    prefix = layer.split(".layers.1.")[0] + ".layers.1."
    rewrite_checkpoint(qwen35_copy, lambda tensors: [tensors.pop(k) for k in list(tensors) if k.startswith(prefix)])
    _checkpoint(tmp_path / "p" / "e", qwen35_copy, 40)
    problem = resume_problem(_plan(tmp_path))
    assert problem is not None
    assert problem.startswith(f"CHECKPOINT_DIR={str(tmp_path)!r}: the checkpoint resume would load (step 40) has a broken HF export")
    assert prefix in problem and "trainer.resume_from_path" in problem


def test_an_explicit_resume_choice_is_not_blocked(
    qwen35_copy: Path, tmp_path: Path, rewrite_checkpoint, tensors_of  # type: ignore[no-untyped-def]
) -> None:
    """What the refusal tells the user to do must then work."""
    norm = next(name for name in tensors_of(qwen35_copy) if name.endswith("norm.weight"))
    rewrite_checkpoint(qwen35_copy, lambda tensors: tensors.pop(norm))
    _checkpoint(tmp_path / "p" / "e", qwen35_copy, 40)
    assert resume_problem(_plan(tmp_path)) is not None
    chosen = _plan(tmp_path, "trainer.resume_mode=resume_path", f"trainer.resume_from_path={tmp_path}/p/e/global_step_20")
    assert resume_problem(chosen) is None
