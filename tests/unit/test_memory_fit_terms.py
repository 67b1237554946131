"""Every line of the memory estimate as `plan` shows it: each term's name, size, kind (fixed or growing with the
batch) and the setting that shrinks it, in each offload combination, and vLLM's share of its pool."""

from __future__ import annotations

from dataclasses import replace

import pytest

from recipe.layout import ParallelLayout
from recipe.memory_fit import GIB, MemoryEstimate, estimate, vllm_cache_bytes
from recipe.memory_workload import Workload
from recipe.model_sizes import QWEN3_5_35B_A3B_CONFIG, ModelSizes, sizes_from_config

SIZES = sizes_from_config(QWEN3_5_35B_A3B_CONFIG)
#: 32 devices on 2 nodes: dense DP = 32 / (TP 2 x PP 2 x CP 2) = 4, expert DP = 32 / (EP 4 x ETP 2 x PP 2) = 2.
LAYOUT = ParallelLayout(tp=2, pp=2, cp=2, ep=4, etp=2, gen_tp=4, nnodes=2, ndevices_per_node=16)
#: Everything stays on the device: the reference model, the actor's weights, 3/4 of the optimizer state.
KEPT = Workload(
    prompt_tokens=1000, response_tokens=3000, micro_batch_tokens=8192, gpu_memory_utilization=0.7, max_num_seqs=100,
    actor_param_offload=False, ref_param_offload=False, reference=True, optimizer_host_fraction=0.25,
    optimizer_offload=False,
)  # fmt: skip
#: Everything verl can move to the host is moved.
MOVED = replace(KEPT, actor_param_offload=True, ref_param_offload=True, optimizer_host_fraction=1.0, optimizer_offload=True)

SPLIT = "TP, PP, EP or ETP (split over more devices), or more devices"
OFFLOAD = "OFFLOAD=1 (verl moves it to the host while the other phase runs)"
HOST_OPTIMIZER = (
    "actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_cpu_offload=True with "
    "optimizer_offload_fraction=1 (the recipe's)"
)
SHORTER = "actor_rollout_ref.actor.ppo_max_token_len_per_gpu, CP"
POOL = "actor_rollout_ref.rollout.gpu_memory_utilization (lower leaves less KV cache)"

# The first of 2 pipeline stages (the embedding and the vision tower; the output layer is on the last stage).
DENSE = (SIZES.tp_sharded / 2 + SIZES.embedding + SIZES.vision) / 2 + SIZES.replicated / 2
EXPERTS = SIZES.experts / (2 * 4 * 2)
SHARD = DENSE + EXPERTS
OPTIMIZER = 12 * (DENSE / 4 + EXPERTS / 2)
TOKENS = 8192 / 2  # over CP
ACTIVATIONS = [
    ("checkpointed layer inputs", TOKENS * 2048 * 2 * 40 / 2, False, f"{SHORTER}, TP"),
    ("one layer recomputed", 34 * TOKENS * 2048 / 2, False, f"{SHORTER}, TP"),
    ("MoE dispatch buffers", TOKENS * 8 * (2 * 2048 + 3 * 512) * 2 / 2, False, f"{SHORTER}, ETP"),
    ("fp32 logits", TOKENS * 248320 / 2 * 4, False, f"{SHORTER}, TP"),
    # Half of the micro-batch's prompt share (1000 of 4000 tokens) are image tokens, each 2x2 patches through 27 vision
    # blocks of 1152, 34 bytes an element (none recomputed), over TP.
    ("vision tower activations", TOKENS * 1000 / 4000 / 2 * 4 * 1152 * 27 * 34 / 2, False,
     f"{SHORTER}, data.max_prompt_length, TP"),
]


def _lines(found: MemoryEstimate) -> dict[str, list[tuple[str, float, bool, str]]]:
    return {phase.name: [(t.name, t.bytes, t.fixed, t.shrink) for t in phase.terms] for phase in found.phases}


def _same(found: dict[str, list[tuple[str, float, bool, str]]], expected: dict[str, list[tuple[str, float, bool, str]]]) -> None:
    assert list(found) == list(expected)
    for phase, terms in expected.items():
        assert [(n, f, s) for n, _, f, s in found[phase]] == [(n, f, s) for n, _, f, s in terms], phase
        assert [b for _, b, _, _ in found[phase]] == pytest.approx([b for _, b, _, _ in terms], rel=1e-12), phase


