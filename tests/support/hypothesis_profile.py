"""Hypothesis settings for every suite that uses it: no clock in a test's verdict.

Hypothesis fails an example that runs over 200 ms (`deadline`) and a test whose data is slow
to generate (`HealthCheck.too_slow`). Both measure the machine: on a loaded CI runner a correct
test fails. Imported by the conftest of each suite that runs generated cases, before their test
modules, so the profile applies to every `@given` (an explicit `@settings` still sets its own
example count).

In CI (CI=true, as .ci/run sets it) the examples are derandomized: each test draws the same examples on every
run, so a catch never depends on luck and a red CI reproduces; named edges are `@example`s beside them. Off CI,
each run draws new examples, and the example database replays a failure found before.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

#: Whether this run is CI's (the variable .ci/run and most CI systems set).
IN_CI = os.environ.get("CI", "").lower() == "true"

settings.register_profile(
    "grpo-recipe", deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=IN_CI
)
settings.load_profile("grpo-recipe")
