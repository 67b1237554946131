"""recipe/env_warnings.py at its bounds (issue 52): a name at exactly the typo cutoff warns, one letter past it does not.

difflib's ratio is 2·M/T (M letters matched, T the two lengths together); TYPO_CUTOFF is 0.8, and a ratio equal to it
counts (difflib's own `>=`, and env_warnings' prefilter by length, which must not drop the bound itself).
"""

from __future__ import annotations

import difflib

import pytest

from recipe.env_warnings import TYPO_CUTOFF, allow_drift_warnings, near_miss_warnings


def _ratio(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b).ratio()


@pytest.mark.parametrize(
    ("variable", "warning"),
    [
        ("NODE", "NODE is not a setting (ignored); did you mean NNODES?"),  # 2·4/10: exactly the cutoff, shorter
        ("NNODESXYZ", "NNODESXYZ is not a setting (ignored); did you mean NNODES?"),  # 2·6/15: exactly, longer
        ("NNODESXYZW", None),  # 2·6/16: one letter past it
        ("NOD", None),  # 2·3/9
    ],
)
def test_a_setting_typo_at_exactly_the_cutoff_warns_and_one_letter_past_it_does_not(variable: str, warning: str | None) -> None:
    assert near_miss_warnings({variable: "1"}) == ([warning] if warning else [])
    assert (_ratio(variable, "NNODES") >= TYPO_CUTOFF) is (warning is not None)


@pytest.mark.parametrize(("field", "warns"), [("MODEL_IDXYZW", True), ("MODEL_IDXYZWV", False), ("ODEL", False)])
def test_an_allow_drift_field_at_exactly_the_cutoff_warns(field: str, warns: bool) -> None:
    expected = [f"ALLOW_DRIFT names {field}, which is no field a record compares; did you mean MODEL_ID?"]
    assert allow_drift_warnings([field], ["MODEL_ID"]) == (expected if warns else [])


@pytest.mark.parametrize("blank", ["", " ", "\t\n"])
def test_a_typo_with_an_empty_or_blank_value_still_warns(blank: str) -> None:
    """The name is what is ignored, whatever it holds: an empty value (`TPP=` in .env) is no exception."""
    assert near_miss_warnings({"TPP": blank}) == ["TPP is not a setting (ignored); did you mean TP?"]
