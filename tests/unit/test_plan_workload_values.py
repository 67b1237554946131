"""The numbers the memory estimate reads, after `--`: refused by name (the lengths), skipped with why, never a crash.

`data.max_prompt_length=0 data.max_response_length=0` on a model without DeltaNet layers made the memory estimate
divide by a sequence of no tokens: `plan` ended in a ZeroDivisionError traceback; lengths near 1e308 overflowed it.
The class: any literal length that is not a whole number of tokens from 1 to 2**31 - 1.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from recipe.errors import RecipeConfigError
from recipe.memory_workload import LENGTH_KEYS, WORKLOAD_DEFAULTS, length_problems
from recipe import plan as plan_module
from recipe.plan import build_plan
from recipe.smoke import shipped_model_dir
from recipe.verl_config import VerlConfigCheck

from .envtools import settings_of

RULE = "a sequence length is a whole number of tokens, from 1 to 2147483647"


@pytest.mark.parametrize("value", ["0", "0.5", "-1", "512.5", "nan", "inf", "-inf", "1e400", "0e3", "2147483648",
                                   "8.98e307"])
@pytest.mark.parametrize("key", LENGTH_KEYS)
def test_a_length_that_is_no_whole_number_from_1_to_2_31_is_named_with_the_rule(key: str, value: str) -> None:
    assert length_problems([f"{key}=512", f"{key}={value}"]) == [f"{key}={value}: {RULE}"]  # the last one counts


@pytest.mark.parametrize("value", ["1", "512", "512.0", "1e3", "2147483647", "${oc.env:PROMPT_LENGTH}", "abc"])
@pytest.mark.parametrize("key", LENGTH_KEYS)
def test_a_whole_length_or_one_that_is_no_literal_is_not_refused_here(key: str, value: str) -> None:
    """Not a literal number: the estimate says it skipped, as for every other workload value."""
    assert length_problems([f"{key}={value}"]) == []


def test_lengths_left_to_verls_defaults_are_not_refused() -> None:
    assert length_problems([]) == []
    assert length_problems(["trainer.total_epochs=0"]) == []


def test_a_length_that_is_no_literal_does_not_hide_the_other() -> None:
    assert length_problems(["data.max_prompt_length=${oc.env:PROMPT_LENGTH}", "data.max_response_length=0"]) == [
        f"data.max_response_length=0: {RULE}"
    ]


def test_both_lengths_are_named_in_argv_order_of_the_keys() -> None:
    assert length_problems(["data.max_response_length=0", "data.max_prompt_length=0"]) == [
        f"data.max_prompt_length=0: {RULE}",
        f"data.max_response_length=0: {RULE}",
    ]


@pytest.fixture
def attention_only_model(tmp_path: Path) -> Path:
    """The smoke model with full attention in every layer: no DeltaNet state, so a sequence's size is its tokens only."""
    directory = tmp_path / "model"
    directory.mkdir()
    config = json.loads((shipped_model_dir() / "config.json").read_text())
    text = config["text_config"]
    text["full_attention_interval"] = 1
    text["layer_types"] = ["full_attention"] * text["num_hidden_layers"]
    (directory / "config.json").write_text(json.dumps(config))
    return directory


LENGTHS = st.one_of(st.integers(-3, 4096).map(str), st.floats(allow_nan=True, allow_infinity=True).map(repr),
                    st.sampled_from(["0", "0.0", "1", "-0", "1e400"]))


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=LENGTHS, response=LENGTHS)
@example(prompt="0", response="0")  # the ZeroDivisionError first reported
@example(prompt="-3", response="3")  # no tokens in all, though one length is whole
@example(prompt="8.988465674311579e+307", response="8.98846567431158e+307")  # overflowed the estimate
@example(prompt="2147483647", response="2147483647")  # the largest lengths: estimated (and far too big)
def test_plan_refuses_bad_lengths_by_name_and_estimates_the_rest(attention_only_model: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch, prompt: str,
                                                                  response: str) -> None:
    """Whatever literal lengths are passed, the plan either refuses naming each bad one, or estimates a finite fit.

    verl's composition of the overrides (about a second each, tested in its own files) is left out.
    """
    monkeypatch.setattr(plan_module, "check_verl_config", lambda *args: VerlConfigCheck([]))
    chosen = settings_of(DEVICE="gpu", MODEL_PATH=str(attention_only_model), CHECKPOINT_DIR=str(tmp_path / "ck"),
                         TP=1, GEN_TP=1, EP=1, NDEVICES_PER_NODE=1, DEVICE_MEMORY_GIB=4096)
    overrides = [f"data.max_prompt_length={prompt}", f"data.max_response_length={response}"]
    bad = {key for key, text in zip(LENGTH_KEYS, (prompt, response))
           if not (1 <= float(text) <= 2**31 - 1 and float(text).is_integer())}
    try:
        plan = build_plan(chosen, {}, overrides)
    except RecipeConfigError as refused:
        named = {key for key in LENGTH_KEYS for line in refused.problems if line.startswith(f"{key}=") and RULE in line}
        assert named == bad, refused.problems
        return
    assert not bad
    assert plan.memory is not None and math.isfinite(plan.memory.kv_sequences)


NUMBER_KEYS = [key for key, default in WORKLOAD_DEFAULTS.items() if not isinstance(default, bool)]
HOSTILE = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr), st.integers(-(2**70), 2**70).map(str),
                    st.text(max_size=12), st.sampled_from(["1e308", "-0", "2147483647", "2147483648", "${oc.env:X}"]))


@settings(max_examples=80, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.dictionaries(st.sampled_from(NUMBER_KEYS), HOSTILE, min_size=1))
def test_any_value_of_what_the_estimate_reads_gives_a_plan_or_a_refusal_never_a_crash(
    attention_only_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, values: dict[str, str]
) -> None:
    """Every number the estimate reads, set after `--` to anything: an estimate, a skip that says why, or a refusal."""
    monkeypatch.setattr(plan_module, "check_verl_config", lambda *args: VerlConfigCheck([]))
    chosen = settings_of(DEVICE="gpu", MODEL_PATH=str(attention_only_model), CHECKPOINT_DIR=str(tmp_path / "ck"),
                         TP=1, GEN_TP=1, EP=1, NDEVICES_PER_NODE=1, DEVICE_MEMORY_GIB=4096)
    overrides = [f"{key}={text}" for key, text in values.items() if "\n" not in text and "=" not in text]
    try:
        plan = build_plan(chosen, {}, overrides)
    except RecipeConfigError as refused:
        assert refused.problems
        return
    assert plan.memory is not None or plan.memory_skipped