def test_with_nothing_offloaded_every_state_is_on_the_device_in_both_phases() -> None:
    """The optimizer's device share (1 - optimizer_offload_fraction) is in both phases; only its host share in RAM."""
    found = estimate(SIZES, LAYOUT, KEPT, "gpu", 80, "test")
    _same(_lines(found), {
        "actor phase (training)": [
            ("actor weights (bf16)", 2 * SHARD, True, SPLIT),
            ("actor gradients (fp32)", 4 * SHARD, True, SPLIT),
            ("optimizer state on the device (fp32)", 0.75 * OPTIMIZER, True, HOST_OPTIMIZER),
            ("reference weights (bf16)", 2 * SHARD, True, OFFLOAD),
            *ACTIVATIONS,
        ],
        "rollout phase (vLLM awake)": [
            ("actor weights and gradients kept", 6 * SHARD, True, OFFLOAD),
            ("reference weights kept", 2 * SHARD, True, OFFLOAD),
            ("optimizer state kept (fp32)", 0.75 * OPTIMIZER, True, HOST_OPTIMIZER),
            ("vLLM pool (0.7 x device)", 0.7 * 80 * GIB, True, POOL),
        ],
        "host RAM per node (16 devices)": [("optimizer state (fp32)", 0.25 * OPTIMIZER * 16, True, SPLIT)],
    })  # fmt: skip
    assert [phase.capacity for phase in found.phases] == [80 * GIB, 80 * GIB, None]


def test_with_everything_offloaded_the_host_holds_it_and_vllm_sleeps_there_on_npu() -> None:
    found = estimate(SIZES, LAYOUT, MOVED, "npu", 64, "test")
    _same(_lines(found), {
        "actor phase (training)": [
            ("actor weights (bf16)", 2 * SHARD, True, SPLIT),
            ("actor gradients (fp32)", 4 * SHARD, True, SPLIT),
            *ACTIVATIONS,
        ],
        "rollout phase (vLLM awake)": [("vLLM pool (0.7 x device)", 0.7 * 64 * GIB, True, POOL)],
        "host RAM per node (16 devices)": [
            ("optimizer state (fp32)", OPTIMIZER * 16, True, SPLIT),
            ("actor weights and gradients offloaded", 6 * SHARD * 16, True, SPLIT),
            ("reference weights offloaded", 2 * SHARD * 16, True, SPLIT),
            ("vLLM weights while asleep (level 1 on npu)", 2 * SIZES.total / 4 * 16, True, "GEN_TP"),
        ],
    })  # fmt: skip


def test_megatron_s_optimizer_offload_moves_the_device_share_out_of_the_rollout_phase_only() -> None:
    """optimizer_offload with half the state on the host: the actor phase has the other half, the rollout phase none,
    and the host holds all of it while vLLM is awake. Without use_kl_loss there is no reference anywhere, whatever
    the reference's offload says."""
    work = replace(KEPT, optimizer_host_fraction=0.5, optimizer_offload=True, reference=False, ref_param_offload=True)
    _same(_lines(estimate(SIZES, LAYOUT, work, "gpu", 80, "test")), {
        "actor phase (training)": [
            ("actor weights (bf16)", 2 * SHARD, True, SPLIT),
            ("actor gradients (fp32)", 4 * SHARD, True, SPLIT),
            ("optimizer state on the device (fp32)", 0.5 * OPTIMIZER, True, HOST_OPTIMIZER),
            *ACTIVATIONS,
        ],
        "rollout phase (vLLM awake)": [
            ("actor weights and gradients kept", 6 * SHARD, True, OFFLOAD),
            ("vLLM pool (0.7 x device)", 0.7 * 80 * GIB, True, POOL),
        ],
        "host RAM per node (16 devices)": [("optimizer state (fp32)", OPTIMIZER * 16, True, SPLIT)],
    })  # fmt: skip
    without = _lines(estimate(SIZES, LAYOUT, replace(work, ref_param_offload=False), "gpu", 80, "test"))
    assert not [name for terms in without.values() for name, *_ in terms if name.startswith("reference")]


def test_vllm_s_kv_cache_is_what_its_pool_leaves_after_weights_and_sampler_in_full_length_sequences() -> None:
    found = estimate(SIZES, LAYOUT, KEPT, "gpu", 80, "test")
    kv_space = 0.7 * 80 * GIB - 2 * SIZES.total / 4 - 100 * 248320 * 4
    per_sequence = (1000 + 3000) * 10240 + SIZES.state_bytes_per_sequence / 4  # 2 KV heads over GEN_TP 4: one a rank
    assert found.kv_sequences == pytest.approx(kv_space / per_sequence, rel=1e-12)


def test_the_text_table_shows_every_phase_with_its_capacity_and_every_term_in_gib() -> None:
    found = estimate(SIZES, LAYOUT, KEPT, "gpu", 80, "an H100")
    assert found.to_text() == [
        "80 GiB per device: an H100",
        "actor phase (training)                            35.0 of 80.0 GiB",
        "  actor weights (bf16)                             5.3",
        "  actor gradients (fp32)                          10.6",
        "  optimizer state on the device (fp32)            10.2",
        "  reference weights (bf16)                         5.3",
        "  checkpointed layer inputs                        0.3",
        "  one layer recomputed                             0.1",
        "  MoE dispatch buffers                             0.2",
        "  fp32 logits                                      1.9",
        "  vision tower activations                         1.0",
        "rollout phase (vLLM awake)                        87.5 of 80.0 GiB",
        "  actor weights and gradients kept                15.9",
        "  reference weights kept                           5.3",
        "  optimizer state kept (fp32)                     10.2",
        "  vLLM pool (0.7 x device)                        56.0",
        "host RAM per node (16 devices)                    54.4 GiB",
        "  optimizer state (fp32)                          54.4",
        "vLLM's KV cache holds 744 full-length sequences per replica",
        (
            "vLLM: weights 16.3 GiB, sampler logits 0.1 GiB, KV cache 39.6 GiB in its pool; one full-length sequence "
            "takes 0.053 GiB (10240 B per token, 15 MiB of DeltaNet state)"
        ),
        (
            "vision tower: activations for 512 image tokens a micro-batch, assuming images take 50% of each prompt "
            "and no vision block is recomputed (prepare-data measures yours)"
        ),
    ]


