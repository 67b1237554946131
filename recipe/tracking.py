"""Where the run's curves go on Weights & Biases: the project, entity and run name verl's wandb.init will use.

verl 0.9.1 (verl/utils/tracking.py) calls `wandb.init(project=trainer.project_name,
name=trainer.experiment_name, entity=os.environ["WANDB_ENTITY"] or None)`: an explicit project, which
wandb's own WANDB_PROJECT can no longer change. So the recipe plans `trainer.project_name` from
WANDB_PROJECT when it is set, else from PROJECT_NAME; trainer.project_name names nothing else the
recipe runs (the checkpoint and TensorBoard folders are set from PROJECT_NAME explicitly). The run
is named EXPERIMENT_NAME; the entity is WANDB_ENTITY, read by verl itself, or wandb's default.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from recipe.errors import RecipeConfigError
from recipe.export.report import printable
from recipe.hydra_text import literal_problem
from recipe.launch import override_value
from recipe.plan_warnings import wandb_logged

#: W&B's longest project name.
MAX_PROJECT_LENGTH = 128


def tracker_project(environ: Mapping[str, str]) -> str | None:
    """WANDB_PROJECT when set (the trackers' project then), None otherwise; RecipeConfigError (exit 2) when verl's
    config could not carry it as it is."""
    value = environ.get("WANDB_PROJECT", "")
    if not value.strip():
        return None
    problem = literal_problem(value)
    if problem is None and (not value.isprintable() or len(value) > MAX_PROJECT_LENGTH):
        problem = f"must be printable text of at most {MAX_PROJECT_LENGTH} characters (W&B's project names)"
    if problem:
        raise RecipeConfigError([f"WANDB_PROJECT={printable(value[:80])!r}: {problem}"])
    return value


def wandb_names(overrides: Sequence[str], environ: Mapping[str, str]) -> dict[str, Any]:
    """The W&B project, entity and run name of the planned trainer, with where each comes from; {} when wandb is
    not among trainer.logger's loggers."""
    if not wandb_logged(overrides):
        return {}
    project, run = override_value(overrides, "trainer.project_name"), override_value(overrides, "trainer.experiment_name")
    source = "WANDB_PROJECT" if tracker_project(environ) else "PROJECT_NAME"
    entity = environ.get("WANDB_ENTITY", "").strip() or None
    return {
        "project": project,
        "project_from": source,
        "entity": entity,
        "run": run,
        "text": f"project {project} ({source}), entity "
                f"{entity + ' (WANDB_ENTITY)' if entity else 'your W&B default (WANDB_ENTITY unset)'}, run {run} "
                "(EXPERIMENT_NAME)",
    }  # fmt: skip
