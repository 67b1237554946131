"""What `plan` accepts but what would fail later gets one warning line each (recipe.plan_warnings, issue 43).

wandb without a key (the logger value read by Hydra's own parser, generated), another model type than the tuned one
(config.json read by the recipe's model loader), and data prepared where TRAIN_FILES does not point; each through
build_plan into the plan's text and JSON as well.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recipe.models import QWEN3_5_MODEL_TYPE, load_architecture
from recipe.plan import build_plan
from recipe.plan_warnings import data_warning, model_type_warning, plan_warnings, wandb_warning
from recipe.smoke import shipped_model_dir

from .envtools import settings_of

WANDB_LINE = (
    "trainer.logger names wandb but WANDB_API_KEY is not set: wandb.init fails when the trainer starts; "
    "set WANDB_API_KEY (the recipe then adds wandb itself), or WANDB_MODE=offline to log to files"
)
NO_KEY = settings_of()


# --- wandb without a key ----------------------------------------------------------------------------------------------

LOGGERS = st.lists(st.sampled_from(["console", "tensorboard", "wandb", "file", "mlflow", "wandbx", "swanlab"]), max_size=4)


def _written(names: list[str], style: int) -> str:
    """A logger list as users write it in an override: quoted or not, with or without blanks."""
    if style == 0:
        return "[" + ",".join(names) + "]"
    if style == 1:
        return "[" + ", ".join(f"'{n}'" for n in names) + "]"
    return "[" + ",".join(f'"{n}"' for n in names) + "]"


@settings(max_examples=60)
@given(names=LOGGERS, style=st.integers(0, 2))
def test_wandb_in_the_logger_list_without_a_key_warns_as_hydra_reads_the_list(names: list[str], style: int) -> None:
    overrides = ["trainer.logger=['console','tensorboard']", f"trainer.logger={_written(names, style)}"]
    expected = WANDB_LINE if "wandb" in names else None
    assert wandb_warning(NO_KEY, overrides, {}) == expected


def test_one_logger_name_alone_is_read_as_hydra_reads_it() -> None:
    assert wandb_warning(NO_KEY, ["trainer.logger=wandb"], {}) == WANDB_LINE
    assert wandb_warning(NO_KEY, ["trainer.logger=wandbx"], {}) is None


@pytest.mark.parametrize(
    ("environ", "values"),
    [
        ({}, {"WANDB_API_KEY": "k" * 40}),  # a key: the recipe adds wandb itself, and wandb.init has what it needs
        ({"WANDB_MODE": "offline"}, {}),
        ({"WANDB_MODE": " Disabled "}, {}),
        ({"WANDB_MODE": "dryrun"}, {}),
    ],
)
def test_a_key_or_a_keyless_mode_is_silent(environ: dict[str, str], values: dict[str, str]) -> None:
    assert wandb_warning(settings_of(**values), ["trainer.logger=[console,wandb]"], environ) is None


def test_no_logger_override_or_an_unparsable_one_is_silent() -> None:
    assert wandb_warning(NO_KEY, [], {"WANDB_MODE": "online"}) is None
    assert wandb_warning(NO_KEY, ["trainer.logger=[wandb"], {}) is None  # Hydra refuses it elsewhere, by name


# --- another model type -----------------------------------------------------------------------------------------------


def _model_with(tmp_path: Path, model_type: object) -> Path:
    config = json.loads((shipped_model_dir() / "config.json").read_text())
    if model_type is None:
        config.pop("model_type", None)
    else:
        config["model_type"] = model_type
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_the_tuned_model_type_and_the_built_in_profile_are_silent(tmp_path: Path) -> None:
    assert load_architecture(shipped_model_dir()).model_type == QWEN3_5_MODEL_TYPE
    assert model_type_warning(load_architecture(shipped_model_dir())) is None
    assert model_type_warning(load_architecture(tmp_path / "not-downloaded")) is None


@pytest.mark.parametrize(
    ("model_type", "shown"),
    [
        ("qwen3_moe", "model_type qwen3_moe"),
        ("Qwen3_5_moe", "model_type Qwen3_5_moe"),  # transformers' names are lower case: another type
        ("qwen3_5_moe\nerror: forged", "model_type qwen3_5_moe\\nerror: forged"),  # one line, whatever the file says
        (7, "no model_type"),
        (None, "no model_type"),
    ],
)
def test_another_model_type_is_named_with_what_is_still_checked(tmp_path: Path, model_type: object, shown: str) -> None:
    line = model_type_warning(load_architecture(_model_with(tmp_path, model_type)))
    assert line == (
        f"MODEL_PATH's config.json has {shown}; the recipe's batch, lengths and memory defaults are tuned for "
        "Qwen3.5-35B-A3B (qwen3_5_moe): the layout and memory rules above still use this model's own config, its "
        "training values are yours to check"
    )


# --- data prepared elsewhere ------------------------------------------------------------------------------------------


def _prepared(data_dir: Path, name: str) -> Path:
    (data_dir / name).mkdir(parents=True)
    pq.write_table(pa.table({"x": [1]}), data_dir / name / "train.parquet")
    return data_dir / name / "train.parquet"


def test_data_prepared_where_train_files_does_not_point_is_named(tmp_path: Path) -> None:
    gsm8k = _prepared(tmp_path, "gsm8k")
    settings_ = settings_of(DATA_DIR=str(tmp_path))
    assert data_warning(settings_, []) == (
        f"TRAIN_FILES='{tmp_path}/geo3k/train.parquet' does not exist, but prepare-data wrote {gsm8k}: "
        "set TRAIN_FILES (and VAL_FILES) to the dataset to train on"
    )
    # Where TRAIN_FILES points at it (the setting, or data.train_files after `--`), nothing is said.
    assert data_warning(settings_of(DATA_DIR=str(tmp_path), TRAIN_FILES=str(gsm8k)), []) is None
    assert data_warning(settings_, [f"data.train_files='{gsm8k}'"]) is None


def test_nothing_prepared_or_no_data_dir_is_silent(tmp_path: Path) -> None:
    assert data_warning(settings_of(DATA_DIR=str(tmp_path)), []) is None
    assert data_warning(settings_of(DATA_DIR=str(tmp_path / "absent")), []) is None
    (tmp_path / "geo3k").mkdir()  # a folder without its train.parquet was not prepared
    assert data_warning(settings_of(DATA_DIR=str(tmp_path)), []) is None


# --- through the plan -------------------------------------------------------------------------------------------------


def test_the_plan_states_its_warnings_in_text_and_json(tmp_path: Path) -> None:
    _prepared(tmp_path / "data", "gsm8k")
    values = {"DATA_DIR": str(tmp_path / "data"), "CHECKPOINT_DIR": str(tmp_path / "ck")}
    plan = build_plan(settings_of(**values), {}, ["trainer.logger=[console,wandb]"])
    assert plan.warnings == plan_warnings(plan.settings, {}, plan.model, plan.overrides)
    assert len(plan.warnings) == 2 and plan.warnings[1] == WANDB_LINE
    assert plan.to_dict()["warnings"] == plan.warnings
    assert [line for line in plan.to_text().splitlines() if line.startswith("warning  ")][-2:] == [
        f"warning  {line}" for line in plan.warnings
    ]
    assert build_plan(settings_of(CHECKPOINT_DIR=str(tmp_path / "ck")), {}).warnings == []


# --- validation left on geo3k; GRPO with a group of one (issue 54) ------------------------------------------------


@pytest.mark.parametrize(
    ("values", "warns"),
    [
        ({"TRAIN_FILES": "/data/gsm8k/train.parquet"}, True),
        ({"TRAIN_FILES": "/data/gsm8k/train.parquet", "VAL_FILES": "/data/gsm8k/test.parquet"}, False),
        ({"TRAIN_FILES": "/data/geo3k/train.parquet"}, False),  # geo3k's own, written out: its test split is right
        ({}, False),
        ({"VAL_FILES": "/data/other/test.parquet"}, False),
    ],
)
def test_train_files_moved_with_val_files_left_on_geo3k_is_named(values: dict[str, str], warns: bool) -> None:
    from recipe.plan_warnings import validation_warning

    line = validation_warning(settings_of(DATA_DIR="/data", **values))
    assert (line is not None) == warns
    if warns:
        assert line == ("TRAIN_FILES='/data/gsm8k/train.parquet' is set, VAL_FILES is not: validation still runs on "
                        "'/data/geo3k/test.parquet' (geo3k's); set VAL_FILES to the same dataset's test split")


@pytest.mark.parametrize(
    ("overrides", "warns"),
    [
        (["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=1"], True),
        (["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2"], False),  # the edge: two is a group
        (["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=5"], False),
        (["algorithm.adv_estimator=gae", "actor_rollout_ref.rollout.n=1"], False),  # PPO's critic is its baseline
        (["algorithm.adv_estimator=grpo"], False),
    ],
)
def test_grpo_with_one_response_per_prompt_is_named(overrides: list[str], warns: bool) -> None:
    from recipe.plan_warnings import group_warning

    line = group_warning(overrides)
    assert (line is not None) == warns
    if warns:
        assert line is not None and line.startswith("ROLLOUT_N=1 (actor_rollout_ref.rollout.n=1): GRPO's baseline")


def test_rollout_n_1_reaches_the_plan_as_a_warning(tmp_path: Path) -> None:
    plan = build_plan(settings_of(PROFILE="smoke", DEVICE="gpu", ROLLOUT_N=1, CHECKPOINT_DIR=str(tmp_path)), {})
    assert any(line.startswith("ROLLOUT_N=1 ") for line in plan.warnings), plan.warnings


@pytest.mark.parametrize(("device", "visible", "per_node", "line"), [
    ("npu", 16, 8, "NDEVICES_PER_NODE=8: 16 NPUs are visible on this node, 8 of them stay unused; set "
                   "NDEVICES_PER_NODE=16 to train on all of them (the layout's rules then hold for 16)"),
    ("gpu", 8, 4, "NDEVICES_PER_NODE=4: 8 GPUs are visible on this node, 4 of them stay unused; set "
                  "NDEVICES_PER_NODE=8 to train on all of them (the layout's rules then hold for 8)"),
    ("npu", 16, 16, None),  # the edge: all used
    ("gpu", 0, 8, None),  # `plan` where no device is visible (a laptop, CI): nothing to say
])  # fmt: skip
def test_devices_left_unused_on_the_node_are_named(device: str, visible: int, per_node: int, line: str | None) -> None:
    from recipe.plan_warnings import unused_devices_warning

    assert unused_devices_warning(device, visible, per_node) == line


def test_the_plan_warns_of_unused_devices_from_what_it_detected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    from recipe import plan as plan_module

    detect = plan_module.detect_device
    monkeypatch.setattr(plan_module, "detect_device",
                        lambda *a, **k: dataclasses.replace(detect(*a, **k), visible_devices=16))  # fmt: skip
    plan = build_plan(settings_of(DEVICE="gpu", NDEVICES_PER_NODE=8, CHECKPOINT_DIR=str(tmp_path)), {})
    assert any(line.startswith("NDEVICES_PER_NODE=8: 16 GPUs are visible") for line in plan.warnings), plan.warnings
    # The smoke profile runs on one device by design: no warning there.
    smoke = build_plan(settings_of(PROFILE="smoke", DEVICE="gpu", CHECKPOINT_DIR=str(tmp_path)), {})
    assert not any(line.startswith("NDEVICES_PER_NODE=") for line in smoke.warnings), smoke.warnings


# --- named edges (issue 52) -------------------------------------------------------------------------------------------

GROUP_LINE = (
    "ROLLOUT_N=1 (actor_rollout_ref.rollout.n=1): GRPO's baseline is the mean reward of each prompt's group, "
    "and a group of one has none: verl then takes each raw reward as its advantage (no baseline, no "
    "normalisation); set ROLLOUT_N to 2 or more (5 by default)"
)


@pytest.mark.parametrize("n", ["1", " 1 "])
def test_a_group_of_one_is_said_word_for_word(n: str) -> None:
    from recipe.plan_warnings import group_warning

    assert group_warning(["algorithm.adv_estimator=grpo", f"actor_rollout_ref.rollout.n={n}"]) == GROUP_LINE


def test_four_prepared_datasets_name_the_first_three_in_order(tmp_path: Path) -> None:
    found = [_prepared(tmp_path, name) for name in ("math", "gsm8k", "aime", "hellaswag")]
    first_three = sorted(found)[:3]
    assert data_warning(settings_of(DATA_DIR=str(tmp_path)), []) == (
        f"TRAIN_FILES='{tmp_path}/geo3k/train.parquet' does not exist, but prepare-data wrote "
        f"{first_three[0]}, {first_three[1]}, {first_three[2]}: set TRAIN_FILES (and VAL_FILES) to the dataset to train on"
    )


def test_without_hydra_a_logger_value_is_read_as_the_one_name_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """`plan` on a laptop without verl: the recipe's own logger value is taken as written, never lost."""
    from recipe import plan_warnings as module

    monkeypatch.setattr(module, "hydra_override_parser", lambda: None)
    assert module.logger_names("wandb") == ["wandb"]
    assert module.logger_names("[console,tensorboard]") == ["[console,tensorboard]"]
    assert wandb_warning(NO_KEY, ["trainer.logger=wandb"], {}) == WANDB_LINE


@pytest.mark.parametrize("mode", ["offline", " Offline ", "DISABLED", "dryrun"])
def test_each_keyless_wandb_mode_in_any_case_is_silent(mode: str) -> None:
    assert wandb_warning(NO_KEY, ["trainer.logger=wandb"], {"WANDB_MODE": mode}) is None


@pytest.mark.parametrize("mode", ["", "   ", "online", "run"])
def test_an_empty_blank_or_online_wandb_mode_still_warns(mode: str) -> None:
    assert wandb_warning(NO_KEY, ["trainer.logger=wandb"], {"WANDB_MODE": mode}) == WANDB_LINE
