"""The trainer's Hydra overrides hold upstream's tuned values, the recipe's own additions, and name who decides each.

The oracle is verl's examples/grpo_trainer/run_qwen3_5_35b_megatron.sh (transcribed below by hand,
in Hydra's grammar as the recipe writes it: strings quoted) and docs/upstream.md ("Differences from
upstream's script"); the refusals and the workers' environment are what docs/settings.md promises.
A value here changed without docs/upstream.md saying why is a silent retune of a 35B run.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from recipe.allocator import decide_allocator
from recipe.errors import RecipeConfigError
from recipe.launch import (
    Override,
    build_overrides,
    checkpoint_root,
    override_value,
    resume_mode_problem,
    runtime_environment,
    trainer_argv,
)
from recipe.layout import resolve_layout
from recipe.models import QWEN3_5_35B_A3B
from recipe.settings import Settings
from recipe.user_overrides import merge_user_overrides

from .envtools import REPO, settings_of

A, R, F = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.ref"
T, O = f"{A}.megatron.override_transformer_config", f"{A}.optim.override_optimizer_config"
ENV = "+ray_kwargs.ray_init.runtime_env.env_vars."

#: Upstream's values on both targets (the script's DATA, ALGORITHM, MODEL, ACTOR, ROLLOUT, REF, TRAINER arrays).
UPSTREAM = {
    "data.max_prompt_length": "1024",
    "data.max_response_length": "2048",
    "data.truncation": "'error'",
    "data.filter_overlong_prompts": "True",
    "data.train_batch_size": "32",
    "algorithm.adv_estimator": "'grpo'",
    "algorithm.use_kl_in_reward": "False",
    "actor_rollout_ref.model.trust_remote_code": "True",
    f"{A}.optim.lr": "1e-06",
    f"{A}.ppo_mini_batch_size": "32",
    f"{A}.ppo_micro_batch_size_per_gpu": "1",
    f"{A}.ppo_max_token_len_per_gpu": "4096",
    f"{A}.use_kl_loss": "True",
    f"{A}.kl_loss_coef": "0.01",
    f"{A}.kl_loss_type": "'low_var_kl'",
    f"{A}.entropy_coeff": "0",
    f"{A}.megatron.use_mbridge": "True",
    f"{A}.megatron.param_offload": "True",
    f"{A}.megatron.optimizer_offload": "True",
    f"{F}.megatron.param_offload": "True",
    f"{A}.megatron.dtype": "'bfloat16'",
    f"++{T}.attention_backend": "'auto'",
    f"+{T}.recompute_method": "'uniform'",
    f"+{T}.recompute_granularity": "'full'",
    f"+{T}.recompute_num_layers": "1",
    f"+{T}.moe_aux_loss_coeff": "0.01",
    f"+{T}.moe_z_loss_coeff": "0.001",
    f"+{T}.moe_permute_fusion": "True",
    f"+{T}.moe_grouped_gemm": "True",
    f"+{O}.optimizer_offload_fraction": "1",
    f"+{O}.overlap_cpu_optimizer_d2h_h2d": "True",
    f"+{O}.use_precision_aware_optimizer": "True",
    f"+{O}.optimizer_cpu_offload": "True",
    f"{R}.name": "'vllm'",
    f"{R}.n": "5",
    f"{R}.dtype": "'bfloat16'",
    f"{R}.log_prob_micro_batch_size_per_gpu": "1",
    f"{R}.log_prob_max_token_len_per_gpu": "4096",
    f"{R}.calculate_log_probs": "True",
    f"{F}.log_prob_micro_batch_size_per_gpu": "1",
    f"{F}.log_prob_max_token_len_per_gpu": "4096",
    "trainer.critic_warmup": "0",
    "trainer.save_freq": "20",
    "trainer.val_before_train": "False",
    "trainer.test_freq": "5",
    "trainer.total_epochs": "15",
    "model_engine": "'megatron'",
}
#: Upstream's values that differ by target (gpu, npu); None: not set on that target.
UPSTREAM_BY_TARGET = {
    f"{A}.use_dynamic_bsz": ("False", "True"),
    f"{R}.log_prob_use_dynamic_bsz": ("False", "True"),
    f"{F}.log_prob_use_dynamic_bsz": ("False", "True"),
    f"{R}.gpu_memory_utilization": ("0.6", "0.65"),
    f"+{T}.use_flash_attn": (None, "True"),
    f"+{T}.moe_token_dispatcher_type": (None, "'alltoall'"),
    f"+{T}.use_naive_l2norm": (None, "True"),
    f"+{R}.engine_kwargs.vllm.mm_processor_cache_gb": (None, "0"),
    f"{ENV}CUDA_DEVICE_MAX_CONNECTIONS": ("'1'", None),
    f"{ENV}VLLM_ALLREDUCE_USE_SYMM_MEM": ("'0'", None),
    f"{ENV}VLLM_USE_V1": ("'1'", "'1'"),
    f"{ENV}CPU_AFFINITY_CONF": (None, "'1'"),
}
#: The recipe's own values, each a difference docs/upstream.md or launch.py's comments give a reason for.
RECIPE = {
    # Packed sequences on both targets (upstream pads on gpu).
    "actor_rollout_ref.model.use_remove_padding": "True",
    f"{A}.megatron.use_remove_padding": "True",
    # Truncated importance sampling of the rollout's samples per token, capped at 2 (ROLLOUT_CORRECTION).
    "algorithm.rollout_correction.rollout_is": "'token'",
    "algorithm.rollout_correction.rollout_is_threshold": "2.0",
    # A resume continues the LR schedule.
    f"{A}.optim.use_checkpoint_opt_param_scheduler": "True",
    # Megatron-Bridge, lenient export with Hugging Face weights, on both targets.
    f"{A}.megatron.vanilla_mbridge": "False",
    f"{A}.checkpoint.strict": "False",
    f"{A}.checkpoint.save_contents": "['model','optimizer','extra','hf_model']",
    # Seeds pinned (SEED=42).
    "data.seed": "42", f"{A}.data_loader_seed": "42", f"{A}.megatron.seed": "42", f"{R}.seed": "42",
    "trainer.logger": "['console','tensorboard']",
    "trainer.resume_mode": "'auto'",
    "trainer.default_local_dir": "'/checkpoints/grpo_qwen3_5_35b_geo3k/qwen3_5_35b_megatron'",
    f"{ENV}TENSORBOARD_DIR": "'/checkpoints/tensorboard/grpo_qwen3_5_35b_geo3k/qwen3_5_35b_megatron'",
    "+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook": "'recipe.worker_setup.configure_worker'",
}  # fmt: skip
RECIPE_BY_TARGET = {
    "trainer.device": ("'cuda'", "'npu'"),
    f"{ENV}HCCL_CONNECT_TIMEOUT": (None, "'1800'"),  # HCCL's 120 s is short for a 35B model's first load
    f"{ENV}RECIPE_DEVICE": ("'gpu'", "'npu'"),
}


def _built(device: str = "gpu", environ: dict[str, str] | None = None, **values: object) -> list[Override]:
    settings = settings_of(**values)
    layout = resolve_layout(settings, device, QWEN3_5_35B_A3B)  # type: ignore[arg-type]
    env = runtime_environment(settings, device, decide_allocator(settings, device, environ or {}), environ or {})  # type: ignore[arg-type]
    return build_overrides(settings, device, layout, env)  # type: ignore[arg-type]


def _by_key(overrides: list[Override]) -> dict[str, str]:
    return {f"{o.prefix}{o.key}": o.value for o in overrides}


@pytest.mark.parametrize("device", ["gpu", "npu"])
def test_upstreams_tuned_values_and_the_recipes_own_reach_the_trainer(device: str) -> None:
    at = 0 if device == "gpu" else 1
    expected = {**UPSTREAM, **RECIPE}
    for table in (UPSTREAM_BY_TARGET, RECIPE_BY_TARGET):
        expected |= {key: values[at] for key, values in table.items() if values[at] is not None}
    built = _by_key(_built(device))
    assert {key: built.get(key) for key in expected} == expected
    absent = [key for table in (UPSTREAM_BY_TARGET, RECIPE_BY_TARGET) for key, values in table.items() if values[at] is None]
    assert [key for key in absent if key in built] == []


def test_each_override_is_written_prefix_key_equals_value() -> None:
    assert str(Override("a.b", "1")) == "a.b=1"
    assert str(Override("a.b", "'x'", prefix="++", setting="TP")) == "++a.b='x'"
    texts = [str(o) for o in _built()]
    assert "++actor_rollout_ref.actor.megatron.override_transformer_config.attention_backend='auto'" in texts
    assert "trainer.nnodes=1" in texts


def _decided_in_the_docs(device: str) -> dict[str, str]:
    """docs/settings.md's "Settings that decide keys": each key a setting decides on DEVICE, with that setting."""
    text = (REPO / "docs" / "settings.md").read_text(encoding="utf-8")
    table = text.split("## Settings that decide keys\n", 1)[1].split("\n## ", 1)[0]
    decided = {}
    for row in [line for line in table.splitlines() if line.startswith("|")][2:]:
        setting, decides = (cell.strip() for cell in row.strip("|").split("|")[:2])
        for key, only in re.findall(r"`([^`]+)`(?:\s*\((gpu|npu)\))?", decides):
            if only in ("", device):
                decided[ENV.lstrip("+") + key.removeprefix("env:") if key.startswith("env:") else key] = setting.strip("`")
    return decided


