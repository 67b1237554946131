"""Numbers from outside (a file read back, a probe's answer, a TensorBoard scalar), read within stated bounds.

Python's own conversions fail in ways a caller's `except ValueError` misses or never expects:
int() of more than 4,300 digits is a ValueError by the interpreter's limit (and costs quadratic
time below it), float() of a 400-digit integer is an OverflowError, round(inf) is an OverflowError
and a NaN compares false with every bound. Here a number is refused before any of that: its text
bounded in digits, its value finite and within the range the caller states. NumberRefused names
the value (cut) and the rule in one line.
"""

from __future__ import annotations

import math
import re
from typing import Any

#: More digits than any count, size or step the recipe reads; checked before int() sees the text.
MAX_DIGITS = 30
_WHOLE = re.compile(r"\s*[+-]?[0-9][0-9_]*\s*")


class NumberRefused(ValueError):
    """A number from outside that is not one the caller may use."""


def _shown(value: Any) -> str:
    """The value for a message, cut to 40 characters; an int too long for repr (4,300 digits) by its size."""
    if isinstance(value, int) and value.bit_length() > 256:
        return f"<a {value.bit_length()}-bit integer>"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def whole_number(value: Any, low: int, high: int, what: str) -> int:
    """`value` (an int, or text as int() reads it) as an int in [low, high]; NumberRefused otherwise."""
    if isinstance(value, bool):
        raise NumberRefused(f"{what}={_shown(value)}: must be a whole number, not true/false")
    if isinstance(value, int):
        number = value
    elif isinstance(value, (str, bytes)):
        text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
        if not _WHOLE.fullmatch(text) or sum(c.isdigit() for c in text) > MAX_DIGITS:
            raise NumberRefused(f"{what}={_shown(value)}: must be a whole number of at most {MAX_DIGITS} digits")
        number = int(text)
    else:
        raise NumberRefused(f"{what}={_shown(value)}: must be a whole number")
    if not low <= number <= high:
        raise NumberRefused(f"{what}={_shown(number)}: must be between {low} and {high}")
    return number


def real_number(value: Any, low: float, high: float, what: str) -> float:
    """`value` (an int or float, not a bool) as a finite float in [low, high]; NumberRefused otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise NumberRefused(f"{what}={_shown(value)}: must be a number")
    try:
        number = float(value)
    except OverflowError:
        raise NumberRefused(f"{what}={_shown(value)}: beyond any float") from None
    if not math.isfinite(number):
        raise NumberRefused(f"{what}={_shown(value)}: must be finite")
    if not low <= number <= high:
        raise NumberRefused(f"{what}={_shown(number)}: must be between {low:g} and {high:g}")
    return number


def finite_or_none(value: Any) -> float | None:
    """A metric as a float when it is a finite number (not a bool), else None: shown as n/a, never a crash."""
    try:
        return real_number(value, -math.inf, math.inf, "metric")
    except NumberRefused:
        return None
