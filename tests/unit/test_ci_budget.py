"""CI's time budget (.ci/budget.toml): its rows add up within the limits, it names .ci/run's phases in their order,
docs/testing.md shows it as it is, and .ci/run's report warns of a phase over it."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .envtools import REPO

_SPEC = importlib.util.spec_from_file_location("ci_budget", REPO / ".ci" / "budget.py")
assert _SPEC and _SPEC.loader
budget_module = importlib.util.module_from_spec(_SPEC)
sys.modules["ci_budget"] = budget_module  # dataclasses look their module up
_SPEC.loader.exec_module(budget_module)

BUDGET = budget_module.load()
CI_RUN = (REPO / ".ci" / "run").read_text(encoding="utf-8")


def test_the_rows_add_up_within_the_warm_and_cold_limits() -> None:
    assert (BUDGET.total_warm, BUDGET.total_cold) == (45, 65)
    assert sum(row.warm for row in BUDGET.rows) <= BUDGET.total_warm
    assert sum(row.cold for row in BUDGET.rows) <= BUDGET.total_cold
    assert all(0 < row.warm <= row.cold for row in BUDGET.rows), "a cold run never takes less than a warm one"


def test_room_is_kept_for_the_work_that_follows() -> None:
    reserved = {row.name: row.cold for row in BUDGET.rows if row.reserved}
    # Issue 53's routing-replay run is not run (replay is not offered: docs/health.md): its minute is released.
    assert reserved == {}
    # The rows of issues 50 and 52 (2 minutes) went into the mutation check, which runs their breakages.
    assert {row.name: row.cold for row in BUDGET.phases}["mutation check"] == 5
    # The two-node e2e (issue 51): 9.4 and 9.6 minutes measured, over the 8 (its row says why).
    assert {row.name: row.cold for row in BUDGET.phases}["two-node e2e (tests/e2e/test_two_nodes.py)"] == 10


def test_the_budget_names_the_phases_of_ci_run_in_their_order() -> None:
    run_phases = [name for name in re.findall(r'^phase "([^"]*)"', CI_RUN, flags=re.MULTILINE) if name]
    assert run_phases == [row.name for row in BUDGET.phases]


def test_the_readmes_test_command_and_the_e2e_are_within_their_own_budgets() -> None:
    by_name = {row.name: row for row in BUDGET.phases}
    assert by_name["set-up and pytest (tests/setup.sh)"].cold <= 11  # issue 49: the one command on a fresh clone
    assert by_name["e2e (CPU GRPO on Megatron)"].cold <= 11


def test_docs_testing_shows_the_budget_table_as_the_file_has_it() -> None:
    page = (REPO / "docs" / "testing.md").read_text(encoding="utf-8")
    assert budget_module.markdown(BUDGET) in page, "regenerate it: python .ci/budget.py markdown"


def test_the_report_warns_of_a_phase_over_its_budget_and_of_one_with_no_row() -> None:
    first = BUDGET.phases[0]
    times = {first.name: first.warm * 60 + 30, "a phase nobody budgeted": 10.0}
    lines, warnings = budget_module.report(BUDGET, times)
    assert any(line.startswith(first.name) and line.endswith("over the warm budget") for line in lines), lines
    assert warnings[0].startswith(f"{first.name}: ") and "over the warm budget" in warnings[0]
    assert "a phase nobody budgeted: a phase of .ci/run with no row in .ci/budget.toml" in warnings
    assert budget_module.report(BUDGET, {first.name: first.warm * 60})[1] == [], "at its budget is within it"


@pytest.mark.parametrize("over", ["warm", "cold"])
def test_the_report_is_printed_by_the_script_and_never_fails(tmp_path: Path, over: str) -> None:
    row = max(BUDGET.phases, key=lambda row: row.cold - row.warm)  # room between its warm and cold budgets
    seconds = row.cold * 60 + 60 if over == "cold" else (row.warm + row.cold) * 30
    times = tmp_path / "times"
    times.write_text(f"{row.name}\t{seconds:.0f}\n")
    done = subprocess.run([sys.executable, str(REPO / ".ci" / "budget.py"), "report", str(times)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert f"[ci] WARNING (budget): {row.name}: " in done.stdout and f"over the {over} budget" in done.stdout


def test_files_ranks_the_test_files_of_a_junit_report_by_their_time(tmp_path: Path) -> None:
    report = tmp_path / "unit.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.unit.test_a" name="t1" time="1.5"/>'
        '<testcase classname="tests.unit.test_a.TestGroup" name="t2" time="2.5"/>'
        '<testcase classname="tests.unit.test_b" name="t3" time="6.0"/>'
        "</testsuite></testsuites>"
    )
    lines = budget_module.slowest_test_files(report)
    assert lines[1].split() == ["tests/unit/test_b.py", "1", "6.0", "60.0%"]
    assert lines[2].split() == ["tests/unit/test_a.py", "2", "4.0", "40.0%"]
    assert lines[3].split()[-2:] == ["3", "10.0"]
