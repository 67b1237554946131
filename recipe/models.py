"""The model's architecture numbers that the parallel layout must respect.

Read from the model directory's config.json when it is there (as JSON: no
transformers import on the `plan` path), else a built-in profile of
Qwen3.5-35B-A3B so that `plan` works before the weights are downloaded.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from recipe.errors import RecipeConfigError
from recipe.read_back import FileRefused, parse_json
from recipe.model_sizes import (
    MAX_COUNT,
    QWEN3_5_35B_A3B_CONFIG,
    ModelSizes,
    SizesInvalid,
    SizesUnknown,
    sizes_from_config,
)


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
    """The architecture in use and where it was read from, with its parameter counts for the memory estimate."""

    architecture: ModelArchitecture
    source: str
    #: None when config.json lacks a number the memory estimate needs (`sizes_problem` says which).
    sizes: ModelSizes | None = None
    sizes_problem: str | None = None
    #: config.json's `model_type` when it is a string (transformers' name of the model class); None for the built-in profile.
    model_type: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form for `plan --json`: the architecture, and the parameter counts the memory estimate uses."""
        sizes = self.sizes.to_dict() if self.sizes else {"unknown": self.sizes_problem}
        return {"source": self.source, **self.architecture.to_dict(), "sizes": sizes}


#: transformers' model_type of Qwen3.5-35B-A3B, the model the built-in profile is and the recipe's values are tuned for.
QWEN3_5_MODEL_TYPE = "qwen3_5_moe"

#: config.json larger than this is not a model config (HF configs are a few kB).
MAX_CONFIG_BYTES = 16 * 1024 * 1024


def _count(text: dict[str, Any], field: str, keys: tuple[str, ...], name: str) -> tuple[int | None, str | None]:
    """The value of the first of `keys` present in `text`, checked: (value, None) or (None, problem)."""
    key = next((k for k in keys if k in text and text[k] is not None), None)
    if key is None:
        if field in _OPTIONAL:
            return 0, None  # a model without linear attention
        return None, f"MODEL_PATH={name!r}: config.json lacks {'/'.join(keys)}"
    value = text[key]
    # JSON true/false are Python bools, which are ints: 1 attention head is not what `true` means.
    if type(value) is not int or not 1 <= value <= MAX_COUNT:
        shown = json.dumps(value)[:40] if isinstance(value, (int, float, str)) else f"<{type(value).__name__}>"
        return None, f"MODEL_PATH={name!r}: config.json {key}={shown}: must be a positive whole number up to {MAX_COUNT}"
    return value, None


def architecture_from_config(config: dict[str, Any], name: str) -> ModelArchitecture:
    """Architecture from a parsed HF config.json; a VLM nests its text model under `text_config`.

    Raises RecipeConfigError naming every missing or unusable count.
    """
    text = config.get("text_config")
    if text is None:
        text = config
    elif not isinstance(text, dict):
        kind = type(text).__name__
        raise RecipeConfigError([f"MODEL_PATH={name!r}: config.json text_config must be a JSON object, not {kind}"])
    values: dict[str, int] = {}
    problems: list[str] = []
    for field, keys in _KEYS.items():
        value, problem = _count(text, field, keys, name)
        if problem:
            problems.append(problem)
        else:
            values[field] = value  # type: ignore[assignment]
    if problems:
        raise RecipeConfigError(problems)
    return ModelArchitecture(name=name, **values)


def _read_config(config_file: Path, name: str) -> bytes:
    """The bytes of a regular config.json; never opens a FIFO or device in a blocking way."""

    def refuse(why: str) -> RecipeConfigError:
        return RecipeConfigError([f"MODEL_PATH={name!r}: config.json {why}"])

    # O_NONBLOCK: opening a FIFO for reading returns at once instead of waiting for a writer.
    try:
        fd = os.open(config_file, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise refuse(f"is unreadable ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise refuse("is not a regular file (a directory, FIFO, socket or device)")
        if info.st_size > MAX_CONFIG_BYTES:
            raise refuse(f"is {info.st_size} bytes, larger than any model config ({MAX_CONFIG_BYTES})")
        with os.fdopen(os.dup(fd), "rb") as handle:
            return handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise refuse(f"is unreadable ({exc.strerror})") from None
    finally:
        os.close(fd)


def load_architecture(model_path: Path) -> ModelSource:
    """The architecture of the model at `model_path`, or the built-in profile when it has no config.json.

    Only a config.json that is absent (nothing at that path, not even a dangling link) means
    "not downloaded yet"; anything else there must be a readable JSON object with sound numbers.
    """
    name = str(model_path)
    config_file = model_path / "config.json"
    try:
        os.lstat(config_file)
    except FileNotFoundError:
        return ModelSource(
            QWEN3_5_35B_A3B,
            f"built-in profile {QWEN3_5_35B_A3B.name} ({config_file} not found)",
            sizes_from_config(QWEN3_5_35B_A3B_CONFIG),
            model_type=QWEN3_5_MODEL_TYPE,
        )
    except NotADirectoryError:
        raise RecipeConfigError([f"MODEL_PATH={name!r}: is not a directory"]) from None
    except OSError as exc:
        raise RecipeConfigError([f"MODEL_PATH={name!r}: config.json cannot be examined ({exc.strerror})"]) from None
    data = _read_config(config_file, name)
    try:
        config = parse_json(data, "config.json")
    except FileRefused as refused:
        raise RecipeConfigError([f"MODEL_PATH={name!r}: {refused}"]) from None
    if not isinstance(config, dict):
        raise RecipeConfigError([f"MODEL_PATH={name!r}: config.json is not a JSON object"])
    architecture = architecture_from_config(config, name)
    model_type = config.get("model_type") if isinstance(config.get("model_type"), str) else None
    try:
        return ModelSource(architecture, str(config_file), sizes_from_config(config), model_type=model_type)
    except SizesInvalid as invalid:
        raise RecipeConfigError([f"MODEL_PATH={name!r}: {invalid}"]) from None
    except SizesUnknown as unknown:
        return ModelSource(architecture, str(config_file), None, str(unknown), model_type)
