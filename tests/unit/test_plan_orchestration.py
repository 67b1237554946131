"""recipe.plan by direct calls: the stages it chains, what `plan` and `plan --json` print, and the drift guard.

Settings are built in-process (envtools.settings_of), never from os.environ; the smoke profile's shipped model
config stands in for a model. Composing verl's config (recipe.verl_config) is replaced where only its wiring is
under test: its own tests compose. The expected lines are written from the documented output, not from the code.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from recipe import __version__
from recipe import plan as plan_module
from recipe.checkpoint_tracker import TRACKER_NAME
from recipe.errors import RecipeConfigError
from recipe.launch import Override
from recipe.plan import build_plan, grouped_overrides
from recipe.record_file import RECORD_NAME, record_bytes, write_record
from recipe.settings import Settings
from recipe.smoke import shipped_model_dir
from recipe.verl_config import VerlConfigCheck

from .export.conftest import finished_step
from .envtools import settings_of

COMMAND_NOTE = "with these overrides (one argv item each; the exact command line: plan --json, or run's Executing: line)"


def smoke(tmp_path: Path, **values: object) -> Settings:
    """The smoke profile on one device, its checkpoints under tmp_path."""
    return settings_of(PROFILE="smoke", CHECKPOINT_DIR=str(tmp_path / "ck"), **values)


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """A model directory holding the smoke model's config.json (no weights: `plan` reads only the config)."""
    directory = tmp_path / "model"
    directory.mkdir()
    shutil.copy(shipped_model_dir() / "config.json", directory / "config.json")
    return directory


def full(tmp_path: Path, model: Path, **values: object) -> Settings:
    """A full (not smoke) run of that model on one GPU: trainer.resume_mode=auto, so the drift guard applies."""
    one = {"TP": 1, "GEN_TP": 1, "EP": 1, "NDEVICES_PER_NODE": 1}
    return settings_of(DEVICE="gpu", MODEL_PATH=str(model), CHECKPOINT_DIR=str(tmp_path / "ck"), **(one | values))


# --- the plan's stages -------------------------------------------------------------------------------------------------


def test_a_plan_chains_device_model_layout_allocator_and_the_trainers_argv(tmp_path: Path) -> None:
    plan = build_plan(smoke(tmp_path, DEVICE="gpu"), {})
    assert (plan.device.name, plan.chip) == ("gpu", None)
    assert plan.model.architecture is not None
    assert (plan.layout.tp, plan.layout.world_size) == (1, 1)
    assert plan.allocator.variable == "PYTORCH_CUDA_ALLOC_CONF"
    assert plan.env["PYTORCH_CUDA_ALLOC_CONF"] is None  # expandable segments stay out of the allocator variable
    assert plan.argv == [sys.executable, "-m", "recipe.trainer_main", *plan.overrides]
    assert plan.memory is not None and plan.memory_skipped is None
    assert plan.drift_accepted == []
    assert plan.provenance["layout"] == {
        "tp": 1, "pp": 1, "cp": 1, "ep": 1, "etp": 1, "gen_tp": 1, "nnodes": 1, "ndevices_per_node": 1, "world_size": 1, "dp": 1,
    }  # fmt: skip
    assert plan.provenance["extra_overrides"] == []


def test_the_smoke_profiles_overrides_replace_the_recipes_and_name_its_reward_function(tmp_path: Path) -> None:
    plan = build_plan(smoke(tmp_path), {})
    keys = [text.split("=", 1)[0].lstrip("+") for text in plan.overrides]
    assert len(keys) == len(set(keys))  # replaced, never given twice
    assert "trainer.resume_mode=disable" in plan.overrides and "trainer.total_training_steps=3" in plan.overrides
    reward = str(Path(plan_module.__file__).parent / "smoke" / "reward.py")
    assert plan.provenance["referenced_files"]["reward.custom_reward_function.path"]["path"] == reward


def test_the_smoke_profile_reads_its_shipped_model_when_the_model_path_has_none(tmp_path: Path) -> None:
    plan = build_plan(smoke(tmp_path, MODEL_PATH=str(tmp_path / "empty")), {})
    assert plan.model.source == str(shipped_model_dir() / "config.json")


