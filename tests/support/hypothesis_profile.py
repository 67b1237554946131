"""Hypothesis settings for every suite that uses it: no clock in a test's verdict.

Hypothesis fails an example that runs over 200 ms (`deadline`) and a test whose data is slow
to generate (`HealthCheck.too_slow`). Both measure the machine: on a loaded CI runner a correct
test fails. Imported by the conftest of each suite that runs generated cases, before their test
modules, so the profile applies to every `@given` (an explicit `@settings` still sets its own
example count).
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

settings.register_profile("grpo-recipe", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("grpo-recipe")
