"""The tensors a Hugging Face model class expects on disk for a given config.json.

The model is built on torch's meta device (shapes only, no memory, no weights), so
this works for a 35B model on a laptop. transformers 5 keeps some weights fused in
memory (MoE experts as one `experts.gate_up_proj`) while `save_pretrained` writes
them per expert; checkpoints on the Hub use either. So each parameter is described
by its on-disk layouts: the one `save_pretrained` writes (transformers' own
`revert_weight_conversion`, applied to that parameter alone) and, where different,
the fused in-memory name. The check accepts either layout per parameter.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipe.export.safetensors_header import ShardError
from recipe.export.shards import allowed_roots, resolve_member

logger = logging.getLogger("recipe.export.expected")

Layout = dict[str, tuple[int, ...]]


class ExportCheckError(Exception):
    """The directory cannot be checked at all (no config.json, unknown architecture, ...)."""


@dataclass(frozen=True)
class ExpectedGroup:
    """One model parameter (or persistent buffer) and the on-disk layouts that provide it.

    `layouts[0]` is what save_pretrained writes; `layouts[1]`, when present, is the
    fused in-memory name. `optional` marks a weight tied to another one (e.g. lm_head
    with tie_word_embeddings): it may be absent, and is checked when present.
    """

    module_key: str
    layouts: tuple[Layout, ...]
    optional: bool = False


@dataclass(frozen=True)
class ExpectedTensors:
    """Everything the check needs to know about the model class."""

    architecture: str
    groups: tuple[ExpectedGroup, ...]
    ignore_missing: tuple[str, ...]
    ignore_unexpected: tuple[str, ...]


#: What a model class name looks like; anything else is never looked up in transformers.
_CLASS_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")  # e.g. xLSTMForCausalLM; never a dunder


def _named_model_class(name: object) -> type | None:
    """The transformers model class called `name`, or None: only PreTrainedModel subclasses count.

    `architectures` comes from the checked directory, so it may name any attribute of
    transformers (`Trainer`, `pipeline`, ...): nothing but a model class is ever built.
    """
    import transformers  # lazy: transformers is heavy or absent where this module is imported; loaded only here

    if not isinstance(name, str) or not _CLASS_NAME.match(name):
        return None
    try:
        cls = getattr(transformers, name, None)
    except Exception as error:  # noqa: BLE001 - a lazy import of an optional backend may fail
        logger.debug("transformers.%s cannot be imported: %s", name, error)
        return None
    if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel):
        return cls
    return None


def _model_class(config: Any) -> type:
    import transformers  # lazy: transformers is heavy or absent where this module is imported; loaded only here

    architectures = getattr(config, "architectures", None) or []
    if not isinstance(architectures, (list, tuple)):
        raise ExportCheckError(f"config.json architectures={architectures!r}: not a list of model class names")
    for name in architectures:
        cls = _named_model_class(name)
        if cls is not None:
            return cls
    if architectures:
        raise ExportCheckError(
            f"config.json architectures={list(architectures)!r}: not a class of the installed transformers "
            f"{transformers.__version__} that is a model (PreTrainedModel); only model classes are built, "
            "and remote code is not run by the check"
        )
    # No `architectures` (config written without a model): the class transformers itself
    # would pick for this model_type, vision-language first (Qwen3.5 is a VLM).
    for auto in (transformers.AutoModelForImageTextToText, transformers.AutoModelForCausalLM):
        try:
            found = auto._model_mapping[type(config)]
        except KeyError:
            continue
        # Some mappings hold a tuple of candidate classes; the first is the default.
        for candidate in found if isinstance(found, tuple) else (found,):
            if isinstance(candidate, type):
                return candidate
    raise ExportCheckError(
        f"config.json has no `architectures` and model_type={getattr(config, 'model_type', None)!r} "
        "has no causal-LM or image-text-to-text class: cannot tell which model class to check against"
    )


def build_meta_model(config_dir: Path) -> Any:
    """The HF model class of `config_dir/config.json`, instantiated on the meta device."""
    import torch  # lazy: torch is heavy or absent where this module is imported; loaded only here
    # lazy: transformers is heavy or absent where this module is imported; loaded only here
    from transformers import AutoConfig

    config_path = config_dir / "config.json"
    if not os.path.lexists(config_path):
        raise ExportCheckError(f"{config_dir}: no config.json (the export must carry the HF config)")
    try:  # the same rule as for shards: inside the directory, or a Hugging Face cache blob
        resolve_member(config_dir, "config.json", allowed_roots(config_dir), "absent")
    except ShardError as error:
        raise ExportCheckError(f"{config_dir}/{error}") from None
    if not config_path.is_file():  # a FIFO would block the reader, a device never end
        raise ExportCheckError(f"{config_path}: not a regular file")
    try:
        config = AutoConfig.from_pretrained(str(config_dir), trust_remote_code=False)
    except Exception as error:
        raise ExportCheckError(f"{config_dir}/config.json: transformers cannot read it ({error})") from error
    cls = _model_class(config)
    try:
        with torch.device("meta"):
            return cls(config)
    except Exception as error:
        raise ExportCheckError(f"{cls.__name__}: cannot be built from {config_dir}/config.json ({error})") from error


def _shape(tensor: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in tensor.shape)


def expected_tensors(config_dir: Path) -> ExpectedTensors:
    """What `config_dir/config.json`'s model class expects on disk, per parameter."""
    # lazy: transformers is heavy or absent where this module is imported; loaded only here
    from transformers.core_model_loading import revert_weight_conversion

    model = build_meta_model(config_dir)
    state = model.state_dict()
    tied = set((getattr(model, "all_tied_weights_keys", None) or {}).keys())
    groups: list[ExpectedGroup] = []
    for key, tensor in state.items():
        try:
            reverted = revert_weight_conversion(model, {key: tensor})
        except Exception as error:  # noqa: BLE001 - fall back to the in-memory name
            logger.debug("no reverse conversion for %s: %s", key, error)
            reverted = {key: tensor}
        canonical: Layout = {name: _shape(value) for name, value in reverted.items()}
        layouts: tuple[Layout, ...] = (canonical,)
        if set(canonical) != {key}:
            layouts = (canonical, {key: _shape(tensor)})
        groups.append(ExpectedGroup(key, layouts, optional=key in tied))
    return ExpectedTensors(
        architecture=type(model).__name__,
        groups=tuple(groups),
        ignore_missing=tuple(sorted(str(p) for p in (model._keys_to_ignore_on_load_missing or ()))),
        ignore_unexpected=tuple(sorted(str(p) for p in (model._keys_to_ignore_on_load_unexpected or ()))),
    )
