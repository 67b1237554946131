"""Expandable segments: never in the allocator environment vLLM reads; user options kept; contradictions refused.

Also the exact decision `plan` shows (variable, value, run-time switch, reason) and the exact error lines.
"""

from __future__ import annotations

import pytest

from recipe.allocator import decide_allocator
from recipe.errors import RecipeConfigError

from .envtools import settings_of


@pytest.mark.parametrize(("device", "variable"), [("gpu", "PYTORCH_CUDA_ALLOC_CONF"), ("npu", "PYTORCH_NPU_ALLOC_CONF")])
def test_default_keeps_the_variable_unset_and_lets_verl_switch(device: str, variable: str) -> None:
    decision = decide_allocator(settings_of(), device, {})  # type: ignore[arg-type]
    assert decision.variable == variable
    assert decision.value is None and decision.runtime_switch
    assert decision.environment() == {variable: None, "RECIPE_EXPANDABLE_SEGMENTS": "1"}
    assert "pytorch#147851" in decision.reason


@pytest.mark.parametrize("device", ["gpu", "npu"])
def test_users_expandable_segments_true_is_moved_out_of_the_environment(device: str) -> None:
    variable = {"gpu": "PYTORCH_CUDA_ALLOC_CONF", "npu": "PYTORCH_NPU_ALLOC_CONF"}[device]
    decision = decide_allocator(settings_of(), device, {variable: "expandable_segments:True,max_split_size_mb:128"})  # type: ignore[arg-type]
    # The exact substring vLLM's and vllm-ascend's pools assert on is gone; the other option stays.
    assert "expandable_segments:True" not in (decision.value or "")
    assert decision.value == "max_split_size_mb:128"
    assert decision.runtime_switch
    assert "moved from" in decision.reason


def test_users_other_options_are_kept_in_order() -> None:
    given = "max_split_size_mb:256, garbage_collection_threshold:0.6"
    decision = decide_allocator(settings_of(), "gpu", {"PYTORCH_CUDA_ALLOC_CONF": given})
    assert decision.value == "max_split_size_mb:256,garbage_collection_threshold:0.6"


def test_setting_false_writes_false_and_disables_the_runtime_switch() -> None:
    decision = decide_allocator(settings_of(EXPANDABLE_SEGMENTS=False), "npu", {"PYTORCH_NPU_ALLOC_CONF": "max_split_size_mb:64"})
    assert decision.value == "max_split_size_mb:64,expandable_segments:False"
    assert not decision.runtime_switch
    assert decision.environment()["RECIPE_EXPANDABLE_SEGMENTS"] == "0"


