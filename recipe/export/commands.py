"""The `verify-export` and `export` subcommands: argparse wiring and handlers for recipe.cli.

    verify-export DIR [--json] [--allow REGEX]... [--no-default-allow] [--reference DIR]
    export --out DIR [--checkpoint-dir DIR] [--model-path DIR] [--strict|--lenient] [--json]

Exit codes: 0 complete or lenient; 1 broken; 2 the directory cannot be checked or
there is nothing to export (one `error:` line on stderr).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Any

from recipe.checkpoint_tracker import TRACKER_NAME
from recipe.errors import report_errors
from recipe.export.hf_check import DEFAULT_ALLOWED_PATTERNS, ExportCheckError
from recipe.export.report import ExportReport, printable
from recipe.help import add_command
from recipe.record_file import RECORD_NAME

EXIT_UNCHECKABLE = 2


def add_export_commands(commands: Any) -> None:
    """Add `verify-export` and `export` to an argparse subparsers object."""
    verify = add_command(
        commands, "verify-export",
        summary="check an exported Hugging Face checkpoint (exit 1 when broken)",
        description="Compare the tensors in DIR's safetensors shards, its index and what the model class of "
        "DIR/config.json expects; report missing, unexpected, mis-shaped and ghost tensors and classify the "
        "export as complete, lenient or broken. DIR may also be a checkpoint directory: its newest HF export "
        "is checked.",
        exit_codes={0: "complete or lenient", 1: "broken", 2: "cannot check (no export, unreadable files)"},
        # verl 0.9.1 writes the export to global_step_N/actor/model/huggingface (recipe.export.watch.HF_SUBDIRS).
        examples=["entrypoint.py verify-export /checkpoints/grpo/exp/global_step_20/actor/model/huggingface"],
    )
    verify.add_argument("directory", type=Path, metavar="DIR")
    _common(verify)
    verify.add_argument(
        "--reference",
        type=Path,
        metavar="DIR",
        help="the checkpoint the export started from (e.g. $MODEL_PATH): also report what the export dropped",
    )

    export = add_command(
        commands, "export",
        summary="export the newest verl Megatron checkpoint to Hugging Face with Megatron-Bridge, then check it",
        description="Find the newest verl Megatron (dist) checkpoint of this experiment, load it with "
        "Megatron-Bridge into the model of MODEL_PATH, write Hugging Face safetensors to OUT (leniently by "
        "default: what matches is written and the rest reported), then check OUT as verify-export does.",
        exit_codes={0: "written; complete or lenient", 1: "written but broken", 2: "cannot export or check: nothing written"},
        examples=["entrypoint.py export --out /checkpoints/hf-export"],
    )
    export.add_argument("--out", type=Path, required=True, metavar="DIR", help="an empty or new directory")
    export.add_argument("--checkpoint-dir", type=Path, metavar="DIR", help="default: this experiment's checkpoints")
    export.add_argument("--model-path", type=Path, metavar="DIR", help="default: $MODEL_PATH")
    strictness = export.add_mutually_exclusive_group()
    strictness.add_argument(
        "--strict", dest="strict", action="store_true", default=None, help="fail on any key mismatch"
    )
    strictness.add_argument("--lenient", dest="strict", action="store_false", help="write what matches (default)")
    _common(export)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the report as one JSON document")
    parser.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="REGEX",
        help="a tensor name pattern (re.search) whose absence or presence is accepted; repeatable",
    )
    parser.add_argument(
        "--no-default-allow",
        action="store_true",
        help=f"do not allow {', '.join(DEFAULT_ALLOWED_PATTERNS)} (multi-token-prediction layers) by default",
    )


def allowed_patterns(args: argparse.Namespace) -> list[str]:
    """The default patterns (unless --no-default-allow) plus every --allow."""
    return ([] if args.no_default_allow else list(DEFAULT_ALLOWED_PATTERNS)) + list(args.allow)


def _print(report: ExportReport, as_json: bool) -> int:
    print(report.to_json() if as_json else report.summary())
    return report.exit_code


def _fail(command: str, message: str, as_json: bool) -> int:
    return report_errors(command, [printable(message)], EXIT_UNCHECKABLE, as_json)


def _resolve_export_dir(directory: Path) -> Path:
    """DIR itself when it holds a checkpoint; else the newest finished HF export below it.

    A checkpoint root (a run's record, verl's tracker or a global_step_N below it) with no finished
    export is refused for what it is; any other directory is checked as given, so that the error
    names what the export lacks.
    """
    # lazy: the export commands' modules load only when one of them runs, not for plan
    from recipe.export.watch import HF_SUBDIRS, MANIFEST, find_hf_exports, has_step_dirs

    if (directory / "config.json").is_file() or any(directory.glob("*.safetensors")):
        return directory
    exports = find_hf_exports(directory)
    ready = [export for export in exports if export.ready]
    if ready:
        return ready[-1].directory
    marked = any((directory / name).is_file() for name in (RECORD_NAME, TRACKER_NAME))
    if exports or marked or has_step_dirs(directory):
        saved = (
            f"step {exports[-1].step} has one that verl did not finish saving (no {MANIFEST})" if exports
            else f"no global_step_N below it holds one ({' or '.join(HF_SUBDIRS)})"
        )
        raise ExportCheckError(
            f"{directory}: a checkpoint root with no finished HF export: {saved}; a run writes one at each save "
            "(SAVE_FREQ) once its step ends; give verify-export a finished step's export, "
            f"global_step_N/{HF_SUBDIRS[0]}"
        )
    return directory


def run_verify_export(args: argparse.Namespace) -> int:
    """Handler of `verify-export`; returns the exit code."""
    # lazy: the export commands' modules load only when one of them runs, not for plan
    from recipe.export.hf_check import verify_export

    try:
        report = verify_export(_resolve_export_dir(args.directory), allowed_patterns(args), reference=args.reference)
    except ExportCheckError as error:
        return _fail("verify-export", str(error), args.json)
    return _print(report, args.json)


def run_export(args: argparse.Namespace, checkpoint_dir: Path, model_path: Path, strict: bool) -> int:
    """Handler of `export`; the defaults come from the recipe's settings (the CLI passes them)."""
    # lazy: bridge_export needs Megatron-Bridge; only `export` loads it
    from recipe.export.bridge_export import ExportError, export_latest

    try:
        # megatron-core and Megatron-Bridge report with print(): their lines go to stderr, so that
        # stdout holds the report alone (one JSON document with --json).
        with contextlib.redirect_stdout(sys.stderr):
            report = export_latest(
                args.checkpoint_dir or checkpoint_dir,
                args.model_path or model_path,
                args.out,
                strict=strict if args.strict is None else args.strict,
                allowed_patterns=allowed_patterns(args),
            )
    except ExportError as error:
        return _fail("export", str(error), args.json)
    return _print(report, args.json)