def test_the_smoke_profile_reads_the_model_path_when_it_holds_a_config(tmp_path: Path, model: Path) -> None:
    assert build_plan(smoke(tmp_path, MODEL_PATH=str(model)), {}).model.source == str(model / "config.json")


def test_a_full_run_before_the_model_is_downloaded_plans_for_the_built_in_profile(tmp_path: Path) -> None:
    plan = build_plan(full(tmp_path, tmp_path / "absent", DEVICE_MEMORY_GIB=4096), {})
    assert plan.model.source == f"built-in profile Qwen3.5-35B-A3B ({tmp_path / 'absent' / 'config.json'} not found)"


@pytest.mark.parametrize(
    ("node", "environ", "device", "reason"),
    [
        ("davinci0", {}, "npu", "1 Ascend device node(s) /dev/davinciN found"),
        (None, {"NVIDIA_VISIBLE_DEVICES": "all"}, "gpu", "no accelerator found; NVIDIA_VISIBLE_DEVICES is set (CUDA image)"),
    ],
)
def test_device_auto_looks_at_the_root_and_environment_given(
    node: str | None, environ: dict[str, str], device: str, reason: str, tmp_path: Path
) -> None:
    (tmp_path / "root" / "dev").mkdir(parents=True)
    if node:
        (tmp_path / "root" / "dev" / node).write_text("")
    plan = build_plan(smoke(tmp_path), environ, root=tmp_path / "root")
    assert (plan.device.name, plan.device.source, plan.device.reason) == (device, "auto", reason)


def test_every_stages_problem_is_reported_at_once(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    settings = settings_of(DEVICE="gpu", MODEL_PATH=str(tmp_path), EXPANDABLE_SEGMENTS="false")
    with pytest.raises(RecipeConfigError) as caught:
        build_plan(settings, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    problems = caught.value.problems
    assert len(problems) == 2
    assert str(tmp_path) in problems[0]  # the model: its config.json is no JSON
    assert problems[1] == (
        "PYTORCH_CUDA_ALLOC_CONF='expandable_segments:True': contradicts EXPANDABLE_SEGMENTS=false; set only one of them"
    )


def test_a_workers_variable_verl_would_read_as_an_interpolation_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RecipeConfigError) as caught:
        build_plan(smoke(tmp_path, DEVICE="gpu"), {"VLLM_USE_V1": "${oc.env:HOME}"})
    [line] = caught.value.problems
    assert line.startswith("VLLM_USE_V1='${oc.env:HOME}': ")


def test_a_layout_that_does_not_fit_the_devices_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RecipeConfigError) as caught:
        build_plan(smoke(tmp_path, TP=2), {})
    assert caught.value.problems and all("TP" in line for line in caught.value.problems[:1])


@pytest.mark.parametrize(
    ("labels", "chip", "reason"),
    [
        (None, "a3", "not in an image: the Dockerfile's default CANN_CHIP=a3; for an Atlas A2, 910B node set CANN_CHIP=910b"),
        ("io.grpo-recipe.cann.chip=910b\n", "910b", "the image's label io.grpo-recipe.cann.chip=910b"),
    ],
)
def test_on_npu_the_plan_names_the_chip_it_assumed_and_why(labels: str | None, chip: str, reason: str, tmp_path: Path) -> None:
    if labels is not None:
        (tmp_path / "labels.d").mkdir()
        (tmp_path / "labels.d" / "image.labels").write_text(labels)
    plan = build_plan(smoke(tmp_path, DEVICE="npu"), {"RECIPE_IMAGE_INFO_DIR": str(tmp_path)})
    assert plan.chip == {"name": chip, "reason": reason}
    assert plan.memory is not None and plan.memory.device_gib == 64  # both chips' NPUs hold 64 GiB, not a GPU's 80
    assert plan.to_dict()["chip"] == plan.chip
    assert plan.to_text().splitlines()[1] == f"chip     {chip} ({reason})"


