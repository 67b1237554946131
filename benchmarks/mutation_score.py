#!/usr/bin/env python3
"""mutmut's mutation score of some recipe modules against their unit tests: a benchmark, not a gate.

tests/mutations/check.py is the gate (named breakages CI must catch). This asks mutmut
(`pip install mutmut==3.8.1`, the release measured; not in the test extra, as CI does not run
this) to make every small mutation of each module below, runs the
module's own unit tests against each, and prints killed / all per module. A survived mutant
is a change no test notices; a "no tests" one is code those tests never reach.

    python benchmarks/mutation_score.py [MODULE ...]      # e.g. layout allocator

Each module runs in a throw-away copy of the repository (mutmut rewrites files); about a
minute per module on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: module under recipe/ -> the unit tests that are meant to pin it down.
MODULES = {
    "layout": ["tests/unit/test_layout.py"],
    "allocator": ["tests/unit/test_allocator.py"],
    "cluster": ["tests/unit/test_cluster.py"],
}
# recipe/provenance.py is left out: its tests run `entrypoint.py run` end to end (seconds each),
# which makes a mutation run of it take most of an hour here.
#: What the tests read besides the code.
ALSO_COPY = ["tests/", "recipe/", "README.md", "pyproject.toml", "docs/", "docker/", "entrypoint.py", "k8s/", ".env.example"]


def score(module: str, tests: list[str]) -> dict[str, int]:
    """mutmut's counts for recipe/MODULE.py against TESTS, from a fresh copy of the repository."""
    with tempfile.TemporaryDirectory() as folder:
        copy = Path(folder) / "repo"
        shutil.copytree(REPO, copy, ignore=shutil.ignore_patterns(".venv*", ".git", ".e2e", "__pycache__", "mutants"))
        also = "\n    ".join(ALSO_COPY)
        (copy / "setup.cfg").write_text(
            f"[mutmut]\nsource_paths=recipe/{module}.py\n"
            f"pytest_add_cli_args_test_selection={' '.join(tests)}\nalso_copy={also}\n"
        )
        subprocess.run([sys.executable, "-m", "mutmut", "run"], cwd=copy, check=True, capture_output=True, timeout=1800)
        results = subprocess.run(
            [sys.executable, "-m", "mutmut", "results", "--all", "true"], cwd=copy, capture_output=True, text=True,
            check=True,
        ).stdout
    counts = {"killed": 0, "survived": 0, "no tests": 0, "timeout": 0, "other": 0}
    for line in results.splitlines():
        status = line.rsplit(":", 1)[-1].strip() if ":" in line else ""
        counts[status if status in counts else "other"] += 1
    return counts


def main() -> int:
    from importlib.util import find_spec

    if find_spec("mutmut") is None:
        print("error: mutmut is not installed: pip install mutmut==3.8.1", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", metavar="MODULE", help=f"some of: {', '.join(MODULES)} (default: all)")
    args = parser.parse_args()
    totals: dict[str, int] = {}
    unknown = sorted(set(args.modules) - set(MODULES))
    if unknown:
        parser.error(f"unknown module(s) {', '.join(unknown)}: choose from {', '.join(MODULES)}")
    for module in args.modules or list(MODULES):
        counts = score(module, MODULES[module])
        total = sum(counts.values())
        for key, value in counts.items():
            totals[key] = totals.get(key, 0) + value
        print(f"recipe/{module}.py: {counts['killed']}/{total} killed ({counts['killed'] / max(total, 1):.0%}); "
              + json.dumps({k: v for k, v in counts.items() if k != 'killed'}))
    total = sum(totals.values())
    print(f"all: {totals.get('killed', 0)}/{total} killed ({totals.get('killed', 0) / max(total, 1):.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
