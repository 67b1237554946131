"""`PROFILE=smoke run` end to end with the stand-in trainer (tests/unit/runtools): one variable is enough."""

from __future__ import annotations

import json
from pathlib import Path

from recipe.launch import override_value
from recipe.smoke import SmokeAssets
from recipe.smoke import reward
from recipe.smoke.profile import SMOKE_ASSETS_DIRNAME, VERDICT_FILE

from ..runtools import cli, recorded, run_environment
from .test_verdict import export_of, write_metrics


def _smoke_run(built: SmokeAssets, tmp_path: Path, trained: bool) -> tuple[Path, dict[str, str]]:
    """`run`'s environment for PROFILE=smoke; the stand-in saves step 3 (the build's weights, +1 on one tensor
    when `trained`) and logs the recorded metrics of 3 steps."""
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    # The session's build, where `run` builds it: `run` reuses a build whose manifest matches.
    (checkpoints / SMOKE_ASSETS_DIRNAME).symlink_to(built.root, target_is_directory=True)
    export = export_of(built.model_path, tmp_path / "export", trained)
    metrics = write_metrics(tmp_path / "recorded.jsonl", lambda steps: steps.update({3: dict(steps[2])}))
    env = run_environment(tmp_path, tmp_path / "unused", PROFILE="smoke", DEVICE="gpu", CHECKPOINT_DIR=str(checkpoints))
    for name in ("MODEL_PATH", "TRAIN_FILES", "VAL_FILES", "PROJECT_NAME", "EXPERIMENT_NAME"):
        env.pop(name)
    env |= {"STAND_IN_MODE": "save", "STAND_IN_EXPORT": str(export), "STAND_IN_METRICS": str(metrics)}
    return checkpoints, env


def test_profile_smoke_runs_the_trainer_on_its_own_model_and_data_and_judges_it(
    built: SmokeAssets, tmp_path: Path
) -> None:
    """Every check passes but the image check, which needs the model's processor: Qwen3-VL's imports torchvision,
    which this venv lacks (the images have it, and `doctor` checks it; the e2e's verdict, where it is, passes)."""
    checkpoints, env = _smoke_run(built, tmp_path, trained=True)
    done = cli(["run"], env)
    assert done.returncode == 4, done.stdout + done.stderr
    assets = checkpoints / SMOKE_ASSETS_DIRNAME
    assert f"Preparing the smoke model and data in {assets}" in done.stdout
    argv = recorded(tmp_path)["argv"]  # type: ignore[index]
    assert override_value(argv, "actor_rollout_ref.model.path") == str(assets / "model")
    assert override_value(argv, "data.train_files") == str(assets / "data" / "train.parquet")
    assert override_value(argv, "trainer.total_training_steps") == "3"
    assert override_value(argv, "trainer.resume_mode") == "disable"
    assert override_value(argv, "trainer.n_gpus_per_node") == "1"
    assert override_value(argv, "reward.custom_reward_function.path") == reward.__file__
    assert done.stdout.splitlines()[-1] == "smoke: FAIL"
    assert "PASS  export was trained" in done.stdout and "PASS  vision tower was trained" in done.stdout
    written = json.loads((checkpoints / "grpo_recipe_smoke" / "qwen3_5_moe_tiny" / VERDICT_FILE).read_text())
    assert [check["name"] for check in written["checks"] if not check["passed"]] == ["images reached the rollout"]
    assert len(written["checks"]) == 11
    failed = next(check for check in written["checks"] if not check["passed"])
    assert failed["measured"].startswith("the data's prompts cannot be counted: ImportError:")
    assert "Torchvision" in failed["measured"]


def test_profile_smoke_whose_export_was_never_trained_exits_4_naming_the_check(
    built: SmokeAssets, tmp_path: Path
) -> None:
    checkpoints, env = _smoke_run(built, tmp_path, trained=False)
    done = cli(["run"], env)
    assert done.returncode == 4, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == "smoke: FAIL"
    assert "FAIL  export was trained" in done.stdout
    written = json.loads((checkpoints / "grpo_recipe_smoke" / "qwen3_5_moe_tiny" / VERDICT_FILE).read_text())
    assert written["passed"] is False


def test_profile_smoke_whose_trainer_fails_keeps_the_trainers_code(built: SmokeAssets, tmp_path: Path) -> None:
    _, env = _smoke_run(built, tmp_path, trained=True)
    done = cli(["run"], env | {"STAND_IN_MODE": "exit", "STAND_IN_EXIT": "7"})
    assert done.returncode == 7
    assert "smoke: FAIL (the trainer exited 7" in done.stdout
