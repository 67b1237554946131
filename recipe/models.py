"""The model's architecture numbers that the parallel layout must respect.

Read from the model directory's config.json when it is there (as JSON: no
transformers import on the `plan` path), else a built-in profile of
Qwen3.5-35B-A3B so that `plan` works before the weights are downloaded.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from recipe.errors import RecipeConfigError


@dataclass(frozen=True)
class ModelArchitecture:
    """What Megatron and vLLM divide across devices."""

    name: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    num_experts: int
    moe_ffn_hidden_size: int
    #: Gated DeltaNet (linear attention) heads; 0 for a model without linear attention.
    linear_key_heads: int
    linear_value_heads: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form for `plan --json`."""
        return asdict(self)


#: Qwen3.5-35B-A3B (transformers `qwen3_5_moe`), from its config.json.
QWEN3_5_35B_A3B = ModelArchitecture(
    name="Qwen3.5-35B-A3B",
    num_layers=40,
    num_attention_heads=16,
    num_kv_heads=2,
    num_experts=256,
    moe_ffn_hidden_size=512,
    linear_key_heads=16,
    linear_value_heads=32,
)

# config.json key -> field; the first key present wins (names differ across Qwen MoE families).
_KEYS: dict[str, tuple[str, ...]] = {
    "num_layers": ("num_hidden_layers",),
    "num_attention_heads": ("num_attention_heads",),
    "num_kv_heads": ("num_key_value_heads",),
    "num_experts": ("num_experts", "num_local_experts", "n_routed_experts"),
    "moe_ffn_hidden_size": ("moe_intermediate_size",),
    "linear_key_heads": ("linear_num_key_heads",),
    "linear_value_heads": ("linear_num_value_heads",),
}
_OPTIONAL = {"linear_key_heads", "linear_value_heads"}


@dataclass(frozen=True)
class ModelSource:
    """The architecture in use and where it was read from."""

    architecture: ModelArchitecture
    source: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form for `plan --json`."""
        return {"source": self.source, **self.architecture.to_dict()}


def architecture_from_config(config: dict[str, Any], name: str) -> ModelArchitecture:
    """Architecture from a parsed HF config.json; a VLM nests its text model under `text_config`.

    Raises RecipeConfigError naming every missing key.
    """
    text = config.get("text_config") or config
    values: dict[str, int] = {}
    missing: list[str] = []
    for field, keys in _KEYS.items():
        found = next((text[k] for k in keys if isinstance(text.get(k), int)), None)
        if found is None:
            if field in _OPTIONAL:
                found = 0
            else:
                missing.append("/".join(keys))
                continue
        values[field] = found
    if missing:
        raise RecipeConfigError([f"MODEL_PATH={name!r}: config.json lacks {key}" for key in missing])
    return ModelArchitecture(name=name, **values)


def load_architecture(model_path: Path) -> ModelSource:
    """The architecture of the model at `model_path`, or the built-in profile when it has no config.json."""
    config_file = model_path / "config.json"
    if not config_file.is_file():
        return ModelSource(QWEN3_5_35B_A3B, f"built-in profile {QWEN3_5_35B_A3B.name} ({config_file} not found)")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RecipeConfigError([f"MODEL_PATH={str(model_path)!r}: config.json is unreadable ({exc})"]) from None
    if not isinstance(config, dict):
        raise RecipeConfigError([f"MODEL_PATH={str(model_path)!r}: config.json is not a JSON object"])
    return ModelSource(architecture_from_config(config, str(model_path)), str(config_file))
