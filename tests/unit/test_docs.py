"""The README documents what the code reads: every setting appears in its table."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from .envtools import REPO
from recipe.settings import Settings


def test_readme_settings_table_lists_every_setting() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `([A-Z_]+)` \|", readme, flags=re.MULTILINE))
    assert {name.upper() for name in Settings.model_fields} <= documented


#: The chips' one spelling is CANN's image tags (`a3`, `910b`); `a2` was once used for 910b and is refused.
_OLD_CHIP_SPELLING = re.compile(r"CANN_CHIP\s*[=:]\s*[\"']?a2\b|cann:[\w.]*-a2-|chip[:= ]+[\"'`]?a2\b", re.IGNORECASE)


def test_each_chip_has_one_spelling_in_the_whole_tree() -> None:
    """Docs, Dockerfiles, compose, k8s, code and tests: CANN_CHIP is `a3` or `910b`, never `a2`."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.split(b"\0")
    found = []
    for name in filter(None, (raw.decode() for raw in tracked)):
        path = REPO / name
        if path.suffix in {".parquet", ".safetensors", ".png"} or not path.is_file() or path == Path(__file__):
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if _OLD_CHIP_SPELLING.search(line):
                found.append(f"{name}:{number}: {line.strip()}")
    assert found == []


#: Issue 25's list of what users report upstream: each needs a row in docs/troubleshooting.md.
_UPSTREAM_FAILURES = ["verl#1649", "verl#3364", "ms-swift#9991", "verl#6972", "common.pt", "HCCL_CONNECT_TIMEOUT",
                      "verl#6741", "verl#7067", "pytorch#147851"]  # fmt: skip


def test_troubleshooting_settles_every_reported_failure_in_one_of_three_ways() -> None:
    """Each row is prevented, detected or documented; every failure named upstream has one; the README links it."""
    text = (REPO / "docs" / "troubleshooting.md").read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| what you see")]
    assert rows and all(re.search(r"\*\*(Prevented|Detected|Documented)\*\*", row) for row in rows), rows
    assert [f for f in _UPSTREAM_FAILURES if not any(f in row for row in rows)] == []
    assert "(docs/troubleshooting.md)" in (REPO / "README.md").read_text(encoding="utf-8")


def test_the_progress_line_is_described_in_one_set_of_words() -> None:
    """Issue 54: `run --help`, the README (twice) and docs/deploy.md describe the progress line's fields with the
    same words, recipe.run.progress.PROGRESS_LINE; the help builds its text from it."""
    from recipe.cli import _parser
    from recipe.run.progress import PROGRESS_LINE

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    deploy = (REPO / "docs" / "deploy.md").read_text(encoding="utf-8")
    assert readme.count(f"({PROGRESS_LINE})") == 2 and deploy.count(f"({PROGRESS_LINE})") == 1
    run = next(action for action in _parser()._subparsers._group_actions[0].choices.values()  # type: ignore[union-attr]
               if action.prog.endswith(" run"))  # fmt: skip
    assert PROGRESS_LINE in " ".join(run.format_help().split())
