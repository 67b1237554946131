"""The folders and files the recipe creates, found as something else: one line each, exit 2, in `plan` and `run`.

Issue 50, class 3. Generated cases plant a file, a FIFO, a dangling or looping link, a directory (where a file
goes) or an unwritable folder at one of the paths a plan creates (recipe.own_paths lists them per profile), on
the real file system, and `plan` (build_plan, in process) must refuse with exactly one line naming the path and
the setting that places it. The issue's own examples (PROFILE=bench with CHECKPOINT_DIR/bench-data a file or a
dangling link, which `plan` passed and `run` died on with a FileExistsError traceback) go through the real CLI.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings as hypothesis_settings, strategies as st

from recipe.errors import RecipeConfigError
from recipe.own_paths import own_paths
from recipe.plan import build_plan

from .envtools import settings_of

#: What is planted where a folder goes, and where a file goes.
FOLDER_PLANTS = ("file", "fifo", "dangling link", "looping link", "link to a file", "unwritable folder")
FILE_PLANTS = ("directory", "fifo", "link to a fifo", "dangling link")
#: What the refusal says the path is, per plant.
SAID = {
    "file": "a regular file, not a directory", "fifo": "a FIFO", "dangling link": "a link that leads nowhere",
    "looping link": "a link that leads nowhere", "link to a file": "a link to a regular file, not a directory",
    "unwritable folder": f"a directory that uid {os.getuid()} cannot write into", "directory": "a directory, where the run writes",
    "link to a fifo": "a link to a FIFO, where the run writes",
}  # fmt: skip


def _settings(tmp: Path, model: Path, profile: str):  # type: ignore[no-untyped-def]
    one = {"TP": 1, "GEN_TP": 1, "EP": 1, "NDEVICES_PER_NODE": 1, "TRAIN_BATCH_SIZE": 2}
    return settings_of(DEVICE="gpu", PROFILE=profile, MODEL_PATH=str(model), CHECKPOINT_DIR=str(tmp / "ck"), **one)


def _plant(path: Path, what: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if what == "file":
        path.write_text("x")
    elif what == "fifo":
        os.mkfifo(path)
    elif what == "dangling link":
        path.symlink_to(path.parent / "nowhere")
    elif what == "looping link":
        path.symlink_to(path)
    elif what == "link to a file":
        (path.parent / "a-file").write_text("x")
        path.symlink_to(path.parent / "a-file")
    elif what == "directory":
        path.mkdir()
    elif what == "link to a fifo":  # a link to a FIFO: verl's open() would follow it and wait
        os.mkfifo(path.parent / "a-fifo")
        path.symlink_to(path.parent / "a-fifo")
    elif what == "unwritable folder":
        path.mkdir()
        # Root writes anywhere; an immutable folder it cannot (ext4's attribute, which access(2) honours for root).
        if subprocess.run(["chattr", "+i", str(path)], capture_output=True, check=False).returncode != 0:
            pytest.skip(f"chattr +i {path} failed: this file system cannot make a folder unwritable for uid {os.getuid()}")


def _unplant(path: Path) -> None:
    subprocess.run(["chattr", "-i", str(path)], capture_output=True, check=False)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from recipe.smoke import shipped_model_dir

    directory = tmp_path_factory.mktemp("model")
    shutil.copy(shipped_model_dir() / "config.json", directory / "config.json")
    return directory


@given(profile=st.sampled_from(["full", "smoke", "bench"]), index=st.integers(0, 20), data=st.data())
@example(profile="bench", index=-1, data=None)  # the issue's: bench-data a file
@hypothesis_settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_path_of_ours_that_is_something_else_is_one_line_of_plan(
    profile: str, index: int, data: st.DataObject | None, tmp_path_factory: pytest.TempPathFactory, model: Path
) -> None:
    tmp = tmp_path_factory.mktemp("own")
    settings = _settings(tmp, model, profile)
    control = build_plan(settings, {})  # nothing planted: the plan builds
    ours = own_paths(settings, control.overrides, control.env)
    own = ours[index % len(ours)]
    plants = FOLDER_PLANTS if own.directory else FILE_PLANTS
    what = data.draw(st.sampled_from(plants)) if data is not None else "file"
    if own.path == settings.checkpoint_dir and what == "unwritable folder":
        what = "file"  # an immutable CHECKPOINT_DIR also stops the test's own clean-up of what is below it
    _plant(own.path, what)
    if not own.directory and "link" in what and not own.opened_by_verl:
        # The recipe's own files are written atomically: a link planted there is replaced, never followed.
        assert build_plan(settings, {}).overrides == control.overrides
        return
    try:
        with pytest.raises(RecipeConfigError) as refused:
            build_plan(settings, {})
    finally:
        _unplant(own.path)
    lines = [line for line in refused.value.problems if str(own.path) in line]
    assert len(lines) == 1, (own, what, refused.value.problems)
    assert lines[0].startswith(f"{own.setting}: {own.role}, {own.path} is {SAID[what]}") and "\n" not in lines[0]
    assert lines[0].endswith("; move it away or choose another place")
    assert len(refused.value.problems) == 1, refused.value.problems


@pytest.mark.parametrize(
    ("profile", "suffix", "what"),
    [
        ("full", "ck/grpo_qwen3_5_35b_geo3k/qwen3_5_35b_megatron", "unwritable folder"),
        ("full", "ck/tensorboard/grpo_qwen3_5_35b_geo3k/qwen3_5_35b_megatron", "looping link"),
        ("full", "ck/grpo_qwen3_5_35b_geo3k/qwen3_5_35b_megatron/run-record.json", "directory"),
        ("smoke", "ck/smoke-assets", "dangling link"),
        ("smoke", "ck/grpo_recipe_smoke/qwen3_5_moe_tiny/smoke-metrics.jsonl", "link to a fifo"),  # verl would wait on it
        ("smoke", "ck/grpo_recipe_smoke/qwen3_5_moe_tiny/smoke-metrics.jsonl", "dangling link"),  # verl writes through
        ("bench", "ck/bench-data", "fifo"),
        ("bench", "ck", "link to a file"),
    ],
)
def test_named_edges_are_refused(tmp_path: Path, model: Path, profile: str, suffix: str, what: str) -> None:
    settings = _settings(tmp_path, model, profile)
    _plant(tmp_path / suffix, what)
    try:
        with pytest.raises(RecipeConfigError) as refused:
            build_plan(settings, {})
    finally:
        _unplant(tmp_path / suffix)
    assert len(refused.value.problems) == 1 and f"{tmp_path / suffix} is {SAID[what]}" in refused.value.problems[0], refused.value.problems


def test_each_profile_lists_the_paths_its_run_creates(tmp_path: Path, model: Path) -> None:
    """The list the check walks: what `run` and verl create (a path missing here would go unchecked)."""
    root = tmp_path / "ck" / "p" / "e"
    listed = {}
    for profile in ("full", "smoke", "bench"):
        settings = _settings(tmp_path, model, profile).model_copy(update={"project_name": "p", "experiment_name": "e"})
        plan = build_plan(settings, {})
        listed[profile] = {str(own.path.relative_to(tmp_path / "ck")) for own in own_paths(settings, plan.overrides, plan.env)}
    common = {".", "p/e", "p/e/run-record.json", "p/e/run-report.json", "tensorboard/p/e"}
    assert listed["full"] == common
    assert listed["smoke"] == common | {"smoke-assets", "p/e/smoke-verdict.json", "p/e/smoke-metrics.jsonl"}
    assert listed["bench"] == common | {"bench-data"}
    assert root.parent.parent == tmp_path / "ck"


@pytest.mark.parametrize("what", ["file", "dangling link"])
def test_bench_data_that_is_a_file_or_a_dangling_link_stops_plan_and_run_with_one_line(
    tmp_path: Path, model: Path, what: str
) -> None:
    """The issue's example through the real CLI: `plan` passed, and `run` died with a FileExistsError traceback."""
    from .runtools import cli, layout_of_one, recorded, run_environment

    env = run_environment(tmp_path, model, **layout_of_one(PROFILE="bench", TRAIN_BATCH_SIZE="2"))
    for name in ("TRAIN_FILES", "VAL_FILES", "EXPERIMENT_NAME"):
        env.pop(name)  # the profile's own
    bench_data = Path(env["CHECKPOINT_DIR"]) / "bench-data"
    _plant(bench_data, what)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    for command in (["plan"], ["run"]):
        done = cli(command, env)
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        lines = [line for line in done.stderr.splitlines() if str(bench_data) in line]
        assert len(lines) == 1 and "the bench data" in lines[0], done.stderr
        assert "Traceback" not in done.stderr
    assert recorded(tmp_path) is None and sorted(str(p) for p in tmp_path.rglob("*")) == before
