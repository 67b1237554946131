"""How the recipe writes values for Hydra, and which strings it refuses: exact text, derived by hand from the grammar.

Hydra's quoted-string grammar (hydra/grammar/OverrideLexer.g4, QUOTED_VALUE) un-escapes only
backslashes that precede a quote or end the string: those come in pairs, and an odd one
escapes the quote. Every other backslash is literal. test_hostile_settings.py proves the round
trip against Hydra's own parser; this file pins the exact text and messages without it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from recipe.hydra_text import hydra_string, hydra_value, literal_problem

INTERPOLATION = (
    "must be a literal string: `${` starts an OmegaConf interpolation, which verl would resolve "
    "(and re-resolve after its in-place OmegaConf.resolve)"
)
MISSING = "must be a literal string: OmegaConf reads `???` as a missing value"
NUL = "must not contain a NUL character"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("${oc.env:HF_TOKEN}", INTERPOLATION), ("a${b", INTERPOLATION), ("${", INTERPOLATION),
        ("???", MISSING), ("a\x00b", NUL), ("\x00", NUL),
        # Near misses that OmegaConf keeps as they are.
        ("$ {x}", None), ("$", None), ("{x}", None), ("??", None), ("????", None), ("a???", None), ("", None),
    ],
)  # fmt: skip
def test_what_omegaconf_would_not_keep_literal_is_named(text: str, problem: str | None) -> None:
    assert literal_problem(text) == problem


def test_an_interpolation_is_named_before_a_nul() -> None:
    assert literal_problem("${x}\x00") == INTERPOLATION


@pytest.mark.parametrize(
    ("text", "quoted"),
    [
        ("", "''"),
        ("abc", "'abc'"),
        ("123", "'123'"),  # stays a string, never a number
        ("it's", r"'it\'s'"),  # a quote is escaped
        ("''", r"'\'\''"),
        ("run\\2024", r"'run\2024'"),  # a backslash before anything else is literal
        ("a\\", r"'a\\'"),  # one before the closing quote is doubled
        ("\\\\", r"'\\\\'"),  # a run of them before it: each doubled
        ("a\\'b", r"'a\\\'b'"),  # before an inner quote: doubled, then the quote escaped
        ("x\\\\'", r"'x\\\\\''"),
    ],
)
def test_a_string_is_quoted_so_that_hydra_reads_it_back(text: str, quoted: str) -> None:
    assert hydra_string(text) == quoted


@pytest.mark.parametrize(("text", "problem"), [("${x}", INTERPOLATION), ("???", MISSING), ("a\x00", NUL)])
def test_a_string_hydra_would_not_keep_is_refused_with_its_reason(text: str, problem: str) -> None:
    with pytest.raises(ValueError) as caught:
        hydra_string(text)
    assert str(caught.value) == f"{text!r}: {problem}"


@pytest.mark.parametrize(
    ("value", "written"),
    [
        (True, "True"), (False, "False"),  # not 1 / 0: a bool is checked before int
        (0, "0"), (-3, "-3"), (0.6, "0.6"), (1e-6, "1e-06"),
        (["model", "hf_model"], "['model','hf_model']"), (("a", 1, False), "['a',1,False]"), ([], "[]"),
        ([["x"], []], "[['x'],[]]"),
        (Path("/data/x.parquet"), "'/data/x.parquet'"), (None, "null"), ("null", "'null'"),  # None is Hydra's null
    ],
)  # fmt: skip
def test_a_value_is_written_as_hydra_reads_it_back(value: object, written: str) -> None:
    assert hydra_value(value) == written
