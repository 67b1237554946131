"""Kill and resume: SIGKILL after step 1's save, resume_mode=auto, and the recipe's resume guard."""

from __future__ import annotations

import os
import re
import shutil
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.e2e.conftest import E2ERun
from tests.e2e.harness.metrics import step_metrics
from tests.e2e.harness.plan import RUN_OVERRIDES, recipe_settings


def test_first_run_killed_between_step_1_save_and_step_2(e2e: E2ERun) -> None:
    """The harness SIGKILLed the first run once step 1 was saved, before step 2 finished."""
    assert e2e.first.killed_by_harness, e2e.first.tail()
    assert e2e.first.returncode == -signal.SIGKILL
    assert sorted(step_metrics(e2e.first.text())) == [1]
    assert e2e.step1_after_kill, "global_step_1 was empty after the kill"
    # Step 2 never completed before the kill: its save's manifest (written last) was not there.
    assert not e2e.step2_after_kill


def test_second_run_resumed_from_step_1(e2e: E2ERun) -> None:
    """verl says it resumes from global_step_1 and trains only step 2."""
    log = e2e.second.text()
    step_1 = re.escape(str(e2e.step_dir(1)))
    assert re.search(rf"Resuming from {step_1}, setting global step to 1", log), e2e.second.tail()
    assert "Training from scratch" not in log
    assert sorted(step_metrics(log)) == [2]


def test_step_1_files_unchanged_by_the_resume(e2e: E2ERun) -> None:
    """Resuming reads step 1 and writes nothing there: every file has the same bytes."""
    assert e2e.step1_after_resume == e2e.step1_after_kill


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _resume_problem(e2e: E2ERun, checkpoint_dir: Path) -> str | None:
    """The recipe's resume guard (what `entrypoint.py run` asks before resuming) on `checkpoint_dir`."""
    from recipe.cli import resume_problem
    from recipe.plan import build_plan
    from recipe.settings import load_settings

    with _environment(recipe_settings(e2e.assets, checkpoint_dir)):
        plan = build_plan(load_settings(), os.environ, RUN_OVERRIDES)
    return resume_problem(plan)


def _copy_checkpoints(e2e: E2ERun, target: Path) -> Path:
    """The run's checkpoints under another CHECKPOINT_DIR (same project/experiment), TensorBoard logs left out."""
    shutil.copytree(e2e.root, target / e2e.root.relative_to(e2e.checkpoint_dir))
    return target


def test_resume_guard_accepts_the_run(e2e: E2ERun, tmp_path: Path) -> None:
    """The run's own checkpoints: the guard lets `run` resume (from step 2)."""
    assert _resume_problem(e2e, _copy_checkpoints(e2e, tmp_path)) is None


def test_resume_guard_refuses_a_corrupt_newest_export(e2e: E2ERun, tmp_path: Path) -> None:
    """Truncate a shard of the newest export: the guard refuses to resume from it and says why."""
    checkpoints = _copy_checkpoints(e2e, tmp_path)
    export = checkpoints / e2e.hf_export(2).relative_to(e2e.checkpoint_dir)
    shard = sorted(export.glob("*.safetensors"))[0]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    problem = _resume_problem(e2e, checkpoints)
    assert problem is not None
    assert "(step 2) has a broken HF export" in problem, problem
    assert "trainer.resume_mode=resume_path" in problem
