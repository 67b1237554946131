"""`prepare-data`'s command line and handler, without loading any data.

What a user types and reads: the help (exit codes, defaults, usage), how `--max-image-mib` is
checked, which output folder and image cap reach `prepare_dataset`, what is printed on success
and on a failure to fetch, and that the SIGTERM handler (`docker stop`) is set only while the
command runs, and only where Python allows it (the main thread). `prepare_dataset` is replaced
by a recorder here: the end-to-end runs are in test_command.py and test_prepare.py.
"""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

import recipe.data.prepare
from recipe.data import DataPreparationError, PreparedData, PreparedFile
from recipe.data.command import add_prepare_data_parser, run_prepare_data
from recipe.errors import RecipeConfigError

MIB = 2**20

#: `entrypoint.py prepare-data --help` at 100 columns: the text a user reads, word for word (the
#: exit codes are the contract docs/data.md and the README describe; a Kubernetes Job relies on them).
HELP = """\
usage: entrypoint.py prepare-data [-h] [--out DIR] [--source PATH] [--max-image-mib N]
                                  {geo3k,gsm8k}

Load a dataset with Hugging Face datasets (the hub by default; HF_TOKEN, HF_ENDPOINT, HF_HOME and \
HF_HUB_OFFLINE are read from the environment) and write OUT/train.parquet and OUT/test.parquet in \
verl's RL format, atomically.

positional arguments:
  {geo3k,gsm8k}      geo3k (images, the default data) or gsm8k (text)

options:
  -h, --help         show this help message and exit
  --out DIR          output directory (default: $DATA_DIR/<dataset>)
  --source PATH      a local copy instead of the hub: save_to_disk output or a download of the hub
                     repository
  --max-image-mib N  refuse an image larger than N MiB, embedded or read from a path (default: 64)

exit codes:
  0  both files written
  1  the dataset could not be fetched or the files not written (one line on stderr)
  2  a bad --source, --out or dataset content: nothing written

example:
  entrypoint.py prepare-data geo3k
  entrypoint.py prepare-data gsm8k --source /data/gsm8k-copy
"""


def parser() -> argparse.ArgumentParser:
    """A parser that mounts prepare-data the way recipe/cli.py does."""
    top = argparse.ArgumentParser(prog="entrypoint.py")
    add_prepare_data_parser(top.add_subparsers(dest="command", metavar="COMMAND"))
    return top


