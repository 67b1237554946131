"""A JSON writer for configuration objects that never raises on an odd value.

verl writes Megatron's TransformerConfig (for Qwen3.5: the Megatron-Bridge provider,
a dataclass holding vision configs, layer-spec callables, dtypes, enums, ...) to
`transformer_config.json` at every checkpoint save. One value that json cannot
encode must not kill a training run hours in, and it must not vanish silently
either: every value that is not plain JSON is converted by the rules below, and
each conversion that loses information is reported as a warning naming its path.

Rules, in order (first match wins):
- None, bool, int, str: as they are (subclasses become the base type);
- float: as it is; NaN and +-Infinity become "nan", "inf", "-inf" (strict JSON has none);
- objects with a working `to_dict()` (transformers configs): that dict, converted;
- dataclass instances: their fields, converted (a field that cannot be read: a string);
- Enum members: "Class.NAME" (warning-free: the name is the information);
- torch.dtype / torch.device / numpy dtypes: str(value), e.g. "torch.bfloat16";
- numpy scalars and 0-d arrays: the Python value, converted (longdouble and clongdouble,
  which have none: their text);
- os.PathLike: the path string (a bytes path decoded as os.fsdecode does);
- Mapping: an object; keys become strings (non-str keys converted, then str());
- list, tuple, set, frozenset and other non-str sequences/sets: a list
  (sets sorted by their JSON text so the output is stable);
- bytes: the text when it is UTF-8, else "base64:<data>";
- callables (functions, classes, partials): "<callable module.qualname>";
- anything else, and any value whose conversion raised: a stable string (repr with
  memory addresses removed, or the type name when repr itself fails), with a warning;
- cycles and nesting deeper than `max_depth`: a marker string, with a warning.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import json
import logging
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any, Union

from recipe.atomic import atomic_write

logger = logging.getLogger("recipe.export.jsonsafe")

JSONValue = Union[None, bool, int, float, str, list["JSONValue"], dict[str, "JSONValue"]]

#: Deeper than this, a value is replaced by a marker (a config is never this deep).
DEFAULT_MAX_DEPTH = 64

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _type_name(value: object) -> str:
    kind = type(value)
    return f"{kind.__module__}.{kind.__qualname__}"


def _stable_repr(value: object) -> str:
    """repr() without memory addresses; the type name when repr raises or returns junk."""
    try:
        text = repr(value)
        if not isinstance(text, str):
            raise TypeError("repr did not return str")
    except BaseException:  # noqa: BLE001 - a hostile __repr__ must not escape
        return f"<{_type_name(value)}>"
    return _ADDRESS.sub("", text)


def _callable_name(value: object) -> str:
    func = getattr(value, "func", None)  # functools.partial keeps the real function here
    target = func if func is not None and callable(func) else value
    module = getattr(target, "__module__", None) or _type_name(target)
    qualname = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or type(target).__qualname__
    return f"<callable {module}.{qualname}>"


class _Converter:
    """One conversion run: remembers the path being converted and the warnings given."""

    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        self.notes: list[str] = []
        self._active: set[int] = set()

    def note(self, path: str, message: str) -> None:
        self.notes.append(f"{path or '<root>'}: {message}")

    def convert(self, value: Any, path: str, depth: int) -> JSONValue:
        try:
            return self._convert(value, path, depth)
        except BaseException as error:
            if isinstance(error, (KeyboardInterrupt, SystemExit)):
                raise
            self.note(path, f"{_type_name(value)} could not be converted ({type(error).__name__}); wrote a string")
            return _stable_repr(value)

    def _container(self, value: Any, path: str, depth: int, build: Any) -> JSONValue:
        """Convert a container while guarding against cycles and runaway depth."""
        if depth >= self.max_depth:
            self.note(path, f"nested deeper than {self.max_depth}; wrote a marker")
            return f"<too deep: {_type_name(value)}>"
        marker = id(value)
        if marker in self._active:
            self.note(path, "refers back to itself; wrote a marker")
            return f"<cycle: {_type_name(value)}>"
        self._active.add(marker)
        try:
            return build()
        finally:
            self._active.discard(marker)

    def _convert(self, value: Any, path: str, depth: int) -> JSONValue:
        if value is None or isinstance(value, bool):
            return None if value is None else bool(value)
        if isinstance(value, enum.Enum):
            # Before int/str: IntEnum and StrEnum members must keep their names.
            return f"{type(value).__name__}.{value.name}"
        if isinstance(value, int):
            return int(value)
        if isinstance(value, float):
            number = float(value)
            if math.isfinite(number):
                return number
            return "nan" if math.isnan(number) else ("inf" if number > 0 else "-inf")
        if isinstance(value, str):
            return str(value)
        special = _special(value)
        if special is not _NO_MATCH:
            return self.convert(special, path, depth + 1) if not isinstance(special, str) else special
        to_dict = getattr(value, "to_dict", None)
        if callable(to_dict) and not isinstance(value, type):
            return self._container(value, path, depth, lambda: self._from_to_dict(value, to_dict, path, depth))
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return self._container(value, path, depth, lambda: self._from_dataclass(value, path, depth))
        if isinstance(value, os.PathLike):
            return os.fsdecode(os.fspath(value))  # a bytes path decoded as the OS would (undecodable bytes kept as escapes)
        if isinstance(value, (bytes, bytearray, memoryview)):
            raw = bytes(value)
            try:
                return raw.decode("utf-8")
            except UnicodeDecodeError:
                return "base64:" + base64.b64encode(raw).decode("ascii")
        if isinstance(value, Mapping):
            return self._container(value, path, depth, lambda: self._from_mapping(value, path, depth))
        if isinstance(value, (set, frozenset)):
            return self._container(value, path, depth, lambda: self._from_set(value, path, depth))
        if isinstance(value, (list, tuple)):
            return self._container(value, path, depth, lambda: self._from_sequence(value, path, depth))
        if callable(value):
            return _callable_name(value)
        self.note(path, f"{_type_name(value)} is not JSON; wrote its repr")
        return _stable_repr(value)

    def _from_to_dict(self, value: Any, to_dict: Any, path: str, depth: int) -> JSONValue:
        try:
            produced = to_dict()
        except Exception as error:  # noqa: BLE001 - a broken to_dict falls back to the next rule
            self.note(path, f"{_type_name(value)}.to_dict() raised {type(error).__name__}")
            if dataclasses.is_dataclass(value):
                return self._from_dataclass(value, path, depth)
            return _stable_repr(value)
        if produced is value:
            self.note(path, f"{_type_name(value)}.to_dict() returned itself; wrote its repr")
            return _stable_repr(value)
        return self.convert(produced, path, depth + 1)

    def _from_dataclass(self, value: Any, path: str, depth: int) -> JSONValue:
        result: dict[str, JSONValue] = {}
        for field in dataclasses.fields(value):
            try:
                item = getattr(value, field.name)
            except Exception as error:  # noqa: BLE001 - a property-backed field may raise
                self.note(f"{path}.{field.name}", f"could not be read ({type(error).__name__})")
                result[field.name] = f"<unreadable: {type(error).__name__}>"
                continue
            result[field.name] = self.convert(item, f"{path}.{field.name}", depth + 1)
        return result

    def _key(self, key: Any, path: str, depth: int) -> str:
        if isinstance(key, str):
            return str(key)
        converted = self.convert(key, path, depth + 1)
        return converted if isinstance(converted, str) else json.dumps(converted, sort_keys=True)

    def _from_mapping(self, value: Mapping[Any, Any], path: str, depth: int) -> JSONValue:
        result: dict[str, JSONValue] = {}
        for key, item in list(value.items()):
            name = self._key(key, f"{path}[key]", depth)
            if name in result:
                self.note(f"{path}.{name}", "two keys became the same string; kept the first")
                continue
            result[name] = self.convert(item, f"{path}.{name}", depth + 1)
        return result

    def _from_set(self, value: Any, path: str, depth: int) -> JSONValue:
        items = [self.convert(item, f"{path}[]", depth + 1) for item in list(value)]
        return sorted(items, key=lambda item: json.dumps(item, sort_keys=True))

    def _from_sequence(self, value: Any, path: str, depth: int) -> JSONValue:
        return [self.convert(item, f"{path}[{index}]", depth + 1) for index, item in enumerate(list(value))]


_NO_MATCH = object()


def _special(value: Any) -> Any:
    """torch / numpy values, recognised without importing either (they may be absent)."""
    module = type(value).__module__ or ""
    if module.startswith("torch"):
        name = type(value).__name__
        if name in ("dtype", "device", "Size"):
            return str(value) if name != "Size" else list(value)
        if name in ("Tensor", "Parameter") and value.numel() == 1:
            return value.item()
        if name in ("Tensor", "Parameter"):
            return f"<tensor shape={list(value.shape)} dtype={value.dtype}>"
    if module.startswith("numpy"):
        if type(value).__name__ == "dtype" or type(value).__name__.endswith("DType"):
            return str(value)
        if hasattr(value, "item") and getattr(value, "ndim", None) == 0:
            item = value.item()
            # complex, and numpy's longdouble / clongdouble, whose item() is the numpy value itself: their text.
            if isinstance(item, complex) or type(item).__module__.startswith("numpy"):
                return str(item)
            return item
        if hasattr(value, "tolist"):
            return value.tolist()
    if isinstance(value, complex):
        return str(value)
    return _NO_MATCH


def to_json_safe(value: Any, *, max_depth: int = DEFAULT_MAX_DEPTH) -> tuple[JSONValue, list[str]]:
    """Convert `value` to plain JSON types; return it with one note per lossy conversion.

    Never raises (except KeyboardInterrupt/SystemExit). The notes name the path of
    each value that was replaced by a string, e.g. `.vision_config.act: ... wrote its repr`.
    """
    converter = _Converter(max_depth)
    converted = converter.convert(value, "", 0)
    return converted, converter.notes


def dumps_json_safe(value: Any, *, indent: int | None = 2, warn: bool = True) -> str:
    """The JSON text of `value` by the rules in this module's docstring; never raises.

    Each lossy conversion is logged as a warning on logger `recipe.export.jsonsafe`
    when `warn` is true. The text is strict JSON (no NaN/Infinity) with sorted keys.
    """
    converted, notes = to_json_safe(value)
    if warn:
        for note in notes:
            logger.warning("JSON-safe config: %s", note)
    return json.dumps(converted, indent=indent, sort_keys=True, allow_nan=False, ensure_ascii=False)


def dump_json_safe(value: Any, target: str | os.PathLike[str] | IO[str], *, indent: int | None = 2) -> list[str]:
    """Write `value` as JSON to a path or text file object; return the notes (also logged).

    A path is written atomically (temporary file, then rename), so a crash never
    leaves half a config behind.
    """
    converted, notes = to_json_safe(value)
    for note in notes:
        logger.warning("JSON-safe config: %s", note)
    text = json.dumps(converted, indent=indent, sort_keys=True, allow_nan=False, ensure_ascii=False)
    if hasattr(target, "write"):
        target.write(text)  # type: ignore[union-attr]
        return notes
    # Atomic, and never through a link planted where the file or its temporary goes.
    atomic_write(Path(os.fspath(target)), lambda out: out.write(text.encode("utf-8")))  # type: ignore[arg-type]
    return notes
