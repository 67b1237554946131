"""The embedded smoke profile (PROFILE=smoke): the whole stack on one device in minutes, no downloads.

A tiny Qwen3.5-MoE (same architecture family as Qwen3.5-35B-A3B: Gated DeltaNet and
gated attention layers, routed and shared experts, a vision tower) with random weights,
a byte-level tokenizer and an arithmetic dataset, all built offline from files shipped
in this package. Importing this package imports neither torch nor transformers.
"""

from recipe.smoke.prepare import SmokeAssets, prepare_smoke_assets, shipped_model_dir
from recipe.smoke.profile import (
    SMOKE_DEFAULTS,
    SMOKE_LAYOUT,
    SMOKE_SETTINGS,
    SMOKE_STEPS,
    assets_root,
    smoke_overrides,
)

__all__ = [
    "SMOKE_DEFAULTS",
    "SMOKE_LAYOUT",
    "SMOKE_SETTINGS",
    "SMOKE_STEPS",
    "SmokeAssets",
    "assets_root",
    "prepare_smoke_assets",
    "shipped_model_dir",
    "smoke_overrides",
]