@pytest.mark.parametrize("device", ["gpu", "npu"])
def test_each_key_a_setting_decides_names_that_setting_as_the_docs_say(device: str) -> None:
    """What a refused override names (user_overrides reads Override.setting): the docs' table, key for key."""
    # The user's own allocator options, so that the allocator variable is among the overrides; the health bounds,
    # whose copy for the workers is there only when they are set.
    environ = {"PYTORCH_CUDA_ALLOC_CONF" if device == "gpu" else "PYTORCH_NPU_ALLOC_CONF": "max_split_size_mb:128"}
    built = {o.key: o.setting for o in _built(device, environ, health_thresholds="flat_steps=20")
             if o.setting is not None and o.key != "model_engine"}  # fmt: skip
    decided = _decided_in_the_docs(device)
    assert sorted(built) == sorted(decided)
    # The label is the setting itself, or a sentence naming it among others (the allocator policy).
    assert [key for key, setting in decided.items() if not re.search(rf"\b{setting}\b", str(built[key]))] == []


@pytest.mark.parametrize(
    ("override", "who"),
    [
        ("model_engine=fsdp", "the recipe (Megatron engine only)"),
        ("trainer.device=cpu", "DEVICE"),
        ("+ray_kwargs.ray_init.runtime_env.env_vars.RECIPE_DEVICE=npu", "DEVICE"),
        ("+ray_kwargs.ray_init.runtime_env.env_vars.RECIPE_EXPANDABLE_SEGMENTS=0",
         "EXPANDABLE_SEGMENTS and PYTORCH_CUDA_ALLOC_CONF / PYTORCH_NPU_ALLOC_CONF (the allocator policy)"),
        ("+ray_kwargs.ray_init.runtime_env.env_vars.PYTORCH_CUDA_ALLOC_CONF=x",
         "EXPANDABLE_SEGMENTS and PYTORCH_CUDA_ALLOC_CONF / PYTORCH_NPU_ALLOC_CONF (the allocator policy)"),
        ("trainer.total_epochs=1", "TOTAL_EPOCHS"),
        ("algorithm.rollout_correction.rollout_is=sequence", "ROLLOUT_CORRECTION"),
    ],
)  # fmt: skip
def test_an_override_of_a_decided_key_names_who_decides_it(override: str, who: str) -> None:
    key = override.split("=", 1)[0].lstrip("+")
    with pytest.raises(RecipeConfigError) as caught:
        merge_user_overrides(_built(), [override])
    assert caught.value.problems == [f"override {override!r}: {key} is decided by {who}; set that instead"]


