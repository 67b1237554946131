"""`entrypoint.py replay RECORD [--format shell|env-file]`: a stored run record's settings as a file, and what changed since.

stdout is one file for one kind of reader (recipe/replay_files.py has the rules): `shell` (the
default) for bash and dash, `set -a; . ./replay.sh; set +a`, which holds every value; `env-file` for
`docker run --env-file` and Compose's `env_file:` with `format: raw`, which leaves out, as a comment
line naming the setting and one `replay:` line on stderr, a value those readers cannot hold (a
newline, a carriage return at its end, more than 4,096 characters). Each file holds one line per
recipe setting the record holds, read back by its reader exactly, and comment lines. A record is
input too (it travels between clusters and into tickets): only the settings model's own names are
written, never a secret (a record holds them redacted, and sourcing `HF_TOKEN='**********'` would
replace the real token), no value runs as code in its reader, and a comment line never holds a
newline. A setting that is not a scalar (a list, an object) refuses the record (exit 2, naming it).
Then `plan` with the record's extra overrides gives the record's argv. Each input that no longer
matches the record (a data file, the model's files, a framework version) is one `replay:` line on
stderr.
"""

from __future__ import annotations

import argparse
import os
import shlex
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipe.export.report import printable
from recipe.help import add_command
from recipe.provenance import drift, shown_name
from recipe.record_file import RECORD_NAME, UnreadableRecord, read_record
from recipe.replay_files import ENV_FILE, FORMATS, READERS, SHELL, UnwritableRecord, comment, setting_line
from recipe.settings import Settings
from recipe.settings_messages import SECRET_SETTINGS

EXIT_OK, EXIT_CANNOT_READ = 0, 2

#: The settings model's own names; replay writes them all but the secrets, ALLOW_DRIFT (a decision
#: about one resume, which a replayed record must not make for the next: it would switch off the guard)
#: and OVERRIDES (a record holds them as extra_overrides, which the `run with` comment gives: twice
#: would apply them twice).
SETTINGS = frozenset(name.upper() for name in Settings.model_fields)
REPLAYABLE = SETTINGS - SECRET_SETTINGS - {"ALLOW_DRIFT", "OVERRIDES"}


@dataclass(frozen=True)
class Replayed:
    """One file replay writes: its lines, the record's keys that are not settings, the settings left out of it."""

    lines: list[str]
    not_settings: list[str]
    #: One note per setting whose value this file's reader cannot hold (a comment line in the file too).
    left_out: list[str]


def add_replay_parser(commands: Any) -> None:
    """Register `replay RECORD [--format shell|env-file]` on the CLI's subcommands."""
    replay = add_command(
        commands, "replay",
        summary="print a stored run record's settings as a shell file or an env-file, and which inputs changed since",
        description="Read RECORD (a run-record.json that `run` wrote to the checkpoint root or a global_step_N, "
        "or the directory holding one) and print its settings, secrets never included, as a file for one reader, "
        "so that `plan` with them gives the record's trainer command; the extra overrides it ran with follow as a "
        "comment. Each value is written so that its reader gets it back exactly; a value the env-file cannot hold "
        "(a newline) is left out of it as a comment naming the setting, and said on stderr. Then compare the "
        "inputs the record names (data files, the model's files, the framework versions) with what is there now: "
        "one `replay:` line on stderr for each that changed.",
        exit_codes={0: "printed (changes and values left out, if any, on stderr)", 2: "RECORD is not a readable run record"},
        examples=[
            "entrypoint.py replay /checkpoints/p/e/global_step_40 > replay.sh",
            "entrypoint.py replay --format env-file /checkpoints/p/e/global_step_40 > replay.env",
        ],
    )  # fmt: skip
    replay.add_argument("record", type=Path, metavar="RECORD")
    replay.add_argument(
        "--format", choices=FORMATS, default=SHELL,
        help=f"the reader the file is for: {SHELL} (the default) {READERS[SHELL]}; {ENV_FILE} {READERS[ENV_FILE]}",
    )  # fmt: skip


def replay_lines(record: dict[str, Any], path: Path, form: str = SHELL) -> Replayed:
    """The file of FORM for a record read from PATH; raises UnwritableRecord."""
    settings = record.get("settings")
    extra = record.get("extra_overrides", [])
    if not isinstance(settings, dict) or not isinstance(extra, list):
        raise UnwritableRecord("settings must be an object and extra_overrides a list")
    lines = [
        comment(f"settings of the run recorded in {path} (recipe {record.get('recipe_version')})"),
        comment(READERS[form]),  # the two files look alike: each says which reader it is for
    ]
    not_settings = sorted(shown_name(str(name)) for name in settings if name not in SETTINGS)
    written = [setting_line(name, value, form) for name, value in sorted(settings.items())
               if name in REPLAYABLE and value is not None]  # fmt: skip
    lines += [line for line, _ in written]
    if extra:
        lines.append(comment("run with: entrypoint.py run -- " + " ".join(shlex.quote(str(o)) for o in extra)))
    return Replayed(lines, not_settings, [note for _, note in written if note is not None])


def _emit(text: str) -> None:
    """TEXT on stdout as UTF-8 whatever the locale: docker's reader refuses other bytes, a shell passes them on."""
    binary = getattr(sys.stdout, "buffer", None)
    if binary is None:  # a text-only stream (io.StringIO): nothing to encode
        sys.stdout.write(text)
        return
    sys.stdout.flush()
    binary.write(text.encode("utf-8"))
    binary.flush()


