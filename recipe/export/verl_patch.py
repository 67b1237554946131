"""A narrow, version-checked guard for verl's `transformer_config.json` write.

verl 0.9.1 (MegatronCheckpointManager._save_transformer_config) first filters the
TransformerConfig through `_to_json_safe_config_dict`, then calls json.dump with
`default=lambda o: o.to_dict() if hasattr(o, "to_dict") else o`. Measured on
Megatron-Bridge 0.6.2's real Qwen3.5 provider (tests/bridge/test_verl_patch.py):
- it does not raise on that provider, but it silently drops every field the filter
  does not know, among them `vision_config` (the object the `default=` was added
  for: the filter removes it before json.dump ever sees it) and all callables;
- it still raises on a numpy scalar whose .item() is not JSON (complex, datetime64,
  bytes): json.dump's `default` returns the object itself -> ValueError.

`install()` replaces that one method with a writer that keeps every field and
cannot raise on a value (recipe.export.jsonsafe), only for the verl versions it was
checked against. It does not import verl or megatron: if verl's checkpoint module
is not loaded yet, the patch is applied the moment it is (recipe.import_patch), so a
Ray worker that never saves a checkpoint pays nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from recipe.export.jsonsafe import dump_json_safe
from recipe.import_patch import patch_when_imported, verl_is_one_of

logger = logging.getLogger("recipe.export.verl_patch")

TARGET_MODULE = "verl.utils.checkpoint.megatron_checkpoint_manager"
#: Versions whose _save_transformer_config was read and tested against this patch.
VERIFIED_VERL_VERSIONS: tuple[str, ...] = ("0.9.1",)
_MARK = "__recipe_json_safe__"


def _json_safe_save_transformer_config(self: Any, local_path: str) -> None:
    """Rank 0 writes the TransformerConfig to <local_path>/transformer_config.json, never raising on a value."""
    if self.rank != 0:
        return
    # lazy: verl is heavy or absent where this module is imported; loaded only here
    from verl.utils.megatron_utils import get_transformer_config_checkpoint_path

    path = get_transformer_config_checkpoint_path(local_path)
    notes = dump_json_safe(self.transformer_config, path)
    if notes:
        logger.warning("%s: %d value(s) written as strings (see warnings above)", path, len(notes))


setattr(_json_safe_save_transformer_config, _MARK, True)


def patch_module(module: ModuleType) -> bool:
    """Replace MegatronCheckpointManager._save_transformer_config in an imported verl module."""
    cls = getattr(module, "MegatronCheckpointManager", None)
    original = getattr(cls, "_save_transformer_config", None)
    if cls is None or original is None:
        logger.warning(
            "%s has no MegatronCheckpointManager._save_transformer_config: transformer_config.json is left to verl",
            module.__name__,
        )
        return False
    if getattr(original, _MARK, False):
        return True
    _json_safe_save_transformer_config.__wrapped__ = original  # type: ignore[attr-defined]
    cls._save_transformer_config = _json_safe_save_transformer_config
    logger.info("verl's transformer_config.json is written by recipe.export.jsonsafe")
    return True


def install(versions: Sequence[str] = VERIFIED_VERL_VERSIONS) -> bool:
    """Guard verl's transformer_config.json write in this process; True when installed (or pending import).

    Call it in every Ray worker (e.g. from the worker_process_setup_hook). With another
    verl version it changes nothing and says so once.
    """
    if not verl_is_one_of(versions, "transformer_config.json guard not installed"):
        return False
    return patch_when_imported(TARGET_MODULE, patch_module)
