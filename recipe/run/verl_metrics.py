"""The names of verl 0.9.1's step metrics that `run` reads back: the step's timers, its token count, memory peaks.

verl's trainer times each part of a step with `marked_timer` (verl/trainer/ppo/ray_trainer.py, `fit`)
and logs every timer as `timing_s/<name>`; `compute_throughout_metrics` (verl/trainer/ppo/
metric_utils.py) logs the step's tokens (prompt and response, every sample) and those tokens per
second per device; the Megatron worker logs the device's peak allocation after each actor update
(verl/workers/engine_workers.py). The names are verl's and change with it; a metric a version no
longer logs is reported as missing, never guessed.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

#: The reward the progress line shows.
REWARD = "critic/rewards/mean"
#: The whole step, from the rollout's start to the weights' sync (validation is outside it).
STEP_SECONDS = "timing_s/step"
#: The timers inside a step, in the order a step runs them: the label the recipe shows -> verl's metric.
PHASES: Mapping[str, str] = MappingProxyType(
    {
        "generation": "timing_s/gen",
        "reward": "timing_s/reward",
        "log-probs (old)": "timing_s/old_log_prob",
        "log-probs (ref)": "timing_s/ref",
        "advantages": "timing_s/adv",
        "actor update": "timing_s/update_actor",
        "save": "timing_s/save_checkpoint",
        "weight sync": "timing_s/update_weights",
    }
)
#: The progress line's short names for the same timers.
PHASE_SHORT: Mapping[str, str] = MappingProxyType(
    {"generation": "gen", "reward": "reward", "log-probs (old)": "old", "log-probs (ref)": "ref",
     "advantages": "adv", "actor update": "update", "save": "save", "weight sync": "sync"}  # fmt: skip
)
#: Validation, when a step runs it: timed outside `timing_s/step`.
VALIDATION_SECONDS = "timing_s/testing"
#: Prompt and response tokens of every sample of the step (the attention mask's sum).
TOKENS = "perf/total_num_tokens"
#: verl's own tokens per second per device: TOKENS / (step seconds x the trainer's devices).
THROUGHPUT = "perf/throughput"
#: The actor worker's device peak (torch's max_memory_allocated, since the process started) and the node's used RAM.
ACTOR_PEAK_GIB = "actor/perf/max_memory_allocated_gb"
ACTOR_RESERVED_GIB = "actor/perf/max_memory_reserved_gb"
HOST_USED_GIB = "actor/perf/cpu_memory_used_gb"

#: The share of response tokens whose importance ratio the rollout correction capped (verl/trainer/ppo/
#: rollout_corr_helper.py: the tokens above rollout_is_threshold, which truncated importance sampling truncates).
CAPPED_TOKENS = "rollout_corr/rollout_is_ratio_fraction_high"

#: Every metric `run` reads back from the event files.
READ_BACK = frozenset(
    {REWARD, STEP_SECONDS, VALIDATION_SECONDS, TOKENS, THROUGHPUT, ACTOR_PEAK_GIB, ACTOR_RESERVED_GIB, HOST_USED_GIB,
     CAPPED_TOKENS, *PHASES.values()}  # fmt: skip
)
