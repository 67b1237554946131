"""docs/settings.md's tables against the plan: the docs are the independent source of which verl keys each setting decides.

For each setting: changing it changes exactly the keys of its row in `plan --json`'s overrides
(Plan.to_dict, which `plan --json` prints), on gpu and on npu, and an override of each key it
decides is refused with a message naming it. The keys that differ by target hold the table's
values on each target, and only there.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from recipe.errors import RecipeConfigError
from recipe.plan import build_plan
from recipe.settings import Settings
from tests.unit.envtools import settings_of

DOC = Path(__file__).resolve().parents[2] / "docs" / "settings.md"
ENV_PREFIX = "ray_kwargs.ray_init.runtime_env.env_vars."
DEVICES = ("gpu", "npu")
#: A layout that fits both targets and leaves room to change each of its numbers.
BASE = {"NDEVICES_PER_NODE": 16, "TP": 2, "PP": 1, "CP": 1, "EP": 8, "ETP": 1, "GEN_TP": 8}
MULTI_NODE = {"NNODES": 2, "MASTER_ADDR": "head", "RAY_AUTH_MODE": "disabled"}
#: For each setting: another valid value, and the settings it needs beside it (in the base and the change alike;
#: the setting's own value there, if any, is its value before the change).
CHANGES: dict[str, tuple[object, dict[str, object]]] = {
    "NNODES": (2, {"MASTER_ADDR": "head", "RAY_AUTH_MODE": "disabled"}),
    "NDEVICES_PER_NODE": (8, {}),
    "TP": (1, {}),
    "PP": (2, {}),
    "CP": (2, {}),
    "EP": (4, {}),
    "ETP": (2, {}),
    "GEN_TP": (16, {}),
    "MODEL_PATH": ("/models/another-copy", {}),
    "TRAIN_FILES": ("/elsewhere/train.parquet", {}),
    "VAL_FILES": ("/elsewhere/test.parquet", {}),
    "DATA_DIR": ("/elsewhere", {}),
    "CHECKPOINT_DIR": ("/elsewhere/checkpoints", {}),
    "PROJECT_NAME": ("another_project", {}),
    "EXPERIMENT_NAME": ("another_experiment", {}),
    "SAVE_FREQ": (7, {}),
    "TEST_FREQ": (3, {}),
    "TOTAL_EPOCHS": (3, {}),
    "TRAIN_BATCH_SIZE": (64, {}),
    "ROLLOUT_N": (8, {}),
    # Without offload the trainer's weights stay while vLLM is awake: an H200's 141 GiB holds both (recipe.memory_fit).
    "OFFLOAD": (False, {"DEVICE_MEMORY_GIB": 141}),
    "DEVICE_MEMORY_GIB": (141, {}),
    # Read by `run`'s report only: no key moves.
    "PEAK_TFLOPS": (312, {}),
    "EXPORT_STRICT": (True, {}),
    "SEED": (7, {}),
    "ROLLOUT_CORRECTION": ("off", {}),
    "HEALTH_THRESHOLDS": ("mismatch_kl=0.005", {}),
    "EXPANDABLE_SEGMENTS": (False, {}),
    "WANDB_API_KEY": ("wandb_key_for_the_table_test", {}),
    "RAY_ADDRESS": ("10.0.0.9:6379", {}),
    "HF_TOKEN": ("hf_token_for_the_table_test", {}),
    "RAY_AUTH_TOKEN": ("another_ray_token", MULTI_NODE | {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "a_ray_token"}),
    "RAY_AUTH_MODE": ("disabled", MULTI_NODE | {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "a_ray_token"}),
    "NODE_RANK": (1, MULTI_NODE),
    "MASTER_ADDR": ("another-head", MULTI_NODE),
    "RAY_PORT": (6380, {}),
    "RAY_WAIT_TIMEOUT": (60, {}),
    "RAY_START_ARGS": ("--node-ip-address=10.0.0.5", {}),
    "ALLOW_DRIFT": ("TP", {}),
    "ALLOW_UPSTREAM_ISSUE": ("vllm-ascend#10014", {}),
    "PROGRESS": ("off", {}),  # what `run` prints, not what verl runs
    # With every size set, the chip's defaults have nothing left to fill: no key moves.
    "CANN_CHIP": ("910b", {}),
    # The user's own keys, never the recipe's: exactly the key it names moves (OVERRIDES_CHANGES).
    "OVERRIDES": ("actor_rollout_ref.actor.optim.lr=3e-6", {}),
}
#: The keys a setting changes that are the user's choice rather than a row of the docs' tables.
OVERRIDES_CHANGES = {"OVERRIDES": {"actor_rollout_ref.actor.optim.lr"}}
_KEY = re.compile(r"`([^`]+)`(?:\s*\((gpu|npu)\))?")


def _key(text: str) -> str:
    return ENV_PREFIX + text.removeprefix("env:") if text.startswith("env:") else text


def _section(heading: str) -> list[list[str]]:
    """The cells of each body row of the first table under `## heading`."""
    text = DOC.read_text()
    part = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in part.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:]]


def _keys(cell: str, device: str) -> set[str]:
    """The keys a cell names for this device (a key marked for the other target left out)."""
    return {_key(name) for name, only in _KEY.findall(cell) if only in ("", device) and ("." in name or name.startswith("env:"))}


DECIDING = {row[0].strip("`"): row for row in _section("Settings that decide keys")}
NO_KEY = {row[0].strip("`") for row in _section("Settings that decide no key")}
BY_TARGET = {_key(row[0].strip("`")): dict(zip(DEVICES, (row[1].strip("`"), row[2].strip("`")))) for row in _section("Keys that differ by target")}


def _overrides(device: str, values: dict[str, object]) -> dict[str, str]:
    document = build_plan(settings_of(DEVICE=device, **BASE | values), environ={}).to_dict()
    return {text.split("=", 1)[0].lstrip("+~"): text.split("=", 1)[1] for text in document["overrides"]}


def _changed(device: str, setting: str) -> set[str]:
    value, companions = CHANGES[setting]
    before, after = _overrides(device, dict(companions)), _overrides(device, {**companions, setting: value})
    return {key for key in before.keys() | after.keys() if before.get(key) != after.get(key)}


def test_the_docs_name_every_setting_once() -> None:
    settings = {name.upper() for name in Settings.model_fields} - {"PROFILE"}
    assert DECIDING.keys() | NO_KEY == settings and not DECIDING.keys() & NO_KEY
    assert set(CHANGES) | {"DEVICE"} == settings


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("setting", sorted(DECIDING.keys() | NO_KEY))
def test_changing_a_setting_changes_exactly_the_keys_its_row_names(setting: str, device: str) -> None:
    if setting == "DEVICE":
        other = "npu" if device == "gpu" else "gpu"
        before, after = _overrides(device, {}), _overrides(other, {})
        changed = {key for key in before.keys() | after.keys() if before.get(key) != after.get(key)}
        expected = _keys(DECIDING["DEVICE"][1], device) | set(BY_TARGET)
    else:
        changed = _changed(device, setting)
        row = DECIDING.get(setting, ["", "", ""])
        expected = _keys(row[1], device) | _keys(row[2], device) | OVERRIDES_CHANGES.get(setting, set())
    assert changed == expected


@pytest.mark.parametrize("device", DEVICES)
def test_the_keys_that_differ_by_target_hold_the_tables_values(device: str) -> None:
    overrides = _overrides(device, {})
    for key, values in BY_TARGET.items():
        assert overrides.get(key) == (values[device] or None), key


@pytest.mark.parametrize("device", DEVICES)
def test_an_override_of_each_decided_key_is_refused_naming_its_setting(device: str) -> None:
    decided = {key: setting for setting, row in DECIDING.items() for key in _keys(row[1], device)}
    with pytest.raises(RecipeConfigError) as caught:
        build_plan(settings_of(DEVICE=device, **BASE), environ={}, extra_overrides=[f"{key}=1" for key in decided])
    problems: list[Any] = caught.value.problems
    for key, setting in decided.items():
        mine = [p for p in problems if f"override '{key}=1': {key} is decided by " in p]
        assert len(mine) == 1 and setting in mine[0].split(" is decided by ", 1)[1], (key, setting, mine)
