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
from recipe.verl_config import key_kinds

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


# --- a sweep's fix, for what verl reads its key as (item 6: only what works for the key's type) -------------------

KINDS = key_kinds([]) if PARSER is not None else None  # verl's own trainer config, as the test venv installs it
TOKENS = st.lists(st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True), min_size=2, max_size=3)


@pytest.mark.parametrize(
    ("key", "kind"),
    [
        ("trainer.total_epochs", "int"),
        ("actor_rollout_ref.actor.optim.lr", "float"),
        ("trainer.val_before_train", "bool"),
        ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "int"),  # null, typed by its dataclass
        ("trainer.logger", "list"),
        ("trainer.project_name", "text"),
        ("trainer.no_such_option", None),
    ],
)
def test_verls_own_config_says_what_each_key_is_read_as(key: str, kind: str | None) -> None:
    assert KINDS is not None and KINDS(key) == kind


@pytest.mark.parametrize("key", ["trainer.total_epochs", "actor_rollout_ref.actor.optim.lr", "trainer.val_before_train"])
def test_a_number_or_bool_sweep_is_told_to_give_one_value(key: str) -> None:
    line = parse_user_override(f"{key}=1,2", PARSER, KINDS)
    assert isinstance(line, str) and line.endswith("in verl's config: give it one value (a run trains one configuration)")
    assert "[" not in line and "quote" not in line  # neither a list nor a text would pass verl's type check


@given(TOKENS)
@example(["console", "tensorboard"])
def test_a_list_keys_sweep_is_shown_as_the_list_hydra_parses(values: list[str]) -> None:
    line = parse_user_override(f"trainer.logger={','.join(values)}", PARSER, KINDS)
    assert isinstance(line, str) and "trainer.logger is a list in verl's config: write it in brackets" in line
    parsed = PARSER.parse_override(eval(line.rsplit(", ", 1)[1]))  # shown as Python quotes a string (shown_override)
    assert not parsed.is_sweep_override() and parsed.value() == values


@given(TOKENS, st.sampled_from([",", ", "]))
@example(["run_a", "run_b"], ",")
def test_a_text_keys_sweep_is_shown_quoted_as_the_text_hydra_parses(values: list[str], comma: str) -> None:
    text = comma.join(values)
    line = parse_user_override(f"trainer.project_name={text}", PARSER, KINDS)
    assert isinstance(line, str) and "trainer.project_name is text in verl's config: quote the value" in line
    fix = line.rsplit(", ", 1)[1] if comma == "," else line.split("quote the value, ", 1)[1]
    parsed = PARSER.parse_override(eval(fix))  # the fix is shown as Python quotes a string (shown_override)
    assert not parsed.is_sweep_override() and parsed.value() == text


def test_a_sweep_function_unknown_key_or_withheld_value_gets_a_fix_without_its_values() -> None:
    assert parse_user_override("trainer.logger=choice(a,b)", PARSER, KINDS).endswith("write it in brackets, trainer.logger=[a,b]")
    assert parse_user_override("trainer.project_name=range(1,3)", PARSER, KINDS).endswith("text in verl's config: quote the value")
    general = "is a sweep, which Hydra refuses outside --multirun; write a list as [a,b] or quote the value"
    assert parse_user_override("+trainer.no_such_option=1,2", PARSER, KINDS) == f"override '+trainer.no_such_option=1,2': {general}"
    withheld = parse_user_override("trainer.project_name=hf_" + "abcdefghij" * 4 + ",b", PARSER, KINDS)
    assert isinstance(withheld, str) and withheld.endswith(general) and "hf_abc" not in withheld


def test_plan_says_the_fix_for_the_keys_type_through_overrides_and_after_the_dashes() -> None:
    from recipe.errors import RecipeConfigError
    from recipe.plan import build_plan

    from .envtools import settings_of

    with pytest.raises(RecipeConfigError) as refused:
        build_plan(settings_of(DEVICE="gpu", OVERRIDES="trainer.logger=console,tensorboard"), environ={},
                   extra_overrides=["actor_rollout_ref.actor.optim.lr=1e-6,2e-6"])  # fmt: skip
    said = "\n".join(refused.value.problems)
    assert "trainer.logger is a list in verl's config: write it in brackets, 'trainer.logger=[console,tensorboard]'" in said
    assert "actor_rollout_ref.actor.optim.lr is a float in verl's config: give it one value" in said
