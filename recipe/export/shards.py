"""Read what an HF checkpoint directory holds, without loading a single weight.

(Over 400 lines on purpose: it mirrors the safetensors loader's validation rule by rule, and the
rules read best together.)

A safetensors file starts with an 8-byte little-endian header length and a JSON
header naming each tensor with its dtype, shape and byte range
(https://huggingface.co/docs/safetensors#format). Reading only that header makes
the check take milliseconds per shard, whatever the checkpoint's size.

The header is validated exactly as the `safetensors` loader (0.8) validates it,
still without reading tensor data: header length at most 100,000,000 bytes and
inside the file; strict UTF-8 and strict JSON (serde_json's rules: no NaN or
Infinity, no lone surrogate escapes, at most 127 nested containers, no number out
of range); known dtypes; shape entries and offsets plain non-negative integers below
2**64; offsets contiguous from 0 and covering the data section exactly;
`prod(shape) * bits == 8 * (end - start)` with the loader's overflow rules. The
file's size comes from fstat, so a 65 GB shard costs the same as a 65 kB one.

Only regular files are opened (never a FIFO or a device), by plain file names
inside the checkpoint directory; a symlink is followed only when its target is
inside that directory, or inside the `blobs/` of the Hugging Face cache repository
the directory is a snapshot of (see `allowed_roots`).
"""

from __future__ import annotations

import gc
import json
import math
import os
import re
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
#: safetensors' own MAX_HEADER_SIZE: a longer header is refused by the loader.
MAX_HEADER_BYTES = 100_000_000
#: An index larger than this is not a real index (30k tensors take about 3 MB).
MAX_INDEX_BYTES = 256 * 1024 * 1024
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


@dataclass
class CheckpointContents:
    """Tensors found in the shards, the index's weight_map, and what could not be read."""

    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    index: dict[str, str] | None = None
    shard_names: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


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


# --- files ------------------------------------------------------------------------------


