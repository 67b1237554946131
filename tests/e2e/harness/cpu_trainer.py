"""The trainer `entrypoint.py run` starts on a CPU node: the plan's own command with the CPU mapping, nothing else.

`run` hands the stand-in named by RECIPE_TEST_TRAINER (recipe.run.trainer._run_trainer) the trainer's argv,
`python -m recipe.trainer_main <overrides>`; this maps the overrides for a CPU cluster
(tests/e2e/harness/plan.py: apply_cpu_mapping with cluster=True) and execs the same command. Run as
`python -m tests.e2e.harness.cpu_trainer <argv>`.
"""

from __future__ import annotations

import os
import sys

from tests.e2e.harness.plan import apply_cpu_mapping


def main(argv: list[str]) -> None:
    """Exec the trainer command `argv` with its overrides mapped for a CPU Ray cluster."""
    python, flag, module, *overrides = argv
    if (flag, module) != ("-m", "recipe.trainer_main"):
        raise SystemExit(f"cpu_trainer: expected `python -m recipe.trainer_main ...`, got {argv[:3]}")
    os.execv(python, [python, flag, module, *apply_cpu_mapping(overrides, cluster=True)])


if __name__ == "__main__":
    main(sys.argv[1:])
