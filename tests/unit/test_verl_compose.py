"""The generated overrides compose against the INSTALLED verl 0.9.1's real Hydra config.

Hydra's `+key=` lets unknown keys through, so the actor, rollout and checkpoint
nodes are also instantiated with verl's own `omega_conf_to_dataclass`, which
rejects unknown or mistyped keys, and the whole config goes through verl's own
`validate_config`. Ray's RuntimeEnv checks what reaches `ray.init`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.support.needs import needs

from .envtools import clear_settings
from recipe.plan import build_plan
from recipe.settings import load_settings

verl = needs("verl", install="needs the trainer extra: pip install -e '.[trainer]' (CI installs it)")
pytestmark = pytest.mark.verl

from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass, validate_config  # noqa: E402

CONFIG_DIR = str(Path(verl.__file__).parent / "trainer" / "config")


def test_the_pinned_verl_is_installed() -> None:
    from importlib.metadata import version

    assert version("verl") == "0.9.1"


def compose_trainer_config(overrides: list[str]) -> Any:
    """verl's trainer config as `python -m verl.trainer.main_ppo <overrides>` would build it."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def check_like_verl(overrides: list[str]) -> Any:
    """Compose, instantiate the typed nodes and validate, as verl does at start; returns the config."""
    from ray.runtime_env import RuntimeEnv

    config = compose_trainer_config(overrides)
    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
    omega_conf_to_dataclass(config.actor_rollout_ref.actor.checkpoint)
    validate_config(config, use_reference_policy=True, use_critic=False)
    RuntimeEnv(**OmegaConf.to_container(config.ray_kwargs.ray_init.runtime_env))
    assert type(actor).__name__ == "McoreActorConfig"
    return config


VARIANTS: dict[str, dict[str, str]] = {
    "gpu defaults": {"DEVICE": "gpu"},
    "npu defaults": {"DEVICE": "npu"},
    "gpu tp4 ep4 strict wandb": {"DEVICE": "gpu", "TP": "4", "EP": "4", "EXPORT_STRICT": "true", "WANDB_API_KEY": "k"},
    # Without offload the trainer's weights stay while vLLM is awake: 64 GiB NPUs cannot hold both (recipe.memory_fit).
    "npu tp4 pp1 gen_tp2 no offload": {
        "DEVICE": "npu", "TP": "4", "PP": "1", "GEN_TP": "2", "OFFLOAD": "false", "DEVICE_MEMORY_GIB": "128",
    },
    "gpu two nodes": {
        "DEVICE": "gpu", "NNODES": "2", "MASTER_ADDR": "10.0.0.1", "EP": "16", "RAY_AUTH_MODE": "disabled",
    },
    "npu odd names and allocator": {
        "DEVICE": "npu", "PROJECT_NAME": "123", "EXPERIMENT_NAME": "true", "CHECKPOINT_DIR": "/ck pt/it's",
        "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:128",
    },
    "gpu expandable segments off": {"DEVICE": "gpu", "EXPANDABLE_SEGMENTS": "false"},
    "npu bench": {"DEVICE": "npu", "PROFILE": "bench"},
}


def _plan(monkeypatch: pytest.MonkeyPatch, values: dict[str, str], extra: tuple[str, ...] = ()) -> Any:
    clear_settings(monkeypatch)
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return build_plan(load_settings(), os.environ, extra)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_plan_composes_and_instantiates(variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = _plan(monkeypatch, VARIANTS[variant])
    config = check_like_verl(plan.overrides)
    lay = plan.layout
    megatron = config.actor_rollout_ref.actor.megatron
    assert (megatron.tensor_model_parallel_size, megatron.pipeline_model_parallel_size) == (lay.tp, lay.pp)
    assert (megatron.expert_model_parallel_size, config.actor_rollout_ref.rollout.tensor_model_parallel_size) == (lay.ep, lay.gen_tp)
    assert megatron.vanilla_mbridge is False
    assert config.actor_rollout_ref.actor.checkpoint.strict is (plan.settings.export_strict)
    assert config.trainer.project_name == plan.settings.project_name  # strings stay strings
    assert config.trainer.default_local_dir.startswith(str(plan.settings.checkpoint_dir))
    env_vars = config.ray_kwargs.ray_init.runtime_env.env_vars
    assert all(isinstance(v, str) for v in env_vars.values())
    assert "expandable_segments:True" not in env_vars.get(plan.allocator.variable, "")


#: What verl must write at a save and read back at a resume for the resumed run to be the one that would have
#: happened (tests/e2e/test_resume.py proves it on CPU): the weights, the optimizer (Adam's moments and step, the
#: LR schedule) and the RNG states; verl writes the dataloader's position (data.pt) at every save on its own.
LOSSLESS_RESUME = {"model", "optimizer", "extra"}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_plan_saves_and_loads_what_a_lossless_resume_needs(variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """checkpoint.save_contents and load_contents (verl reads load_contents, which follows save_contents unless
    set), and the LR schedule: verl 0.9.1 restores the scheduler's state only with use_checkpoint_opt_param_scheduler."""
    actor = check_like_verl(_plan(monkeypatch, VARIANTS[variant]).overrides).actor_rollout_ref.actor
    assert LOSSLESS_RESUME <= set(actor.checkpoint.save_contents), actor.checkpoint.save_contents
    assert LOSSLESS_RESUME <= set(actor.checkpoint.load_contents), actor.checkpoint.load_contents
    assert actor.optim.use_checkpoint_opt_param_scheduler is True


def test_user_overrides_compose_too(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = _plan(monkeypatch, {"DEVICE": "gpu"}, ("actor_rollout_ref.actor.optim.lr=3e-6", "trainer.total_training_steps=7"))
    config = check_like_verl(plan.overrides)
    assert config.actor_rollout_ref.actor.optim.lr == 3e-6 and config.trainer.total_training_steps == 7


def test_upstreams_removed_grad_offload_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can fail: upstream's script passes a key verl 0.9.1 no longer has."""
    plan = _plan(monkeypatch, {"DEVICE": "gpu"})
    with pytest.raises(Exception, match="grad_offload"):
        check_like_verl([*plan.overrides, "actor_rollout_ref.actor.megatron.grad_offload=True"])


def test_a_mistyped_plus_key_is_caught_by_the_dataclass(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = _plan(monkeypatch, {"DEVICE": "gpu"})
    with pytest.raises(Exception, match="strictt"):
        check_like_verl([*plan.overrides, "+actor_rollout_ref.actor.checkpoint.strictt=False"])
