"""PROFILE=smoke through build_plan: its settings and overrides, in the recipe's plan, compose against verl 0.9.1."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.support.needs import needs

from recipe.plan import build_plan
from recipe.settings import Settings, load_settings
from recipe.smoke import SMOKE_DEFAULTS, SMOKE_STEPS, SmokeAssets, smoke_overrides
from recipe.smoke.profile import SMOKE_ASSETS_DIRNAME

from ..envtools import clear_settings


def test_every_default_is_a_valid_recipe_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_settings(monkeypatch)
    fields = {name.upper() for name in Settings.model_fields}
    assert set(SMOKE_DEFAULTS) <= fields
    settings = Settings(**{name.lower(): value for name, value in SMOKE_DEFAULTS.items()})
    assert settings.save_freq == settings.test_freq == SMOKE_STEPS


def test_overrides_are_plain_keys_set_once() -> None:
    """No `+`: every key must already exist in verl's config, so a typo fails to compose."""
    keys = [text.split("=", 1)[0] for text in smoke_overrides()]
    assert not any(key.startswith(("+", "~")) for key in keys)
    assert len(keys) == len(set(keys))


verl = needs("verl", install="needs the trainer extra: pip install -e '.[trainer]' (CI installs it)")
pytestmark = pytest.mark.verl

from ..test_verl_compose import check_like_verl, compose_trainer_config  # noqa: E402


def smoke_plan(monkeypatch: pytest.MonkeyPatch, device: str, assets: SmokeAssets, tmp_path: Path) -> Any:
    """The plan of `PROFILE=smoke DEVICE=<device>` and nothing else, as a user starts it.

    CHECKPOINT_DIR/smoke-assets is the session's one build (a link), so the profile's own
    defaults point at a built model and data.
    """
    clear_settings(monkeypatch)
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    (checkpoints / SMOKE_ASSETS_DIRNAME).symlink_to(assets.root, target_is_directory=True)
    for name, value in {"PROFILE": "smoke", "DEVICE": device, "CHECKPOINT_DIR": str(checkpoints)}.items():
        monkeypatch.setenv(name, value)
    return build_plan(load_settings(), os.environ)


@pytest.mark.parametrize("device", ["gpu", "npu"])
def test_the_smoke_plan_composes_and_instantiates(
    device: str, built: SmokeAssets, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    plan = smoke_plan(monkeypatch, device, built, tmp_path)
    # The layout is checked against the tiny model's own config.json, not the 35B profile.
    assert plan.model.architecture.num_experts == 8 and plan.model.source.endswith("config.json")
    assert plan.settings.model_path == tmp_path / "checkpoints" / SMOKE_ASSETS_DIRNAME / "model"
    assert (plan.layout.world_size, plan.layout.dp) == (1, 1)
    # The plan's own overrides, exactly what `run` passes to the trainer.
    config = check_like_verl(plan.overrides)
    trainer, data = config.trainer, config.data
    assert trainer.total_training_steps == 3 and trainer.save_freq == 3
    assert trainer.test_freq == 3 and trainer.resume_mode == "disable"
    assert (trainer.n_gpus_per_node, trainer.nnodes) == (1, 1)
    assert (data.max_prompt_length, data.max_response_length) == (256, 64)
    assert data.train_batch_size == 4 and config.actor_rollout_ref.rollout.n == 4
    assert data.train_files == str(tmp_path / "checkpoints" / SMOKE_ASSETS_DIRNAME / "data" / "train.parquet")
    megatron = config.actor_rollout_ref.actor.megatron
    sizes = (
        megatron.tensor_model_parallel_size,
        megatron.pipeline_model_parallel_size,
        megatron.context_parallel_size,
        megatron.expert_model_parallel_size,
        megatron.expert_tensor_parallel_size,
        config.actor_rollout_ref.rollout.tensor_model_parallel_size,
    )
    assert sizes == (1, 1, 1, 1, 1, 1)
    assert megatron.param_offload is False and megatron.optimizer_offload is False
    # The path under test is the real one: Megatron-Bridge export, lenient, with HF weights.
    assert megatron.vanilla_mbridge is False and config.actor_rollout_ref.actor.checkpoint.strict is False
    assert "hf_model" in config.actor_rollout_ref.actor.checkpoint.save_contents
    assert config.actor_rollout_ref.rollout.gpu_memory_utilization == 0.3


def test_the_smoke_steps_fit_the_data(built: SmokeAssets) -> None:
    """3 steps of TRAIN_BATCH_SIZE prompts must exist in one epoch, or verl stops early."""
    import pyarrow.parquet as pq

    assert pq.read_metadata(built.train_file).num_rows >= SMOKE_STEPS * int(SMOKE_DEFAULTS["TRAIN_BATCH_SIZE"])


def test_a_smoke_override_for_a_missing_key_would_fail() -> None:
    """The composition check can fail: a plain key verl does not have is refused."""
    with pytest.raises(Exception, match="total_training_stepz"):
        compose_trainer_config(["model_engine=megatron", "trainer.total_training_stepz=3"])
