"""A safetensors header, validated as the `safetensors` loader (0.8) validates it, without a byte of tensor data.

A safetensors file starts with an 8-byte little-endian header length and a JSON header naming each
tensor with its dtype, shape and byte range (https://huggingface.co/docs/safetensors#format). The
rules, in the loader's order: strict UTF-8 and strict JSON (serde_json's rules: no NaN or Infinity,
no lone surrogate escapes, at most 127 nested containers, no number out of range); known dtypes;
shape entries and offsets plain non-negative integers below 2**64; offsets contiguous from 0 and
covering the data section exactly; `prod(shape) * bits == 8 * (end - start)` with the loader's
overflow rules. (Over 300 lines on purpose: it mirrors the loader rule by rule, and the rules read
best together.) Reading the file, the index and the checkpoint's folder is recipe.export.shards'.
"""

from __future__ import annotations

import gc
import json
import math
import re
from dataclasses import dataclass
from typing import Any

#: safetensors' own MAX_HEADER_SIZE: a longer header is refused by the loader.
MAX_HEADER_BYTES = 100_000_000
#: Element width in bits of every dtype safetensors 0.8 knows (its `Dtype::bitsize`).
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
}
_U64_MAX = 2**64 - 1
#: The deepest nesting of JSON arrays/objects the loader parses (measured on safetensors 0.8).
_MAX_DEPTH = 127
_TENSOR_FIELDS = ("dtype", "shape", "data_offsets")
_METADATA = "__metadata__"
#: A \\uD800-\\uDFFF escape: the only way a surrogate gets into a strictly UTF-8 decoded header.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


class ShardError(Exception):
    """A shard file that cannot be read as safetensors; the message is one line naming the file."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor in a shard: its file, dtype and shape."""

    shard: str
    dtype: str
    shape: tuple[int, ...]


# --- strict JSON, the way serde_json reads a safetensors header -------------------------


