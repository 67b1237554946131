"""PROFILE=bench: the settings and Hydra overrides of a short measured run on the real model and layout.

Like the smoke profile's (recipe.smoke.profile), `BENCH_SETTINGS` fill the settings the user left
unset, and `bench_overrides()` are the recipe's own overrides for keys no setting decides. What
stays the user's: MODEL_PATH, the layout, TRAIN_BATCH_SIZE, ROLLOUT_N and the lengths
(data.max_prompt_length, data.max_response_length), so the bench measures the run it stands for.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from recipe.bench.data import IMAGE_SIZE, row_counts

#: Steps of a bench run: the first carries the start-up's one-off costs (compilation, first weight sync); the
#: report's medians are over all of them, and each step's row is in run-report.json.
BENCH_STEPS = 4

#: The synthetic data are written under CHECKPOINT_DIR/<this> (the one volume a run must be able to write).
BENCH_DATA_DIRNAME = "bench-data"

#: Run settings of the profile (a value the user sets still wins).
BENCH_SETTINGS: Mapping[str, int | str] = MappingProxyType(
    {
        # No checkpoint and so no HF export: a save of the real model costs minutes and measures the disk.
        # SAVE_FREQ=<steps> asks for one (its time is then the report's "save" phase).
        "SAVE_FREQ": -1,
        "TEST_FREQ": -1,
        "TOTAL_EPOCHS": 1,
        # Its own tracking name, so its checkpoint root, run record and report never touch the real run's.
        "EXPERIMENT_NAME": "qwen3_5_35b_megatron_bench",
    }
)


def bench_data_dir(checkpoint_dir: Path) -> Path:
    """Where `run` writes the bench's synthetic parquet files: CHECKPOINT_DIR/bench-data."""
    return Path(checkpoint_dir) / BENCH_DATA_DIRNAME


def bench_overrides() -> list[str]:
    """Hydra overrides of verl 0.9.1's trainer config for a bench run (every key exists in verl's config)."""
    return [
        f"trainer.total_training_steps={BENCH_STEPS}",
        # Always from step 0, and never from a real run's checkpoint.
        "trainer.resume_mode=disable",
        # Every response is exactly data.max_response_length tokens: the same work in every step and every run
        # (verl passes it to vLLM's SamplingParams, vllm_async_server.py).
        "actor_rollout_ref.rollout.ignore_eos=True",
    ]


def bench_rows(train_file: Path, checkpoint_dir: Path, train_batch_size: int, steps: int) -> tuple[int, int] | None:
    """(train rows, test rows) `run` writes for the bench, or None when the training file is not the bench's own
    (data.train_files points elsewhere: the user's prompts). What `plan` states and what `run` writes, from one place."""
    if not Path(train_file).is_relative_to(bench_data_dir(checkpoint_dir)):
        return None
    return row_counts(train_batch_size, steps)


def bench_data_note(steps: int, train_rows: int, test_rows: int) -> str:
    """What `plan` says of the bench data (recipe.bench.data, written by run) for `steps` steps."""
    return (
        f"{train_rows} synthetic train rows ({steps} step(s) of TRAIN_BATCH_SIZE prompts) and {test_rows} test rows "
        f"in geo3k's layout (written by run, nothing downloaded): a fixed question (0-7 filler sentences, so that no "
        f"batch has one length) and a {IMAGE_SIZE}x{IMAGE_SIZE} image of its own in every prompt; every response exactly data.max_response_length tokens (ignore_eos); "
        "no validation, no checkpoint unless SAVE_FREQ asks; the run report at the end"
    )
