"""Read what an HF checkpoint directory holds, without loading a single weight.

Reading only each shard's header (recipe.export.safetensors_header validates it as the
safetensors loader does) makes the check take milliseconds per shard, whatever the checkpoint's
size: the file's size comes from fstat, so a 65 GB shard costs the same as a 65 kB one. The index
(model.safetensors.index.json) says which shard holds which tensor.

Only regular files are opened (never a FIFO or a device), by plain file names
inside the checkpoint directory; a symlink is followed only when its target is
inside that directory, or inside the `blobs/` of the Hugging Face cache repository
the directory is a snapshot of (see `allowed_roots`).
"""

from __future__ import annotations

import json
import os
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path

from recipe.export.safetensors_header import MAX_HEADER_BYTES, ShardError, TensorInfo, parse_safetensors_header

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
#: An index larger than this is not a real index (30k tensors take about 3 MB).
MAX_INDEX_BYTES = 256 * 1024 * 1024
@dataclass
class CheckpointContents:
    """Tensors found in the shards, the index's weight_map, and what could not be read."""

    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    index: dict[str, str] | None = None
    shard_names: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


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
