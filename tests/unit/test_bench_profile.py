"""PROFILE=bench: the real model and layout, a few steps of synthetic prompts with fixed lengths, and the run report."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import pytest

from recipe.bench import BENCH_STEPS, row_counts, write_bench_data
from recipe.bench.data import IMAGE_SIZE, QUESTION
from recipe.launch import override_value
from recipe.plan import build_plan

from .envtools import settings_of
from .runtools import cli, layout_of_one, recorded, run_environment


def _plan(**values: object):  # type: ignore[no-untyped-def]
    return build_plan(settings_of(DEVICE="gpu", **values), environ={})


def test_the_bench_plan_is_the_full_plan_on_synthetic_prompts_of_fixed_lengths() -> None:
    bench, full = _plan(PROFILE="bench"), _plan()
    assert bench.layout == full.layout and bench.settings.model_path == full.settings.model_path
    values = {key: override_value(bench.overrides, key) for key in (
        "trainer.total_training_steps", "trainer.resume_mode", "actor_rollout_ref.rollout.ignore_eos", "trainer.save_freq",
        "trainer.test_freq", "trainer.val_before_train", "trainer.experiment_name", "data.train_files")}  # fmt: skip
    assert values == {
        "trainer.total_training_steps": str(BENCH_STEPS), "trainer.resume_mode": "disable",
        "actor_rollout_ref.rollout.ignore_eos": "True", "trainer.save_freq": "-1", "trainer.test_freq": "-1",
        "trainer.val_before_train": "False", "trainer.experiment_name": "qwen3_5_35b_megatron_bench",
        "data.train_files": "/checkpoints/bench-data/train.parquet",
    }  # fmt: skip
    # Everything else is the full plan's: the bench measures the run it stands for. Its own experiment name moves
    # the checkpoint root and TensorBoard's directory, away from the real run's.
    changed = {o.split("=", 1)[0] for o in set(bench.overrides) ^ set(full.overrides)}
    assert changed == {"trainer.total_training_steps", "trainer.resume_mode", "actor_rollout_ref.rollout.ignore_eos",
                       "trainer.save_freq", "trainer.test_freq", "trainer.experiment_name", "trainer.total_epochs",
                       "data.train_files", "data.val_files", "trainer.default_local_dir",
                       "+ray_kwargs.ray_init.runtime_env.env_vars.TENSORBOARD_DIR"}  # fmt: skip
    assert bench.data is not None and f"{32 * BENCH_STEPS} synthetic train rows" in bench.data
    assert "resume" in bench.to_text() and "starts fresh" in bench.to_text()


def test_the_users_settings_and_overrides_win() -> None:
    plan = build_plan(settings_of(DEVICE="gpu", PROFILE="bench", SAVE_FREQ=2, TRAIN_BATCH_SIZE=8), environ={},
                      extra_overrides=["trainer.total_training_steps=2"])  # fmt: skip
    assert override_value(plan.overrides, "trainer.save_freq") == "2"
    assert plan.data is not None and plan.data.startswith("16 synthetic train rows (2 step(s) of TRAIN_BATCH_SIZE")
    elsewhere = _plan(PROFILE="bench", TRAIN_FILES="/data/mine/train.parquet")
    assert elsewhere.data is None


@pytest.mark.parametrize(
    ("train_files", "ours"),
    [
        ("{ck}/bench-data/train.parquet", True),  # the profile's own
        ("{ck}/mine/train.parquet", False),  # a user's file under CHECKPOINT_DIR: never replaced by synthetic rows
        ("{ck}/bench-data-old/train.parquet", False),  # a sibling whose name starts the same
        ("{ck}/train.parquet", False),
    ],
)
def test_only_the_profiles_own_folder_is_bench_data_not_a_users_files_under_checkpoint_dir(
    tmp_path: Path, train_files: str, ours: bool
) -> None:
    """Issue 52: `run` writes synthetic rows only where the plan's training file is under CHECKPOINT_DIR/bench-data."""
    from recipe.bench import bench_rows

    path = Path(train_files.format(ck=tmp_path))
    assert (bench_rows(path, tmp_path, 4, 2) is not None) is ours


def test_one_prompt_a_step_is_refused_by_name() -> None:
    from recipe.errors import RecipeConfigError

    from recipe.smoke import shipped_model_dir

    # DP=1 takes any batch; the smoke model fits one device.
    one = {"TP": 1, "PP": 1, "CP": 1, "EP": 1, "ETP": 1, "GEN_TP": 1, "NDEVICES_PER_NODE": 1, "MODEL_PATH": shipped_model_dir()}
    with pytest.raises(RecipeConfigError) as refused:
        _plan(PROFILE="bench", TRAIN_BATCH_SIZE=1, **one)
    assert [line[:60] for line in refused.value.problems] == ["TRAIN_BATCH_SIZE=1: PROFILE=bench needs 2 prompts a step or "]
    assert _plan(PROFILE="bench", TRAIN_BATCH_SIZE=2, **one).data is not None
    assert _plan(TRAIN_BATCH_SIZE=1, **one).data is None  # the full profile takes one prompt a step


def test_the_prompts_are_geo3k_rows_each_with_its_own_image(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets", reason="the bench data are written with datasets (the trainer extra)")
    from PIL import Image

    train, test = write_bench_data(tmp_path, *row_counts(3, 2))
    rows = datasets.Dataset.from_parquet(str(train)).to_list()
    assert len(rows) == 6 and len(datasets.Dataset.from_parquet(str(test))) == 3
    pictures = [row["images"][0]["bytes"] for row in rows]
    assert len(set(pictures)) == 6
    assert {Image.open(io.BytesIO(p)).size for p in pictures} == {(IMAGE_SIZE, IMAGE_SIZE)}
    assert all(row["data_source"] == "hiyouga/geometry3k" and QUESTION in row["prompt"][0]["content"] for row in rows)
    assert [row["reward_model"]["ground_truth"] for row in rows] == [str(i) for i in range(6)]
    # Neighbouring rows differ in length: a batch of equal lengths crashes verl 0.9.1's VLM update (recipe.bench.data).
    lengths = [len(row["prompt"][0]["content"]) for row in rows]
    assert all(a != b for a, b in zip(lengths, lengths[1:])), lengths
    again = write_bench_data(tmp_path / "again", *row_counts(3, 2))[0]
    assert hashlib.sha256(again.read_bytes()).digest() == hashlib.sha256(train.read_bytes()).digest()


def test_run_writes_the_prompts_trains_on_them_and_reports(tmp_path: Path, model: Path) -> None:
    env = run_environment(tmp_path, model, **layout_of_one(PROFILE="bench", TRAIN_BATCH_SIZE="2"))
    for name in ("TRAIN_FILES", "VAL_FILES", "EXPERIMENT_NAME"):
        env.pop(name)  # the profile's own
    done = cli(["run"], env)
    assert done.returncode == 0, done.stderr
    data = tmp_path / "checkpoints" / "bench-data"
    argv = (recorded(tmp_path) or {})["argv"]
    assert f"data.train_files='{data / 'train.parquet'}'" in argv and "actor_rollout_ref.rollout.ignore_eos=True" in argv
    import datasets

    assert len(datasets.Dataset.from_parquet(str(data / "train.parquet"))) == 2 * BENCH_STEPS
    report = tmp_path / "checkpoints" / "p" / "qwen3_5_35b_megatron_bench" / "run-report.json"
    assert json.loads(report.read_text())["outcome"] == "finished"
    assert "run report (" in done.stdout
