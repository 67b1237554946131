"""What the plan's overrides decide about memory: the Workload the estimate (recipe.memory_fit) sizes.

Each key is read from the plan's final overrides as verl reads a literal value, verl 0.9.1's default
where they leave it out. A value that is no literal number (an interpolation) skips the estimate
(EstimateSkipped, said by `plan`); a sequence length no sequence can have is refused
(length_problems), since the estimate would divide by it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from recipe.launch import override_value

_ACTOR, _ROLLOUT = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
OPTIMIZER_CONFIG = f"{_ACTOR}.optim.override_optimizer_config"


@dataclass(frozen=True)
class Workload:
    """What the run's verl config decides about memory (read from the plan's final overrides)."""

    prompt_tokens: int
    response_tokens: int
    #: Tokens of one actor micro-batch on one device (ppo_max_token_len_per_gpu with dynamic batching).
    micro_batch_tokens: int
    gpu_memory_utilization: float
    max_num_seqs: int
    actor_param_offload: bool
    ref_param_offload: bool
    #: The reference model exists (use_kl_loss).
    reference: bool
    #: Share of the optimizer's state that always lives on the host (optimizer_cpu_offload x optimizer_offload_fraction).
    optimizer_host_fraction: float
    #: verl moves the device's share of the optimizer state to the host while vLLM is awake (megatron.optimizer_offload).
    optimizer_offload: bool


#: Every key the estimate reads, with verl 0.9.1's default for it (the plan's overrides set most of them;
#: tests/unit/test_memory_fit.py checks these against verl's own composed config).
WORKLOAD_DEFAULTS: dict[str, Any] = {
    "data.max_prompt_length": 512,
    "data.max_response_length": 512,
    f"{_ACTOR}.use_dynamic_bsz": False,
    f"{_ACTOR}.ppo_max_token_len_per_gpu": 16384,
    f"{_ACTOR}.ppo_micro_batch_size_per_gpu": None,
    f"{_ACTOR}.use_kl_loss": False,
    f"{_ACTOR}.megatron.param_offload": False,
    f"{_ACTOR}.megatron.optimizer_offload": False,
    "actor_rollout_ref.ref.megatron.param_offload": False,
    f"{OPTIMIZER_CONFIG}.optimizer_cpu_offload": False,
    f"{OPTIMIZER_CONFIG}.optimizer_offload_fraction": 0.0,
    f"{_ROLLOUT}.gpu_memory_utilization": 0.5,
    f"{_ROLLOUT}.max_num_seqs": 256,
}


#: The largest number the estimate reads: past it (1e308 say) its integer arithmetic overflows a float.
MAX_LITERAL = 2**31 - 1


class EstimateSkipped(ValueError):
    """A value the estimate needs is not a literal number in the plan (an interpolation, say)."""


def _number(text: str) -> float | None:
    """TEXT as a number the way verl would read a literal one (float syntax), or None when it is none."""
    try:
        return float(text)
    except ValueError:
        return None


def _literal(key: str, text: str | None) -> Any:
    """The value of an override as verl would read a literal one; EstimateSkipped when it is not one."""
    default = WORKLOAD_DEFAULTS[key]
    if text is None:
        if default is None:
            raise EstimateSkipped(f"{key} is not set")
        return default
    if isinstance(default, bool):
        if text.lower() in ("true", "false"):
            return text.lower() == "true"
    else:
        number = _number(text)
        if number is not None and 0 <= number <= MAX_LITERAL:
            return number
    wanted = "true/false" if isinstance(default, bool) else f"number from 0 to {MAX_LITERAL}"
    raise EstimateSkipped(f"{key}={text!r} is not a literal {wanted}")


#: verl's per-sequence lengths, in tokens.
LENGTH_KEYS = ("data.max_prompt_length", "data.max_response_length")


def length_problems(overrides: Sequence[str]) -> list[str]:
    """Each literal sequence length in OVERRIDES that no sequence can have (a fraction, or out of range), named.

    A value that is not a literal number (an interpolation) is left to the estimate, which says it skipped.
    """
    problems = []
    for key in LENGTH_KEYS:
        text = override_value(overrides, key)
        number = _number(text) if text is not None else None
        if number is not None and not (1 <= number <= MAX_LITERAL and number.is_integer()):
            problems.append(f"{key}={text}: a sequence length is a whole number of tokens, from 1 to {MAX_LITERAL}")
    return problems


def workload_from_overrides(overrides: Sequence[str]) -> Workload:
    """The Workload of a plan, from its final overrides (verl's defaults for keys they leave out)."""
    value = {key: _literal(key, override_value(overrides, key)) for key in WORKLOAD_DEFAULTS}
    prompt, response = int(value["data.max_prompt_length"]), int(value["data.max_response_length"])
    if value[f"{_ACTOR}.use_dynamic_bsz"]:
        micro = int(value[f"{_ACTOR}.ppo_max_token_len_per_gpu"])
    else:
        micro = int(value[f"{_ACTOR}.ppo_micro_batch_size_per_gpu"]) * (prompt + response)
    cpu_optimizer = value[f"{OPTIMIZER_CONFIG}.optimizer_cpu_offload"]
    return Workload(
        prompt_tokens=prompt,
        response_tokens=response,
        micro_batch_tokens=micro,
        gpu_memory_utilization=float(value[f"{_ROLLOUT}.gpu_memory_utilization"]),
        max_num_seqs=int(value[f"{_ROLLOUT}.max_num_seqs"]),
        actor_param_offload=value[f"{_ACTOR}.megatron.param_offload"],
        ref_param_offload=value["actor_rollout_ref.ref.megatron.param_offload"],
        reference=value[f"{_ACTOR}.use_kl_loss"],
        optimizer_host_fraction=min(float(value[f"{OPTIMIZER_CONFIG}.optimizer_offload_fraction"]), 1.0) if cpu_optimizer else 0.0,
        optimizer_offload=value[f"{_ACTOR}.megatron.optimizer_offload"],
    )
