"""The `prepare-data` subcommand: its arguments and its handler, for recipe/cli.py to mount."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from recipe.data.errors import DataPreparationError
from recipe.help import add_command
from recipe.data.guard import DEFAULT_MAX_IMAGE_BYTES
from recipe.data.specs import SPECS

_MIB = 2**20


def _positive_mib(text: str) -> int:
    """argparse type of --max-image-mib: a whole number of MiB, at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of MiB") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be at least 1")
    return value


def add_prepare_data_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    """Add `prepare-data {geo3k,gsm8k} [--out DIR] [--source PATH] [--max-image-mib N]` to `subparsers`."""
    parser = add_command(
        subparsers, "prepare-data",
        summary="download a dataset and write verl's train/test parquet files",
        description=(
            "Load a dataset with Hugging Face datasets (the hub by default; HF_TOKEN, HF_ENDPOINT, "
            "HF_HOME and HF_HUB_OFFLINE are read from the environment) and write OUT/train.parquet "
            "and OUT/test.parquet in verl's RL format, atomically."
        ),
        exit_codes={
            0: "both files written",
            1: "the dataset could not be fetched or the files not written (one line on stderr)",
            2: "a bad --source, --out or dataset content: nothing written",
        },
        examples=["entrypoint.py prepare-data geo3k", "entrypoint.py prepare-data gsm8k --source /data/gsm8k-copy"],
    )
    parser.add_argument("dataset", choices=sorted(SPECS), help="geo3k (images, the default data) or gsm8k (text)")
    parser.add_argument(
        "--out", type=Path, default=None, metavar="DIR", help="output directory (default: $DATA_DIR/<dataset>)"
    )
    parser.add_argument(
        "--source",
        default=None,
        metavar="PATH",
        help="a local copy instead of the hub: save_to_disk output or a download of the hub repository",
    )
    parser.add_argument(
        "--max-image-mib",
        type=_positive_mib,
        default=DEFAULT_MAX_IMAGE_BYTES // _MIB,
        metavar="N",
        help=(
            "refuse an image larger than N MiB, embedded or read from a path "
            f"(default: {DEFAULT_MAX_IMAGE_BYTES // _MIB})"
        ),
    )
    return parser


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    # `docker stop` sends SIGTERM; exiting through SystemExit runs the cleanup of staged files.
    raise SystemExit(128 + signum)


def run_prepare_data(args: argparse.Namespace, data_dir: Path, model_dir: Path | None = None) -> int:
    """Prepare `args.dataset` into `args.out` or `data_dir/<dataset>`; print what was written and, where the model
    is at `model_dir`, each split's prompt lengths in tokens (text and images).

    Returns 0, or 1 after one `prepare-data: ...` line on stderr when the data cannot be
    fetched or written. RecipeConfigError (a bad --source or --out, or a source whose files or
    rows are refused) propagates to the CLI, which reports it with exit code 2.
    """
    from recipe.data.prepare import prepare_dataset  # lazy: datasets and pyarrow, only when it runs

    out = args.out if args.out is not None else data_dir / args.dataset
    # Signal handlers can only be set from the main thread (not when called from a worker thread).
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm) if main_thread else None
    try:
        max_image_mib = getattr(args, "max_image_mib", DEFAULT_MAX_IMAGE_BYTES // _MIB)
        prepared = prepare_dataset(
            args.dataset, out, args.source, max_image_bytes=max_image_mib * _MIB, model_dir=model_dir
        )
    except DataPreparationError as exc:
        print(f"prepare-data: {exc}", file=sys.stderr)
        return 1
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
    for line in prepared.summary():
        print(line)
    return 0
