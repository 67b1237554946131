"""The folders and files the recipe itself creates, checked before anything starts.

`run` (and verl under it) creates these under CHECKPOINT_DIR: the checkpoint root, TensorBoard's folder, the
smoke profile's model and data, the bench profile's data, and files in the root (the run record, the run
report, the smoke verdict, the smoke metrics verl's file logger writes). Found as something else, each would
fail late (a FileExistsError traceback from `mkdir`) or worse: verl opens its metrics file with
`open(path, "wb")`, which waits forever on a FIFO and writes through a link. So `plan`, and `run` through it,
refuse with one line each (exit 2, nothing started):
- a folder of ours, or a part of its path, that exists and is no directory (a file, a FIFO, a dangling or
  looping link), or an existing folder of ours this user cannot write into;
- a file of ours that is a directory, a FIFO, a socket or a device; for a file verl opens itself, a link too.
The recipe's own files are written atomically and replace a link planted at their name (recipe.atomic), so a
link there is no problem. Folders that do not exist yet are created by `run`; whether their nearest existing
parent is writable is `run`'s preflight (recipe.run.preflight), since `plan` may run on another machine.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from recipe.launch import METRICS_VARIABLE, planned_checkpoint_root, planned_training_file
from recipe.export.report import printable
from recipe.settings import Settings

#: The files `run` writes into the checkpoint root (recipe.record_file, recipe.run.trainer, recipe.smoke.profile).
ROOT_FILES = ("run-record.json", "run-report.json")
SMOKE_ROOT_FILES = ("smoke-verdict.json",)


@dataclass(frozen=True)
class OwnPath:
    """A path the recipe (or verl under it) creates, and the setting that decides where it is."""

    path: Path
    #: What it is, for the message: "the checkpoint root".
    role: str
    #: The setting (and its value) the message names, since it is the user's way to move it.
    setting: str
    directory: bool
    #: verl opens it itself (follows a link, blocks on a FIFO); the recipe's own files replace a link.
    opened_by_verl: bool = False


def own_paths(settings: Settings, overrides: Sequence[str], env: Mapping[str, str | None]) -> list[OwnPath]:
    """Every folder and file the run creates for this plan, with the setting that places it."""
    where = f"CHECKPOINT_DIR={str(settings.checkpoint_dir)!r}"
    root = planned_checkpoint_root(settings, overrides)
    paths = [
        OwnPath(settings.checkpoint_dir, "the checkpoint folder", where, True),
        OwnPath(root, "the checkpoint root", where, True),
        *(OwnPath(root / name, "a file of the run", where, False) for name in ROOT_FILES),
    ]
    tensorboard = env.get("TENSORBOARD_DIR")
    if tensorboard:
        paths.append(OwnPath(Path(tensorboard), "TensorBoard's folder", f"TENSORBOARD_DIR={tensorboard!r}", True))
    if settings.profile == "smoke":
        # lazy: the smoke profile's modules import datasets and Pillow; only with PROFILE=smoke
        from recipe.smoke import assets_root

        paths.append(OwnPath(assets_root(settings.checkpoint_dir), "the smoke model and data", where, True))
        paths += [OwnPath(root / name, "a file of the run", where, False) for name in SMOKE_ROOT_FILES]
        metrics = env.get(METRICS_VARIABLE)
        if metrics:
            paths.append(OwnPath(Path(metrics), "verl's metrics file", f"{METRICS_VARIABLE}={metrics!r}", False, True))
    if settings.profile == "bench":
        from recipe.bench import bench_data_dir, bench_rows  # lazy: the bench profile's modules, only with PROFILE=bench

        if bench_rows(planned_training_file(settings, overrides), settings.checkpoint_dir, 1, 1) is not None:
            paths.append(OwnPath(bench_data_dir(settings.checkpoint_dir), "the bench data", where, True))
    return paths


def _kind(path: Path) -> str:
    """What is at `path`, in words, not following a link: `a regular file`, `a FIFO`, `a dangling link`, ..."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return "nothing"
    if stat.S_ISLNK(mode):
        try:
            target = os.stat(path).st_mode
        except OSError:
            return "a link that leads nowhere (dangling or looping)"
        return "a link to a directory" if stat.S_ISDIR(target) else f"a link to {_kind_of_mode(target)}"
    return _kind_of_mode(mode)


def _kind_of_mode(mode: int) -> str:
    for test, words in ((stat.S_ISDIR, "a directory"), (stat.S_ISREG, "a regular file"), (stat.S_ISFIFO, "a FIFO"),
                        (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device")):  # fmt: skip
        if test(mode):
            return words
    return "a special file"


def _folder_problem(own: OwnPath) -> tuple[Path, str] | None:
    """(the offending path, why) for a folder of ours, or None."""
    # The nearest part of the path that exists must be a directory (following links: a folder may be a link to
    # another disk); the folder itself, when it exists, one this user can write into.
    for part in (own.path, *own.path.parents):
        if not os.path.lexists(part):
            continue
        kind = _kind(part)
        if kind not in ("a directory", "a link to a directory"):
            of = "" if part == own.path else f" (on the way to {printable(str(own.path))})"
            return part, f"{printable(str(part))}{of} is {kind}, not a directory"
        if part == own.path and not os.access(part, os.W_OK | os.X_OK):
            return part, f"{printable(str(part))} is a directory that uid {os.getuid()} cannot write into"
        return None
    return None


def _file_problem(own: OwnPath) -> tuple[Path, str] | None:
    """(the file, why) for a file of ours that exists as something the run cannot write, or None."""
    if not os.path.lexists(own.path):
        return None
    kind = _kind(own.path)
    if kind == "a regular file" or (kind.startswith("a link") and not own.opened_by_verl):
        return None  # overwritten; a link is replaced (recipe.atomic), never written through
    return own.path, f"{printable(str(own.path))} is {kind}, where the run writes a file"


def own_path_problems(settings: Settings, overrides: Sequence[str], env: Mapping[str, str | None]) -> list[str]:
    """One line per folder or file of the run that exists as something the run cannot use (exit 2 in `plan` and `run`)."""
    problems, seen = [], set()
    for own in own_paths(settings, overrides, env):
        found = _folder_problem(own) if own.directory else _file_problem(own)
        if found and found[0] not in seen:  # a file at CHECKPOINT_DIR is one problem, not one per folder below it
            seen.add(found[0])
            problems.append(f"{printable(own.setting)}: {own.role}, {found[1]}; move it away or choose another place")
    return problems
