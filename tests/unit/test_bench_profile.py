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

    train, test = write_bench_data(tmp_path / "bench-data" / "new", *row_counts(3, 2))  # folders made as needed
    assert (train, test) == (tmp_path / "bench-data" / "new" / "train.parquet", tmp_path / "bench-data" / "new" / "test.parquet")
    from recipe.data.specs import SPECS, output_features

    assert datasets.Dataset.from_parquet(str(train)).features == output_features(SPECS["geo3k"])  # geo3k's schema
    tests = datasets.Dataset.from_parquet(str(test)).to_list()
    assert [(row["extra_info"]["split"], row["extra_info"]["index"], row["reward_model"]["ground_truth"])
            for row in tests] == [("test", 6, "6"), ("test", 7, "7"), ("test", 8, "8")]  # after the train rows' numbers
    rows = datasets.Dataset.from_parquet(str(train)).to_list()
    assert {row["extra_info"]["split"] for row in rows} == {"train"}
    assert len(rows) == 6 and len(datasets.Dataset.from_parquet(str(test))) == 3
    pictures = [row["images"][0]["bytes"] for row in rows]
    assert len(set(pictures)) == 6
    assert {Image.open(io.BytesIO(p)).size for p in pictures} == {(IMAGE_SIZE, IMAGE_SIZE)}
    assert all(row["data_source"] == "hiyouga/geometry3k" and QUESTION in row["prompt"][0]["content"] for row in rows)
    assert [row["reward_model"]["ground_truth"] for row in rows] == [str(i) for i in range(6)]
    # Neighbouring rows differ in length: a batch of equal lengths crashes verl 0.9.1's VLM update (recipe.bench.data).
    lengths = [len(row["prompt"][0]["content"]) for row in rows]
    assert all(a != b for a, b in zip(lengths, lengths[1:])), lengths
    assert write_bench_data(tmp_path / "bench-data" / "new", 1, 1)[0] == train  # a second run writes over its own
    assert len(datasets.Dataset.from_parquet(str(train))) == 1
    train = write_bench_data(tmp_path / "first", *row_counts(3, 2))[0]
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


def test_the_profiles_settings_and_overrides_in_full() -> None:
    """Every default the bench profile fills, and its own overrides, as docs/performance.md states them."""
    from recipe.bench import BENCH_SETTINGS, bench_overrides

    assert dict(BENCH_SETTINGS) == {"SAVE_FREQ": -1, "TEST_FREQ": -1, "TOTAL_EPOCHS": 1,
                                    "EXPERIMENT_NAME": "qwen3_5_35b_megatron_bench"}  # fmt: skip
    assert bench_overrides() == ["trainer.total_training_steps=4", "trainer.resume_mode=disable",
                                 "actor_rollout_ref.rollout.ignore_eos=True"]  # fmt: skip
    assert BENCH_STEPS == 4


def test_the_plans_line_about_the_bench_data_in_full() -> None:
    from recipe.bench import bench_data_note

    assert bench_data_note(3, 6, 2) == (
        "6 synthetic train rows (3 step(s) of TRAIN_BATCH_SIZE prompts) and 2 test rows in geo3k's layout (written by "
        "run, nothing downloaded): a fixed question (0-7 filler sentences, so that no batch has one length) and a "
        "448x448 image of its own in every prompt; every response exactly data.max_response_length tokens "
        "(ignore_eos); no validation, no checkpoint unless SAVE_FREQ asks; the run report at the end"
    )


@pytest.mark.parametrize(("batch", "steps", "rows"), [(1, 4, (4, 1)), (8, 2, (16, 8)), (9, 3, (27, 8)), (32, 4, (128, 8))])
def test_train_rows_are_a_batch_a_step_and_test_rows_at_most_eight(batch: int, steps: int, rows: tuple[int, int]) -> None:
    assert row_counts(batch, steps) == rows


def test_the_bench_data_lie_under_checkpoint_dir_in_their_own_folder(tmp_path: Path) -> None:
    from recipe.bench import bench_data_dir, bench_rows

    assert bench_data_dir(tmp_path) == tmp_path / "bench-data"
    assert bench_data_dir(str(tmp_path)) == tmp_path / "bench-data"  # type: ignore[arg-type]
    assert bench_rows(tmp_path / "bench-data" / "train.parquet", tmp_path, 3, 5) == (15, 3)