def test_on_npu_the_layout_fills_the_assumed_chips_node(tmp_path: Path, model: Path) -> None:
    """An Atlas A2 (910B) node has 8 NPUs, an A3 node 16: the chip the image names sizes the default node."""
    (tmp_path / "labels.d").mkdir()
    (tmp_path / "labels.d" / "image.labels").write_text("io.grpo-recipe.cann.chip=910b\n")
    settings = settings_of(DEVICE="npu", MODEL_PATH=str(model), CHECKPOINT_DIR=str(tmp_path / "ck"), TP=1, GEN_TP=1, EP=1)
    plan = build_plan(settings, {"RECIPE_IMAGE_INFO_DIR": str(tmp_path)})
    assert (plan.layout.ndevices_per_node, plan.layout.world_size) == (8, 8)


def test_without_overrides_after_the_separator_verls_config_is_not_composed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any) -> VerlConfigCheck:
        raise AssertionError("composed without a user override")

    monkeypatch.setattr(plan_module, "check_verl_config", refuse)
    assert build_plan(smoke(tmp_path), {}).provenance["environment_reads"] == {}


def test_what_verls_config_reads_goes_into_the_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code = tmp_path / "dataset.py"
    code.write_text("class Data: ...\n")
    calls: list[tuple[Any, ...]] = []

    def composed(recipe: list[Override], overrides: list[str], extra: list[str]) -> VerlConfigCheck:
        calls.append((recipe, overrides, extra))
        return VerlConfigCheck([], {"H13_VAR": "v"}, {"data.custom_cls.path": str(code)})

    monkeypatch.setattr(plan_module, "check_verl_config", composed)
    plan = build_plan(smoke(tmp_path), {}, ["actor_rollout_ref.actor.optim.lr=3e-6"])
    [(recipe, overrides, extra)] = calls
    assert extra == ["actor_rollout_ref.actor.optim.lr=3e-6"] and overrides == plan.overrides
    # The user's value replaces the recipe's, in the recipe's place.
    assert [o if not o.startswith("actor_rollout_ref.actor.optim.lr=") else "actor_rollout_ref.actor.optim.lr=3e-6"
            for o in map(str, recipe)] == overrides  # fmt: skip
    assert plan.provenance["extra_overrides"] == ["actor_rollout_ref.actor.optim.lr=3e-6"]
    assert plan.provenance["environment_reads"] == {"H13_VAR": "v"}
    assert plan.provenance["referenced_files"]["data.custom_cls.path"]["path"] == str(code)
    assert "reward.custom_reward_function.path" in plan.provenance["referenced_files"]  # the smoke reward, too


def test_what_verls_config_rejects_is_the_plans_problem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan_module, "check_verl_config", lambda *args: VerlConfigCheck(["verl says no"]))
    with pytest.raises(RecipeConfigError) as caught:
        build_plan(smoke(tmp_path), {}, ["actor_rollout_ref.actor.optim.lr=3e-6"])
    assert caught.value.problems == ["verl says no"]


def test_an_override_the_recipe_refuses_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan_module, "check_verl_config", lambda *args: VerlConfigCheck([]))
    with pytest.raises(RecipeConfigError) as caught:
        build_plan(smoke(tmp_path), {}, ["trainer.n_gpus_per_node=4"])
    assert caught.value.problems == [
        "override 'trainer.n_gpus_per_node=4': trainer.n_gpus_per_node is decided by NDEVICES_PER_NODE; set that instead"
    ]


def test_a_memory_estimate_over_the_device_is_a_problem(tmp_path: Path) -> None:
    with pytest.raises(RecipeConfigError) as caught:
        build_plan(smoke(tmp_path, DEVICE_MEMORY_GIB=0.01), {})
    assert caught.value.problems and all("DEVICE_MEMORY_GIB" in line or "GiB" in line for line in caught.value.problems)


