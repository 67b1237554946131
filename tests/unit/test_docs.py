"""The README documents what the code reads: every setting appears in its table."""

from __future__ import annotations

import re

from .envtools import REPO
from recipe.settings import Settings


def test_readme_settings_table_lists_every_setting() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `([A-Z_]+)` \|", readme, flags=re.MULTILINE))
    assert {name.upper() for name in Settings.model_fields} <= documented
