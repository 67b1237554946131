"""Text as Hydra's override grammar and OmegaConf read it: what may pass literally, and how to quote it.

The lowest room of the recipe: settings check values with literal_problem, launch and the smoke
profile write overrides with hydra_value; it imports nothing of the recipe.
"""

from __future__ import annotations

import re

#: Where the user's overrides go, the same on every path (plan, run, Compose, the Job, the RayJob).
OVERRIDE_PLACES = "in OVERRIDES, or after `--` of plan and run"


def override_hint(*overrides: str) -> str:
    """A suggested override as every message names it: `key=value` and where it goes, true on every path."""
    return f"`{' '.join(overrides)}` ({OVERRIDE_PLACES})"


#: OmegaConf's marker of a mandatory value: a string that is exactly this is never a value.
OMEGACONF_MISSING = "???"


def literal_problem(value: str) -> str | None:
    """Why `value` cannot reach verl's config as exactly this string (None when it can).

    Every string the recipe passes to verl is quoted for Hydra (hydra_string, below), so
    Hydra reads it back exactly. OmegaConf then treats `${...}` as an interpolation (which
    could read a secret with oc.env) and `???` as a missing value. Escaping `\\${` is no
    remedy: verl's TaskRunner runs OmegaConf.resolve(config) in place, which drops the escape,
    and reads the config again, which resolves the interpolation then. So both are refused.
    """
    if "${" in value:
        return (
            "must be a literal string: `${` starts an OmegaConf interpolation, which verl would resolve "
            "(and re-resolve after its in-place OmegaConf.resolve)"
        )
    if value == OMEGACONF_MISSING:
        return "must be a literal string: OmegaConf reads `???` as a missing value"
    if "\x00" in value:
        return "must not contain a NUL character"
    return None


# A run of backslashes followed by a quote, or ending the text: the only backslashes
# Hydra's quoted-string grammar un-escapes (hydra/grammar/OverrideLexer.g4, QUOTED_VALUE).
_BACKSLASHES_BEFORE_QUOTE = re.compile(r"(\\*)('|\Z)")


def hydra_string(text: str) -> str:
    """`text` quoted, so that Hydra reads it back as exactly this string (never a number or list).

    Inside Hydra's single quotes a backslash is literal unless backslashes precede a quote
    (or the closing quote): there they come in pairs, and an odd one escapes the quote. So only
    those runs are doubled. Raises ValueError for text OmegaConf would not keep literal
    (settings.literal_problem): settings refuse such values before anything is built.
    """
    problem = literal_problem(text)
    if problem:
        raise ValueError(f"{text!r}: {problem}")
    escaped = _BACKSLASHES_BEFORE_QUOTE.sub(lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), text)
    return "'" + escaped + "'"


def hydra_value(value: object) -> str:
    """A value as Hydra's override grammar reads it back unchanged (quoted when it must be)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    # Every string is quoted: unquoted, Hydra reads "123", "true" or "null" as another type.
    return hydra_string(str(value))
