"""Under CI=true a skipped test is a failure, unless the test says why CI may skip it.

CI runs `.ci/run` with CI=true (GitHub Actions sets it too). A skip there nearly always
means an install step is missing or broken, and the run would be green while proving
nothing: the composition against verl, the Megatron-Bridge exports, the deploy checks must
RUN in CI. So, for the suites whose conftest imports these hooks (tests/unit, tests/bridge,
tests/deploy):

- with CI=true, every skip becomes a failure that quotes the skip's reason, including a
  skip of a whole module at collection (`needs(...)` at module level, or a skip mark
  placed by a conftest);
- except a test marked `@pytest.mark.ci_may_skip("why CI cannot run it")`, and, with
  `unless_env="NAME"`, only while NAME is unset: the engine checks of tests/deploy may
  skip in the plain `pytest` run (no Docker engine yet) but not under .ci/images.sh, which
  exports DOCKER_HOST and runs them against the engine it started.
- xfail stays xfail.

Locally (CI unset) nothing changes: a skip is a skip, with its reason (`-ra` prints it).
To see what CI would say: `CI=true pytest`.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

MARKER = "ci_may_skip"


def ci_forbids_skips() -> bool:
    """True when the environment says this is CI (CI=true, as GitHub Actions and .ci/run's caller set it)."""
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def _skip_reason(report: Any) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _allowed(item: pytest.Item) -> bool:
    marker = item.get_closest_marker(MARKER)
    if marker is None:
        return False
    unless = marker.kwargs.get("unless_env")
    return not (unless and os.environ.get(unless))


def _fail(report: Any, what: str) -> None:
    report.outcome = "failed"
    report.longrepr = (
        f"skipped under CI=true, where a skip is a failure: {what}: {_skip_reason(report)}\n"
        f"Fix the install step the reason names, or (only for a test CI cannot run by design) mark it "
        f"@pytest.mark.{MARKER}('why') (tests/support/skip_policy.py)."
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A test's skip (in setup or call) fails under CI=true unless the test is marked ci_may_skip."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and not hasattr(report, "wasxfail") and ci_forbids_skips() and not _allowed(item):
        _fail(report, item.nodeid)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Any:
    """A whole module skipped at collection fails under CI=true (no marker can excuse it there)."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and ci_forbids_skips():
        _fail(report, collector.nodeid)
