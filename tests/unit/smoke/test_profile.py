"""PROFILE=smoke's numbers are the ones docs/smoke.md promises (direct calls; the composition against verl is
test_profile_compose.py's)."""

from __future__ import annotations

from pathlib import Path

from recipe.hydra_text import hydra_value
from recipe.smoke import reward
from recipe.smoke.profile import SMOKE_DEFAULTS, VERDICT_FILE, assets_root, smoke_overrides


def _overrides() -> dict[str, str]:
    return dict(text.split("=", 1) for text in smoke_overrides())


def test_the_run_is_what_the_docs_describe() -> None:
    # docs/smoke.md, "Runs the recipe's normal GRPO launch with smaller numbers": one device, 4 prompts x 4
    # responses, no offload, saves and validates once at step 3.
    assert {name: SMOKE_DEFAULTS[name] for name in ("TP", "PP", "CP", "EP", "ETP", "GEN_TP", "NDEVICES_PER_NODE")} == dict.fromkeys(
        ("TP", "PP", "CP", "EP", "ETP", "GEN_TP", "NDEVICES_PER_NODE"), 1
    )
    assert (SMOKE_DEFAULTS["TRAIN_BATCH_SIZE"], SMOKE_DEFAULTS["ROLLOUT_N"], SMOKE_DEFAULTS["OFFLOAD"]) == (4, 4, False)
    assert SMOKE_DEFAULTS["SAVE_FREQ"] == SMOKE_DEFAULTS["TEST_FREQ"] == 3 and SMOKE_DEFAULTS["TOTAL_EPOCHS"] == 1
    assert (SMOKE_DEFAULTS["PROJECT_NAME"], SMOKE_DEFAULTS["EXPERIMENT_NAME"]) == ("grpo_recipe_smoke", "qwen3_5_moe_tiny")


def test_the_overrides_are_what_the_docs_describe() -> None:
    overrides = _overrides()
    assert overrides == {
        # The share of digits, a signal random weights get; verl loads it by path and name.
        "reward.custom_reward_function.path": hydra_value(reward.__file__),
        "reward.custom_reward_function.name": "compute_score",
        "trainer.total_training_steps": "3",
        "trainer.resume_mode": "disable",  # a fresh start every time
        "data.max_prompt_length": "256",
        "data.max_response_length": "64",
        "actor_rollout_ref.rollout.gpu_memory_utilization": "0.3",  # 30 % of device memory
        # Fewer of verl's default 8 agent-loop and reward workers: Ray actors that only cost start-up time here.
        "actor_rollout_ref.rollout.agent.num_workers": "2",
        "reward.num_workers": "2",
    }
    assert Path(reward.__file__).name == "reward.py"


def test_assets_and_verdict_live_under_the_checkpoint_volume(tmp_path: Path) -> None:
    assert assets_root(tmp_path) == tmp_path / "smoke-assets"
    assert assets_root(str(tmp_path)) == tmp_path / "smoke-assets"  # type: ignore[arg-type]
    assert VERDICT_FILE == "smoke-verdict.json"
