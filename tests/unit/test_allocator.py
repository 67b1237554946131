"""Expandable segments: never in the allocator environment vLLM reads; user options kept; contradictions refused."""

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
