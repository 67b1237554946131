"""The allocator's expandable segments on gpu and npu, decided so that vLLM survives.

Facts behind the policy (see DESIGN.md):
- vLLM's sleep-mode pool (CuMemAllocator) and vllm-ascend's (CaMemAllocator) assert
  at start when PYTORCH_CUDA_ALLOC_CONF / PYTORCH_NPU_ALLOC_CONF contains
  `expandable_segments:True` (pytorch/pytorch#147851). verl's colocated rollout
  uses sleep mode, so that value must never reach the trainer or its Ray workers.
- verl 0.9.1 itself switches expandable segments on for training phases and off
  around weight sync, at run time, through the torch allocator API. So the
  benefit is kept by leaving the switch to verl (see recipe.worker_setup).
- Any other allocator option the user set (max_split_size_mb, ...) is kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from recipe.device import Device
from recipe.errors import RecipeConfigError
from recipe.settings import Settings

#: The allocator variable each target's torch reads.
ALLOC_CONF_VARIABLE: dict[Device, str] = {"gpu": "PYTORCH_CUDA_ALLOC_CONF", "npu": "PYTORCH_NPU_ALLOC_CONF"}

#: Device-generic variable that newer torch reads before PYTORCH_CUDA_ALLOC_CONF.
GENERIC_ALLOC_CONF_VARIABLE = "PYTORCH_ALLOC_CONF"

#: Every allocator variable a torch of some target reads: none of them may carry
#: expandable_segments into the trainer or its workers other than as this module decides.
ALLOC_CONF_VARIABLES = (
    GENERIC_ALLOC_CONF_VARIABLE, "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_NPU_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF"
)

#: Environment variable that tells recipe.worker_setup in each Ray worker what was decided.
RUNTIME_SWITCH_VARIABLE = "RECIPE_EXPANDABLE_SEGMENTS"

_OPTION = "expandable_segments"


@dataclass(frozen=True)
class AllocatorDecision:
    """What the trainer and its workers get, and why."""

    variable: str
    #: Value handed to the trainer and every Ray worker; None means the variable is unset there.
    value: str | None
    #: Whether verl may switch expandable segments on at run time (training phases).
    runtime_switch: bool
    reason: str

    def environment(self) -> dict[str, str | None]:
        """Variables to set (None: remove) for the trainer process and every Ray worker."""
        return {self.variable: self.value, RUNTIME_SWITCH_VARIABLE: "1" if self.runtime_switch else "0"}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form for `plan --json`."""
        return {
            "variable": self.variable,
            "value": self.value,
            "runtime_switch": self.runtime_switch,
            "reason": self.reason,
        }


def _split_options(value: str) -> list[tuple[str, str]]:
    """`a:1,b:2` -> [("a", "1"), ("b", "2")], keeping order; whitespace around parts dropped."""
    options = []
    for part in value.split(","):
        if part.strip():
            key, _, val = part.partition(":")
            options.append((key.strip(), val.strip()))
    return options


def _is_expandable(key: str) -> bool:
    """Whether an option key means expandable_segments, however it is spelt (case, spaces)."""
    return "".join(key.split()).lower() == _OPTION


def _expandable_choice(variable: str, value: str) -> tuple[bool | None, list[str]]:
    """The expandable_segments choice in an allocator value (None: not given) and the problems with it."""
    choices = {v.strip().lower() for k, v in _split_options(value) if _is_expandable(k)}
    unknown = choices - {"true", "false"}
    if unknown:
        return None, [f"{variable}={value!r}: expandable_segments must be True or False"]
    if len(choices) > 1:
        return None, [f"{variable}={value!r}: expandable_segments is given twice with different values"]
    return (choices.pop() == "true") if choices else None, []


def decide_allocator(settings: Settings, device: Device, environ: Mapping[str, str]) -> AllocatorDecision:
    """Decide the allocator environment from EXPANDABLE_SEGMENTS and the user's own allocator variable.

    Raises RecipeConfigError when the two contradict each other.
    """
    variable = ALLOC_CONF_VARIABLE[device]
    user_value = environ.get(variable, "")
    options = _split_options(user_value)
    others = [(k, v) for k, v in options if not _is_expandable(k)]
    user_choice, problems = _expandable_choice(variable, user_value)
    setting_given = "EXPANDABLE_SEGMENTS" in settings.user_set()
    generic = environ.get(GENERIC_ALLOC_CONF_VARIABLE, "")
    if any(_is_expandable(k) for k, _ in _split_options(generic)):
        # The trainer and its workers inherit it, and newer torch prefers it to the device's variable.
        problems.append(
            f"{GENERIC_ALLOC_CONF_VARIABLE}={generic!r}: must not set expandable_segments (vLLM's sleep-mode pool "
            f"asserts on it); use EXPANDABLE_SEGMENTS, or {variable} for the other allocator options"
        )
    if problems:
        raise RecipeConfigError(problems)

    if user_choice is not None and setting_given and user_choice != settings.expandable_segments:
        raise RecipeConfigError(
            [
                f"{variable}={user_value!r}: contradicts EXPANDABLE_SEGMENTS="
                f"{str(settings.expandable_segments).lower()}; set only one of them"
            ]
        )
    enabled = settings.expandable_segments if setting_given or user_choice is None else user_choice
    kept = ",".join(f"{k}:{v}" for k, v in others)

    if enabled:
        why = (
            f"expandable segments on for training, switched at run time by verl; kept out of {variable} "
            "because vLLM's sleep-mode memory pool asserts on expandable_segments:True (pytorch#147851)"
        )
        if user_choice:
            why += f"; moved from {variable} to the run-time switch"
        return AllocatorDecision(variable, kept or None, True, why + (f"; kept the user's {kept}" if kept else ""))

    value = ",".join(filter(None, [kept, f"{_OPTION}:False"]))
    source = f"{variable}" if user_choice is False and not setting_given else "EXPANDABLE_SEGMENTS=false"
    return AllocatorDecision(
        variable, value, False, f"expandable segments off everywhere ({source}); verl's run-time switch is disabled"
    )
