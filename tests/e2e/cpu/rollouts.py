"""Reproducible rollouts: each training sample gets its own vLLM seed, derived from where it is in the run.

vLLM samples a request without a seed from its engine's one generator, so a sample's tokens
depend on which requests ran before it and beside it: a resumed run's step 2 would draw other
responses than the same step of an uninterrupted run, and the two could not be compared.
verl 0.9.1's agent loop knows each sample's step and dataset row
(verl/experimental/agent_loop/agent_loop.py:1151 get_trajectory_info) and, on the v1 trainer's
path, its place among the `rollout.n` samples of its prompt (`session_id`,
verl/trainer/ppo/v1/agent_loop_tq.py:121-127); the seed is made from those, so it is the same in
any run that reaches that step with the same data order, and differs between the samples of one
prompt (one seed for all of them would make them identical: every GRPO advantage 0). The
batch order (the dataset rows of each step) is logged for the resume tests.
"""

from __future__ import annotations

import types
import zlib
from typing import Any

from tests.e2e.cpu.hooks import after_import, log

#: The log line of each step's batch: `[tests.e2e.cpu] rollout batch step=N rows=[...]`.
BATCH_LINE = "rollout batch step={step} rows={rows}"


def sample_seed(step: int, row: Any, place: int) -> int:
    """A stable 31-bit seed for one sample (step, dataset row, place among its prompt's samples)."""
    return zlib.crc32(f"{step}/{row}/{place}".encode()) & 0x7FFFFFFF


@after_import("verl.experimental.agent_loop.agent_loop")
def _seeded_samples(module: types.ModuleType) -> None:
    original_info = module.get_trajectory_info

    async def get_trajectory_info(step: int, index: list[Any], validate: bool) -> list[dict[str, Any]]:
        if not validate:
            log(BATCH_LINE.format(step=step, rows=[int(row) for row in index]))
        return await original_info(step, index, validate)  # type: ignore[no-any-return]

    worker = module.AgentLoopWorker
    original_run = worker._run_agent_loop

    async def _run_agent_loop(self: Any, sampling_params: dict[str, Any], trajectory: dict[str, Any], **kwargs: Any) -> Any:
        if not trajectory["validate"]:
            # v1 (TransferQueue) path: the n samples of a prompt share a trajectory and differ by session_id;
            # the older path repeats the prompt in the batch and counts its copies in rollout_n.
            place = kwargs.get("session_id", trajectory["rollout_n"])
            seed = sample_seed(trajectory["step"], trajectory["sample_index"], int(place))
            sampling_params = {**sampling_params, "seed": seed}
        return await original_run(self, sampling_params, trajectory, **kwargs)

    module.get_trajectory_info = get_trajectory_info
    worker._run_agent_loop = _run_agent_loop
    log("agent loop: one vLLM seed per training sample (step, row, place in group)")
