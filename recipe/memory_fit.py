"""Will the run fit? Device memory per phase and host RAM per node, estimated term by term before anything starts.

A colocated GRPO step has two peaks on each device:
- the actor phase (Megatron trains): the actor's weights and gradients, the optimizer's share kept on the
  device, the reference model's weights unless offloaded, and the activations of one micro-batch under the
  recipe's full recompute (checkpointed layer inputs, one layer recomputed, the MoE dispatch, fp32 logits);
- the rollout phase (vLLM awake): what the trainer keeps resident, plus vLLM's own pool, which it takes as
  `gpu_memory_utilization` x the device's memory at wake-up (weights / GEN_TP, the sampler's logits, and the
  KV cache with Gated DeltaNet's recurrent state per sequence in what is left).
Host RAM holds every offloaded byte: the optimizer's fp32 master weights and Adam moments (the recipe keeps
them on the host: optimizer_cpu_offload), offloaded weights and gradients, and, on npu, vLLM's weights while
it sleeps (verl sleeps vLLM at level 1 there, level 2 on gpu: vllm_async_server.py _resolve_sleep_level).

The weight, gradient and optimizer terms place parameters as Megatron does (megatron/training/
theoretical_memory_usage.py: the first pipeline stage is the most loaded; norms and routers whole on every
rank; experts over EP x ETP; bf16 weights, fp32 gradients, 12 B of optimizer state per parameter split over
the data-parallel ranks), and equal its figures where it applies (tests/unit/test_memory_fit.py). What this
does not count, and the sources, are in docs/memory.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from recipe.chip import CHIPS, Chip
from recipe.device import Device
from recipe.layout import ParallelLayout
from recipe.memory_workload import OPTIMIZER_CONFIG, Workload
from recipe.model_sizes import BF16_BYTES, FP32_BYTES, ModelSizes

GIB = 1 << 30
#: Memory of one gpu when DEVICE_MEMORY_GIB is unset: the 80 GiB of an H100 or A100 80GB, upstream's machines.
DEFAULT_GPU_MEMORY_GIB = 80
#: bf16 weights, fp32 main gradients (Megatron's DDP buffers), fp32 master weights + two Adam moments.
WEIGHT_BYTES, GRAD_BYTES, OPTIMIZER_BYTES = BF16_BYTES, FP32_BYTES, 3 * FP32_BYTES
#: Korthikanti et al. 2022 (arXiv 2205.05198), Table 2: a transformer layer's activations with sequence
#: parallelism and without the attention-score term (flash attention) are 34 x tokens x hidden bytes / TP.
LAYER_ACTIVATION_FACTOR = 34
#: The estimate's assumption for image tokens: this share of each prompt's budget (data.max_prompt_length). A geo3k
#: prompt is one figure of a few hundred image tokens and a short question, within the recipe's 1024; prepare-data
#: prints the measured lengths (docs/memory.md).
IMAGE_SHARE_OF_PROMPT = 0.5
#: The estimate within this share of the device is a warning: the allocator's fragmentation, the runtime's
#: context and communicator buffers and the CUDA graphs are not counted (docs/memory.md).
WARN_MARGIN = 0.10
#: vllm-ascend pads the Gated DeltaNet state's pages to twice their size (vllm-ascend#7393).
NPU_STATE_PADDING = 2


def device_memory(setting: float | None, device: Device, chip: Chip) -> tuple[float, str]:
    """The memory of one device the estimate assumes, GiB, and where that figure comes from (DEVICE_MEMORY_GIB first)."""
    if setting is not None:
        return setting, "DEVICE_MEMORY_GIB"
    if device == "npu":
        return CHIPS[chip].memory_gib, f"one {chip} NPU, {CHIPS[chip].product}; DEVICE_MEMORY_GIB for another"
    return DEFAULT_GPU_MEMORY_GIB, "an H100 or A100 80GB; DEVICE_MEMORY_GIB for another"


@dataclass(frozen=True)
class Term:
    """One line of the estimate."""

    name: str
    bytes: float
    #: False when it grows with the batch (micro-batch tokens, sequences): only fixed terms can refuse a layout.
    fixed: bool
    #: The settings or keys that shrink it.
    shrink: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form for `plan --json`."""
        return {"name": self.name, "gib": round(self.bytes / GIB, 2), "fixed": self.fixed, "shrink": self.shrink}


