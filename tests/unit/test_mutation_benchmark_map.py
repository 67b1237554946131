"""benchmarks/mutation_score.py measures every module of recipe/ against test files that exist."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_every_module_of_recipe_has_its_tests_named() -> None:
    spec = importlib.util.spec_from_file_location("mutation_score", REPO / "benchmarks" / "mutation_score.py")
    assert spec is not None and spec.loader is not None
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    modules = {str(path.relative_to(REPO / "recipe").with_suffix("")) for path in (REPO / "recipe").rglob("*.py")
               if path.name != "__init__.py"}  # fmt: skip
    assert set(benchmark.MODULES) == modules
    assert all((REPO / test).exists() for tests in benchmark.MODULES.values() for test in tests)


def test_docs_mutation_table_has_a_row_for_each_module_measured() -> None:
    """docs/mutation.md's score table (once the README's) names exactly the modules the benchmark measures."""
    import re

    spec = importlib.util.spec_from_file_location("mutation_score", REPO / "benchmarks" / "mutation_score.py")
    assert spec is not None and spec.loader is not None
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    text = (REPO / "docs" / "mutation.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `recipe/([\w/]+)\.py` \|", text, flags=re.MULTILINE)
    assert sorted(rows) == sorted(set(rows)), "a module has two rows"
    assert set(rows) == set(benchmark.MODULES)
