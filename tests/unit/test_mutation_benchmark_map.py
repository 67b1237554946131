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