def test_a_plan_without_an_estimate_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan_module, "check_verl_config", lambda *args: VerlConfigCheck([]))
    plan = build_plan(smoke(tmp_path), {}, ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null"])
    assert plan.memory is None
    assert plan.memory_skipped == plan_module._memory_estimate(
        plan.settings, "gpu", "a3", plan.model, plan.layout, plan.overrides
    )[1]
    assert plan.memory_skipped


def test_no_estimate_without_the_models_sizes_or_the_workload_says_why(tmp_path: Path) -> None:
    plan = build_plan(smoke(tmp_path), {})
    no_sizes = SimpleNamespace(sizes=None, sizes_problem="no layer sizes", source="/m/config.json")
    assert plan_module._memory_estimate(plan.settings, "gpu", "a3", no_sizes, plan.layout, plan.overrides) == (  # type: ignore[arg-type]
        None, "no layer sizes (/m/config.json)"
    )
    assert plan_module._memory_estimate(plan.settings, "gpu", "a3", plan.model, plan.layout, []) == (
        None, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu is not set"
    )


@pytest.mark.parametrize(
    ("device", "gib", "source", "note"),
    [
        ("gpu", 80, "an H100 or A100 80GB; DEVICE_MEMORY_GIB for another", "1 MiB of DeltaNet state)"),
        ("npu", 64, "one a3 NPU, Atlas A3, 910C; DEVICE_MEMORY_GIB for another", "page padding (vllm-ascend#7393))"),
    ],
)
def test_the_estimate_is_for_the_planned_device_and_chip(device: str, gib: int, source: str, note: str, tmp_path: Path) -> None:
    plan = build_plan(smoke(tmp_path), {})
    memory, why = plan_module._memory_estimate(plan.settings, device, "a3", plan.model, plan.layout, plan.overrides)
    assert why is None and memory is not None
    assert (memory.device_gib, memory.device_source) == (gib, source)
    assert memory.notes[0].endswith(note)  # vllm-ascend pads the DeltaNet state pages: the device decides


# --- files the plan looks at -------------------------------------------------------------------------------------------


def test_data_files_that_are_no_files_are_refused_naming_the_setting(tmp_path: Path) -> None:
    train, val = tmp_path / "train", tmp_path / "val"
    train.mkdir()
    os.mkfifo(val)
    settings = settings_of(TRAIN_FILES=str(train), VAL_FILES=str(val))
    assert plan_module._data_file_problems(settings) == [
        f"TRAIN_FILES='{train}': a directory; name the parquet file itself (e.g. {train}/train.parquet)",
        f"VAL_FILES='{val}': not a regular file; name the parquet file itself",
    ]


def test_a_validation_directory_gets_no_train_file_example(tmp_path: Path) -> None:
    (tmp_path / "val").mkdir()
    (tmp_path / "train.parquet").write_bytes(b"PAR1")
    settings = settings_of(TRAIN_FILES=str(tmp_path / "train.parquet"), VAL_FILES=str(tmp_path / "val"))
    assert plan_module._data_file_problems(settings) == [
        f"VAL_FILES='{tmp_path / 'val'}': a directory; name the parquet file itself"
    ]


def test_data_files_not_there_yet_are_no_problem_of_the_plan(tmp_path: Path) -> None:
    assert plan_module._data_file_problems(settings_of(TRAIN_FILES=str(tmp_path / "a"), VAL_FILES=str(tmp_path / "b"))) == []


# --- the drift guard ---------------------------------------------------------------------------------------------------


def _saved_run(tmp_path: Path, model: Path, tracker: str | None = "1", where: str = "root") -> tuple[Path, dict[str, Any]]:
    """A checkpoint root as a run of full(tmp_path, model) leaves it: its record, verl's tracker and step directory."""
    plan = build_plan(full(tmp_path, model), {})
    root = Path(dict(text.split("=", 1) for text in plan.overrides)["trainer.default_local_dir"].strip("'"))
    if tracker is not None:
        finished_step(root, 1)
        (root / TRACKER_NAME).write_text(tracker)
    else:
        root.mkdir(parents=True)  # no tracker: a record, and no save (verl never saved: it starts fresh)
    write_record(root if where == "root" else root / "global_step_1", record_bytes(plan.provenance))
    return root, plan.provenance


@pytest.mark.parametrize("where", ["root", "step"])
def test_a_resume_with_changed_settings_is_refused_naming_the_field(where: str, tmp_path: Path, model: Path) -> None:
    _saved_run(tmp_path, model, where=where)
    with pytest.raises(RecipeConfigError) as caught:
        build_plan(full(tmp_path, model, SEED=7), {})
    assert [line.split(":")[0] for line in caught.value.problems] == ["SEED"]


def test_allow_drift_accepts_the_named_change_and_the_plan_shows_it(tmp_path: Path, model: Path) -> None:
    _saved_run(tmp_path, model)
    plan = build_plan(full(tmp_path, model, SEED=7, ALLOW_DRIFT="SEED"), {})
    assert [line.split(":")[0] for line in plan.drift_accepted] == ["SEED"]
    assert f"drift    {plan.drift_accepted[0]}" in plan.to_text().splitlines()
    assert plan.to_dict()["drift_accepted"] == plan.drift_accepted


def test_an_unchanged_resume_is_no_drift(tmp_path: Path, model: Path) -> None:
    _saved_run(tmp_path, model)
    assert build_plan(full(tmp_path, model), {}).drift_accepted == []


@pytest.mark.parametrize(
    ("tracker", "overrides"),
    [
        (None, []),  # no tracker: verl starts afresh
        ("1", ["trainer.resume_mode=disable"]),  # a fresh start asked for
    ],
)
def test_no_drift_check_where_verl_resumes_nothing(tracker: str | None, overrides: list[str], tmp_path: Path, model: Path) -> None:
    root, record = _saved_run(tmp_path, model, tracker=tracker)
    changed = full(tmp_path, model, SEED=7)
    now = build_plan(changed, {}, []) if tracker is None else None
    auto = [f"trainer.default_local_dir={root}", "trainer.resume_mode=auto"]
    assert plan_module._drift_guard(changed, [*auto, *overrides], {**record, "settings": {}}) == []
    if now is not None:
        assert now.drift_accepted == []


def test_the_checkpoint_root_the_overrides_name_is_the_one_compared(tmp_path: Path, model: Path) -> None:
    root, _ = _saved_run(tmp_path, model)
    changed = build_plan(full(tmp_path, model, SEED=7, ALLOW_DRIFT="SEED"), {}).provenance
    elsewhere = full(tmp_path / "elsewhere", model)  # its own CHECKPOINT_DIR holds nothing
    auto = ["trainer.resume_mode=auto"]
    with pytest.raises(RecipeConfigError):
        plan_module._drift_guard(elsewhere, [*auto, f"trainer.default_local_dir={root}"], changed)
    assert plan_module._drift_guard(elsewhere, auto, changed) == []


def test_without_an_override_the_settings_checkpoint_root_is_compared(tmp_path: Path, model: Path) -> None:
    _, record = _saved_run(tmp_path, model)
    changed = build_plan(full(tmp_path, model, SEED=7, ALLOW_DRIFT="SEED"), {}).provenance
    accepted = plan_module._drift_guard(full(tmp_path, model, ALLOW_DRIFT="SEED"), ["trainer.resume_mode=auto"], changed)
    assert [line.split(":")[0] for line in accepted] == ["SEED"]


def test_an_unreadable_tracker_still_leaves_the_runs_record_to_compare(tmp_path: Path, model: Path) -> None:
    _saved_run(tmp_path, model, tracker="not a number")
    with pytest.raises(RecipeConfigError) as caught:
        build_plan(full(tmp_path, model, SEED=7), {})
    assert [line.split(":")[0] for line in caught.value.problems] == ["SEED"]


def test_an_unreadable_record_is_refused_even_with_allow_drift(tmp_path: Path, model: Path) -> None:
    root, _ = _saved_run(tmp_path, model)
    (root / RECORD_NAME).write_text("{not json")
    with pytest.raises(RecipeConfigError) as caught:
        build_plan(full(tmp_path, model, ALLOW_DRIFT="SEED"), {})
    [line] = caught.value.problems
    assert line.startswith(f"CHECKPOINT_DIR='{tmp_path / 'ck'}': {root / RECORD_NAME}: not a run record (")
    assert line.endswith("; move it away to resume without a drift check")


# --- what `plan` and `plan --json` print -------------------------------------------------------------------------------


def test_plan_json_is_the_whole_plan_in_one_document(tmp_path: Path) -> None:
    plan = build_plan(smoke(tmp_path, DEVICE="gpu"), {})
    document = json.loads(plan.to_json())
    assert list(document) == [
        "recipe_version", "device", "settings", "model", "layout", "allocator", "env", "overrides", "argv",
        "provenance", "drift_accepted", "chip", "memory", "data", "resume", "warnings", "nodes", "wandb",
    ]  # fmt: skip
    assert document["recipe_version"] == __version__
    assert document["device"] == plan.device.to_dict() and document["model"] == plan.model.to_dict()
    assert document["layout"] == plan.layout.to_dict() and document["allocator"] == plan.allocator.to_dict()
    assert document["settings"] == plan.settings.redacted()
    assert (document["env"], document["overrides"], document["argv"]) == (plan.env, plan.overrides, plan.argv)
    assert document["provenance"] == json.loads(json.dumps(plan.provenance))
    assert document["memory"] == json.loads(json.dumps(plan.memory.to_dict()))  # type: ignore[union-attr]
    assert plan.to_json().startswith('{\n  "recipe_version": ')  # indented for people reading it


def test_a_smoke_plan_says_its_data_have_an_image_in_every_prompt(tmp_path: Path) -> None:
    """PROFILE=smoke on its own data: `plan` says what they are, images included; on the user's files, nothing."""
    plan = build_plan(smoke(tmp_path, DEVICE="gpu"), {})
    note = (
        "64 train and 8 test rows in geo3k's layout (built by run), an image in every prompt: the arithmetic "
        "expression drawn at 64x64 (4 image tokens), asked about in text"
    )
    assert plan.data == note and json.loads(plan.to_json())["data"] == note
    assert f"data     {note}" in plan.to_text().splitlines()
    mine = tmp_path / "mine.parquet"
    mine.write_bytes(b"x")
    theirs = build_plan(smoke(tmp_path, DEVICE="gpu", TRAIN_FILES=str(mine)), {})
    assert theirs.data is None and not any(line.startswith("data     ") for line in theirs.to_text().splitlines())


def test_plan_json_says_why_there_is_no_memory_estimate(tmp_path: Path) -> None:
    plan = dataclasses.replace(build_plan(smoke(tmp_path), {}), memory=None, memory_skipped="no sizes")
    assert plan.to_dict()["memory"] == {"skipped": "no sizes"}
    assert "fit      no memory-fit estimate: no sizes" in plan.to_text().splitlines()


def test_plan_text_names_each_stage_on_its_own_line(tmp_path: Path) -> None:
    plan = build_plan(smoke(tmp_path, DEVICE="gpu", TP=1), {})
    lines = plan.to_text().splitlines()
    assert lines[0] == "device   gpu (setting: DEVICE=gpu was set)"
    assert lines[1] == f"model    {shipped_model_dir()} [{shipped_model_dir() / 'config.json'}]"
    assert lines[2] == "layout   TP=1 PP=1 CP=1 EP=1 ETP=1 GEN_TP=1 DP=1 on 1 node(s) x 1 = 1 devices"
    # TP came from the environment (here: the settings given); the rest from the profile or the defaults.
    assert lines[3] == "         defaults used for: PP, CP, EP, ETP, GEN_TP, NDEVICES_PER_NODE, NNODES"
    assert lines[4] == f"memory   PYTORCH_CUDA_ALLOC_CONF=(unset): {plan.allocator.reason}"
    assert lines[5] == "fit      80 GiB per device: an H100 or A100 80GB; DEVICE_MEMORY_GIB for another"
    env = [line for line in lines if line.startswith("env      ")]
    assert env == ["env      " + " ".join(f"{k}={'(unset)' if v is None else v}" for k, v in plan.env.items())]
    assert "PYTORCH_CUDA_ALLOC_CONF=(unset)" in env[0]
    assert f"command  {sys.executable} -m recipe.trainer_main, {COMMAND_NOTE}" in lines


def test_plan_text_without_defaults_has_no_defaults_line(tmp_path: Path) -> None:
    plan = build_plan(smoke(tmp_path), {})
    sources = {name: "environment" for name in plan.layout.sources}
    plan = dataclasses.replace(plan, layout=dataclasses.replace(plan.layout, sources=sources))
    assert not any("defaults used for" in line for line in plan.to_text().splitlines())


def test_plan_text_shows_the_memory_estimate_and_its_warnings(tmp_path: Path) -> None:
    estimate = SimpleNamespace(to_text=lambda: ["phase one", "  term"], warnings=lambda: ["tight"])
    allocator = SimpleNamespace(variable="PYTORCH_NPU_ALLOC_CONF", value="max_split_size_mb:64", reason="why")
    plan = dataclasses.replace(build_plan(smoke(tmp_path), {}), memory=estimate, allocator=allocator)  # type: ignore[arg-type]
    lines = plan.to_text().splitlines()
    at = lines.index("memory   PYTORCH_NPU_ALLOC_CONF=max_split_size_mb:64: why")
    assert lines[at + 1 : at + 4] == ["fit      phase one", "           term", "warning  tight"]


def test_plan_text_lists_the_overrides_by_group_one_per_line_printable(tmp_path: Path) -> None:
    argv = ["/opt/my python/bin/python", "-m", "recipe.trainer_main",
            "data.a=1", "trainer.x=1", "data.b=2", "model_engine=megatron", "+trainer.bad=a\x1bb"]  # fmt: skip
    plan = dataclasses.replace(build_plan(smoke(tmp_path), {}), argv=argv, env={"A": "1", "B": None})
    lines = plan.to_text().splitlines()
    assert "env      A=1 B=(unset)" in lines
    at = lines.index(f"command  '/opt/my python/bin/python' -m recipe.trainer_main, {COMMAND_NOTE}")
    assert lines[at + 1 :] == [
        "  data      data.a=1",
        "            data.b=2",
        "  trainer   trainer.x=1",
        "            +trainer.bad=a\\x1bb",
        "  other     model_engine=megatron",
    ]


@pytest.mark.parametrize(
    ("override", "group"),
    [
        ("data.train_files=x", "data"),
        ("actor_rollout_ref.model.path=x", "model"),
        ("actor_rollout_ref.actor.optim.lr=1", "actor"),
        ("+actor_rollout_ref.actor.megatron.x=1", "actor"),
        ("actor_rollout_ref.rollout.n=4", "rollout"),
        ("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1", "ref"),
        ("algorithm.adv_estimator=grpo", "algorithm"),
        ("reward.num_workers=2", "reward"),
        ("trainer.nnodes=1", "trainer"),
        ("~trainer.logger", "trainer"),
        ("++ray_kwargs.ray_init.address=auto", "ray"),
        ("model_engine=megatron", "other"),
        ("datasets.x=1", "other"),  # a prefix of the word is not the group
        ("actor_rollout_ref.hybrid_engine=True", "other"),
        ("critic.x=data.y", "other"),  # the value does not decide the group
    ],
)
def test_each_override_is_shown_in_the_group_its_key_starts(override: str, group: str) -> None:
    assert grouped_overrides([override]) == [(group, [override])]


def test_groups_keep_argv_order_within_and_drop_none() -> None:
    overrides = ["trainer.a=1", "data.x=1", "other=1", "trainer.b=2", "data.y=2"]
    assert grouped_overrides(overrides) == [("data", ["data.x=1", "data.y=2"]), ("trainer", ["trainer.a=1", "trainer.b=2"]),
                                            ("other", ["other=1"])]  # fmt: skip
    assert grouped_overrides([]) == []


# --- small parts -------------------------------------------------------------------------------------------------------


def test_a_profile_override_splits_at_its_first_equals_sign() -> None:
    assert plan_module._profile_override("reward.custom_reward_function.name=a=b") == Override(
        "reward.custom_reward_function.name", "a=b"
    )


def test_a_stage_that_fails_adds_its_problems_and_the_plan_goes_on() -> None:
    problems: list[str] = ["earlier"]

    def fails() -> int:
        raise RecipeConfigError(["one", "two"])

    assert plan_module._collect(problems, fails) is None
    assert plan_module._collect(problems, lambda: 5) == 5
    assert problems == ["earlier", "one", "two"]


def test_only_plus_and_tilde_before_a_key_are_skipped_to_find_its_group() -> None:
    """A key the user adds after `--` (Hydra's `+`) is grouped by its own first letters: `Xtrainer.` is no trainer key."""
    assert grouped_overrides(["+Xtrainer.a=1", "Xdata.b=2"]) == [("other", ["+Xtrainer.a=1", "Xdata.b=2"])]


def test_no_override_is_dropped_from_the_groups_not_even_an_empty_one() -> None:
    assert grouped_overrides(["", "trainer.a=1"]) == [("trainer", ["trainer.a=1"]), ("other", [""])]


def test_on_gpu_no_chip_is_looked_up_before_the_problems_are_reported(tmp_path: Path) -> None:
    """The image's chip label matters on npu only: a refused gpu plan reports its problems even where the image-info
    location cannot be looked up (here a name too long for the file system)."""
    with pytest.raises(RecipeConfigError) as caught:
        build_plan(smoke(tmp_path, DEVICE="gpu", TP=2), {"RECIPE_IMAGE_INFO_DIR": "/" + "x" * 300})
    assert caught.value.problems and all("TP" in line for line in caught.value.problems[:1])


def test_a_plan_across_nodes_states_how_long_a_lost_node_or_head_takes_to_end_the_run(tmp_path: Path) -> None:
    """The bounds docs/deploy.md documents and the two-node e2e measures: Ray's health checks (65 s at most) + one
    read of the node table (5 s) + the trainer's grace (30 s); the worker's raylet (15 s) + its `ray start` (30 s)
    + RAY_WAIT_TIMEOUT. One node: no line."""
    two = build_plan(smoke(tmp_path, DEVICE="gpu", NNODES=2, NODE_RANK=1, MASTER_ADDR="10.0.0.1",
                           RAY_AUTH_MODE="disabled", RAY_WAIT_TIMEOUT=120), {})  # fmt: skip
    assert two.nodes["lost_node_bound_s"] == 100 and two.nodes["lost_head_bound_s"] == 15 + 30 + 120
    assert json.loads(two.to_json())["nodes"] == two.nodes
    line = next(line for line in two.to_text().splitlines() if line.startswith("nodes    "))
    assert line.startswith("nodes    a node lost mid-run ends the head's run within 100 s, a lost head each "
                           "worker's within 165 s (RAY_WAIT_TIMEOUT=120 s for a restarted head among it)")
    one = build_plan(smoke(tmp_path, DEVICE="gpu"), {})
    assert one.nodes == {} and not any(line.startswith("nodes") for line in one.to_text().splitlines())


def test_under_kuberay_the_plan_states_no_worker_run_for_a_lost_head(tmp_path: Path) -> None:
    """With RAY_ADDRESS (a RayJob's driver) the workers are KubeRay's raylets, not `run`s waiting for a head: a lost
    node still ends this run within its bound; a lost head ends it with the head, and the RayJob retries."""
    driver = build_plan(smoke(tmp_path, DEVICE="gpu", NNODES=2, RAY_ADDRESS="10.0.0.1:6379"), {})
    assert driver.nodes == {
        "lost_node_bound_s": 100,
        "text": "a node lost mid-run ends this run within 100 s: exit 3 and one line naming it; a lost head ends it "
                "with the head; the RayJob's retry (its backoffLimit) resumes from the last save",
    }  # fmt: skip
    assert "worker" not in next(line for line in driver.to_text().splitlines() if line.startswith("nodes    "))