def run_replay(args: argparse.Namespace, now: dict[str, Any] | None = None) -> int:
    """Handler of `replay`: NOW is the record of the current inputs (computed when None)."""
    shown = printable(str(args.record))
    try:
        path = args.record / RECORD_NAME if args.record.is_dir() else args.record
        record = read_record(path)
    except UnreadableRecord as error:
        print(f"error: RECORD={shown!r}: {printable(str(error))}", file=sys.stderr)
        return EXIT_CANNOT_READ
    except (OSError, ValueError) as error:  # a name too long, or one the file system cannot take
        print(f"error: RECORD={shown!r}: cannot be read ({printable(str(error))})", file=sys.stderr)
        return EXIT_CANNOT_READ
    if record is None:
        print(f"error: RECORD={shown!r}: no {RECORD_NAME} there", file=sys.stderr)
        return EXIT_CANNOT_READ
    try:
        replayed = replay_lines(record, path, args.format)
    except UnwritableRecord as error:
        print(f"error: RECORD={shown!r}: {error}", file=sys.stderr)
        return EXIT_CANNOT_READ
    _emit("\n".join(replayed.lines) + "\n")
    if replayed.not_settings:
        print(f"replay: not settings, left out: {', '.join(replayed.not_settings)}", file=sys.stderr)
    for note in replayed.left_out:  # stdout is a file: said here too, or nobody sees it
        print(printable(f"replay: {note}"), file=sys.stderr)
    if now is None:
        now, not_compared = _current_inputs(record, _owner(path))
        for line in not_compared:
            print(printable(f"replay: {line}"), file=sys.stderr)
    for field, (then, current) in drift(_inputs_only(record), _inputs_only(now)).items():
        print(printable(f"replay: {field} changed since the record: {then} then, {current} now"), file=sys.stderr)
    return EXIT_OK


def _inputs_only(record: dict[str, Any]) -> dict[str, Any]:
    """The parts of a record that are inputs outside the settings (what may have changed on disk)."""
    return {key: record.get(key) for key in ("recipe_version", "frameworks", "model", "data")}


def _owner(path: Path) -> int:
    try:
        return path.stat().st_uid
    except OSError:
        return os.geteuid()


def comparable(path: Path, owner: int) -> str | None:
    """Why replay does not read `path`, which a record names (None: it may).

    A record is input: read by root, it could otherwise learn whether any root-only file has
    changed. So a file is read only when it is the record owner's own or readable by everyone.
    """
    try:
        info = path.stat()
        folders = [(folder, folder.stat()) for folder in path.absolute().parents]
    except (OSError, ValueError):
        return None  # not there (or no name a file system takes): compared as absent
    # The owner must reach the file too: every folder on the way searchable by it or by everyone.
    for folder, found in folders:
        if not (found.st_uid == owner and found.st_mode & stat.S_IXUSR or found.st_mode & stat.S_IXOTH):
            return f"{path}: the record owner (uid {owner}) cannot reach it through {folder}"
    if info.st_uid == owner and info.st_mode & stat.S_IRUSR or info.st_mode & stat.S_IROTH:
        return None
    return f"{path} is neither the record owner's (uid {owner}) nor readable by everyone"


def _current_inputs(record: dict[str, Any], owner: int) -> tuple[dict[str, Any], list[str]]:
    """(the record's inputs as they are now, lines on what was not compared and why).

    The same paths hashed again, within their bounds and never into the hash cache (a record
    must not fill it), the versions installed.
    """
    # lazy: hashing and the versions are needed only for a record's inputs, and read at call time
    from recipe import __version__
    from recipe.digests import (
        MAX_DATA_BYTES,
        MAX_MODEL_FILE_BYTES,
        FileRefused,
        sha256_file,
    )
    from recipe.provenance import MODEL_FILES, installed_versions

    not_compared: list[str] = []

    def digest(field: str, path: Path, limit: int) -> str | None:
        why = comparable(path, owner)
        if why is None:
            try:
                return sha256_file(path, limit) if path.is_file() else None
            except FileRefused as error:
                why = str(error)
            except OSError as error:
                why = f"{path}: {error.strerror or type(error).__name__}"
        not_compared.append(f"{field} not compared: {why}")
        return record_digest(record, field)

    model_path = Path(str((record.get("model") or {}).get("path", "")))
    files = {}
    for name in MODEL_FILES:
        found = digest(f"MODEL_PATH/{name}", model_path / name, MAX_MODEL_FILE_BYTES) if model_path.name else None
        if found is not None:
            files[name] = found
    data: dict[str, Any] = {}
    for name in ("TRAIN_FILES", "VAL_FILES"):
        entry = (record.get("data") or {}).get(name)
        found = digest(name, Path(entry["path"]), MAX_DATA_BYTES) if entry else None
        data[name] = {"sha256": found} if found is not None else None
    now = {
        "recipe_version": __version__,
        "frameworks": installed_versions(),
        "model": {"path": str(model_path), "files": files},
        "data": data,
    }
    return now, not_compared


def record_digest(record: dict[str, Any], field: str) -> str | None:
    """The digest the record holds for a field (TRAIN_FILES, MODEL_PATH/config.json): kept when a file is not compared."""
    if field.startswith("MODEL_PATH/"):
        return ((record.get("model") or {}).get("files") or {}).get(field.removeprefix("MODEL_PATH/"))
    return (((record.get("data") or {}).get(field)) or {}).get("sha256")
