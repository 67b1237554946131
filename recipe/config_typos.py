"""A key verl's config does not have, one slip from one it has: `lrr` for `lr`, `Trainer` for `trainer`.

Hydra refuses a key its config lacks, and advises `+key=value` to add it. Followed, that advice
adds the typo as a new key, which nothing in verl reads: the learning rate meant is never set,
and nothing says so. So an override that names (or adds with `+`/`++`) a key one slip
(recipe.near_miss) from a key of the same node of verl's config is refused naming that key, in
place of Hydra's advice. A new key that is no near miss passes, as it must under verl's free-form
nodes (`env_vars`, `engine_kwargs`, `override_transformer_config`, ...).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from recipe.near_miss import one_slip_from


def key_typo(key: str, config: Mapping[str, Any]) -> str | None:
    """The dotted key `key` meant, when it leaves `config` (a plain nested dict) at a component one slip from a key
    of that node; None when every component exists, or the first missing one is like none of its siblings."""
    node: Any = config
    parts = key.split(".")
    for depth, part in enumerate(parts):
        if not isinstance(node, Mapping):
            return None
        if part in node:
            node = node[part]
            continue
        neighbour = one_slip_from(part, [name for name in node if isinstance(name, str)])
        return ".".join([*parts[:depth], neighbour, *parts[depth + 1 :]]) if neighbour else None
    return None


def typo_problems(extra: Sequence[str], base: Mapping[str, Any], parser: Any) -> dict[str, str]:
    """override text -> its refusal, for each of the user's overrides (`extra`) whose key is a typo of one in `base`
    (verl's config composed with the recipe's overrides alone, as a plain dict); `parser` is Hydra's."""
    problems = {}
    for text in extra:
        try:
            override = parser.parse_override(text)
        except Exception:  # noqa: BLE001 - Hydra's own refusal says why, elsewhere
            continue
        key = override.key_or_group
        if override.is_delete() or override.package is not None or "/" in key:
            continue
        meant = key_typo(key, base)
        if meant:
            adds = " (`+` adds a key that verl never reads)" if override.is_add() or override.is_force_add() else ""
            problems[text] = f"override {text!r}: verl's config has no {key}; did you mean {meant}?{adds}"
    return problems
