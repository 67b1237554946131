"""The recipe's version as the repository declares it (pyproject.toml), without importing it."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def repo_version(repo: Path = REPO) -> str:
    """Read `project.version`, or the module attribute that `dynamic = ["version"]` names."""
    project = tomllib.loads((repo / "pyproject.toml").read_text())
    if "version" in project["project"]:
        return str(project["project"]["version"])
    attr = project["tool"]["setuptools"]["dynamic"]["version"]["attr"]  # e.g. recipe.__version__
    module, _, name = attr.rpartition(".")
    path = repo / Path(*module.split("."))
    source = (path / "__init__.py") if path.is_dir() else path.with_suffix(".py")
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return str(ast.literal_eval(node.value))
    raise LookupError(f"{attr} not found in {source}")
