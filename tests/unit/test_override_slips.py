"""Everyday slips in overrides, said in the recipe's words (issue 54, item 6): blanks around `=`, two overrides
quoted as one argument, overrides separated by commas. Generated against Hydra's own override parser: each slip
is one Hydra refuses, the line names the slip, and each fix it shows is an override Hydra parses, the same ones
the user meant."""

from __future__ import annotations

import re

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from recipe.user_overrides import hydra_override_parser, parse_user_override

PARSER = hydra_override_parser()
pytestmark = pytest.mark.skipif(PARSER is None, reason="Hydra is in the test venv (tests/setup.sh) and the images")

KEYS = st.lists(st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True), min_size=1, max_size=3).map(".".join)
VALUES = st.one_of(st.integers(-10**6, 10**6).map(str), st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True),
                   st.floats(1e-6, 1e3).map(lambda x: f"{x:g}"))  # fmt: skip
OVERRIDES = st.tuples(KEYS, VALUES).map("=".join)


def _fixes(line: str) -> list[str]:
    """The overrides a message shows as its fix (each quoted as shown_override quotes it)."""
    return re.findall(r"'([^']*)'", line.split(": ", 1)[1])


@given(KEYS, VALUES, st.sampled_from([" = ", " =", " ="]))
@example("trainer.total_training_steps", "100", " = ")
def test_a_blank_before_equals_is_named_with_the_override_that_parses(key: str, value: str, blanks: str) -> None:
    text = f"{key}{blanks}{value}"
    line = parse_user_override(text, PARSER)
    assert isinstance(line, str), line  # Hydra refuses it
    assert "has a blank before `=`, which Hydra cannot parse; write" in line
    [fix] = _fixes(line)
    assert fix == f"{key}={value}" and not isinstance(parse_user_override(fix, PARSER), str)


@given(st.lists(OVERRIDES, min_size=2, max_size=3), st.sampled_from([" ", "  ", ",", ", "]))
@example(["trainer.total_training_steps=100", "trainer.save_freq=10"], ",")
@example(["trainer.total_training_steps=100", "trainer.save_freq=10"], " ")
def test_several_overrides_in_one_argument_are_named_with_the_first_two_apart(overrides: list[str], separator: str) -> None:
    text = separator.join(overrides)
    line = parse_user_override(text, PARSER)
    assert isinstance(line, str), line
    said = "separated by a comma" if "," in separator else "holds two overrides in one argument"
    assert said in line, line
    first, second = _fixes(line)[:2]
    assert first == overrides[0] and second == separator.join(overrides[1:])
    assert not isinstance(parse_user_override(first, PARSER), str)


def test_what_hydra_parses_is_never_called_a_slip() -> None:
    """A value with a blank or a comma that Hydra takes as it is stays the user's: a string, a list."""
    for text in ("a=x y", "a=[1,2]", "a='b=c d=e'", "a=1"):
        assert not isinstance(parse_user_override(text, PARSER), str), text


def test_a_slip_never_repeats_a_secret() -> None:
    line = parse_user_override("data.train_files=x hf_token=hf_abcdefghijklmnopqrstuvwxyz", PARSER)
    assert isinstance(line, str) and "hf_abcdefghijklmnopqrstuvwxyz" not in line
    assert "holds two overrides in one argument" in line and "'hf_token=<value withheld: it may hold a secret>'" in line
