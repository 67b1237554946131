"""What `plan` accepts but what would fail or mislead later: one warning line each, never a refusal.

Each is a mistake that costs a model load or a wasted run when found at run time:

- wandb in `trainer.logger` with no WANDB_API_KEY: verl's tracking calls wandb.init at the trainer's
  start, which fails without a key (or a login) unless WANDB_MODE keeps it offline;
- a model of another type than the recipe's values were tuned for (Qwen3.5-35B-A3B): the layout
  and memory rules still read that model's own config.json, the tuned batch and lengths do not fit it;
- data prepared where TRAIN_FILES does not point: `prepare-data gsm8k` writes DATA_DIR/gsm8k while
  TRAIN_FILES keeps its geo3k default, so the run would find no file, or the wrong one;
- TRAIN_FILES moved to another dataset with VAL_FILES left on geo3k's default: validation scores another task;
- one response per prompt (ROLLOUT_N=1) under GRPO: a group of one has no baseline;
- fewer devices per node in the layout than the node shows (NDEVICES_PER_NODE=8 on a 16-NPU Atlas A3);
- verl's routing replay let through by ALLOW_UPSTREAM_ISSUE: no test of the recipe proves it (docs/health.md).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from recipe.export.report import printable
from recipe.launch import override_value, planned_training_file
from recipe.models import QWEN3_5_MODEL_TYPE, ModelSource
from recipe.routing_replay import UNPROVEN, routing_replay_on
from recipe.settings import Settings
from recipe.user_overrides import hydra_override_parser

#: WANDB_MODE values in which wandb.init needs no key (wandb's own modes that never reach its server).
WANDB_KEYLESS_MODES = frozenset({"offline", "disabled", "dryrun"})
#: The file `prepare-data NAME` writes under DATA_DIR/NAME.
PREPARED_TRAIN_FILE = "train.parquet"


def logger_names(value: str) -> list[str]:
    """`trainer.logger`'s value as Hydra parses it: a list of names, or the one name."""
    parser = hydra_override_parser()
    parsed: Any = value
    if parser is not None:
        try:
            parsed = parser.parse_override(f"trainer.logger={value}").value()
        except Exception:  # noqa: BLE001 - check_user_overrides refuses what Hydra cannot parse; here: no warning
            return []
    return [str(item) for item in parsed] if isinstance(parsed, list) else [str(parsed)]


def wandb_logged(overrides: Sequence[str]) -> bool:
    """Whether wandb is among the planned trainer.logger's loggers."""
    value = override_value(overrides, "trainer.logger")
    # Hydra parses the list only where wandb may be in it: `plan` imports no Hydra for the recipe's own loggers.
    return value is not None and "wandb" in value and "wandb" in logger_names(value)


def wandb_warning(settings: Settings, overrides: Sequence[str], environ: Mapping[str, str]) -> str | None:
    """wandb logging asked for with no key to log with (None when there is one, or no wandb)."""
    if settings.wandb_api_key is not None or environ.get("WANDB_MODE", "").strip().lower() in WANDB_KEYLESS_MODES:
        return None
    if not wandb_logged(overrides):
        return None
    return (
        "trainer.logger names wandb but WANDB_API_KEY is not set: wandb.init fails when the trainer starts; "
        "set WANDB_API_KEY (the recipe then adds wandb itself), or WANDB_MODE=offline to log to files"
    )


def model_type_warning(model: ModelSource) -> str | None:
    """A config.json of another model type than the recipe's tuned one (None for that one, and the built-in profile)."""
    if model.model_type == QWEN3_5_MODEL_TYPE:
        return None
    shown = f"model_type {printable(model.model_type)}" if model.model_type is not None else "no model_type"
    return (
        f"MODEL_PATH's config.json has {shown}; the recipe's batch, lengths and memory defaults are tuned "
        f"for Qwen3.5-35B-A3B ({QWEN3_5_MODEL_TYPE}): the layout and memory rules above still use this model's own "
        "config, its training values are yours to check"
    )