def test_users_explicit_false_in_the_variable_is_honoured() -> None:
    decision = decide_allocator(settings_of(), "gpu", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"})
    assert decision.value == "expandable_segments:False" and not decision.runtime_switch


def test_a_contradiction_between_setting_and_variable_is_refused() -> None:
    with pytest.raises(RecipeConfigError) as caught:
        decide_allocator(settings_of(EXPANDABLE_SEGMENTS=False), "gpu", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    assert caught.value.problems == [
        "PYTORCH_CUDA_ALLOC_CONF='expandable_segments:True': contradicts EXPANDABLE_SEGMENTS=false; set only one of them"
    ]


def test_the_other_targets_variable_is_left_alone() -> None:
    decision = decide_allocator(settings_of(), "npu", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    assert decision.variable == "PYTORCH_NPU_ALLOC_CONF" and decision.value is None


# --- Exact decisions and messages (issue 27) ---------------------------------------------------
# `plan` prints `VAR=value: reason` and `plan --json` the decision's four fields; error lines go to
# stderr. All of it is what users read and grep, so each case pins the whole output, written by hand.

CUDA = "PYTORCH_CUDA_ALLOC_CONF"
NPU = "PYTORCH_NPU_ALLOC_CONF"
ON_GPU = (
    "expandable segments on for training, switched at run time by verl; kept out of PYTORCH_CUDA_ALLOC_CONF "
    "because vLLM's sleep-mode memory pool asserts on expandable_segments:True (pytorch#147851)"
)
OFF = "expandable segments off everywhere ({}); verl's run-time switch is disabled"


@pytest.mark.parametrize(
    ("setting", "device", "environ", "expected"),
    [
        # Nothing given: unset variable, verl switches at run time.
        ({}, "gpu", {}, {"variable": CUDA, "value": None, "runtime_switch": True, "reason": ON_GPU}),
        # The user's True is moved to the run-time switch, their other option kept, and both are said.
        (
            {}, "gpu", {CUDA: "expandable_segments:True,max_split_size_mb:128"},
            {"variable": CUDA, "value": "max_split_size_mb:128", "runtime_switch": True,
             "reason": ON_GPU + "; moved from PYTORCH_CUDA_ALLOC_CONF to the run-time switch; kept the user's max_split_size_mb:128"},
        ),
        # Only other options: kept and said, nothing claimed to be moved.
        (
            {}, "gpu", {CUDA: "max_split_size_mb:256"},
            {"variable": CUDA, "value": "max_split_size_mb:256", "runtime_switch": True,
             "reason": ON_GPU + "; kept the user's max_split_size_mb:256"},
        ),
        # The setting alone turns it off: the reason names the setting.
        (
            {"EXPANDABLE_SEGMENTS": False}, "npu", {NPU: "max_split_size_mb:64"},
            {"variable": NPU, "value": "max_split_size_mb:64,expandable_segments:False", "runtime_switch": False,
             "reason": OFF.format("EXPANDABLE_SEGMENTS=false")},
        ),
        # The variable alone turns it off: the reason names the variable the user wrote it in.
        (
            {}, "gpu", {CUDA: "expandable_segments:False"},
            {"variable": CUDA, "value": "expandable_segments:False", "runtime_switch": False,
             "reason": OFF.format(CUDA)},
        ),
        # Both say false: the setting is the one named (it is what decides when both are given).
        (
            {"EXPANDABLE_SEGMENTS": False}, "gpu", {CUDA: "expandable_segments:False"},
            {"variable": CUDA, "value": "expandable_segments:False", "runtime_switch": False,
             "reason": OFF.format("EXPANDABLE_SEGMENTS=false")},
        ),
    ],
    ids=["default", "true-moved", "others-kept", "setting-off", "variable-off", "both-off"],
)
def test_the_decision_plan_shows_is_exact(
    setting: dict[str, object], device: str, environ: dict[str, str], expected: dict[str, object]
) -> None:
    decision = decide_allocator(settings_of(**setting), device, environ)  # type: ignore[arg-type]
    assert decision.to_dict() == expected


def test_a_key_spelt_with_other_case_and_spaces_is_still_recognised() -> None:
    # The module's contract: expandable_segments is recognised however it is spelt (case, spaces),
    # so a sloppy spelling can neither slip past the policy nor survive as an "other option".
    decision = decide_allocator(settings_of(), "gpu", {CUDA: " Expandable_ Segments : TRUE , max_split_size_mb:32"})
    assert decision.value == "max_split_size_mb:32" and decision.runtime_switch


@pytest.mark.parametrize(
    ("setting", "environ", "problems"),
    [
        (
            {}, {CUDA: "expandable_segments:yes"},
            ["PYTORCH_CUDA_ALLOC_CONF='expandable_segments:yes': expandable_segments must be True or False"],
        ),
        # A second colon makes the value malformed; it must not be passed on as some other option, since
        # it still holds the very substring vLLM's pool asserts on.
        (
            {}, {CUDA: "expandable_segments:True:junk"},
            ["PYTORCH_CUDA_ALLOC_CONF='expandable_segments:True:junk': expandable_segments must be True or False"],
        ),
        (
            {}, {CUDA: "expandable_segments:True,expandable_segments:False"},
            [("PYTORCH_CUDA_ALLOC_CONF='expandable_segments:True,expandable_segments:False': "
              "expandable_segments is given twice with different values")],
        ),
        (
            {"EXPANDABLE_SEGMENTS": True}, {CUDA: "expandable_segments:False"},
            ["PYTORCH_CUDA_ALLOC_CONF='expandable_segments:False': contradicts EXPANDABLE_SEGMENTS=true; set only one of them"],
        ),
        # The device-generic variable reaches the workers too and newer torch prefers it: refused either way.
        (
            {}, {"PYTORCH_ALLOC_CONF": "expandable_segments:True"},
            [("PYTORCH_ALLOC_CONF='expandable_segments:True': must not set expandable_segments (vLLM's sleep-mode pool "
              "asserts on it); use EXPANDABLE_SEGMENTS, or PYTORCH_CUDA_ALLOC_CONF for the other allocator options")],
        ),
        # Every bad variable is reported at once, the device's own first.
        (
            {}, {CUDA: "expandable_segments:1", "PYTORCH_ALLOC_CONF": "max_split_size_mb:64,Expandable_Segments:False"},
            ["PYTORCH_CUDA_ALLOC_CONF='expandable_segments:1': expandable_segments must be True or False",
             ("PYTORCH_ALLOC_CONF='max_split_size_mb:64,Expandable_Segments:False': must not set expandable_segments "
              "(vLLM's sleep-mode pool asserts on it); use EXPANDABLE_SEGMENTS, or PYTORCH_CUDA_ALLOC_CONF for the other "
              "allocator options")],
        ),
    ],
    ids=["not-a-bool", "second-colon", "twice", "contradicts-true", "generic-variable", "all-at-once"],
)
def test_bad_allocator_values_are_refused_with_exact_lines(
    setting: dict[str, object], environ: dict[str, str], problems: list[str]
) -> None:
    with pytest.raises(RecipeConfigError) as caught:
        decide_allocator(settings_of(**setting), "gpu", environ)
    assert caught.value.problems == problems


def test_other_options_in_the_generic_variable_are_accepted() -> None:
    # Only expandable_segments is refused there; the device's variable still decides.
    decision = decide_allocator(settings_of(), "gpu", {"PYTORCH_ALLOC_CONF": "max_split_size_mb:64"})
    assert decision.to_dict() == {"variable": CUDA, "value": None, "runtime_switch": True, "reason": ON_GPU}
