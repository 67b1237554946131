"""What the export watcher saw when it checked an export, and whether its report still speaks for that export.

A report beside an export (hf_export_report.json) decides whether a run counts as finished and whether the
smoke verdict's watcher check passes. A file on disk can be forged, copied from another step or run, or left
stale by a later rewrite of the export, so a report counts only with its evidence: the watcher records, as it
checks, the step, where the export lies in the step's folder, and every file of the export with its size and
a sha256 of what the check reads (the whole file for the small ones: config, index, tokenizer; the header of
each safetensors shard, which names every tensor, its shape and its place, since an export is tens of GB).

A reader (`trusted_status`) takes the report's status only when the report is exactly of this schema, names
this step and this export, holds one of the watcher's three statuses, and lists the same file names with the
same sizes as the folder holds now. Anything else is "not known", and the reader checks the export itself
(recipe.export.hf_check reads only headers: seconds, not a re-read of the weights).
"""

from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, StrictInt, ValidationError

from recipe.export.safetensors_header import MAX_HEADER_BYTES
from recipe.read_back import FileRefused, parse_json, read_file, read_prefix

#: Files up to this size are digested whole; larger ones that are no safetensors shard are listed by size only.
WHOLE_FILE_BYTES = 64 << 20
#: A report larger than this is not one the watcher wrote (they are kilobytes; the evidence adds a line per file).
MAX_REPORT_BYTES = 16 << 20


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class FileSeen(_Strict):
    """One file of the export as the watcher checked it."""

    size: StrictInt
    #: sha256 of the whole file, or of a shard's header (8-byte length and JSON); None: too large, and no shard.
    sha256: str | None


class Evidence(_Strict):
    """What the watcher checked: the step, the export's folder within the step's, and its files."""

    step: StrictInt
    export: str
    files: dict[str, FileSeen]


class _StoredReport(BaseModel):
    """The parts of a stored report a reader trusts (the lists of tensors are for people)."""

    model_config = ConfigDict(strict=True, extra="allow")

    status: Literal["complete", "lenient", "broken"]
    evidence: Evidence


def _files(export: Path) -> dict[str, int]:
    """{name: size} of the regular files directly in the export folder (verl writes a flat folder)."""
    sizes = {}
    with os.scandir(export) as entries:
        for entry in entries:
            if entry.is_file():
                sizes[entry.name] = entry.stat().st_size
    return sizes


def _digest(path: Path, size: int) -> str | None:
    """sha256 of what the check reads of `path`: a shard's header, or a small file whole; None for neither."""
    if path.suffix == ".safetensors":
        prefix = read_prefix(path, 8)
        if len(prefix) < 8:
            return hashlib.sha256(prefix).hexdigest()
        length = struct.unpack("<Q", prefix)[0]
        header = read_prefix(path, 8 + min(length, MAX_HEADER_BYTES))
        return hashlib.sha256(header).hexdigest()
    if size <= WHOLE_FILE_BYTES:
        return hashlib.sha256(read_file(path, WHOLE_FILE_BYTES)).hexdigest()
    return None


def collect_evidence(step: int, step_dir: Path, export: Path) -> Evidence:
    """The evidence of `export` (step `step`, inside `step_dir`) as it is now; OSError or FileRefused if unreadable."""
    files = {name: FileSeen(size=size, sha256=_digest(export / name, size)) for name, size in sorted(_files(export).items())}
    return Evidence(step=step, export=export.relative_to(step_dir).as_posix(), files=files)


def trusted_status(report: Path, step: int, step_dir: Path, export: Path) -> str | None:
    """The status of the watcher's report at `report` when its evidence matches `export` of step `step`; else None.

    Compares the step, the export's place and each file's name and size (no digest: the check made instead,
    when these differ, costs the same). Never raises: an unreadable, forged, foreign or stale report is None.
    """
    try:
        stored = _StoredReport.model_validate(parse_json(read_file(report, MAX_REPORT_BYTES), str(report)))
        now = _files(export)
    except (FileRefused, ValidationError, OSError, ValueError):
        return None
    evidence = stored.evidence
    if not evidence.files:
        return None  # the watcher checks no empty folder (no config.json): no report of its own says it saw nothing
    if evidence.step != step or evidence.export != export.relative_to(step_dir).as_posix():
        return None  # another step's or another export's report
    if {name: seen.size for name, seen in evidence.files.items()} != now:
        return None  # the export changed since it was checked (or the report never saw it)
    return stored.status


__all__ = ["Evidence", "FileSeen", "MAX_REPORT_BYTES", "collect_evidence", "trusted_status"]