class _BadNumber:
    """An integer literal no usize can hold (-0, which serde_json reads as a float): kept to be refused later."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _minus_zero_aware_int(text: str) -> int | _BadNumber:
    return _BadNumber(text) if text == "-0" else int(text)


def _float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number {text[:24]} out of range")
    return value


def _constant(text: str) -> Any:
    raise ValueError(f"{text} is not JSON")


@dataclass
class _Json:
    """A parsed header, and every key/value pair of the objects that repeat a key (by id)."""

    value: Any
    repeated: dict[int, list[tuple[str, Any]]]

    def pairs(self, obj: dict[str, Any]) -> list[tuple[str, Any]]:
        """Every key/value of `obj` in order, repeated keys included (the dict keeps only the last)."""
        found = self.repeated.get(id(obj))
        return found if found is not None else list(obj.items())

    def walk(self, value: Any) -> tuple[int, bool, bool]:
        """(nesting depth, a string with a lone surrogate, a number beyond f64) in `value`, iteratively."""
        deepest, surrogate, huge = 0, False, False
        stack = [(value, 1)]
        while stack:
            item, level = stack.pop()
            if isinstance(item, dict):
                deepest = max(deepest, level)
                for key, child in self.pairs(item):
                    surrogate = surrogate or bool(_SURROGATE.search(key))
                    stack.append((child, level + 1))
            elif isinstance(item, list):
                deepest = max(deepest, level)
                stack.extend((child, level + 1) for child in item)
            elif isinstance(item, str):
                surrogate = surrogate or bool(_SURROGATE.search(item))
            elif item.__class__ is int and not -_U64_MAX <= item <= _U64_MAX:
                try:  # serde_json reads an integer beyond 64 bits as a float: out of range beyond f64
                    float(item)
                except OverflowError:
                    huge = True
        return deepest, surrogate, huge


def _strict_json(raw: bytes) -> _Json:
    """Parse `raw` as serde_json does; ValueError with a short reason when it would refuse it."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"header is not UTF-8 (byte {raw[error.start]:#04x} at offset {error.start})") from None
    repeated: dict[int, list[tuple[str, Any]]] = {}

    def pairs_hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        result = dict(pairs)
        if len(result) != len(pairs):
            repeated[id(result)] = pairs  # the object stays alive in the result: its id is unique
        return result

    try:
        value = json.loads(
            text,
            object_pairs_hook=pairs_hook,
            # Python reads "-0" as 0; serde_json as -0.0, not a usize. Only then is the (slower) hook needed.
            parse_int=_minus_zero_aware_int if "-0" in text else None,
            parse_float=_float,
            parse_constant=_constant,
        )
    except RecursionError:
        raise ValueError(f"header is not JSON the loader reads (nested more than {_MAX_DEPTH} levels deep)") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"header is not JSON ({error.msg} at offset {error.pos})") from None
    except ValueError as error:  # from the hooks above (NaN, Infinity, out of range) or int()'s digit limit
        raise ValueError(f"header is not JSON the loader reads ({str(error).splitlines()[0]})") from None
    parsed = _Json(value, repeated)
    if _SURROGATE_ESCAPE.search(text) and parsed.walk(value)[1]:
        raise ValueError("header is not JSON the loader reads (a lone surrogate escape in a string)")
    return parsed


# --- the header's meaning ----------------------------------------------------------------


def _usize(value: Any) -> bool:
    return value.__class__ is int and 0 <= value <= _U64_MAX


def _all_usize(values: list[Any]) -> bool:
    for value in values:
        if value.__class__ is not int or value < 0 or value > _U64_MAX:
            return False
    return True


def _tensor_entry(parsed: _Json, name: str, value: Any) -> tuple[str, tuple[int, ...], int, int]:
    """(dtype, shape, start, end) of one header entry; ValueError naming the tensor otherwise."""
    if value.__class__ is dict and len(value) == 3 and id(value) not in parsed.repeated:
        # The common case, checked quickly: exactly the three fields, well typed.
        dtype, shape, offsets = value.get("dtype"), value.get("shape"), value.get("data_offsets")
        if (
            dtype.__class__ is str
            and dtype in DTYPE_BITS
            and shape.__class__ is list
            and offsets.__class__ is list
            and len(offsets) == 2
            and _all_usize(shape)
            and _all_usize(offsets)
        ):
            return dtype, tuple(shape), offsets[0], offsets[1]
    return _checked_tensor_entry(parsed, name, value)


def _checked_tensor_entry(parsed: _Json, name: str, value: Any) -> tuple[str, tuple[int, ...], int, int]:
    """_tensor_entry's general case: every rule, the first broken one named."""
    label = f"tensor {name!r}"
    if not isinstance(value, dict):
        raise ValueError(f"{label}: not an object with dtype, shape and data_offsets")
    keys = [key for key, _ in parsed.pairs(value)]
    repeated = sorted({key for key in keys if key in _TENSOR_FIELDS and keys.count(key) > 1})
    if repeated:
        raise ValueError(f"{label}: {repeated[0]} given twice")
    absent = [key for key in _TENSOR_FIELDS if key not in value]
    if absent:
        raise ValueError(f"{label}: no {absent[0]}")
    for key, field_value in parsed.pairs(value):
        if key in _TENSOR_FIELDS:
            continue
        depth, _, huge = parsed.walk(field_value)  # the loader parses unknown fields too
        if 2 + depth > _MAX_DEPTH:
            raise ValueError(f"{label}: field {key!r} nested more than {_MAX_DEPTH} levels deep")
        if huge:
            raise ValueError(f"{label}: field {key!r} holds a number out of range")
    dtype = value["dtype"]
    if isinstance(dtype, dict) and len(dtype) == 1 and id(dtype) not in parsed.repeated:
        # serde also reads a unit enum variant written as {"U8": null}
        ((dtype, unit),) = dtype.items()
        if unit is not None:
            raise ValueError(f"{label}: dtype {{{dtype!r}: {unit!r}}} is not a dtype")
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise ValueError(f"{label}: unknown dtype {_short(dtype)} (safetensors knows {', '.join(DTYPE_BITS)})")
    shape = value["shape"]
    if not isinstance(shape, list):
        raise ValueError(f"{label}: shape {_short(shape)} is not a list")
    for dim in shape:
        if not _usize(dim):
            raise ValueError(f"{label}: shape entry {_short(dim)} is not a non-negative integer below 2**64")
    offsets = value["data_offsets"]
    if not isinstance(offsets, list) or len(offsets) != 2:
        raise ValueError(f"{label}: data_offsets {_short(offsets)} is not [start, end]")
    for offset in offsets:
        if not _usize(offset):
            raise ValueError(f"{label}: data_offsets entry {_short(offset)} is not a non-negative integer below 2**64")
    return dtype, tuple(shape), offsets[0], offsets[1]


def _short(value: Any) -> str:
    """A JSON value for a one-line message, cut when long (a 5000-digit number, a huge list)."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:32]}...({len(text)} chars)"


def parse_safetensors_header(raw: bytes, data_size: int, shard: str) -> dict[str, TensorInfo]:
    """The tensors of a header `raw` followed by `data_size` bytes of data; ShardError if the loader would refuse it.

    Pure: the caller has read the header bytes and knows the file's size. Errors are
    one line starting with `shard`.
    """
    collecting = gc.isenabled()
    gc.disable()  # tens of thousands of small objects, none cyclic: collection passes would double the time
    try:
        return _parse_header(raw, data_size, shard)
    except ValueError as error:
        raise ShardError(f"{shard}: {error}") from None
    finally:
        if collecting:
            gc.enable()


def _parse_header(raw: bytes, data_size: int, shard: str) -> dict[str, TensorInfo]:
    parsed = _strict_json(raw)
    header = parsed.value
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    pairs = parsed.pairs(header)
    if sum(key == _METADATA for key, _ in pairs) > 1:
        raise ValueError(f"{_METADATA} given twice")
    entries: dict[str, tuple[str, tuple[int, ...], int, int]] = {}
    for name, value in pairs:  # every occurrence of a repeated name is parsed; the last one counts
        if name == _METADATA:
            if value is not None and (
                not isinstance(value, dict) or not all(isinstance(v, str) for _, v in parsed.pairs(value))
            ):
                raise ValueError(f"{_METADATA} is not an object of strings")
            continue
        entries[name] = _tensor_entry(parsed, name, value)
    end = 0
    for name, (dtype, shape, start, stop) in sorted(entries.items(), key=lambda item: item[1][2:]):
        if start != end or stop < start:
            raise ValueError(
                f"tensor {name!r}: data_offsets [{start}, {stop}] do not start where the previous tensor ends ({end}): "
                "overlapping, out of order or leaving a gap"
            )
        end = stop
        elements = 1
        for dim in shape:  # the loader multiplies in order and fails on the first overflow
            elements *= dim
            if elements > _U64_MAX:
                raise ValueError(f"tensor {name!r}: shape {list(shape)} overflows 64 bits")
        bits = elements * DTYPE_BITS[dtype]
        if bits > _U64_MAX:
            raise ValueError(f"tensor {name!r}: shape {list(shape)} of {dtype} overflows 64 bits")
        if bits % 8:
            raise ValueError(f"tensor {name!r}: {elements} {dtype} elements do not fill whole bytes")
        if stop - start != bits // 8:
            raise ValueError(
                f"tensor {name!r}: data_offsets [{start}, {stop}] hold {stop - start} bytes, "
                f"shape {list(shape)} of {dtype} needs {bits // 8}"
            )
    if end != data_size:
        raise ValueError(
            f"the data section is {data_size} bytes, the header's offsets need exactly {end} "
            f"({'truncated file' if data_size < end else 'trailing bytes'})"
        )
    return {name: TensorInfo(shard, dtype, shape) for name, (dtype, shape, _, _) in entries.items()}