@pytest.mark.parametrize(
    "override",
    ["+ray_kwargs.ray_init.runtime_env.env_vars.TENSORBOARD_DIR=/tb", "+ray_kwargs.ray_init.runtime_env.env_vars.VLLM_USE_V1=0",
     "actor_rollout_ref.actor.optim.lr=2e-6", "trainer.resume_mode=disable"],
)  # fmt: skip
def test_a_key_no_setting_decides_may_be_overridden(override: str) -> None:
    assert override in merge_user_overrides(_built(), [override])


# --- the workers' environment ---------------------------------------------------------------------


def test_the_workers_environment_on_gpu(tmp_path: Path) -> None:
    settings = settings_of(CHECKPOINT_DIR=str(tmp_path), PROJECT_NAME="p", EXPERIMENT_NAME="e")
    env = runtime_environment(settings, "gpu", decide_allocator(settings, "gpu", {}), {})
    assert env == {
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        "VLLM_USE_V1": "1",
        "VLLM_ALLREDUCE_USE_SYMM_MEM": "0",
        "TENSORBOARD_DIR": f"{tmp_path}/tensorboard/p/e",
        "RECIPE_DEVICE": "gpu",
        "RECIPE_EXPANDABLE_SEGMENTS": "1",
        "PYTORCH_CUDA_ALLOC_CONF": None,  # removed: the worker hook turns expandable segments on at run time, never the environment
    }


