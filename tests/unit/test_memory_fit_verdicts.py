"""When the estimate refuses a layout (exit 2) or warns, at the exact edges, and the words of each line."""

from __future__ import annotations

import pytest

from recipe.layout import ParallelLayout
from recipe.memory_fit import GIB, WARN_MARGIN, MemoryEstimate, Phase, Term

LAYOUT = ParallelLayout(tp=2, pp=1, cp=1, ep=8, etp=1, gen_tp=8, nnodes=1, ndevices_per_node=8)
WHERE = "TP=2, PP=1, CP=1, EP=8, ETP=1, GEN_TP=8 on 10 GiB per device (a test)"


def _estimate(*terms: Term, capacity: float = 10 * GIB, kv_sequences: float = 100.0) -> MemoryEstimate:
    phase = Phase("actor phase (training)", list(terms), capacity)
    host = Phase("host RAM per node (8 devices)", [Term("optimizer state (fp32)", 10_000 * GIB, True, "more")], None)
    return MemoryEstimate([phase, host], 10, "a test", kv_sequences, LAYOUT)


def test_fixed_terms_over_the_device_name_the_two_largest_with_what_shrinks_each() -> None:
    found = _estimate(
        Term("small", 2 * GIB, True, "S"), Term("largest", 6 * GIB, True, "L"), Term("batch", 50 * GIB, False, "B"),
        Term("middle", 3.25 * GIB, True, "M"),
    )  # fmt: skip
    (line,) = found.problems()
    assert line == (
        f"{WHERE}: the actor phase (training) needs 11.2 GiB per device before any batch, more than the device has; "
        "its largest terms are largest (6.0 GiB): L; then middle (3.2 GiB): M"
    )


def test_fixed_terms_that_fill_the_device_exactly_are_not_refused_but_warned() -> None:
    """Only more than the device refuses; the batch terms on top are a warning that says it is over."""
    found = _estimate(Term("weights", 10 * GIB, True, "W"), Term("batch", 1 * GIB, False, "B"))
    assert found.problems() == []
    (warning,) = found.warnings()
    assert warning == (
        "memory: the actor phase (training) is estimated at 11.0 of 10.0 GiB per device, over it, by terms that grow "
        "with the batch; the largest, batch (1.0 GiB), shrinks with B (not counted: fragmentation, runtime buffers; "
        "docs/memory.md)"
    )


def test_the_warning_names_what_shrinks_the_largest_batch_term() -> None:
    """Issue 54: a memory warning names the setting that fixes it; the largest term that grows with the batch, not
    the first, and never a fixed one."""
    found = _estimate(Term("weights", 9 * GIB, True, "W"), Term("small", GIB / 4, False, "S"),
                      Term("large", GIB, False, "L"))  # fmt: skip
    (warning,) = found.warnings()
    assert "the largest, large (1.0 GiB), shrinks with L" in warning and "W" not in warning.split("(not")[0]


def test_an_estimate_that_is_exactly_the_device_is_within_the_margin_not_over_it() -> None:
    found = _estimate(Term("weights", 9 * GIB, True, "W"), Term("batch", 1 * GIB, False, "B"))
    (warning,) = found.warnings()
    assert "estimated at 10.0 of 10.0 GiB per device, within 10% of it," in warning


def test_an_estimate_the_margin_below_the_device_is_no_warning() -> None:
    """The device is exactly total / (1 - WARN_MARGIN): the estimate leaves the margin free, so it is quiet."""
    total = 9 * GIB
    found = _estimate(Term("weights", 8 * GIB, True, "W"), Term("batch", 1 * GIB, False, "B"),
                      capacity=total / (1 - WARN_MARGIN))  # fmt: skip
    assert found.warnings() == []
    assert _estimate(Term("weights", 8 * GIB, True, "W"), Term("batch", 1 * GIB, False, "B"),
                     capacity=total / (1 - WARN_MARGIN) - 1).warnings() != []  # fmt: skip


@pytest.mark.parametrize("sequences", [1.0, 1.5, 40.0])
def test_vllm_with_room_for_one_full_length_sequence_or_more_is_not_refused(sequences: float) -> None:
    assert _estimate(Term("weights", 1 * GIB, True, "W"), kv_sequences=sequences).problems() == []


def test_vllm_without_room_for_one_sequence_says_how_much_it_has_and_what_to_raise() -> None:
    found = _estimate(Term("weights", 1 * GIB, True, "W"), kv_sequences=0.456)
    (line,) = found.problems()
    assert line == (
        f"{WHERE}: vLLM's KV cache holds 0.46 of one full-length sequence (prompt + response) after its weights, and "
        "vLLM refuses to start: raise actor_rollout_ref.rollout.gpu_memory_utilization or GEN_TP, or shorten "
        "data.max_response_length"
    )


def test_a_phase_over_the_device_is_the_one_line_even_when_vllm_has_no_room_either() -> None:
    found = _estimate(Term("weights", 11 * GIB, True, "W"), kv_sequences=0.5)
    (line,) = found.problems()
    assert "needs 11.0 GiB per device" in line and "KV cache" not in line