def _open_regular(path: Path, label: str) -> int:
    """A read-only descriptor of `path` if it is a regular file.

    Anything else (FIFO, device, socket, directory) is refused before it is opened,
    and checked again on the descriptor (O_NONBLOCK: a FIFO swapped in meanwhile
    cannot block the open).
    """
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise ShardError(f"{label}: not a regular file (not read)")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        raise ShardError(f"{label}: cannot open ({error.strerror or error})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ShardError(f"{label}: not a regular file (not read)")
    return fd


def _read_exactly(fd: int, offset: int, size: int) -> bytes:
    chunks: list[bytes] = []
    while size > 0:
        chunk = os.pread(fd, min(size, 1 << 24), offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def read_safetensors_header(path: Path, label: str | None = None) -> dict[str, TensorInfo]:
    """Tensor names, dtypes and shapes from one safetensors file's header, validated as the loader does.

    Reads the first 8 bytes and the header only; the data section's size comes from
    fstat. ShardError (one line starting with `label`, by default the file's name) for
    anything the `safetensors` loader would refuse, and for a path that is not a
    regular file. TensorInfo.shard is `label` too.
    """
    path = Path(path)
    name = label if label is not None else path.name
    fd = _open_regular(path, name)
    try:
        size = os.fstat(fd).st_size
        try:
            prefix = _read_exactly(fd, 0, 8)
            if len(prefix) != 8:
                raise ShardError(f"{name}: {size} bytes, shorter than a safetensors header length")
            (length,) = struct.unpack("<Q", prefix)
            if length > MAX_HEADER_BYTES:
                raise ShardError(f"{name}: header length {length} is over safetensors' limit of {MAX_HEADER_BYTES}")
            if 8 + length > size:
                raise ShardError(f"{name}: header length {length} runs past the end of the file ({size} bytes)")
            raw = _read_exactly(fd, 8, length)
        except OSError as error:
            raise ShardError(f"{name}: cannot read ({error.strerror or error})") from None
    finally:
        os.close(fd)
    if len(raw) != length:
        raise ShardError(f"{name}: header cut short (the file shrank while it was read)")
    return parse_safetensors_header(raw, size - 8 - length, name)


def _plain_name(name: str) -> bool:
    """A single file name: no directory part, not `.`/`..`, nothing a path could be forged from."""
    return (
        bool(name)
        and name not in (".", "..")
        and not any(sep in name for sep in ("/", "\\", "\0"))
        and name.isprintable()
    )


def allowed_roots(directory: Path) -> tuple[Path, ...]:
    """Where a symlinked file of `directory` may point: the directory itself, and for a
    Hugging Face cache snapshot (`<cache>/models--org--name/snapshots/<revision>/...`)
    that repository's `blobs/`, where the cache keeps the real files."""
    real = directory.resolve()
    roots = [real]
    for ancestor in real.parents:
        if ancestor.name == "snapshots" and ancestor.parent.name.startswith("models--"):
            blobs = ancestor.parent / "blobs"
            if blobs.is_dir():
                roots.append(blobs.resolve())
            break
    return tuple(roots)


def resolve_member(directory: Path, name: str, roots: tuple[Path, ...], missing: str) -> Path:
    """The file `name` of `directory`, symlinks resolved; ShardError (one line) when it must not be opened.

    `missing` completes the message when there is no such file.
    """
    shown = repr(name) if not _plain_name(name) else name
    if not _plain_name(name):
        raise ShardError(f"{shown}: not a plain file name inside the checkpoint directory (not opened)")
    path = directory / name
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise ShardError(f"{name}: {missing}") from None
    except OSError as error:
        raise ShardError(f"{name}: cannot read ({error.strerror or error})") from None
    if not stat.S_ISLNK(info.st_mode):
        return path
    try:
        target = path.resolve(strict=True)
    except (OSError, RuntimeError):
        raise ShardError(f"{name}: a symlink whose target does not exist") from None
    if not any(target == root or target.is_relative_to(root) for root in roots):
        raise ShardError(
            f"{name}: a symlink to {str(target)!r}, outside the checkpoint directory "
            "and not a Hugging Face cache blob (not opened)"
        )
    return target


def _read_index(directory: Path, roots: tuple[Path, ...]) -> dict[str, str]:
    """The index's weight_map; ShardError (one line) when it cannot be used."""
    path = resolve_member(directory, INDEX_NAME, roots, "absent")
    fd = _open_regular(path, INDEX_NAME)
    try:
        size = os.fstat(fd).st_size
        if size > MAX_INDEX_BYTES:
            raise ShardError(f"{INDEX_NAME}: {size} bytes, too large for an index (limit {MAX_INDEX_BYTES})")
        try:
            raw = _read_exactly(fd, 0, size)
        except OSError as error:
            raise ShardError(f"{INDEX_NAME}: cannot read ({error.strerror or error})") from None
    finally:
        os.close(fd)
    try:
        # transformers reads the index with Python's json: so does the check, minus the crashes.
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise ShardError(f"{INDEX_NAME}: not UTF-8 (byte at offset {error.start})") from None
    except RecursionError:
        raise ShardError(f"{INDEX_NAME}: JSON nested too deeply to read") from None
    except ValueError as error:  # JSONDecodeError, and an integer too long to convert
        raise ShardError(f"{INDEX_NAME}: not JSON ({str(error).splitlines()[0]})") from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ShardError(f"{INDEX_NAME}: no weight_map of tensor name -> shard file")
    return weight_map


def _listed_shards(directory: Path) -> tuple[set[str], list[str]]:
    """Names of `*.safetensors` entries of `directory` (whatever their type), and listing errors."""
    try:
        with os.scandir(directory) as entries:
            return {entry.name for entry in entries if entry.name.endswith(".safetensors")}, []
    except OSError as error:
        return set(), [f"{directory.name}: cannot list ({error.strerror or error})"]


def read_checkpoint(directory: Path) -> CheckpointContents:
    """Everything the shards and the index of an HF checkpoint directory say.

    Shards are every `*.safetensors` entry of the directory plus any file the index
    names. A shard that is missing, not a regular file, not a plain file name, a
    symlink out of the directory (see `allowed_roots`) or not valid safetensors
    becomes one error line and is not read; the index entries pointing at it become
    ghosts (decided by the caller). Nothing here raises on hostile content.
    """
    directory = Path(directory)
    contents = CheckpointContents()
    roots = allowed_roots(directory)
    if os.path.lexists(directory / INDEX_NAME):
        try:
            contents.index = _read_index(directory, roots)
        except ShardError as error:
            contents.errors.append(str(error))
    names, listing_errors = _listed_shards(directory)
    contents.errors.extend(listing_errors)
    if contents.index:
        named = set(contents.index.values())
        bad = sorted(name for name in named if not _plain_name(name))
        for name in bad:
            count = sum(1 for shard in contents.index.values() if shard == name)
            contents.errors.append(
                f"{INDEX_NAME}: weight_map names {name!r} for {count} tensor(s): not a plain file name "
                "inside the checkpoint directory (not opened)"
            )
        names |= named - set(bad)
    contents.shard_names = sorted(names)
    for name in contents.shard_names:
        try:
            path = resolve_member(directory, name, roots, "named by the index but not on disk")
            found = read_safetensors_header(path, label=name)
        except ShardError as error:
            contents.errors.append(str(error))
            continue
        for tensor, info in found.items():
            if tensor in contents.tensors:
                contents.errors.append(f"{tensor}: in two shards ({contents.tensors[tensor].shard}, {name})")
                continue
            contents.tensors[tensor] = info
    return contents
