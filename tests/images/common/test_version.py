"""The recipe installed in the image is the one in this repository."""

from __future__ import annotations

from typing import Any


def test_installed_distribution_version_is_repo_version(host: Any, expected_version: str) -> None:
    out = host.check_output(
        "python3 -c 'import importlib.metadata as m; print(m.version(\"grpo-recipe\"))'"
    )
    assert out.strip() == expected_version


def test_entrypoint_package_version_is_repo_version(host: Any, expected_version: str) -> None:
    # The entrypoint imports recipe from /opt/recipe: that copy must be the same release.
    out = host.check_output("cd /opt/recipe && python3 -c 'import recipe; print(recipe.__version__)'")
    assert out.strip() == expected_version


def test_recipe_source_is_read_only_for_the_user(host: Any) -> None:
    # The code is root-owned: the training user cannot alter what it runs.
    assert host.file("/opt/recipe/entrypoint.py").user == "root"
