"""`PROFILE=smoke run` end to end with the stand-in trainer (tests/unit/runtools): one variable is enough."""

from __future__ import annotations

from pathlib import Path

from recipe.launch import override_value
from recipe.smoke import SmokeAssets
from recipe.smoke.profile import SMOKE_ASSETS_DIRNAME

from ..runtools import cli, recorded, run_environment


def test_profile_smoke_runs_the_trainer_on_its_own_model_and_data(built: SmokeAssets, tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    # The session's build, where `run` builds it: `run` reuses a build whose manifest matches.
    (checkpoints / SMOKE_ASSETS_DIRNAME).symlink_to(built.root, target_is_directory=True)
    env = run_environment(tmp_path, tmp_path / "unused", PROFILE="smoke", DEVICE="gpu",
                          CHECKPOINT_DIR=str(checkpoints))
    for name in ("MODEL_PATH", "TRAIN_FILES", "VAL_FILES", "PROJECT_NAME", "EXPERIMENT_NAME"):
        env.pop(name)
    done = cli(["run"], env)
    assert done.returncode == 0, done.stderr
    assets = checkpoints / SMOKE_ASSETS_DIRNAME
    assert f"Preparing the smoke model and data in {assets}" in done.stdout
    argv = recorded(tmp_path)["argv"]  # type: ignore[index]
    assert override_value(argv, "actor_rollout_ref.model.path") == str(assets / "model")
    assert override_value(argv, "data.train_files") == str(assets / "data" / "train.parquet")
    assert override_value(argv, "trainer.total_training_steps") == "3"
    assert override_value(argv, "trainer.resume_mode") == "disable"
    assert override_value(argv, "trainer.n_gpus_per_node") == "1"
