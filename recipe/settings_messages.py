"""A setting's refusal as one line: `NAME='value': rule`, in people's words, never echoing a secret."""

from __future__ import annotations

from typing import Any, Mapping

from pydantic.fields import FieldInfo

from recipe.redaction import redact

#: Shown instead of a secret's value everywhere (plan, logs, errors).
REDACTED = "**********"

SECRET_SETTINGS = frozenset({"HF_TOKEN", "WANDB_API_KEY", "RAY_AUTH_TOKEN"})


def describe_error(error: Mapping[str, Any], environ: Mapping[str, str], fields: Mapping[str, FieldInfo]) -> str:
    """One line for one pydantic error of Settings (whose `fields` are given): `NAME='value': rule`, never echoing a
    secret (recipe.redaction)."""
    name = str(error["loc"][0]).upper() if error["loc"] else "settings"
    raw = REDACTED if name in SECRET_SETTINGS else _lookup(environ, name)
    if raw is not None:
        raw = redact(raw)  # OVERRIDES with an unbalanced quote, a URL with its password, a token pasted by mistake
    kind = error["type"]
    whole = is_whole(name, fields)
    if kind in {"int_parsing", "int_from_float", "int_type"}:
        rule = "must be a whole number"
    elif kind in {"float_parsing", "float_type"}:
        rule = "must be a number"
    elif kind == "finite_number":
        rule = "must be a finite number"
    elif kind == "greater_than" and error["ctx"]["gt"] == 0:
        rule = f"must be a positive {'whole number' if whole else 'number'}"
    elif kind == "greater_than":
        rule = f"must be greater than {_bound(error['ctx']['gt'])}"
    elif kind == "greater_than_equal":
        rule = f"must be at least {_bound(error['ctx']['ge'])}"
    elif kind == "less_than_equal":
        rule = f"must be at most {_bound(error['ctx']['le'])}"
    elif kind == "literal_error":
        rule = f"must be one of {error['ctx']['expected']}"
    elif kind == "bool_parsing":
        rule = "must be true or false"
    else:
        # Pydantic's own wording, without its "Value error, " prefix.
        rule = str(error["msg"]).removeprefix("Value error, ")
    # A validator's rule may quote part of the value (an unknown name, a pair): withheld like the value.
    return f"{name}={raw!r}: {redact(rule)}"


def _bound(value: Any) -> str:
    """A validator's bound as people write it: 4096, not 4096.0; 2147483647, not 2.14748e+09."""
    return format(value, "g") if isinstance(value, float) and not value.is_integer() else str(int(value))


def is_whole(name: str, fields: Mapping[str, FieldInfo]) -> bool:
    """Whether the setting NAME (one of `fields`) holds whole numbers (its type has no float in it)."""
    field = fields.get(name.lower())
    return field is None or "float" not in str(field.annotation)


def _lookup(environ: Mapping[str, str], name: str) -> str | None:
    """The raw environment value of NAME, matched case-insensitively like pydantic-settings does."""
    for key, value in environ.items():
        if key.upper() == name:
            return value
    return None
