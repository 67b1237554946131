"""The suite's Hypothesis profile is in force (tests/support/hypothesis_profile.py)."""

from __future__ import annotations

from hypothesis import HealthCheck, settings


def test_generated_cases_have_no_deadline() -> None:
    # tests/support/hypothesis_profile.py, loaded by this suite's conftest: a clock never
    # decides a generated case (issue 13). An explicit @settings keeps this default.
    assert settings().deadline is None
    assert HealthCheck.too_slow in settings().suppress_health_check


def test_generated_cases_are_derandomized_in_ci_alone() -> None:
    """Issue 52: in CI every test draws the same examples on every run (a catch never depends on luck)."""
    from tests.support.hypothesis_profile import IN_CI

    assert settings().derandomize is IN_CI