def test_a_smoke_run_logs_its_metrics_under_the_experiments_checkpoints(tmp_path: Path) -> None:
    """The smoke verdict reads CHECKPOINT_DIR/PROJECT/EXPERIMENT/smoke-metrics.jsonl, which verl's file logger writes."""
    settings = settings_of(PROFILE="smoke", CHECKPOINT_DIR=str(tmp_path))
    env = runtime_environment(settings, "gpu", decide_allocator(settings, "gpu", {}), {})
    assert env["VERL_FILE_LOGGER_PATH"] == str(tmp_path / "grpo_recipe_smoke" / "qwen3_5_moe_tiny" / "smoke-metrics.jsonl")
    overrides = _by_key(_built(PROFILE="smoke", CHECKPOINT_DIR=str(tmp_path)))
    assert overrides["trainer.logger"] == "['console','tensorboard','file']"
    assert f"{ENV}VERL_FILE_LOGGER_PATH" in overrides
    assert "VERL_FILE_LOGGER_PATH" not in runtime_environment(settings_of(), "gpu", decide_allocator(settings_of(), "gpu", {}), {})


def test_wandb_is_logged_to_only_with_a_key_and_after_the_defaults() -> None:
    assert _by_key(_built(WANDB_API_KEY="k"))["trainer.logger"] == "['console','tensorboard','wandb']"


def test_the_users_environment_wins_for_every_default_variable() -> None:
    environ = {"VLLM_USE_V1": "0", "TENSORBOARD_DIR": "/tb", "RECIPE_DEVICE": "gpu"}
    settings = settings_of()
    env = runtime_environment(settings, "npu", decide_allocator(settings, "npu", environ), environ)
    assert (env["VLLM_USE_V1"], env["TENSORBOARD_DIR"], env["HCCL_CONNECT_TIMEOUT"]) == ("0", "/tb", "1800")


