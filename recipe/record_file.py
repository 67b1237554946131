"""The stored run record: its schema, reading it back as input, and writing it without following links.

A record travels (copied between clusters, pasted into tickets), so reading one treats every byte
as hostile: the path must be a regular file of at most RECORD_MAX_BYTES (a FIFO, /dev/zero, a
symlink loop or a dangling link is an unreadable record, never "no record"), the JSON may not be
nested deeper than Python's parser allows, and its content must match StoredRecord exactly
(strict types: `schema_version` 1.0 or true is not 1). Anything else is UnreadableRecord, which
`plan`, `run` and `replay` turn into one exit-2 line; ALLOW_DRIFT never applies to it.

Writing is atomic (a temporary file in the same directory, renamed over the target) and never
follows a symlink: a planted `run-record.json` link is replaced, not written through, and a
`global_step_N` that is itself a link is not written into.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError

from recipe.atomic import atomic_write
from recipe.read_back import FileRefused, open_regular, read_bounded

RECORD_NAME = "run-record.json"
SCHEMA_VERSION = 1
RECORD_MAX_BYTES = 16 << 20

Scalar = StrictStr | StrictInt | float | bool | None


class UnreadableRecord(ValueError):
    """A stored record that cannot be used: not a regular file, not JSON, or not of the schema."""


#: verl 0.9.1's key of a custom reward function's file: its content is part of the math.
REWARD_FUNCTION_KEY = "reward.custom_reward_function.path"


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class DataFile(_Strict):
    path: str
    size: StrictInt
    rows: StrictInt | None
    sha256: str


class ModelFiles(_Strict):
    path: str = ""
    files: dict[str, str] = Field(default_factory=dict)


class ImageFacts(_Strict):
    labels: dict[str, str] | None = None
    locks: dict[str, str] = Field(default_factory=dict)


class ReferencedFile(_Strict):
    path: str
    sha256: str | None


class StoredRecord(_Strict):
    """What a run record may hold; a missing part reads as empty, which the drift guard then reports as changed."""

    schema_version: StrictInt
    recipe_version: str = ""
    frameworks: dict[str, str | None] = Field(default_factory=dict)
    image: ImageFacts = Field(default_factory=ImageFacts)
    model: ModelFiles = Field(default_factory=ModelFiles)
    data: dict[str, DataFile | None] = Field(default_factory=dict)
    layout: dict[str, Scalar] = Field(default_factory=dict)
    training: dict[str, str] = Field(default_factory=dict)
    environment_reads: dict[str, str | None] = Field(default_factory=dict)
    referenced_files: dict[str, ReferencedFile | None] = Field(default_factory=dict)
    #: The one referenced file records of recipe 0.1.0 before referenced_files held: read as its entry.
    reward_function: ReferencedFile | None = None
    extra_overrides: list[str] = Field(default_factory=list)
    setting_keys: dict[str, str] = Field(default_factory=dict)
    settings: dict[str, Scalar] = Field(default_factory=dict)


def _problem(error: ValidationError) -> str:
    first = error.errors()[0]
    # A key of the record is part of the location, and the record may be hostile: a key's newline or control
    # character is shown escaped (JSON's way), so that the message stays one line.
    where = ".".join(json.dumps(part)[1:-1] if isinstance(part, str) else str(part) for part in first["loc"]) or "(top)"
    return f"{where}: {first['msg']}"


def _not_json(constant: str) -> None:
    raise ValueError(f"{constant} is not JSON")  # Python's reader takes NaN and Infinity; a record of ours never has them


def _no_unwritable_text(value: Any) -> None:
    """ValueError for a NUL or a lone surrogate anywhere (a key or a string): no path or value of ours holds one.

    Either breaks whatever reads it next (a path with NUL cannot be opened, a surrogate cannot be
    encoded), so a record holding one is refused as a whole.
    """
    if isinstance(value, str):
        if "\x00" in value or any("\ud800" <= char <= "\udfff" for char in value):
            raise ValueError("a NUL or a lone surrogate in a string")
    elif isinstance(value, dict):
        for key, inner in value.items():
            _no_unwritable_text(key)
            _no_unwritable_text(inner)
    elif isinstance(value, list):
        for inner in value:
            _no_unwritable_text(inner)


def read_record(path: Path) -> dict[str, Any] | None:
    """A stored run record's provenance, validated; None when nothing is at `path` (not even a link).

    Raises UnreadableRecord naming the path and why: a dangling or looping link, a special
    file, more than RECORD_MAX_BYTES, not UTF-8 JSON, nesting too deep, or not of the schema.
    """
    try:
        fd, _ = open_regular(path, RECORD_MAX_BYTES)
    except FileNotFoundError:
        if os.path.lexists(path):
            raise UnreadableRecord(f"{path}: a symlink to nothing") from None
        return None
    except FileRefused as error:
        raise UnreadableRecord(f"{error} (a run record is a regular file of at most 16 MiB)") from None
    except OSError as error:
        raise UnreadableRecord(f"{path}: cannot be read ({error.strerror or type(error).__name__})") from None
    try:
        document = json.loads(read_bounded(fd, RECORD_MAX_BYTES).decode("utf-8"), parse_constant=_not_json)
        _no_unwritable_text(document)
    except FileRefused as error:
        raise UnreadableRecord(f"{path}: {error}") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise UnreadableRecord(f"{path}: not a run record ({type(error).__name__}: {str(error)[:120]})") from None
    except OSError as error:
        raise UnreadableRecord(f"{path}: cannot be read ({error.strerror or type(error).__name__})") from None
    finally:
        os.close(fd)
    record = document.get("provenance") if isinstance(document, dict) else None
    if not isinstance(record, dict):
        raise UnreadableRecord(f"{path}: not a run record (no \"provenance\" object)")
    if type(record.get("schema_version")) is not int or record["schema_version"] != SCHEMA_VERSION:
        raise UnreadableRecord(f"{path}: not a run record of schema {SCHEMA_VERSION}")
    try:
        stored = StoredRecord.model_validate(record).model_dump()
        if stored.pop("reward_function") is not None and REWARD_FUNCTION_KEY not in stored["referenced_files"]:
            stored["referenced_files"][REWARD_FUNCTION_KEY] = record["reward_function"]
        return stored
    except ValidationError as error:
        raise UnreadableRecord(f"{path}: not a run record of schema {SCHEMA_VERSION} ({_problem(error)})") from None
    except RecursionError:
        raise UnreadableRecord(f"{path}: not a run record (nested too deep)") from None


def record_bytes(record: Mapping[str, Any], started: datetime | None = None) -> bytes:
    """The file's content: the record and, beside it (not in it), when the run started."""
    document = {"provenance": record, "started_at": (started or datetime.now(timezone.utc)).isoformat()}
    return (json.dumps(document, indent=2, sort_keys=True) + "\n").encode("utf-8")


