"""The prepare-data subcommand: arguments, default output folder, output lines, exit codes, signals."""

from __future__ import annotations

import argparse
import http.server
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from recipe.data import DataPreparationError
from recipe.data.command import add_prepare_data_parser, run_prepare_data
from recipe.errors import RecipeConfigError

REPO = Path(__file__).resolve().parents[3]


def parse(*argv: str) -> argparse.Namespace:
    """Parse argv with a parser that mounts prepare-data the way recipe/cli.py does."""
    parser = argparse.ArgumentParser(prog="entrypoint.py")
    subparsers = parser.add_subparsers(dest="command", required=True)
    add_prepare_data_parser(subparsers)
    return parser.parse_args(argv)


def test_arguments() -> None:
    args = parse("prepare-data", "gsm8k", "--out", "/x/y", "--source", "/src")
    assert (args.command, args.dataset, args.out, args.source) == ("prepare-data", "gsm8k", Path("/x/y"), "/src")
    args = parse("prepare-data", "geo3k")
    assert (args.dataset, args.out, args.source) == ("geo3k", None, None)


def test_unknown_dataset_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        parse("prepare-data", "mnist")
    assert caught.value.code == 2
    assert "invalid choice: 'mnist'" in capsys.readouterr().err


def test_default_output_is_data_dir_slash_dataset_and_lines_go_to_stdout(
    geo3k_source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = tmp_path / "data"
    assert run_prepare_data(parse("prepare-data", "geo3k", "--source", str(geo3k_source)), data_dir) == 0
    out = capsys.readouterr()
    train, test = data_dir / "geo3k" / "train.parquet", data_dir / "geo3k" / "test.parquet"
    # The settings' default TRAIN_FILES and VAL_FILES are exactly these two paths.
    assert out.out.splitlines() == [
        f"wrote {train}: 5 rows, {train.stat().st_size} bytes",
        f"wrote {test}: 3 rows, {test.stat().st_size} bytes",
        "prompt lengths: not counted: no model given",
    ]
    assert f"loading geo3k from {geo3k_source}" in out.err


def test_out_overrides_the_default(gsm8k_hub_snapshot: Path, tmp_path: Path) -> None:
    args = parse("prepare-data", "gsm8k", "--source", str(gsm8k_hub_snapshot), "--out", str(tmp_path / "elsewhere"))
    assert run_prepare_data(args, tmp_path / "data") == 0
    assert sorted(p.name for p in (tmp_path / "elsewhere").iterdir()) == ["manifest.json", "test.parquet", "train.parquet"]
    assert not (tmp_path / "data").exists()


def test_preparation_failure_is_one_stderr_line_and_exit_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import recipe.data.prepare

    def fail(*args: object, **kwargs: object) -> None:
        raise DataPreparationError("geo3k: cannot load hiyouga/geometry3k from the Hugging Face hub (boom)")

    monkeypatch.setattr(recipe.data.prepare, "prepare_dataset", fail)
    assert run_prepare_data(parse("prepare-data", "geo3k"), tmp_path) == 1
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err == "prepare-data: geo3k: cannot load hiyouga/geometry3k from the Hugging Face hub (boom)\n"


def test_bad_source_propagates_as_config_error(tmp_path: Path, needs_datasets: None) -> None:
    with pytest.raises(RecipeConfigError, match="no such directory"):
        run_prepare_data(parse("prepare-data", "geo3k", "--source", str(tmp_path / "nope")), tmp_path)


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_sigterm_mid_write_exits_143_and_leaves_no_file(
    geo3k_source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`docker stop` sends SIGTERM: the staged files are removed and the handler is restored."""
    import pyarrow.parquet as pq

    real_write_table = pq.ParquetWriter.write_table

    def write_table(self: pq.ParquetWriter, *args: object, **kwargs: object) -> None:
        real_write_table(self, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # delivered to the main thread: this one

    monkeypatch.setattr(pq.ParquetWriter, "write_table", write_table)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as caught:
        run_prepare_data(parse("prepare-data", "geo3k", "--source", str(geo3k_source)), tmp_path)
    assert caught.value.code == 128 + signal.SIGTERM
    assert not (tmp_path / "geo3k").exists()  # nor the folder it made for them
    assert signal.getsignal(signal.SIGTERM) == before


class _EchoingHub(http.server.BaseHTTPRequestHandler):
    """A hub mirror that hands the caller's token back: a relative redirect to a URL holding it, then 401.

    huggingface_hub follows the redirect and raises with that URL in the first line of its
    message, so the token (and the endpoint) reach the text prepare-data prints, unless the
    recipe removes them. Every request is recorded, to show the token was really sent.
    """

    requests: list[tuple[str, str, str]] = []

    def _reply(self) -> None:
        auth = self.headers.get("Authorization", "")
        self.requests.append((self.command, self.path, auth))
        token = auth.removeprefix("Bearer ")
        if token and "/echo/" not in self.path:
            self.send_response(307)
            self.send_header("Location", f"/private-mirror/echo/{token}{self.path.removeprefix('/private-mirror')}")
        else:
            self.send_response(401)
            self.send_header("X-Error-Message", f"token {auth} refused")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD = _reply

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def echoing_hub() -> Iterator[tuple[str, list[tuple[str, str, str]]]]:
    """The hub stand-in on a free loopback port: (HF_ENDPOINT, the requests it received)."""
    handler = type("Hub", (_EchoingHub,), {"requests": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/private-mirror", handler.requests
    finally:
        server.shutdown()
        server.server_close()


def test_a_hub_error_never_prints_the_token_or_the_endpoint(
    tmp_path: Path, needs_datasets: None, echoing_hub: tuple[str, list[tuple[str, str, str]]]
) -> None:
    """The real hub path of `datasets`, against a mirror that echoes the token: a clean error, nothing leaked."""
    endpoint, requests = echoing_hub
    token = "hf_NotARealToken0123456789"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING")) and "proxy" not in k.lower()}
    env |= {
        "HF_HOME": str(tmp_path / "hf-home"),
        "HF_TOKEN": token,
        "HF_ENDPOINT": endpoint,
        "NO_PROXY": "127.0.0.1,localhost",
        "PYTHONPATH": str(REPO),
    }
    script = textwrap.dedent(
        f"""
        import argparse, sys
        from pathlib import Path
        from recipe.data.command import add_prepare_data_parser, run_prepare_data
        parser = argparse.ArgumentParser()
        add_prepare_data_parser(parser.add_subparsers(dest="command"))
        sys.exit(run_prepare_data(parser.parse_args(["prepare-data", "geo3k"]), Path({str(tmp_path / "data")!r})))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    # The token was really used: the hub saw it, and handed it back.
    assert ("HEAD", f"/private-mirror/echo/{token}/datasets/hiyouga/geometry3k/resolve/main/README.md",
            f"Bearer {token}") in requests, requests
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    assert "prepare-data: geo3k: cannot load hiyouga/geometry3k from the Hugging Face hub (" in result.stderr
    assert "401" in result.stderr  # the error is the hub's answer, not an offline shortcut
    assert token not in result.stderr and endpoint not in result.stderr
    assert "127.0.0.1" not in result.stderr
    assert not (tmp_path / "data" / "geo3k").exists()
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert token.encode() not in path.read_bytes(), path


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # closed again when the block ends: nothing listens there


def _prepare_in_process(tmp_path: Path, argv: list[str], **env_values: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING")) and "proxy" not in k.lower()}
    env |= {"HF_HOME": str(tmp_path / "hf-home"), "PYTHONPATH": str(REPO), **env_values}
    script = textwrap.dedent(
        f"""
        import argparse, sys
        from pathlib import Path
        from recipe.cli import main
        sys.exit(main({argv!r}))
        """
    )
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300, check=False)


def test_no_network_fails_fast_in_one_line_and_writes_nothing(tmp_path: Path, needs_datasets: None) -> None:
    # A hub nobody answers for: refused at once, no retry lines, no files.
    endpoint = f"http://127.0.0.1:{_closed_port()}/hub-token-in-path"
    done = _prepare_in_process(tmp_path, ["prepare-data", "gsm8k", "--out", str(tmp_path / "out")], HF_ENDPOINT=endpoint)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    assert lines[-1].startswith("prepare-data: gsm8k: cannot reach the Hugging Face hub: no connection to the hub's host")
    assert len(lines) <= 2, lines  # the "loading ..." line, then the answer
    assert endpoint not in done.stderr and "hub-token-in-path" not in done.stderr
    assert not (tmp_path / "out").exists()


def test_an_offline_hub_is_not_probed(tmp_path: Path) -> None:
    from recipe.data.source import hub_unreachable

    closed = f"http://127.0.0.1:{_closed_port()}"
    assert hub_unreachable({"HF_ENDPOINT": closed}, timeout_s=2).startswith("no connection")  # type: ignore[union-attr]
    assert hub_unreachable({"HF_ENDPOINT": closed, "HF_HUB_OFFLINE": "1"}) is None
    assert hub_unreachable({"HF_ENDPOINT": closed, "HTTPS_PROXY": "http://proxy:3128"}) is None
    assert hub_unreachable({"HF_ENDPOINT": "not a url"}) == "HF_ENDPOINT is not a URL"


@pytest.mark.parametrize("case", ["a file", "below a file"])
def test_an_unwritable_out_is_exit_2_before_any_download(tmp_path: Path, case: str) -> None:
    # (A read-only parent is refused by the same check, os.access; as root, as here, it is writable.)
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    out = {"a file": blocker, "below a file": blocker / "x"}[case]
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    done = _prepare_in_process(tmp_path, ["prepare-data", "gsm8k", "--out", str(out)], HF_ENDPOINT=endpoint)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"error: --out={out}: "), done.stderr
    assert "loading" not in done.stderr and "hub" not in done.stderr
