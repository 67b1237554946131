"""Where the curves go on W&B (issue 54, item 1): WANDB_PROJECT and WANDB_ENTITY, wandb's own variables, win when
set, `plan` says the project, entity and run name, and verl's own tracking starts a wandb run (offline) with
exactly those."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from recipe.errors import RecipeConfigError
from recipe.launch import override_value
from recipe.plan import build_plan
from recipe.tracking import MAX_PROJECT_LENGTH, tracker_project

from .envtools import HANG_GUARD_S, REPO, settings_of


def _plan(tmp_path: Path, environ: dict[str, str], **values: object):  # type: ignore[no-untyped-def]
    return build_plan(settings_of(DEVICE="gpu", CHECKPOINT_DIR=str(tmp_path), WANDB_API_KEY="k" * 40, **values),
                      environ)  # fmt: skip


def test_wandb_project_names_the_trackers_project_and_nothing_else(tmp_path: Path) -> None:
    plan = _plan(tmp_path, {"WANDB_PROJECT": "geo3k-trials", "WANDB_ENTITY": "my-team"}, PROJECT_NAME="runs")
    assert override_value(plan.overrides, "trainer.project_name") == "geo3k-trials"
    # The checkpoint and TensorBoard folders stay PROJECT_NAME's.
    assert override_value(plan.overrides, "trainer.default_local_dir") == str(tmp_path / "runs" / "qwen3_5_35b_megatron")
    assert str(tmp_path / "tensorboard" / "runs") in str(plan.env["TENSORBOARD_DIR"])
    assert plan.wandb == {
        "project": "geo3k-trials", "project_from": "WANDB_PROJECT", "entity": "my-team",
        "run": "qwen3_5_35b_megatron",
        "text": "project geo3k-trials (WANDB_PROJECT), entity my-team (WANDB_ENTITY), run qwen3_5_35b_megatron "
                "(EXPERIMENT_NAME)",
    }  # fmt: skip
    assert f"wandb    {plan.wandb['text']}" in plan.to_text().splitlines()


def test_without_wandb_project_the_project_is_project_name_and_without_wandb_nothing_is_said(tmp_path: Path) -> None:
    plan = _plan(tmp_path, {"WANDB_PROJECT": "  "}, PROJECT_NAME="runs")
    assert override_value(plan.overrides, "trainer.project_name") == "runs"
    assert plan.wandb["text"].startswith("project runs (PROJECT_NAME), entity your W&B default (WANDB_ENTITY unset)")
    quiet = build_plan(settings_of(DEVICE="gpu", CHECKPOINT_DIR=str(tmp_path)), {"WANDB_PROJECT": "p"})
    assert quiet.wandb == {} and not any(line.startswith("wandb") for line in quiet.to_text().splitlines())


@given(st.text(max_size=MAX_PROJECT_LENGTH + 2))
@example("${oc.env:HF_TOKEN}")  # an interpolation verl would resolve into the project's name
@example("???")
@example("x" * MAX_PROJECT_LENGTH)  # the edge: W&B's longest name
@example("x" * (MAX_PROJECT_LENGTH + 1))
@example("geo3k\nnext")
def test_a_wandb_project_verl_cannot_carry_as_it_is_is_refused_naming_it(value: str) -> None:
    try:
        found = tracker_project({"WANDB_PROJECT": value})
    except RecipeConfigError as error:
        [line] = error.problems
        assert line.startswith("WANDB_PROJECT=") and (
            "${" in value or value == "???" or not value.isprintable() or len(value) > MAX_PROJECT_LENGTH)
        return
    if not value.strip():
        assert found is None
    else:
        assert found == value and "${" not in value and value.isprintable() and len(value) <= MAX_PROJECT_LENGTH


#: verl's own tracking, as the trainer starts it, with wandb offline: the run wandb starts.
TRACKED = textwrap.dedent(
    """
    import sys
    from verl.utils.tracking import Tracking
    import wandb
    tracking = Tracking(project_name=sys.argv[1], experiment_name=sys.argv[2], default_backend=["wandb"],
                        config={"trainer": {}})
    print("wandb run:", wandb.run.project, wandb.run.entity, wandb.run.name, flush=True)
    wandb.finish()
    """
)


def test_verls_wandb_run_lands_in_the_planned_project_and_entity(tmp_path: Path) -> None:
    pytest.importorskip("wandb", reason="wandb is in the test venv (verl's dependency) and the images")
    pytest.importorskip("verl.utils.tracking", reason="verl is in the test venv (tests/setup.sh)")
    environ = {"WANDB_PROJECT": "geo3k-trials", "WANDB_ENTITY": "my-team"}
    plan = _plan(tmp_path, environ)
    env = {**os.environ, **environ, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true",
           "PYTHONPATH": str(REPO)}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", TRACKED, override_value(plan.overrides, "trainer.project_name") or "",
                           override_value(plan.overrides, "trainer.experiment_name") or ""],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=HANG_GUARD_S, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "wandb run: geo3k-trials my-team qwen3_5_35b_megatron" in done.stdout.splitlines()
