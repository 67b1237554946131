"""The image's libraries read the variables recipe/env_names.json lists, and plan names a slip in one."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.mark.framework
def test_the_images_libraries_read_the_names_the_table_lists(host: Any) -> None:
    # The table is what plan's near-miss check compares a name with; a moved pin with new names fails here.
    done = host.run("python3 -m recipe.env_names check")
    assert done.rc == 0, done.stderr
    checked = int(done.stdout.split("env_names: ")[1].split()[0])
    assert checked >= 5, done.stdout  # ray, the Hugging Face libraries, wandb, vLLM and the collectives' own


def test_plan_names_the_library_variable_a_slip_meant(run_plan: Any) -> None:
    plan = run_plan({"WANDB_PROJET": "grpo"})
    assert plan.returncode == 0
    assert "WANDB_PROJET is read by no library of the images (ignored); did you mean WANDB_PROJECT, which wandb reads?" in plan.stderr