def _replace_atomically(directory: Path, data: bytes) -> Path:
    """Write `data` to directory/RECORD_NAME by a renamed temporary file (a link there is replaced, not followed)."""
    atomic_write(directory / RECORD_NAME, lambda out: out.write(data))
    return directory / RECORD_NAME


def write_record(root: Path, data: bytes) -> Path:
    """Write record_bytes() to <root>/run-record.json atomically; raises OSError (a full disk, root not a directory)."""
    root.mkdir(parents=True, exist_ok=True)
    return _replace_atomically(root, data)


def copy_into_new_steps(root: Path, existing: set[str], data: bytes) -> list[Path]:
    """Write the run record (record_bytes()) into each global_step_N under root that was not there when the run started.

    A step that is a symlink, or already holds a regular record, is left alone; a link planted
    where the record goes is replaced by the record.
    """
    copied = []
    for step in sorted(root.glob("global_step_*")):
        if step.name in existing:
            continue
        try:
            if not stat.S_ISDIR(os.lstat(step).st_mode):
                continue
            target = step / RECORD_NAME
            if os.path.lexists(target) and stat.S_ISREG(os.lstat(target).st_mode):
                continue
            copied.append(_replace_atomically(step, data))
        except OSError:
            continue  # the step is being deleted (verl's max_ckpt_to_keep) or not writable: the next sweep sees it
    return copied