def data_warning(settings: Settings, overrides: Sequence[str]) -> str | None:
    """TRAIN_FILES names no file while `prepare-data` wrote another dataset under DATA_DIR (None otherwise)."""
    train_files = planned_training_file(settings, overrides)
    if os.path.lexists(train_files):
        return None
    try:
        prepared = sorted(
            child / PREPARED_TRAIN_FILE for child in settings.data_dir.iterdir() if (child / PREPARED_TRAIN_FILE).is_file()
        )
    except OSError:  # no DATA_DIR (yet), or unreadable: nothing was prepared there that plan can name
        return None
    if not prepared:
        return None
    found = ", ".join(printable(str(path)) for path in prepared[:3])
    return (
        f"TRAIN_FILES={printable(str(train_files))!r} does not exist, but prepare-data wrote {found}: "
        "set TRAIN_FILES (and VAL_FILES) to the dataset to train on"
    )


def group_warning(overrides: Sequence[str]) -> str | None:
    """GRPO with one response per prompt: no group to take a baseline from (None with two or more, or no GRPO)."""
    if override_value(overrides, "algorithm.adv_estimator") != "grpo":
        return None
    value = override_value(overrides, "actor_rollout_ref.rollout.n")
    if value is None or value.strip() != "1":
        return None
    # verl 0.9.1's compute_grpo_outcome_advantage: a group of one gets mean 0 and std 1, so its reward is its advantage.
    return (
        "ROLLOUT_N=1 (actor_rollout_ref.rollout.n=1): GRPO's baseline is the mean reward of each prompt's group, "
        "and a group of one has none: verl then takes each raw reward as its advantage (no baseline, no "
        "normalisation); set ROLLOUT_N to 2 or more (5 by default)"
    )


def validation_warning(settings: Settings) -> str | None:
    """TRAIN_FILES moved to another dataset while VAL_FILES kept geo3k's default (None otherwise)."""
    default = Settings.model_construct(data_dir=settings.data_dir)
    if settings.train_files is None or settings.val_files is not None:
        return None
    if settings.resolved_train_files == default.resolved_train_files:
        return None
    return (
        f"TRAIN_FILES={printable(str(settings.train_files))!r} is set, VAL_FILES is not: validation still runs on "
        f"{printable(str(settings.resolved_val_files))!r} (geo3k's); set VAL_FILES to the same dataset's test split"
    )


def unused_devices_warning(device: str, visible: int, per_node: int) -> str | None:
    """More devices visible on this node than the layout uses (None otherwise, and where none are visible)."""
    if visible <= per_node:
        return None
    kind = "NPUs" if device == "npu" else "GPUs"
    return (f"NDEVICES_PER_NODE={per_node}: {visible} {kind} are visible on this node, {visible - per_node} of them stay "
            f"unused; set NDEVICES_PER_NODE={visible} to train on all of them (the layout's rules then hold for "
            f"{visible})")  # fmt: skip


def routing_replay_warning(overrides: Sequence[str]) -> str | None:
    """verl's routing replay turned on, which `plan` lets through only with ALLOW_UPSTREAM_ISSUE (recipe.routing_replay):
    still unproven, said once more (None while both its keys are off, as the recipe leaves them)."""
    on = routing_replay_on(overrides)
    return f"{', '.join(on)}: {UNPROVEN}; docs/health.md, Routing replay" if on else None


def plan_warnings(settings: Settings, environ: Mapping[str, str], model: ModelSource, overrides: Sequence[str],
                  devices: tuple[str, int, int] = ("gpu", 0, 0)) -> list[str]:  # fmt: skip
    """Every warning above that applies, in the order the plan's lines come. `devices`: the target, the devices
    visible on this node and the layout's per node."""
    found = [model_type_warning(model), unused_devices_warning(*devices), data_warning(settings, overrides),
             validation_warning(settings), group_warning(overrides), wandb_warning(settings, overrides, environ),
             routing_replay_warning(overrides)]  # fmt: skip
    return [line for line in found if line is not None]
