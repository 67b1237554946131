"""The built-in profiles (PROFILE=smoke, PROFILE=bench): their setting defaults and their own Hydra overrides.

`full` has neither. The profiles' contents live in their packages (recipe.smoke, recipe.bench),
imported only when chosen: the smoke profile's import Pillow and datasets. Settings take the
defaults (Settings' validator), the plan takes the overrides.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def profile_defaults(data: dict[str, Any], default_checkpoint_dir: Path) -> dict[str, Any]:
    """`data` (the settings' raw values, lower-case names) with the chosen profile's value for each one left unset."""
    profile = str(data.get("profile", "")).lower()
    if profile not in ("smoke", "bench"):
        return data
    checkpoint_dir = Path(data.get("checkpoint_dir") or default_checkpoint_dir)
    data = dict(data)
    if profile == "bench":
        from recipe.bench import BENCH_SETTINGS, bench_data_dir  # lazy: the bench profile's modules, only with it

        defaults: dict[str, Any] = {name.lower(): value for name, value in BENCH_SETTINGS.items()}
        directory = bench_data_dir(checkpoint_dir)
        defaults |= {"train_files": directory / "train.parquet", "val_files": directory / "test.parquet"}
    else:
        # lazy: the smoke profile's modules import datasets and Pillow; only with PROFILE=smoke
        from recipe.smoke import SMOKE_SETTINGS, SmokeAssets, assets_root

        defaults = {name.lower(): value for name, value in SMOKE_SETTINGS.items()}
        assets = SmokeAssets.under(assets_root(checkpoint_dir))
        defaults |= {"model_path": assets.model_path, "train_files": assets.train_file, "val_files": assets.val_file}
    for name, value in defaults.items():
        data.setdefault(name, value)
    return data


def profile_problems(profile: str, train_batch_size: int) -> list[str]:
    """What the chosen profile cannot run: PROFILE=bench with one prompt a step (recipe.bench.data says why)."""
    if profile == "bench" and train_batch_size < 2:
        return [
            f"TRAIN_BATCH_SIZE={train_batch_size}: PROFILE=bench needs 2 prompts a step or more; with one, every "
            "sequence of the batch has the same length (fixed responses), which crashes verl 0.9.1's update of a "
            "VLM (docs/performance.md)"
        ]
    return []


def profile_overrides(profile: str) -> list[str]:
    """The smoke or bench profile's own Hydra overrides (none for full)."""
    if profile == "bench":
        from recipe.bench import bench_overrides  # lazy: the bench profile's modules, only with PROFILE=bench

        return bench_overrides()
    if profile == "smoke":
        # lazy: the smoke profile's modules import datasets and Pillow; only with PROFILE=smoke
        from recipe.smoke import smoke_overrides

        return smoke_overrides()
    return []
