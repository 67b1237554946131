"""Read what an HF checkpoint directory holds, without loading a single weight.

A safetensors file starts with an 8-byte little-endian header length and a JSON
header naming each tensor with its dtype, shape and byte range
(https://huggingface.co/docs/safetensors#format). Reading only that header makes
the check take milliseconds per shard, whatever the checkpoint's size.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
#: A header larger than this is not a real safetensors header (the format caps it at 100 MB).
MAX_HEADER_BYTES = 100 * 1024 * 1024


class ShardError(Exception):
    """A shard file that cannot be read as safetensors."""


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


def read_safetensors_header(path: Path) -> dict[str, TensorInfo]:
    """Tensor names, dtypes and shapes from one safetensors file's header."""
    try:
        with path.open("rb") as handle:
            prefix = handle.read(8)
            if len(prefix) != 8:
                raise ShardError(f"{path.name}: shorter than a safetensors header")
            (length,) = struct.unpack("<Q", prefix)
            if length > MAX_HEADER_BYTES:
                raise ShardError(f"{path.name}: header length {length} is not plausible")
            raw = handle.read(length)
    except OSError as error:
        raise ShardError(f"{path.name}: cannot read ({error.strerror or error})") from error
    if len(raw) != length:
        raise ShardError(f"{path.name}: truncated header")
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ShardError(f"{path.name}: header is not JSON ({error})") from error
    if not isinstance(header, dict):
        raise ShardError(f"{path.name}: header is not a JSON object")
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(entry, dict) or not isinstance(entry.get("shape"), list):
            raise ShardError(f"{path.name}: entry {name!r} has no shape")
        tensors[name] = TensorInfo(path.name, str(entry.get("dtype")), tuple(int(d) for d in entry["shape"]))
    return tensors


def read_checkpoint(directory: Path) -> CheckpointContents:
    """Everything the shards and the index of an HF checkpoint directory say.

    Shards are every `*.safetensors` file in the directory plus any file the index
    names; a file the index names that does not exist becomes an error (and its
    entries ghosts, decided by the caller).
    """
    contents = CheckpointContents()
    index_path = directory / INDEX_NAME
    if index_path.is_file():
        try:
            data = json.loads(index_path.read_text(encoding="utf-8"))
            weight_map = data.get("weight_map") if isinstance(data, dict) else None
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise ValueError("no weight_map of name -> file")
            contents.index = {str(k): v for k, v in weight_map.items()}
        except (OSError, ValueError) as error:
            contents.errors.append(f"{INDEX_NAME}: unreadable ({error})")
    names = {p.name for p in directory.glob("*.safetensors") if p.is_file()}
    if contents.index:
        names |= set(contents.index.values())
    contents.shard_names = sorted(names)
    for name in contents.shard_names:
        path = directory / name
        if not path.is_file():
            contents.errors.append(f"{name}: named by the index but not on disk")
            continue
        try:
            found = read_safetensors_header(path)
        except ShardError as error:
            contents.errors.append(str(error))
            continue
        for tensor, info in found.items():
            if tensor in contents.tensors:
                contents.errors.append(f"{tensor}: in two shards ({contents.tensors[tensor].shard}, {name})")
                continue
            contents.tensors[tensor] = info
    return contents
