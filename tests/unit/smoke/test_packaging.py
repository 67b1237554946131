"""The profile ships its files in the wheel and costs nothing to import."""

from __future__ import annotations

import fnmatch
import subprocess
import sys
import tomllib
from pathlib import Path

from recipe.smoke import shipped_model_dir

REPO = Path(__file__).resolve().parents[3]


def test_the_wheel_includes_every_shipped_file() -> None:
    """Images install the package (not the work tree): the shipped config must be package data."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = pyproject.get("tool", {}).get("setuptools", {}).get("package-data", {}).get("recipe.smoke", [])
    shipped = sorted(p.relative_to(shipped_model_dir().parent).as_posix() for p in shipped_model_dir().iterdir())
    assert shipped, "nothing shipped"
    missing = [name for name in shipped if not any(fnmatch.fnmatch(name, pattern) for pattern in patterns)]
    assert missing == [], 'add to pyproject.toml [tool.setuptools.package-data] "recipe.smoke" = ["shipped/*"]'


def test_importing_the_profile_imports_no_framework() -> None:
    code = (
        "import sys, recipe.smoke; "
        "print(sorted(m for m in ('torch', 'transformers', 'tokenizers', 'pyarrow') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"
