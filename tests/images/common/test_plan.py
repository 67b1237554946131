"""`plan --json`, run by the image's own entrypoint, reflects the environment it is given.

The expected layouts are the upstream reference launch's defaults (DESIGN.md):
gpu TP2 PP1 CP1 EP8 ETP1 GEN_TP8 on 8 devices; npu TP2 PP2 CP1 EP8 ETP1 GEN_TP8 on 16.
"""

from __future__ import annotations

from typing import Any

import pytest

from conftest import Image

DEFAULTS = {
    "gpu": {"tp": 2, "pp": 1, "cp": 1, "ep": 8, "etp": 1, "gen_tp": 8, "ndevices_per_node": 8},
    "npu": {"tp": 2, "pp": 2, "cp": 1, "ep": 8, "etp": 1, "gen_tp": 8, "ndevices_per_node": 16},
}
FAKE_TOKEN = "hf_imagetestNotARealTokenButLongEnough0123"


def _layout_subset(plan: dict[str, Any], keys: dict[str, int]) -> dict[str, int]:
    return {key: plan["layout"][key] for key in keys}


def test_image_default_device_is_its_own(image: Image, run_plan: Any) -> None:
    assert run_plan({}).json()["device"]["name"] == image.device


def test_image_default_layout_is_upstreams(image: Image, run_plan: Any) -> None:
    expected = DEFAULTS[str(image.device)]
    assert _layout_subset(run_plan({}).json(), expected) == expected


@pytest.mark.parametrize("device", ["gpu", "npu"])
def test_device_setting_selects_that_devices_defaults(run_plan: Any, device: str) -> None:
    expected = DEFAULTS[device]
    assert _layout_subset(run_plan({"DEVICE": device}).json(), expected) == expected


@pytest.mark.parametrize(
    ("environment", "expected"),
    [
        ({"DEVICE": "gpu", "TP": "4", "PP": "2", "EP": "4"}, {"tp": 4, "pp": 2, "ep": 4}),
        (
            {"DEVICE": "npu", "TP": "4", "PP": "2", "EP": "4", "GEN_TP": "2"},
            {"tp": 4, "pp": 2, "ep": 4, "gen_tp": 2},
        ),
        (
            {"DEVICE": "gpu", "NNODES": "2", "MASTER_ADDR": "head-node", "EP": "16", "RAY_AUTH_MODE": "disabled"},
            {"nnodes": 2, "ep": 16, "world_size": 16},
        ),
    ],
    ids=["gpu-tp4-pp2-ep4", "npu-tp4-pp2-ep4-gen_tp2", "gpu-2-nodes-ep16"],
)
def test_parallel_overrides_reach_the_layout(
    run_plan: Any, environment: dict[str, str], expected: dict[str, int]
) -> None:
    assert _layout_subset(run_plan(environment).json(), expected) == expected


def test_overridden_values_are_attributed_to_the_setting(run_plan: Any) -> None:
    sources = run_plan({"DEVICE": "gpu", "TP": "4"}).json()["layout"]["sources"]
    assert "default" not in sources["TP"]


def test_paths_reach_the_settings(run_plan: Any) -> None:
    environment = {"DEVICE": "gpu", "MODEL_PATH": "/models/other", "CHECKPOINT_DIR": "/checkpoints/run7"}
    settings = run_plan(environment).json()["settings"]
    assert (settings["MODEL_PATH"], settings["CHECKPOINT_DIR"]) == ("/models/other", "/checkpoints/run7")


def test_data_dir_moves_the_default_data_files(run_plan: Any) -> None:
    settings = run_plan({"DEVICE": "npu", "DATA_DIR": "/data2"}).json()["settings"]
    assert settings["TRAIN_FILES"] == "/data2/geo3k/train.parquet"


def test_checkpoint_dir_reaches_the_trainer_argv(run_plan: Any) -> None:
    plan = run_plan({"DEVICE": "gpu", "CHECKPOINT_DIR": "/checkpoints/run7"}).json()
    assert any("/checkpoints/run7" in arg for arg in plan["argv"])


def test_recipe_version_in_plan_is_the_repo_version(run_plan: Any, expected_version: str) -> None:
    assert run_plan({}).json()["recipe_version"] == expected_version


def test_secret_is_redacted_in_settings(run_plan: Any) -> None:
    settings = run_plan({"DEVICE": "gpu", "HF_TOKEN": FAKE_TOKEN}).json()["settings"]
    assert settings["HF_TOKEN"] == "**********"


def test_secret_value_appears_nowhere_in_the_plan(run_plan: Any) -> None:
    plan = run_plan({"DEVICE": "gpu", "HF_TOKEN": FAKE_TOKEN, "WANDB_API_KEY": FAKE_TOKEN[::-1]})
    assert FAKE_TOKEN not in plan.stdout and FAKE_TOKEN[::-1] not in plan.stdout


def test_invalid_layout_exits_2(run_plan: Any) -> None:
    assert run_plan({"DEVICE": "gpu", "EP": "6"}).returncode == 2


def test_invalid_layout_names_the_variable_on_stderr(run_plan: Any) -> None:
    assert "EP=6" in run_plan({"DEVICE": "gpu", "EP": "6"}).stderr
