"""What the estimate reads from the plan: the device's memory and where that figure comes from, and the workload from
the final overrides (verl's defaults for keys they leave out)."""

from __future__ import annotations

import pytest

from recipe.memory_fit import device_memory
from recipe.memory_workload import EstimateSkipped, workload_from_overrides

MICRO = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"
CPU_OFFLOAD = "actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_cpu_offload"
FRACTION = "actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_offload_fraction"


def test_device_memory_is_the_setting_first_then_the_npu_chip_s_then_an_80_gib_gpu() -> None:
    assert device_memory(24.5, "gpu", "a3") == (24.5, "DEVICE_MEMORY_GIB")
    assert device_memory(24.5, "npu", "910b") == (24.5, "DEVICE_MEMORY_GIB")
    assert device_memory(None, "npu", "910b") == (64, "one 910b NPU, Atlas A2, 910B; DEVICE_MEMORY_GIB for another")
    assert device_memory(None, "npu", "a3") == (64, "one a3 NPU, Atlas A3, 910C; DEVICE_MEMORY_GIB for another")
    assert device_memory(None, "gpu", "a3") == (80, "an H100 or A100 80GB; DEVICE_MEMORY_GIB for another")


def test_verl_s_defaults_keep_everything_on_the_device() -> None:
    work = workload_from_overrides([MICRO])
    assert (work.prompt_tokens, work.response_tokens, work.micro_batch_tokens) == (512, 512, 2 * 1024)
    assert (work.gpu_memory_utilization, work.max_num_seqs) == (0.5, 256)
    assert (work.actor_param_offload, work.ref_param_offload, work.reference) == (False, False, False)
    assert (work.optimizer_host_fraction, work.optimizer_offload) == (0.0, False)


def test_each_offload_switch_is_read_from_its_own_key() -> None:
    work = workload_from_overrides([
        MICRO, "actor_rollout_ref.actor.megatron.param_offload=True", "actor_rollout_ref.ref.megatron.param_offload=true",
        "actor_rollout_ref.actor.use_kl_loss=TRUE", "actor_rollout_ref.actor.megatron.optimizer_offload=True",
    ])  # fmt: skip
    assert (work.actor_param_offload, work.ref_param_offload, work.reference, work.optimizer_offload) == (True,) * 4
    assert work.optimizer_host_fraction == 0.0
    only = workload_from_overrides([MICRO, "actor_rollout_ref.actor.megatron.optimizer_offload=True"])
    assert (only.optimizer_offload, only.actor_param_offload, only.ref_param_offload, only.reference) == (
        True, False, False, False)  # fmt: skip


@pytest.mark.parametrize(
    ("cpu_offload", "fraction", "host"),
    [("True", "0.25", 0.25), ("True", "1", 1.0), ("True", "1.5", 1.0), ("False", "0.25", 0.0), ("False", "1", 0.0)],
)
def test_the_optimizer_s_host_share_is_its_offload_fraction_capped_at_all_and_none_without_cpu_offload(
    cpu_offload: str, fraction: str, host: float
) -> None:
    work = workload_from_overrides([MICRO, f"+{CPU_OFFLOAD}={cpu_offload}", f"+{FRACTION}={fraction}"])
    assert work.optimizer_host_fraction == host


@pytest.mark.parametrize(
    ("value", "expected"), [("0", 0), ("0.0", 0), ("7", 7), ("'3'", 3), ('"12"', 12)]
)
def test_a_literal_number_is_read_as_verl_reads_it_zero_included(value: str, expected: int) -> None:
    assert workload_from_overrides([MICRO, f"data.max_prompt_length={value}"]).prompt_tokens == expected


@pytest.mark.parametrize("value", ["-1", "-0.5", "inf", "-inf", "nan", "1e309", "8.98e307", "2147483648", "abc", "",
                                   "${oc.env:X}"])
def test_a_value_that_is_not_a_number_from_0_to_2_31_skips_the_estimate_and_names_it(value: str) -> None:
    """Past 2**31 - 1 the estimate's integer arithmetic overflowed a float (1e308: an OverflowError traceback)."""
    with pytest.raises(EstimateSkipped) as caught:
        workload_from_overrides([MICRO, f"data.max_prompt_length={value}"])
    assert str(caught.value) == f"data.max_prompt_length={value!r} is not a literal number from 0 to 2147483647"


def test_the_largest_literal_is_read() -> None:
    assert workload_from_overrides([MICRO, "data.max_prompt_length=2147483647"]).prompt_tokens == 2**31 - 1


@pytest.mark.parametrize("value", ["yes", "1", "0", "on", ""])
def test_a_switch_that_is_not_true_or_false_skips_the_estimate_and_says_so(value: str) -> None:
    with pytest.raises(EstimateSkipped) as caught:
        workload_from_overrides([MICRO, f"actor_rollout_ref.actor.use_kl_loss={value}"])
    assert str(caught.value) == f"actor_rollout_ref.actor.use_kl_loss={value!r} is not a literal true/false"
