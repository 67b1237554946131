"""Override building: upstream's values, settings reaching the right keys, user overrides merged safely."""

from __future__ import annotations

import pytest

from recipe.allocator import decide_allocator
from recipe.errors import RecipeConfigError
from recipe.launch import (
    build_overrides,
    hydra_value,
    runtime_environment,
    trainer_argv,
)
from recipe.layout import resolve_layout
from recipe.models import QWEN3_5_35B_A3B
from recipe.user_overrides import merge_user_overrides

from .envtools import settings_of


def _overrides(device: str = "gpu", environ: dict[str, str] | None = None, **values: object) -> dict[str, str]:
    settings = settings_of(**values)
    layout = resolve_layout(settings, device, QWEN3_5_35B_A3B)  # type: ignore[arg-type]
    env = runtime_environment(settings, device, decide_allocator(settings, device, environ or {}), environ or {})  # type: ignore[arg-type]
    return {f"{o.prefix}{o.key}": o.value for o in build_overrides(settings, device, layout, env)}  # type: ignore[arg-type]


def test_hydra_values_round_trip_their_types() -> None:
    assert hydra_value(True) == "True" and hydra_value(3) == "3" and hydra_value(1e-6) == "1e-06"
    assert hydra_value("123") == "'123'"  # a string stays a string
    assert hydra_value("it's") == "'it\\'s'"
    assert hydra_value(["a", "b"]) == "['a','b']"


@pytest.mark.parametrize("device", ["gpu", "npu"])
def test_megatron_bridge_path_and_lenient_export_on_both_targets(device: str) -> None:
    o = _overrides(device)
    assert o["actor_rollout_ref.actor.megatron.vanilla_mbridge"] == "False"
    assert o["actor_rollout_ref.actor.megatron.use_mbridge"] == "True"
    assert o["actor_rollout_ref.actor.checkpoint.strict"] == "False"
    assert "hf_model" in o["actor_rollout_ref.actor.checkpoint.save_contents"]
    assert o["model_engine"] == "'megatron'"
    assert o["algorithm.adv_estimator"] == "'grpo'"
    assert o["trainer.resume_mode"] == "'auto'"


def test_grad_offload_which_verl_0_9_1_dropped_is_not_generated() -> None:
    assert not any("grad_offload" in key for key in _overrides("gpu"))


def test_export_strict_turns_strictness_back_on() -> None:
    assert _overrides(EXPORT_STRICT=True)["actor_rollout_ref.actor.checkpoint.strict"] == "True"


def test_layout_reaches_actor_and_ref() -> None:
    o = _overrides("npu", TP=4, PP=2, EP=4)
    for section in ("actor", "ref"):
        assert o[f"actor_rollout_ref.{section}.megatron.tensor_model_parallel_size"] == "4"
        assert o[f"actor_rollout_ref.{section}.megatron.pipeline_model_parallel_size"] == "2"
        assert o[f"actor_rollout_ref.{section}.megatron.expert_model_parallel_size"] == "4"
    assert o["trainer.n_gpus_per_node"] == "16" and o["trainer.device"] == "'npu'"


def test_npu_gets_upstreams_ascend_settings_and_gpu_does_not() -> None:
    npu, gpu = _overrides("npu"), _overrides("gpu")
    key = "+actor_rollout_ref.actor.megatron.override_transformer_config.moe_token_dispatcher_type"
    assert npu[key] == "'alltoall'" and key not in gpu
    assert npu["actor_rollout_ref.actor.use_dynamic_bsz"] == "True" and gpu["actor_rollout_ref.actor.use_dynamic_bsz"] == "False"
    assert npu["+ray_kwargs.ray_init.runtime_env.env_vars.CPU_AFFINITY_CONF"] == "'1'"


def test_checkpoints_and_tensorboard_live_under_the_checkpoint_dir() -> None:
    o = _overrides(CHECKPOINT_DIR="/ckpt", PROJECT_NAME="p", EXPERIMENT_NAME="e")
    assert o["trainer.default_local_dir"] == "'/ckpt/p/e'"
    assert o["+ray_kwargs.ray_init.runtime_env.env_vars.TENSORBOARD_DIR"] == "'/ckpt/tensorboard/p/e'"


def test_wandb_only_with_a_key_and_the_key_never_in_argv() -> None:
    assert "wandb" not in _overrides()["trainer.logger"]
    with_key = _overrides(WANDB_API_KEY="wandb-secret-123")
    assert "wandb" in with_key["trainer.logger"]
    assert not any("wandb-secret-123" in f"{k}={v}" for k, v in with_key.items())


def test_user_environment_wins_over_device_defaults() -> None:
    o = _overrides("npu", environ={"HCCL_CONNECT_TIMEOUT": "3600"})
    assert o["+ray_kwargs.ray_init.runtime_env.env_vars.HCCL_CONNECT_TIMEOUT"] == "'3600'"


def test_workers_get_the_allocator_hook_and_never_expandable_segments_true() -> None:
    o = _overrides("gpu", environ={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:128"})
    assert o["+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook"] == "'recipe.worker_setup.configure_worker'"
    assert o["+ray_kwargs.ray_init.runtime_env.env_vars.PYTORCH_CUDA_ALLOC_CONF"] == "'max_split_size_mb:128'"
    assert not any("expandable_segments:True" in v for v in o.values())


def test_several_nodes_attach_to_the_running_cluster() -> None:
    assert "+ray_kwargs.ray_init.address" not in _overrides()
    assert _overrides(NNODES=2, MASTER_ADDR="10.0.0.1", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="t" * 32)["+ray_kwargs.ray_init.address"] == "'auto'"


def _built(**values: object):  # type: ignore[no-untyped-def]
    settings = settings_of(**values)
    layout = resolve_layout(settings, "gpu", QWEN3_5_35B_A3B)
    env = runtime_environment(settings, "gpu", decide_allocator(settings, "gpu", {}), {})
    return build_overrides(settings, "gpu", layout, env)


def test_user_override_replaces_a_tuned_value_in_place() -> None:
    merged = merge_user_overrides(_built(), ["actor_rollout_ref.actor.optim.lr=2e-6", "+trainer.extra_thing=1"])
    assert "actor_rollout_ref.actor.optim.lr=2e-6" in merged
    assert "actor_rollout_ref.actor.optim.lr=1e-06" not in merged
    assert merged[-1] == "+trainer.extra_thing=1"


def test_user_override_of_a_setting_key_is_refused_naming_the_setting() -> None:
    with pytest.raises(RecipeConfigError) as caught:
        merge_user_overrides(_built(), ["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4", "nonsense"])
    assert caught.value.problems == [
        "override 'actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4': "
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size is decided by TP; set that instead",
        "override 'nonsense': must look like key=value (Hydra override syntax)",
    ]


def test_trainer_argv_runs_verls_main_through_the_recipes_launcher() -> None:
    assert trainer_argv(["a=1"], python="python3") == ["python3", "-m", "recipe.trainer_main", "a=1"]


def test_override_value_reads_the_last_setting_of_a_key() -> None:
    from recipe.launch import override_value

    overrides = ["trainer.resume_mode='auto'", "+x=1", "++trainer.resume_mode=resume_path"]
    assert override_value(overrides, "trainer.resume_mode") == "resume_path"
    assert override_value(overrides, "x") == "1"
    assert override_value(overrides, "trainer.resume") is None
