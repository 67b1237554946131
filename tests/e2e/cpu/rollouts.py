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

The samples reach the actor in the order they finished: verl 0.9.1's replay buffer lists a step's
trajectories as TransferQueue received them (verl/trainer/ppo/v1/replay_buffer.py _materialize_batch),
and that order changes from run to run. Every sum over the batch follows it (the micro-batches'
gradient accumulation, GRPO's group means, the metrics), so two runs of the same tokens differed in the
last bits. The batch is put back in submission order: the prompt's place in the step (the dataloader's
order), then the sample's session and index.
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


#: The log line of each step's batch order: where verl's replay buffer had each sample, in submission order.
ORDER_LINE = "training batch order: arrival {arrival} -> submission order"


def submission_place(key: str, prompt_order: dict[str, int]) -> tuple[int, int, int]:
    """(the prompt's place in the step's batch, its sample's session, the sample's index) for a trajectory key.

    verl 0.9.1 keys a trajectory `{uid}_{session_id}_{i}` (verl/trainer/ppo/v1/agent_loop_tq.py); the uid is a fresh
    uuid4 each run, so its place among the step's prompts (the dataloader's order) is what two runs share.
    """
    uid, session, index = key.rsplit("_", 2)
    return prompt_order.get(uid, len(prompt_order)), int(session), int(index)


@after_import("verl.trainer.ppo.v1.replay_buffer")
def _batches_in_submission_order(module: types.ModuleType) -> None:
    buffer = module.ReplayBuffer
    original = buffer._materialize_batch

    def _materialize_batch(self: Any, partition_id: str, selected: list[str], snapshot: dict[str, dict]) -> Any:
        # The trainer registers a step's prompts in dataloader order (trainer_base.py _submit_batch_to_rollout);
        # TransferQueue lists keys as they arrived, so this dict holds them in that order.
        prompt_order = {uid: place for place, uid in enumerate(self.prompt_global_steps[partition_id])}
        meta = original(self, partition_id, selected, snapshot)
        order = sorted(range(len(meta.keys)), key=lambda i: submission_place(meta.keys[i], prompt_order))
        log(ORDER_LINE.format(arrival=order))
        meta.reorder(order)
        return meta

    buffer._materialize_batch = _materialize_batch
    log("replay buffer: each training batch in submission order (prompt, session, index), not arrival order")