@dataclass(frozen=True)
class Phase:
    """The terms that are on one device, or in one node's RAM, at the same time."""

    name: str
    terms: list[Term]
    #: What it must fit in, in bytes (None: unknown, e.g. host RAM at plan time).
    capacity: float | None

    @property
    def total(self) -> float:
        return sum(term.bytes for term in self.terms)

    @property
    def fixed_total(self) -> float:
        return sum(term.bytes for term in self.terms if term.fixed)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form for `plan --json`."""
        return {
            "name": self.name,
            "total_gib": round(self.total / GIB, 2),
            "capacity_gib": None if self.capacity is None else round(self.capacity / GIB, 2),
            "terms": [term.to_dict() for term in self.terms],
        }


@dataclass(frozen=True)
class MemoryEstimate:
    """Both device phases and the host, with the device memory assumed and where that figure came from."""

    phases: list[Phase]
    device_gib: float
    device_source: str
    #: Full-length sequences (prompt + response) vLLM's KV cache holds on one rollout replica.
    kv_sequences: float
    layout: ParallelLayout
    notes: list[str] = field(default_factory=list)

    def _where(self) -> str:
        lay = self.layout
        return (
            f"TP={lay.tp}, PP={lay.pp}, CP={lay.cp}, EP={lay.ep}, ETP={lay.etp}, GEN_TP={lay.gen_tp} on "
            f"{self.device_gib:g} GiB per device ({self.device_source})"
        )

    def problems(self) -> list[str]:
        """One line per phase whose fixed terms alone exceed the device (exit 2), and vLLM without room for one sequence."""
        lines = []
        for phase in self.phases:
            if phase.capacity is not None and phase.fixed_total > phase.capacity:
                largest = sorted((t for t in phase.terms if t.fixed), key=lambda t: -t.bytes)[:2]
                named = "; then ".join(f"{t.name} ({t.bytes / GIB:.1f} GiB): {t.shrink}" for t in largest)
                lines.append(
                    f"{self._where()}: the {phase.name} needs {phase.fixed_total / GIB:.1f} GiB per device before any "
                    f"batch, more than the device has; its largest terms are {named}"
                )
        if self.kv_sequences < 1 and not lines:
            lines.append(
                f"{self._where()}: vLLM's KV cache holds {self.kv_sequences:.2f} of one full-length sequence (prompt + "
                "response) after its weights, and vLLM refuses to start: raise "
                "actor_rollout_ref.rollout.gpu_memory_utilization or GEN_TP, or shorten data.max_response_length"
            )
        return lines

    def warnings(self) -> list[str]:
        """A phase whose whole estimate is within WARN_MARGIN of the device, or over it."""
        lines = []
        for phase in self.phases:
            if phase.capacity is not None and phase.fixed_total <= phase.capacity < phase.total / (1 - WARN_MARGIN):
                where = "over it" if phase.total > phase.capacity else f"within {WARN_MARGIN:.0%} of it"
                # The setting that fixes it: what shrinks the largest of the terms that grow with the batch.
                largest = max((term for term in phase.terms if not term.fixed), key=lambda term: term.bytes, default=None)
                fix = (f"; the largest, {largest.name} ({largest.bytes / GIB:.1f} GiB), shrinks with {largest.shrink}"
                       if largest is not None else "")  # fmt: skip
                lines.append(
                    f"memory: the {phase.name} is estimated at {phase.total / GIB:.1f} of {phase.capacity / GIB:.1f} GiB "
                    f"per device, {where}, by terms that grow with the batch{fix} (not counted: fragmentation, runtime "
                    "buffers; docs/memory.md)"
                )
        return lines

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form for `plan --json`."""
        return {
            "device_gib": self.device_gib,
            "device_source": self.device_source,
            "phases": [phase.to_dict() for phase in self.phases],
            "kv_sequences": round(self.kv_sequences, 2),
            "notes": list(self.notes),
            "problems": self.problems(),
            "warnings": self.warnings(),
        }

    def to_text(self) -> list[str]:
        """`plan`'s memory table, one line per term."""
        lines = [f"{self.device_gib:g} GiB per device: {self.device_source}"]
        for phase in self.phases:
            capacity = "" if phase.capacity is None else f" of {phase.capacity / GIB:.1f}"
            lines.append(f"{phase.name:<45} {phase.total / GIB:8.1f}{capacity} GiB")
            lines += [f"  {term.name:<43} {term.bytes / GIB:8.1f}" for term in phase.terms]
        lines.append(f"vLLM's KV cache holds {self.kv_sequences:.0f} full-length sequences per replica")
        return lines + self.notes


