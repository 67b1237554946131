"""PROFILE=smoke: the settings and Hydra overrides that shrink the run to a few steps on one device.

The smoke run goes through the same trainer path as the real one (verl's GRPO trainer
on Megatron through Megatron-Bridge, vLLM rollout, checkpoint with the lenient HF
export); only sizes change. `SMOKE_DEFAULTS` are recipe settings (environment names),
used where the user set nothing; `smoke_overrides()` are Hydra overrides for what no
setting decides, added after the recipe's own overrides (the later value of a key wins).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from recipe.hydra_text import hydra_value

#: The smoke model and data are built under CHECKPOINT_DIR/<this> (the one volume a run must be able to write).
SMOKE_ASSETS_DIRNAME = "smoke-assets"

#: GRPO steps of a smoke run; the one checkpoint (with HF export) and validation come at the last.
SMOKE_STEPS = 3

#: One device, no model parallelism: fits every accelerator the recipe supports.
SMOKE_LAYOUT: Mapping[str, int] = MappingProxyType(
    {"TP": 1, "PP": 1, "CP": 1, "EP": 1, "ETP": 1, "GEN_TP": 1, "NDEVICES_PER_NODE": 1}
)

#: Run settings of the profile (a value the user sets still wins).
SMOKE_SETTINGS: Mapping[str, int | bool | str] = MappingProxyType(
    {
        # 4 prompts x 4 responses = 16 samples a step: a real GRPO group, split over DP=1.
        "TRAIN_BATCH_SIZE": 4,
        "ROLLOUT_N": 4,
        "TOTAL_EPOCHS": 1,
        "SAVE_FREQ": SMOKE_STEPS,
        "TEST_FREQ": SMOKE_STEPS,
        # Nothing to gain from offloading a 8M-parameter model; it only adds time.
        "OFFLOAD": False,
        "PROJECT_NAME": "grpo_recipe_smoke",
        "EXPERIMENT_NAME": "qwen3_5_moe_tiny",
    }
)

#: Every default of the profile, by environment name.
SMOKE_DEFAULTS: Mapping[str, int | bool | str] = MappingProxyType({**SMOKE_LAYOUT, **SMOKE_SETTINGS})

#: Prompt and response budgets in tokens. The tokenizer is byte-level (geo3k's instruction is one token of its own):
#: every smoke prompt is 76 tokens with the chat template and its image's 4 (tests/unit/smoke/test_dataset.py), and
#: verl drops a longer prompt without a word (filter_overlong_prompts).
SMOKE_MAX_PROMPT_LENGTH = 256
SMOKE_MAX_RESPONSE_LENGTH = 64


def assets_root(checkpoint_dir: Path) -> Path:
    """Where a smoke run builds its model and data: CHECKPOINT_DIR/smoke-assets."""
    return Path(checkpoint_dir) / SMOKE_ASSETS_DIRNAME


#: The verdict, beside the metrics, for CI systems.
VERDICT_FILE = "smoke-verdict.json"


def smoke_overrides() -> list[str]:
    """Hydra overrides of verl 0.9.1's trainer config for a smoke run (keys no recipe setting decides).

    Every key exists in verl's config (no `+`), so appending them after the recipe's
    overrides replaces the recipe's values.
    """
    from recipe.smoke import reward  # lazy: recipe.smoke imports this module

    return [
        # A reward a random model gets a signal from (recipe/smoke/reward.py): with gsm8k's, every gradient is 0.
        f"reward.custom_reward_function.path={hydra_value(reward.__file__)}",
        f"reward.custom_reward_function.name={reward.FUNCTION}",
        # Stop after SMOKE_STEPS, whatever the dataset size.
        f"trainer.total_training_steps={SMOKE_STEPS}",
        # Always the whole path from step 0: a resumed smoke run would test nothing.
        "trainer.resume_mode=disable",
        f"data.max_prompt_length={SMOKE_MAX_PROMPT_LENGTH}",
        f"data.max_response_length={SMOKE_MAX_RESPONSE_LENGTH}",
        # The rollout's KV cache for 16 short sequences needs little; leaves room on small devices.
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
        # verl starts 8 of each by default: Ray actors that only cost start-up time and host memory here.
        "actor_rollout_ref.rollout.agent.num_workers=2",
        "reward.num_workers=2",
    ]


def smoke_data_note() -> str:
    """What `plan` says of the smoke data (recipe.smoke.arithmetic, built by `run`)."""
    # lazy: the arithmetic data import Pillow and datasets; recipe.smoke.prepare imports this module
    from recipe.smoke.arithmetic import IMAGE_SIZE
    from recipe.smoke.prepare import TEST_ROWS, TRAIN_ROWS

    return (
        f"{TRAIN_ROWS} train and {TEST_ROWS} test rows in geo3k's layout (built by run), an image in every prompt: "
        f"the arithmetic expression drawn at {IMAGE_SIZE}x{IMAGE_SIZE} (4 image tokens), asked about in text"
    )
