"""Files read back (a record, a report, a tracker, a metrics log, a config, a probe's file) as the hostile input they may be.

A file the recipe or the trainer wrote earlier travels, is edited and is replaced: by the time it is
read back it may be a FIFO (whose open would wait for a writer forever), a directory, a link to
/dev/zero, 2 TiB, bytes that are no UTF-8, JSON nested past Python's recursion limit or numbers of
ten thousand digits. Every reader goes through here: the file is opened with O_NONBLOCK (a FIFO
cannot block the open), checked on the opened descriptor with fstat (a regular file of at most its
bound; a path swapped after a stat cannot slip another file in), and read to at most that bound.
Every failure, to open, to decode, too deep, is FileRefused with one line naming the file, which
the caller turns into its own clear error.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

CHUNK = 1 << 20


class FileRefused(ValueError):
    """A file that is not read: not a regular file, above its bound, unreadable, or not what it should hold."""


def _size_text(size: int) -> str:
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift:
            return f"{size / (1 << shift):.1f} {unit}"
    return f"{size} B"


def open_regular(path: Path, limit: int, *, follow: bool = True) -> tuple[int, os.stat_result]:
    """An fd of `path` opened for reading, with its fstat; FileRefused unless a regular file of at most `limit` bytes.

    O_NONBLOCK keeps a FIFO from blocking the open; the checks are on the opened file itself,
    so a path swapped after a stat cannot slip another file in. `follow=False` refuses a symlink.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FileRefused(f"{path}: not a regular file")
        if info.st_size > limit:
            raise FileRefused(f"{path}: {_size_text(info.st_size)}, above the {_size_text(limit)} bound")
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def read_bounded(fd: int, limit: int) -> bytes:
    """At most `limit` bytes of fd; FileRefused when it holds more (it grew since it was checked)."""
    chunks, total = [], 0
    while chunk := os.read(fd, min(CHUNK, limit + 1 - total)):
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:
            raise FileRefused(f"more than {_size_text(limit)}")
    return b"".join(chunks)


def read_file(path: Path, limit: int, *, follow: bool = True) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; FileRefused for anything else, an OSError's cause included."""
    try:
        fd, _ = open_regular(Path(path), limit, follow=follow)
    except OSError as error:
        raise FileRefused(f"{path}: cannot be opened ({error.strerror or type(error).__name__})") from None
    try:
        return read_bounded(fd, limit)
    except FileRefused as error:
        raise FileRefused(f"{path}: {error}") from None
    except OSError as error:
        raise FileRefused(f"{path}: cannot be read ({error.strerror or type(error).__name__})") from None
    finally:
        os.close(fd)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_json(text: str | bytes, where: str, *, constants: bool = False) -> Any:
    """One JSON document; FileRefused naming `where` and the cause for any failure.

    Strict by default: NaN and Infinity are not JSON (`constants=True` takes them, as Python's
    json writes them: verl's metrics log does). Depth is a failure too: json's parser recurses,
    and a document nested past the interpreter's limit raises RecursionError (or MemoryError),
    which `except ValueError` would let through; so is a number of more than 4,300 digits,
    whose conversion the interpreter refuses with a plain ValueError.
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as error:
            raise FileRefused(f"{where}: not UTF-8 text (byte {error.start})") from None
    try:
        return json.loads(text) if constants else json.loads(text, parse_constant=_no_constant)
    except (RecursionError, MemoryError):
        raise FileRefused(f"{where}: nested too deep to be read") from None
    except json.JSONDecodeError as error:
        raise FileRefused(f"{where}: not JSON ({error.msg}, line {error.lineno} column {error.colno})") from None
    except ValueError as error:  # NaN or Infinity, or an integer past the interpreter's 4,300 digits
        why = "a number of more than 4,300 digits" if "digits" in str(error) else str(error)
        raise FileRefused(f"{where}: not JSON: {why}") from None


def read_json(path: Path, limit: int, *, follow: bool = True, constants: bool = False) -> Any:
    """The JSON document in a regular file of at most `limit` bytes; FileRefused for anything else."""
    return parse_json(read_file(path, limit, follow=follow), str(path), constants=constants)


def read_prefix(path: Path, size: int, *, follow: bool = True) -> bytes:
    """The first `size` bytes of a regular file of any length (a source file parsed only so far); FileRefused otherwise."""
    try:
        fd, _ = open_regular(Path(path), 1 << 62, follow=follow)
    except OSError as error:
        raise FileRefused(f"{path}: cannot be opened ({error.strerror or type(error).__name__})") from None
    try:
        chunks, total = [], 0
        while total < size and (chunk := os.read(fd, min(CHUNK, size - total))):
            chunks.append(chunk)
            total += len(chunk)
        return b"".join(chunks)
    except OSError as error:
        raise FileRefused(f"{path}: cannot be read ({error.strerror or type(error).__name__})") from None
    finally:
        os.close(fd)