@dataclass(frozen=True)
class Shard:
    """Parameters on the most loaded device of the actor (and of the reference, which has its layout)."""

    dense: float
    experts: float
    #: Data-parallel sizes that split the optimizer's state of each part.
    dense_dp: int
    expert_dp: int

    @property
    def total(self) -> float:
        return self.dense + self.experts


def vllm_cache_bytes(sizes: ModelSizes, gen_tp: int, device: Device) -> tuple[float, float]:
    """(attention KV bytes per token, Gated DeltaNet state bytes per sequence) on one vLLM rank.

    KV heads are split over GEN_TP, but a rank holds at least one (vLLM replicates them past that); the
    DeltaNet value heads are split over GEN_TP, and vllm-ascend pads the state's pages to twice their size.
    """
    per_head = sizes.kv_bytes_per_token / max(sizes.num_kv_heads, 1)
    per_token = per_head * max(1, sizes.num_kv_heads // gen_tp)
    return per_token, sizes.state_bytes_per_sequence / gen_tp * (NPU_STATE_PADDING if device == "npu" else 1)


def actor_shard(sizes: ModelSizes, layout: ParallelLayout) -> Shard:
    """Megatron's most loaded shard: the first pipeline stage (the embedding, and the vision tower with it)."""
    tp, pp = layout.tp, layout.pp
    dense = (sizes.tp_sharded / pp + sizes.embedding + sizes.vision) / tp + sizes.replicated / pp
    if not sizes.tied_embeddings and pp == 1:
        dense += sizes.embedding / tp  # the output layer is on the same (only) stage
    experts = sizes.experts / (pp * layout.ep * layout.etp)
    return Shard(dense, experts, layout.dp, layout.world_size // (layout.ep * layout.etp * pp))


def model_state_bytes(shard: Shard, optimizer_on_device: float = 1.0) -> dict[str, float]:
    """Weights, gradients and the device's part of the distributed optimizer's state, for one shard."""
    optimizer = OPTIMIZER_BYTES * (shard.dense / shard.dense_dp + shard.experts / shard.expert_dp)
    return {
        "weights": WEIGHT_BYTES * shard.total,
        "gradients": GRAD_BYTES * shard.total,
        "optimizer": optimizer * optimizer_on_device,
    }


def estimate(
    sizes: ModelSizes,
    layout: ParallelLayout,
    work: Workload,
    device: Device,
    device_gib: float,
    device_source: str,
) -> MemoryEstimate:
    """The estimate of one planned run (see the module's docstring for the terms)."""
    capacity = device_gib * GIB
    shard = actor_shard(sizes, layout)
    state = model_state_bytes(shard, 1 - work.optimizer_host_fraction)
    reference = WEIGHT_BYTES * shard.total if work.reference else 0.0
    split = "TP, PP, EP or ETP (split over more devices), or more devices"
    offload = "OFFLOAD=1 (verl moves it to the host while the other phase runs)"
    host_optimizer = f"{OPTIMIZER_CONFIG}.optimizer_cpu_offload=True with optimizer_offload_fraction=1 (the recipe's)"

    # Activations of one micro-batch on the first stage (it holds PP micro-batches in flight).
    tokens = work.micro_batch_tokens / layout.cp
    hidden = sizes.hidden_size
    shorter = "actor_rollout_ref.actor.ppo_max_token_len_per_gpu, CP"
    checkpoints = tokens * hidden * BF16_BYTES * sizes.num_layers / layout.tp
    layer = LAYER_ACTIVATION_FACTOR * tokens * hidden / layout.tp
    dispatch = tokens * sizes.experts_per_token * (2 * hidden + 3 * sizes.moe_ffn_hidden_size) * BF16_BYTES / layout.etp
    logits = tokens * sizes.vocab_size / layout.tp * FP32_BYTES
    # The vision tower's activations (first stage): IMAGE_SHARE_OF_PROMPT of the micro-batch's prompt tokens are
    # image tokens, every vision block keeps its activations (none recomputed).
    image_tokens = tokens * IMAGE_SHARE_OF_PROMPT * work.prompt_tokens / (work.prompt_tokens + work.response_tokens)
    vision = image_tokens * sizes.vision_activation_bytes_per_image_token / layout.tp
    actor = Phase(
        "actor phase (training)",
        [
            Term("actor weights (bf16)", state["weights"], True, split),
            Term("actor gradients (fp32)", state["gradients"], True, split),
            *([Term("optimizer state on the device (fp32)", state["optimizer"], True, host_optimizer)]
              if state["optimizer"] else []),
            *([Term("reference weights (bf16)", reference, True, offload)] if reference and not work.ref_param_offload else []),
            Term("checkpointed layer inputs", checkpoints, False, f"{shorter}, TP"),
            Term("one layer recomputed", layer, False, f"{shorter}, TP"),
            Term("MoE dispatch buffers", dispatch, False, f"{shorter}, ETP"),
            Term("fp32 logits", logits, False, f"{shorter}, TP"),
            *([Term("vision tower activations", vision, False, f"{shorter}, data.max_prompt_length, TP")]
              if vision else []),
        ],
        capacity,
    )  # fmt: skip

    # vLLM: weights over GEN_TP (experts too: verl's rollout shards them with TP), a KV head at least per rank.
    vllm_pool = work.gpu_memory_utilization * capacity
    vllm_weights = WEIGHT_BYTES * sizes.total / layout.gen_tp
    sampler = work.max_num_seqs * sizes.vocab_size * FP32_BYTES
    kv_per_token, deltanet_state = vllm_cache_bytes(sizes, layout.gen_tp, device)
    per_sequence = (work.prompt_tokens + work.response_tokens) * kv_per_token + deltanet_state
    kv_space = vllm_pool - vllm_weights - sampler
    resident = 0.0 if work.actor_param_offload else state["weights"] + state["gradients"]
    rollout = Phase(
        "rollout phase (vLLM awake)",
        [
            *([Term("actor weights and gradients kept", resident, True, offload)] if resident else []),
            *([Term("reference weights kept", reference, True, offload)] if reference and not work.ref_param_offload else []),
            *([Term("optimizer state kept (fp32)", state["optimizer"], True, host_optimizer)]
              if state["optimizer"] and not work.optimizer_offload else []),
            Term(f"vLLM pool ({work.gpu_memory_utilization:g} x device)", vllm_pool, True,
                 "actor_rollout_ref.rollout.gpu_memory_utilization (lower leaves less KV cache)"),
        ],
        capacity,
    )  # fmt: skip

    optimizer_host = model_state_bytes(shard)["optimizer"] - (0.0 if work.optimizer_offload else state["optimizer"])
    per_node = layout.ndevices_per_node
    host = Phase(
        f"host RAM per node ({per_node} devices)",
        [
            Term("optimizer state (fp32)", optimizer_host * per_node, True, split),
            *([Term("actor weights and gradients offloaded", (state["weights"] + state["gradients"]) * per_node, True, split)]
              if work.actor_param_offload else []),
            *([Term("reference weights offloaded", reference * per_node, True, split)]
              if reference and work.ref_param_offload else []),
            *([Term("vLLM weights while asleep (level 1 on npu)", vllm_weights * per_node, True, "GEN_TP")]
              if device == "npu" else []),
        ],
        None,
    )  # fmt: skip
    notes = [
        f"vLLM: weights {vllm_weights / GIB:.1f} GiB, sampler logits {sampler / GIB:.1f} GiB, KV cache "
        f"{max(kv_space, 0) / GIB:.1f} GiB in its pool; one full-length sequence takes {per_sequence / GIB:.3f} GiB "
        f"({kv_per_token:g} B per token, {deltanet_state / (1 << 20):.0f} MiB of DeltaNet state"
        + (", doubled by vllm-ascend's page padding (vllm-ascend#7393))" if device == "npu" else ")")
    ]
    if vision:
        notes.append(
            f"vision tower: activations for {image_tokens:.0f} image tokens a micro-batch, assuming images take "
            f"{IMAGE_SHARE_OF_PROMPT:.0%} of each prompt and no vision block is recomputed (prepare-data measures yours)"
        )
    kv_sequences = max(kv_space, 0) / per_sequence
    return MemoryEstimate([actor, rollout, host], device_gib, device_source, kv_sequences, layout, notes)
