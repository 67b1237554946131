"""The CI workflow that builds and pushes the full images is a valid GitHub Actions workflow."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import REPO, run, tool

WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))


def test_the_images_workflow_exists() -> None:
    assert REPO / ".github" / "workflows" / "images.yml" in WORKFLOWS


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_matches_the_github_workflow_schema(workflow: Path) -> None:
    checker = tool("check-jsonschema", "check-jsonschema==0.39.0")
    out = run([checker, "--builtin-schema", "vendor.github-workflows", str(workflow)])
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_broken_workflow_fails_the_schema(tmp_path: Path) -> None:
    checker = tool("check-jsonschema", "check-jsonschema==0.39.0")
    broken = tmp_path / "broken.yml"
    broken.write_text("on: push\njobs:\n  build:\n    steps: []\n")  # no runs-on
    out = run([checker, "--builtin-schema", "vendor.github-workflows", str(broken)])
    assert out.returncode != 0