def parse(*argv: str) -> argparse.Namespace:
    return parser().parse_args(["prepare-data", *argv])


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Replace prepare_dataset with a recorder that writes nothing and reports two files."""
    recorded: list[dict[str, Any]] = []

    def fake(name: str, out_dir: Path, source: str | None, *, max_image_bytes: int, model_dir: Path | None) -> PreparedData:
        recorded.append(
            {
                "name": name,
                "out": out_dir,
                "source": source,
                "max_image_bytes": max_image_bytes,
                "sigterm_handler": signal.getsignal(signal.SIGTERM),
            }
        )
        files = (PreparedFile("train", out_dir / "train.parquet", 5, 1234), PreparedFile("test", out_dir / "test.parquet", 3, 987))
        return PreparedData(dataset=name, data_source="hub/id", out_dir=out_dir, files=files)  # type: ignore[arg-type]

    monkeypatch.setattr(recipe.data.prepare, "prepare_dataset", fake)
    return recorded


def test_the_help_is_word_for_word_what_users_read(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "100")  # argparse wraps at the terminal's width
    with pytest.raises(SystemExit) as caught:
        parse("--help")
    assert caught.value.code == 0
    assert capsys.readouterr().out == HELP


def test_the_command_list_shows_the_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    listed = " ".join(parser().format_help().split())
    assert "prepare-data download a dataset and write verl's train/test parquet files" in listed


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["geo3k"], {"dataset": "geo3k", "out": None, "source": None, "max_image_mib": 64}),
        (
            ["gsm8k", "--out", "/x/y", "--source", "~/copy", "--max-image-mib", "1"],
            {"dataset": "gsm8k", "out": Path("/x/y"), "source": "~/copy", "max_image_mib": 1},
        ),
        (["geo3k", "--max-image-mib", "4096"], {"dataset": "geo3k", "out": None, "source": None, "max_image_mib": 4096}),
    ],
)
def test_arguments_and_their_defaults(argv: list[str], expected: dict[str, object]) -> None:
    args = vars(parse(*argv))
    assert {key: args[key] for key in expected} == expected


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("0", "0: must be at least 1"),
        ("-3", "-3: must be at least 1"),
        ("1.5", "'1.5' is not a whole number of MiB"),
        ("64MiB", "'64MiB' is not a whole number of MiB"),
        ("", "'' is not a whole number of MiB"),
    ],
)
def test_a_bad_image_cap_is_a_usage_error_naming_the_value(
    value: str, error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        parse("geo3k", "--max-image-mib", value)
    assert caught.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"entrypoint.py prepare-data: error: argument --max-image-mib: {error}"
    )


@pytest.mark.parametrize(
    ("argv", "out", "max_image_bytes"),
    [
        (["geo3k"], "data/geo3k", 64 * MIB),
        (["gsm8k", "--source", "/src"], "data/gsm8k", 64 * MIB),
        (["gsm8k", "--out", "{tmp}/elsewhere", "--max-image-mib", "1"], "elsewhere", 1 * MIB),
        (["geo3k", "--max-image-mib", "3"], "data/geo3k", 3 * MIB),
    ],
)
def test_the_output_folder_and_image_cap_reach_prepare_dataset(
    tmp_path: Path, calls: list[dict[str, Any]], argv: list[str], out: str, max_image_bytes: int
) -> None:
    args = parse(*[arg.replace("{tmp}", str(tmp_path)) for arg in argv])
    assert run_prepare_data(args, tmp_path / "data") == 0
    [call] = calls
    assert (call["name"], call["out"], call["source"]) == (args.dataset, tmp_path / out, args.source)
    assert call["max_image_bytes"] == max_image_bytes
    assert type(call["max_image_bytes"]) is int  # printed in refusals: "over the limit of 3145728 bytes"


def test_a_namespace_without_the_cap_gets_the_default(tmp_path: Path, calls: list[dict[str, Any]]) -> None:
    """A caller that builds its own arguments (no --max-image-mib) still gets the 64 MiB cap."""
    assert run_prepare_data(argparse.Namespace(dataset="gsm8k", out=None, source=None), tmp_path) == 0
    assert calls[0]["max_image_bytes"] == 64 * MIB
    assert type(calls[0]["max_image_bytes"]) is int


def test_success_prints_one_line_per_file_on_stdout(
    tmp_path: Path, calls: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_prepare_data(parse("geo3k", "--out", str(tmp_path)), tmp_path / "data") == 0
    printed = capsys.readouterr()
    assert printed.out == (
        f"wrote {tmp_path / 'train.parquet'}: 5 rows, 1234 bytes\nwrote {tmp_path / 'test.parquet'}: 3 rows, 987 bytes\n"
        "prompt lengths: not counted: no model given\n"
    )
    assert printed.err == ""


def test_sigterm_exits_143_while_it_runs_and_the_old_handler_comes_back(
    tmp_path: Path, calls: list[dict[str, Any]]
) -> None:
    """`docker stop` sends SIGTERM: exiting through SystemExit(128 + 15) lets the staged files be removed."""
    before = signal.getsignal(signal.SIGTERM)
    assert run_prepare_data(parse("geo3k"), tmp_path) == 0
    handler = calls[0]["sigterm_handler"]
    assert callable(handler) and handler != before
    with pytest.raises(SystemExit) as caught:
        handler(signal.SIGTERM, None)
    assert caught.value.code == 143
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_fetch_failure_is_one_stderr_line_exit_1_and_restores_the_handler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def unreachable(*args: object, **kwargs: object) -> None:
        raise DataPreparationError("gsm8k: cannot reach the Hugging Face hub: no connection")

    monkeypatch.setattr(recipe.data.prepare, "prepare_dataset", unreachable)
    before = signal.getsignal(signal.SIGTERM)
    assert run_prepare_data(parse("gsm8k"), tmp_path) == 1
    assert capsys.readouterr() == ("", "prepare-data: gsm8k: cannot reach the Hugging Face hub: no connection\n")
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_refused_source_propagates_for_exit_2_and_restores_the_handler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(*args: object, **kwargs: object) -> None:
        raise RecipeConfigError(["--source=/x: no such directory"])

    monkeypatch.setattr(recipe.data.prepare, "prepare_dataset", refused)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(RecipeConfigError):
        run_prepare_data(parse("gsm8k", "--source", "/x"), tmp_path)
    assert signal.getsignal(signal.SIGTERM) == before


def test_it_runs_from_a_worker_thread_where_no_signal_handler_may_be_set(
    tmp_path: Path, calls: list[dict[str, Any]]
) -> None:
    """signal.signal raises ValueError outside the main thread: the handler is skipped, the data still made."""
    before = signal.getsignal(signal.SIGTERM)
    results: list[object] = []

    def work() -> None:
        try:
            results.append(run_prepare_data(parse("gsm8k"), tmp_path))
        except Exception as exc:  # reported to the main thread's assertion below
            results.append(exc)

    worker = threading.Thread(target=work)
    worker.start()
    worker.join(timeout=30)
    assert results == [0]
    assert calls[0]["sigterm_handler"] == before  # untouched