def test_every_worker_variable_that_hydra_would_not_keep_literal_is_refused_at_once() -> None:
    environ = {"TENSORBOARD_DIR": "/tb/${oc.env:HF_TOKEN}", "VLLM_USE_V1": "???", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    settings = settings_of()
    with pytest.raises(RecipeConfigError) as caught:
        runtime_environment(settings, "gpu", decide_allocator(settings, "gpu", environ), environ)
    assert caught.value.problems == [
        "VLLM_USE_V1='???': must be a literal string: OmegaConf reads `???` as a missing value",
        (
            "TENSORBOARD_DIR='/tb/${oc.env:HF_TOKEN}': must be a literal string: `${` starts an OmegaConf "
            "interpolation, which verl would resolve (and re-resolve after its in-place OmegaConf.resolve)"
        ),
    ]


def test_a_variable_the_allocator_removes_is_not_passed_to_the_workers() -> None:
    """None in the environment means unset: no `env_vars.NAME=None` override (Ray takes only strings)."""
    overrides = _by_key(_built(environ={}))
    assert f"{ENV}PYTORCH_CUDA_ALLOC_CONF" not in overrides
    assert not any(value in ("None", "'None'") for value in overrides.values())
    env: dict[str, str | None] = {"KEEP": "1", "DROP": None}
    settings = settings_of()
    built = _by_key(build_overrides(settings, "gpu", resolve_layout(settings, "gpu", QWEN3_5_35B_A3B), env))
    assert built[f"{ENV}KEEP"] == "'1'" and f"{ENV}DROP" not in built


@pytest.mark.parametrize(
    ("values", "attached"),
    [
        ({}, False),
        ({"RAY_ADDRESS": "10.0.0.9:6379"}, True),  # KubeRay's cluster, one node
        ({"NNODES": 2, "MASTER_ADDR": "10.0.0.1", "RAY_AUTH_MODE": "disabled"}, True),
    ],
)
def test_the_trainer_attaches_to_a_cluster_the_recipe_started_or_joined(values: dict[str, object], attached: bool) -> None:
    assert _by_key(_built(**values)).get("+ray_kwargs.ray_init.address") == ("'auto'" if attached else None)


# --- reading overrides back, resume modes, the command line -------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "key", "value"),
    [
        (["trainer.resume_mode='auto'"], "trainer.resume_mode", "auto"),
        (['trainer.resume_mode="disable"'], "trainer.resume_mode", "disable"),
        (["~trainer.resume_mode=auto", "x=1"], "trainer.resume_mode", "auto"),
        (["++a.b=1", "+a.b=2"], "a.b", "2"),
        (["a.b=x=y"], "a.b", "x=y"),  # only the first `=` separates key and value
        (["a.b"], "a.b", None),  # no `=`: a deletion or a typo, no value
        (["a.bc=1", "xa.b=1"], "a.b", None),
        (["+XLA.flag=1"], "XLA.flag", "1"),  # only Hydra's `~` and `+` are taken off a key
        (["a.b='XY'"], "a.b", "XY"),  # and only quotes off a value
    ],
)
def test_override_value_reads_what_the_last_override_of_a_key_sets(overrides: list[str], key: str, value: str | None) -> None:
    assert override_value(overrides, key) == value


@pytest.mark.parametrize("mode", ["auto", "disable", "resume_path"])
def test_verls_resume_modes_written_literally_pass(mode: str) -> None:
    assert resume_mode_problem(mode) is None


@pytest.mark.parametrize("value", ["${oc.env:MODE}", "${trainer.other}", "resume", None, "AUTO"])
def test_any_other_resume_mode_is_refused_with_the_ways_that_work(value: object) -> None:
    """An interpolation, read unresolved, is its `${...}` text: refused, whatever mode it would resolve to."""
    assert resume_mode_problem(value) == (
        f"trainer.resume_mode={value!r}: must be one of auto, disable, resume_path, written literally "
        "(verl 0.9.1 knows no other mode, and the resume guard checks what it reads before the run: "
        "an interpolation is resolved only later); use trainer.resume_mode=auto, "
        "trainer.resume_mode=disable, or trainer.resume_mode=resume_path trainer.resume_from_path=<global_step_N dir>"
    )


def test_the_trainer_runs_under_this_interpreter_by_default() -> None:
    assert trainer_argv(["a=1", "b=2"]) == [sys.executable, "-m", "recipe.trainer_main", "a=1", "b=2"]


def test_checkpoints_go_under_checkpoint_dir_project_and_experiment() -> None:
    settings: Settings = settings_of(CHECKPOINT_DIR="/ck", PROJECT_NAME="p", EXPERIMENT_NAME="e")
    assert checkpoint_root(settings) == Path("/ck/p/e")
