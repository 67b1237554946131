"""Every string literal of recipe/, as Python parses it: what the recipe's messages, help and docstrings say.

Adjacent literals come joined and an f-string's literal parts come apart, as the parser gives them, so a scan
sees each piece of text that can reach a user.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

RECIPE = Path(__file__).resolve().parents[2] / "recipe"


def recipe_strings() -> Iterator[tuple[Path, str]]:
    """(module, string) for every string constant of every module under recipe/."""
    for path in sorted(RECIPE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                yield path, node.value
