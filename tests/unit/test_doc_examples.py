"""Every command line the README and docs show is one the tool accepts.

Each `entrypoint.py COMMAND ...` and `docker compose ... run [--rm] gpu|npu COMMAND ...` in README.md,
docs/*.md, compose.yaml's and .env.example's comments is parsed by the real parser; `plan` and `run` examples
go through the real plan in this process (run's through `plan`, which decides exactly what run would), with
the settings the example sets in front of it; a `$ ` transcript that shows `error:` lines must print exactly those. Synopses (`[--json]`, `{geo3k,gsm8k}`, `DIR`) are usage, not
examples, and are left out.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from recipe.cli import _parser, _split_extra, main

from .envtools import REPO, clear_settings

SOURCES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "compose.yaml", REPO / ".env.example"]
_ENTRYPOINT = re.compile(r"((?:[A-Z][A-Z0-9_]*=\S+\s+)*(?:python3?\s+)?\S*entrypoint\.py\s+[a-z][^`#|\n]*)")
_COMPOSE = re.compile(r"docker compose\s+(?:(?:-f|--profile)\s+\S+\s+)*run\s+(?:--rm\s+)?(gpu|npu)\s+([a-z][^`#|\n]*)")
#: Signs of a synopsis: optional parts, choices, placeholders in capitals, an ellipsis.
_SYNOPSIS = re.compile(r"[\[{<]|\.\.\.|\b[A-Z]{3,}\b(?!=)")


def _transcript(lines: list[tuple[int, str]], index: int) -> tuple[str, ...]:
    """The `error:` lines a `$ command` line of a transcript is shown printing (empty: none shown)."""
    shown = []
    for _, line in lines[index + 1:]:
        if not line.startswith("error: "):
            break
        shown.append(line)
    return tuple(shown)


def _examples() -> list[tuple[str, dict[str, str], list[str], tuple[str, ...]]]:
    """(where, settings set in front, argv after entrypoint.py, the errors a transcript shows) of each example."""
    found = []
    for source in SOURCES:
        lines: list[tuple[int, str]] = []
        for number, line in enumerate(source.read_text(encoding="utf-8").splitlines(), 1):
            if lines and lines[-1][1].endswith("\\"):  # a shell line continued: one command
                lines[-1] = (lines[-1][0], lines[-1][1][:-1] + " " + line.strip().lstrip("#").strip())
            else:
                lines.append((number, line))
        for index, (number, line) in enumerate(lines):
            where = f"{source.relative_to(REPO)}:{number}"
            for match in _ENTRYPOINT.finditer(line):
                text = match.group(1).split(" && ")[0].split(";")[0].strip()
                text = re.split(r"\s[12]?>", text)[0].strip()  # a redirection (`> replay.sh`) is the shell's, not ours
                if _SYNOPSIS.search(text.split("entrypoint.py", 1)[1]):
                    continue
                try:
                    words = shlex.split(text)
                except ValueError as error:  # the shell could not read it either: a failing example
                    found.append((where, {}, [f"<not a shell line: {error}: {text}>"], ()))
                    continue
                start = next(i for i, word in enumerate(words) if word.endswith("entrypoint.py"))
                settings = dict(w.split("=", 1) for w in words[:start] if "=" in w)
                shown = _transcript(lines, index) if line.startswith("$ ") else ()
                found.append((where, settings, words[start + 1:], shown))
            for match in _COMPOSE.finditer(line):
                argv = shlex.split(match.group(2).split(" && ")[0].strip())
                if argv and not _SYNOPSIS.search(" ".join(argv)):
                    found.append((where, {"DEVICE": match.group(1)}, argv, ()))
    return found


EXAMPLES = _examples()


def test_the_docs_have_examples_of_every_command_users_start_with() -> None:
    commands = {argv[0] for _, _, argv, _ in EXAMPLES}
    assert {"plan", "run", "doctor", "prepare-data"} <= commands, commands


@pytest.mark.parametrize(("where", "settings", "argv", "shown"), EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_every_documented_command_line_is_accepted(
    where: str, settings: dict[str, str], argv: list[str], shown: tuple[str, ...], monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Accepted, or, where a transcript shows the tool refusing it, refused with exactly the lines shown."""
    ours, extra = _split_extra(argv)
    _parser().parse_args(ours)  # SystemExit(2) on an example the parser refuses
    if ours[0] not in ("plan", "run"):
        return
    clear_settings(monkeypatch)
    monkeypatch.setenv("CHECKPOINT_DIR", str(tmp_path))
    for name, value in {"DEVICE": "gpu", **settings}.items():
        monkeypatch.setenv(name, value)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["plan", *(["--json"] if "--json" in ours else []), *(["--", *extra] if extra else [])])
    if shown:
        assert (code, tuple(err.getvalue().splitlines())) == (2, shown), where
    else:
        assert code == 0, f"{where}: {shlex.join(argv)} with {settings}: {err.getvalue()}"
