"""`entrypoint.py replay RECORD`: a stored run record's settings as an env file, and what changed since.

stdout is the env file: one `NAME=value` line per recipe setting the record holds, and comment
lines. It is read the same by every documented reader: bash and dash (`set -a; . ./replay.env;
set +a`), Compose's `env_file:` and `docker run --env-file`. Those disagree on quotes (docker
keeps them), on `$` (Compose expands it) and on newlines, so a value is written only when it needs
none of them; a record with any other value is refused (exit 2, naming the setting), never
escaped. A record is input too (it travels between clusters and into tickets): only the settings
model's own names are written, never a secret (a record holds them redacted, and sourcing
`HF_TOKEN='**********'` would replace the real token), and a comment line never holds a newline.
Then `plan` with the record's extra overrides gives the record's argv. Each input that no longer
matches the record (a data file, the model's files, a framework version) is one `replay:` line
on stderr.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from pathlib import Path
from typing import Any

from recipe.export.report import printable
from recipe.help import add_command
from recipe.provenance import RECORD_NAME, drift, read_record
from recipe.settings import SECRET_SETTINGS, Settings

EXIT_OK, EXIT_CANNOT_READ = 0, 2

#: The settings model's own names; replay writes them all but the secrets.
SETTINGS = frozenset(name.upper() for name in Settings.model_fields)
REPLAYABLE = SETTINGS - SECRET_SETTINGS
#: Characters every reader takes literally, unquoted: no whitespace, quote, `$` (Compose expands it),
#: `#` (a comment), `~` (bash expands it at the start), glob or control character.
PLAIN_CHARACTERS = "letters, digits and _ . / : , @ % + = -"
_PLAIN = re.compile(r"[A-Za-z0-9_./:,@%+=\-]*")


class UnwritableRecord(ValueError):
    """A record value that not every reader of the env file would read back the same."""


def add_replay_parser(commands: Any) -> None:
    """Register `replay RECORD` on the CLI's subcommands."""
    replay = add_command(
        commands, "replay",
        summary="print a stored run record's settings as an env file, and which inputs changed since",
        description="Read RECORD (a run-record.json that `run` wrote to the checkpoint root or a global_step_N, "
        "or the directory holding one) and print its settings as NAME=value lines, secrets never included, so "
        "that `plan` with them gives the record's trainer command; the extra overrides it ran with follow as a "
        "comment. Then compare the inputs the record names (data files, the model's files, the framework "
        "versions) with what is there now: one `replay:` line on stderr for each that changed.",
        exit_codes={0: "printed (changes, if any, on stderr)", 2: "RECORD is not a readable run record"},
        examples=["entrypoint.py replay /checkpoints/p/e/global_step_40 > replay.env"],
    )
    replay.add_argument("record", type=Path, metavar="RECORD")


def env_line(name: str, value: Any) -> str:
    """NAME=value for every reader of the env file; raises UnwritableRecord naming the setting otherwise."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, (int, float, str)):
        text = str(value)
    else:
        raise UnwritableRecord(f"{name}: a {type(value).__name__} in the record, not a setting's value")
    if not _PLAIN.fullmatch(text):
        raise UnwritableRecord(
            f"{name}={printable(text)!r}: not written, since bash, dash, Compose's env_file and docker's --env-file "
            f"would not all read it back the same (plain values only: {PLAIN_CHARACTERS}); set it by hand"
        )
    return f"{name}={text}"


def _comment(text: str) -> str:
    """One comment line, whatever `text` holds (a newline would start a line of its own)."""
    return "# " + printable(text)


def replay_lines(record: dict[str, Any], path: Path) -> tuple[list[str], list[str]]:
    """(the env file's lines, the record's keys left out as not settings); raises UnwritableRecord."""
    settings = record.get("settings")
    extra = record.get("extra_overrides", [])
    if not isinstance(settings, dict) or not isinstance(extra, list):
        raise UnwritableRecord("settings must be an object and extra_overrides a list")
    lines = [_comment(f"settings of the run recorded in {path} (recipe {record.get('recipe_version')})")]
    left_out = sorted(printable(str(name)) for name in settings if name not in SETTINGS)
    lines += [env_line(name, value) for name, value in sorted(settings.items()) if name in REPLAYABLE and value is not None]
    if extra:
        lines.append(_comment("run with: entrypoint.py run -- " + " ".join(shlex.quote(str(o)) for o in extra)))
    return lines, left_out


def run_replay(args: argparse.Namespace, now: dict[str, Any] | None = None) -> int:
    """Handler of `replay`: NOW is the record of the current inputs (computed when None)."""
    path = args.record / RECORD_NAME if args.record.is_dir() else args.record
    shown = printable(str(args.record))
    try:
        record = read_record(path)
    except (OSError, ValueError) as error:
        print(f"error: RECORD={shown!r}: {printable(str(error))}", file=sys.stderr)
        return EXIT_CANNOT_READ
    if record is None:
        print(f"error: RECORD={shown!r}: no {RECORD_NAME} there", file=sys.stderr)
        return EXIT_CANNOT_READ
    try:
        lines, left_out = replay_lines(record, path)
    except UnwritableRecord as error:
        print(f"error: RECORD={shown!r}: {error}", file=sys.stderr)
        return EXIT_CANNOT_READ
    print("\n".join(lines))
    if left_out:
        print(f"replay: not settings, left out: {', '.join(left_out)}", file=sys.stderr)
    if now is None:
        now = _current_inputs(record)
    for field, (then, current) in drift(_inputs_only(record), _inputs_only(now)).items():
        print(printable(f"replay: {field} changed since the record: {then} then, {current} now"), file=sys.stderr)
    return EXIT_OK


def _inputs_only(record: dict[str, Any]) -> dict[str, Any]:
    """The parts of a record that are inputs outside the settings (what may have changed on disk)."""
    return {key: record.get(key) for key in ("recipe_version", "frameworks", "model", "data")}


def _current_inputs(record: dict[str, Any]) -> dict[str, Any]:
    """The record's inputs as they are now: the same paths hashed again, the versions installed."""
    import os

    from recipe import __version__
    from recipe.provenance import data_file, installed_versions, model_files

    model_path = Path(str((record.get("model") or {}).get("path", "")))
    data = record.get("data") or {}
    paths = {name: (data.get(name) or {}).get("path") for name in ("TRAIN_FILES", "VAL_FILES")}
    return {
        "recipe_version": __version__,
        "frameworks": installed_versions(),
        "model": {"path": str(model_path), "files": model_files(model_path)},
        "data": {name: data_file(Path(p), os.environ) if p else None for name, p in paths.items()},
    }
