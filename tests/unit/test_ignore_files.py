"""What the README's steps create in the checkout is never staged by git nor sent to a build.

`cp .env.example .env` puts a token beside the code and `mkdir -p models data checkpoints
hf-cache` makes room for 70 GB of weights: `git add .` must not stage them and
`docker build .` must not send them as context.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from .envtools import REPO

CREATED_BY_THE_README = (".env", "models/Qwen/config.json", "data/geo3k/train.parquet", "checkpoints/x", "hf-cache/hub/x")
#: Code folders that share a name with those data folders: they must stay tracked.
CODE = ("recipe/data/__init__.py", "tests/unit/data/conftest.py", "recipe/data/a_new_module.py")


def _git_ignores(path: str) -> bool:
    done = subprocess.run(
        ["git", "-C", str(REPO), "check-ignore", "--no-index", "--quiet", path], capture_output=True, check=False
    )
    assert done.returncode in (0, 1), done.stderr
    return done.returncode == 0


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
@pytest.mark.parametrize("path", CREATED_BY_THE_README)
def test_git_ignores_what_the_readme_creates(path: str) -> None:
    assert _git_ignores(path)


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
@pytest.mark.parametrize("path", CODE)
def test_git_does_not_ignore_code_folders_of_the_same_name(path: str) -> None:
    assert not _git_ignores(path)


@pytest.mark.parametrize("entry", [".env", "models/", "data/", "checkpoints/", "hf-cache/"])
def test_dockerignore_excludes_what_the_readme_creates(entry: str) -> None:
    # .dockerignore patterns are relative to the context's root (unlike .gitignore's), so
    # `data/` leaves recipe/data/ in the context.
    lines = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()}
    assert entry in lines