def test_the_vllm_note_on_npu_says_the_deltanet_state_is_doubled_by_vllm_ascend() -> None:
    found = estimate(SIZES, LAYOUT, MOVED, "npu", 64, "test")
    note, vision = found.notes
    assert vision.startswith("vision tower: activations for 512 image tokens a micro-batch")
    assert note == (
        "vLLM: weights 16.3 GiB, sampler logits 0.1 GiB, KV cache 28.4 GiB in its pool; one full-length sequence takes "
        "0.068 GiB (10240 B per token, 31 MiB of DeltaNet state, doubled by vllm-ascend's page padding "
        "(vllm-ascend#7393))"
    )
    assert found.to_text()[-2:] == [note, vision]


def test_a_text_model_has_no_vision_term_and_no_vision_note() -> None:
    text_only = replace(SIZES, vision=0, vision_activation_bytes_per_image_token=0)
    found = estimate(text_only, LAYOUT, KEPT, "gpu", 80, "an H100")
    assert not any(term.name.startswith("vision") for phase in found.phases for term in phase.terms)
    assert len(found.notes) == 1


def test_plan_json_has_the_device_its_source_the_phases_and_the_notes() -> None:
    found = estimate(SIZES, LAYOUT, MOVED, "npu", 23.456, "DEVICE_MEMORY_GIB")
    document = found.to_dict()
    assert list(document) == ["device_gib", "device_source", "phases", "kv_sequences", "notes", "problems", "warnings"]
    assert document["device_gib"] == 23.456 and document["device_source"] == "DEVICE_MEMORY_GIB"
    assert document["notes"] == found.notes and document["kv_sequences"] == round(found.kv_sequences, 2)
    actor, rollout, host = document["phases"]
    assert (actor["capacity_gib"], rollout["capacity_gib"], host["capacity_gib"]) == (23.46, 23.46, None)
    assert rollout == {
        "name": "rollout phase (vLLM awake)", "total_gib": 16.42, "capacity_gib": 23.46,
        "terms": [{"name": "vLLM pool (0.7 x device)", "gib": 16.42, "fixed": True, "shrink": POOL}],
    }  # fmt: skip


def _sizes(kv_bytes_per_token: int, num_kv_heads: int) -> ModelSizes:
    return replace(SIZES, kv_bytes_per_token=kv_bytes_per_token, num_kv_heads=num_kv_heads, state_bytes_per_sequence=600)


@pytest.mark.parametrize(
    ("heads", "gen_tp", "per_token"),
    [
        (1, 1, 1200),  # one KV head: all of it on the one rank
        (1, 4, 1200),  # replicated past one head a rank
        (4, 1, 1200),  # all four heads on one rank
        (4, 2, 600),  # two heads a rank
        (2, 4, 600),  # one head a rank at least
        (3, 2, 400),  # 3 heads over 2 ranks: vLLM gives each rank one (3 // 2)
    ],
)
def test_vllm_holds_its_share_of_kv_heads_a_rank_but_at_least_one(heads: int, gen_tp: int, per_token: float) -> None:
    """1200 B of keys and values per token over all heads; the DeltaNet state splits over GEN_TP, doubled on npu."""
    assert vllm_cache_bytes(_sizes(1200, heads), gen_tp, "gpu") == (per_token, 600 / gen_tp)
    assert vllm_cache_bytes(_sizes(1200, heads), gen_tp, "npu") == (per_token, 2 * 600 / gen_tp)


def test_no_room_for_the_kv_cache_is_zero_sequences_even_for_a_model_of_a_few_bytes_a_sequence() -> None:
    """A tiny config.json (one KV head of 4 B a token, no DeltaNet) and one token a sequence: vLLM's weights take the
    whole pool, so the cache holds nothing, not a fraction of a sequence."""
    tiny = replace(_sizes(4, 1), state_bytes_per_sequence=0)
    work = replace(KEPT, prompt_tokens=1, response_tokens=0, gpu_memory_utilization=0.01)
    found = estimate(tiny, LAYOUT, work, "gpu", 80, "test")
    assert found.kv_sequences == 0 and found.to_dict()["kv_sequences"] == 0
    (line,) = found.problems()
    assert "vLLM's KV cache holds 0.00 of one full-length sequence" in line
