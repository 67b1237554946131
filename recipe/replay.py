"""`entrypoint.py replay RECORD`: a stored run record's settings as an env file, and what changed since.

stdout is the env file (`NAME=value` lines, shell-quoted where needed; no secret was ever
stored): `set -a; . ./replay.env; set +a`, or Compose's `env_file:`, then `plan` with the
record's extra overrides gives the record's argv. Each input that no longer matches the record
(a data file, the model's files, a framework version) is one `replay:` line on stderr.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from recipe.help import add_command
from recipe.provenance import RECORD_NAME, drift, read_record

EXIT_OK, EXIT_CANNOT_READ = 0, 2


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
    """NAME=value for a shell or an env file (true/false for booleans, quoted where the shell needs it)."""
    text = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return f"{name}={shlex.quote(text)}"


def run_replay(args: argparse.Namespace, now: dict[str, Any] | None = None) -> int:
    """Handler of `replay`: NOW is the record of the current inputs (computed when None)."""
    path = args.record / RECORD_NAME if args.record.is_dir() else args.record
    try:
        record = read_record(path)
    except (OSError, ValueError) as error:
        print(f"error: RECORD={str(args.record)!r}: {error}", file=sys.stderr)
        return EXIT_CANNOT_READ
    if record is None:
        print(f"error: RECORD={str(args.record)!r}: no {RECORD_NAME} there", file=sys.stderr)
        return EXIT_CANNOT_READ
    settings = record.get("settings") if isinstance(record.get("settings"), dict) else {}
    print(f"# settings of the run recorded in {path} (recipe {record.get('recipe_version')})")
    for name, value in sorted(settings.items()):
        if value is not None and isinstance(name, str) and name.isupper():
            print(env_line(name, value))
    extra = record.get("extra_overrides") or []
    if extra:
        print("# run with: entrypoint.py run -- " + " ".join(shlex.quote(str(o)) for o in extra))
    if now is None:
        now = _current_inputs(record)
    for field, (then, current) in drift(_inputs_only(record), _inputs_only(now)).items():
        print(f"replay: {field} changed since the record: {then} then, {current} now", file=sys.stderr)
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