@pytest.mark.parametrize("index", [0, 1, 7, 8, 9, 17])
def test_a_row_asks_its_filler_index_mod_8_times_and_its_answer_is_its_number(index: int) -> None:
    """Row i of a split, as prepare-data geo3k writes a row: one image, the question, i mod 8 filler sentences, the
    row's number as the answer; the cycle's edges (7, 8, 9) included."""
    from recipe.bench.data import FILLER, bench_row

    row = bench_row(index, "test")
    question = QUESTION + FILLER * (index % 8)
    assert row["extra_info"] == {"split": "test", "index": index, "answer": str(index), "question": "<image>" + question}
    assert row["prompt"][0]["content"].startswith("<image>" + question + " ")
    assert row["reward_model"] == {"style": "rule", "ground_truth": str(index)}
    assert len(row["images"]) == 1 and row["images"][0]["bytes"][:8] == b"\x89PNG\r\n\x1a\n"


def test_the_picture_is_a_grey_grid_on_white_with_the_rows_number_in_black() -> None:
    from PIL import Image

    from recipe.bench.data import _picture

    image = Image.open(io.BytesIO(_picture(5))).convert("RGB")
    assert image.size == (IMAGE_SIZE, IMAGE_SIZE)
    assert image.getpixel((0, 5)) == image.getpixel((5, 0)) == image.getpixel((32, 7)) == image.getpixel((7, 416))
    assert image.getpixel((32, 7)) == (200, 200, 200) and image.getpixel((31, 7)) == (255, 255, 255)
    assert image.getpixel((16, 448 - 1)) == (255, 255, 255)  # the last line is at 416: 448 is past the edge
    number = [image.getpixel((x, y)) for x in range(149, 170) for y in range(224, 240)]
    assert min(number)[0] < 100  # the number (anti-aliased black), drawn at (149, 224)
    assert image.getpixel((32, 0)) == image.getpixel((0, 32)) == (200, 200, 200)  # the lines run edge to edge
    raw = image.tobytes()
    assert raw[0::3] == raw[1::3] == raw[2::3]  # grey everywhere: black text on grey and white, no colour
    assert min(image.getpixel((x, y)) for x in range(33, 63) for y in range(33, 63)) == (255, 255, 255)
    assert _picture(5) == _picture(5) != _picture(6)


@pytest.mark.parametrize("profile", ["bench", "BENCH", "smoke", "Smoke"])
def test_a_profiles_defaults_fill_only_what_is_unset_under_checkpoint_dir_or_its_default(profile: str, tmp_path: Path) -> None:
    """PROFILE in any case; the data (and the smoke model) under CHECKPOINT_DIR when set, else under the default one;
    a value the user set wins; the user's data dict is left as it was."""
    from recipe.profiles import profile_defaults

    data = {"profile": profile, "save_freq": 7}
    filled = profile_defaults(data, tmp_path / "default")
    assert data == {"profile": profile, "save_freq": 7} and filled["save_freq"] == 7 and filled["total_epochs"] == 1
    under = tmp_path / "default" / ("bench-data" if profile.lower() == "bench" else "smoke-assets")
    if profile.lower() == "bench":
        assert (filled["train_files"], filled["val_files"]) == (under / "train.parquet", under / "test.parquet")
        assert (filled["test_freq"], filled["experiment_name"]) == (-1, "qwen3_5_35b_megatron_bench")
        assert "model_path" not in filled  # the bench measures the user's model
    else:
        assert (filled["model_path"], filled["train_files"], filled["val_files"]) == (
            under / "model", under / "data" / "train.parquet", under / "data" / "test.parquet")
    chosen = profile_defaults({"profile": profile, "checkpoint_dir": str(tmp_path / "ck")}, tmp_path / "default")
    assert str(chosen["train_files"]).startswith(str(tmp_path / "ck" / under.name))


@pytest.mark.parametrize("profile", [None, "full", "", "benchmark"])
def test_no_profile_or_full_fills_nothing(profile: str | None, tmp_path: Path) -> None:
    from recipe.profiles import profile_defaults, profile_overrides, profile_problems

    data = {} if profile is None else {"profile": profile}
    assert profile_defaults(data, tmp_path) is data
    assert profile_overrides(profile or "full") == [] and profile_problems(profile or "full", 1) == []


def test_each_profiles_overrides_and_the_bench_refusal_in_full() -> None:
    from recipe.bench import bench_overrides
    from recipe.profiles import profile_overrides, profile_problems
    from recipe.smoke import smoke_overrides

    assert profile_overrides("bench") == bench_overrides() and profile_overrides("smoke") == smoke_overrides()
    assert profile_problems("bench", 2) == [] and profile_problems("smoke", 1) == []
    assert profile_problems("bench", 1) == [
        "TRAIN_BATCH_SIZE=1: PROFILE=bench needs 2 prompts a step or more; with one, every sequence of the batch has "
        "the same length (fixed responses), which crashes verl 0.9.1's update of a VLM (docs/performance.md)"
    ]
