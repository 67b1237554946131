"""The run's inputs: the smoke profile's own assets, built by the recipe where `run` builds them.

`entrypoint.py run` with PROFILE=smoke builds the tiny Qwen3.5-MoE VLM, its tokenizer and the
arithmetic data under `$CHECKPOINT_DIR/smoke-assets/` before it starts the trainer
(recipe.smoke.prepare_smoke_assets); `plan` only names those paths. The harness runs the
trainer itself, so it builds them the same way, in the same place.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Assets:
    """Where the model and the data are."""

    model: Path
    train_file: Path
    val_file: Path


def build_assets(checkpoint_dir: Path) -> Assets:
    """The smoke profile's assets for a run with this CHECKPOINT_DIR (reused when already built)."""
    from recipe.smoke import assets_root, prepare_smoke_assets

    built = prepare_smoke_assets(assets_root(checkpoint_dir))
    return Assets(built.model_path, built.train_file, built.val_file)
