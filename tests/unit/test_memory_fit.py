"""The memory-fit estimate: Megatron's own formula where it applies, verl's defaults, and what `plan` does with it."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recipe.errors import RecipeConfigError
from recipe.layout import ParallelLayout
from recipe.memory_fit import actor_shard, estimate, model_state_bytes
from recipe.memory_workload import WORKLOAD_DEFAULTS, EstimateSkipped, Workload, workload_from_overrides
from recipe.model_sizes import QWEN3_5_35B_A3B_CONFIG, sizes_from_config
from recipe.plan import build_plan
from recipe.settings import load_settings

from .envtools import ENTRYPOINT, HANG_GUARD_S, clear_settings, entrypoint_env


def _entrypoint(args: list[str], **settings: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ENTRYPOINT, *args], env=entrypoint_env(**settings), capture_output=True, text=True,
                          timeout=HANG_GUARD_S, check=False)  # fmt: skip


def _plan(extra: tuple[str, ...] = (), **values: str) -> Any:
    with pytest.MonkeyPatch.context() as mp:
        clear_settings(mp)
        mp.setenv("DEVICE", values.pop("DEVICE", "gpu"))
        for name, value in values.items():
            mp.setenv(name, value)
        return build_plan(load_settings(), os.environ, list(extra))


# --- Megatron's formula ------------------------------------------------------------------------------------------


@st.composite
def dense_layouts(draw: st.DrawFn) -> tuple[dict[str, Any], ParallelLayout]:
    """A full-attention MoE config (no DeltaNet, no vision: what Megatron's formula knows) and a layout for it."""
    tp, pp, cp = draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2]))
    ep, etp = draw(st.sampled_from([1, 2, 4, 8])), draw(st.sampled_from([1, 2]))
    unit = tp * pp * cp * ep * etp
    world = unit * draw(st.integers(1, 2))
    heads = 16
    config = {
        "hidden_size": 64, "vocab_size": draw(st.integers(100, 1000)), "num_hidden_layers": 2 * pp,
        "num_attention_heads": heads, "num_key_value_heads": draw(st.sampled_from([2, 4, 16])), "head_dim": 32,
        "num_experts": 8 * ep, "num_experts_per_tok": 2, "moe_intermediate_size": 32 * etp,
        "shared_expert_intermediate_size": draw(st.sampled_from([32, 64])),
        "tie_word_embeddings": draw(st.booleans()),
    }  # fmt: skip
    layout = ParallelLayout(tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, gen_tp=tp, nnodes=1, ndevices_per_node=world)
    return config, layout


def _megatron_args(config: dict[str, Any], layout: ParallelLayout) -> argparse.Namespace:
    """Megatron-LM's arguments for the same model and layout (megatron/training/arguments.py names)."""
    return argparse.Namespace(
        kv_channels=config["head_dim"], num_attention_heads=config["num_attention_heads"],
        hidden_size=config["hidden_size"], group_query_attention=True, num_query_groups=config["num_key_value_heads"],
        num_experts=config["num_experts"], swiglu=True,
        moe_shared_expert_intermediate_size=config["shared_expert_intermediate_size"], moe_shared_expert_gate=True,
        moe_layer_freq=1, num_layers=config["num_hidden_layers"], moe_ffn_hidden_size=config["moe_intermediate_size"],
        ffn_hidden_size=0, moe_latent_size=None, moe_router_topk=config["num_experts_per_tok"], add_bias_linear=False,
        mtp_num_layers=None, normalization="RMSNorm", multi_latent_attention=False,
        padded_vocab_size=config["vocab_size"], untie_embeddings_and_output_weights=not config["tie_word_embeddings"],
        tensor_model_parallel_size=layout.tp, pipeline_model_parallel_size=layout.pp,
        expert_model_parallel_size=layout.ep, expert_tensor_parallel_size=layout.etp, world_size=layout.world_size,
        data_parallel_size=layout.dp, use_distributed_optimizer=True,
    )  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(dense_layouts())
def test_weights_gradients_and_optimizer_equal_megatron_s_formula(case: tuple[dict[str, Any], ParallelLayout]) -> None:
    """megatron-core's compute_weight_and_optimizer_memory, plus the two things Qwen3.5 has that its formula does not
    know: the attention output gate (q_proj twice as wide) and the per-head q/k norms, both computed here."""
    pytest.importorskip("megatron.core", reason="Megatron-LM's formula ships with megatron-core (bash .ci/install-megatron-bridge.sh)")
    from tests.support.megatron_py311 import install_shims

    install_shims()  # megatron.training imports typing.override, new in 3.12
    from megatron.training import theoretical_memory_usage as theoretical
    config, layout = case
    sizes = sizes_from_config(config)
    shard = actor_shard(sizes, layout)
    ours = sum(model_state_bytes(shard).values())
    megatron = theoretical.compute_weight_and_optimizer_memory(_megatron_args(config, layout))
    per_dense_param = 6 + 12 / layout.dp
    layers_here = config["num_hidden_layers"] / layout.pp
    gate = config["hidden_size"] * config["num_attention_heads"] * config["head_dim"] * layers_here / layout.tp
    qk_norms = 2 * config["head_dim"] * layers_here
    assert ours == pytest.approx(megatron + (gate + qk_norms) * per_dense_param, rel=1e-12)


# --- verl's defaults ---------------------------------------------------------------------------------------------


def test_the_defaults_are_verl_s_and_megatron_core_s() -> None:
    """What the estimate assumes for a key the plan leaves out is what verl 0.9.1 (or megatron-core's OptimizerConfig,
    for override_optimizer_config's keys, which verl's YAML leaves empty) would use."""
    from recipe.verl_config import compose_verl_config, verl_config_dir

    config_dir = verl_config_dir()
    if config_dir is None:
        pytest.skip("verl is not installed (pip install '.[trainer]')")
    optimizer_config = pytest.importorskip("megatron.core.optimizer.optimizer_config", reason="megatron-core")
    from omegaconf import OmegaConf

    composed = compose_verl_config(["model_engine=megatron"], config_dir)  # the recipe's engine, nothing else
    for key, default in WORKLOAD_DEFAULTS.items():
        if ".override_optimizer_config." in key:
            field = optimizer_config.OptimizerConfig.__dataclass_fields__[key.rsplit(".", 1)[1]]
            assert field.default == default, key
        else:
            assert OmegaConf.select(composed, key) == default, key


def test_every_key_the_estimate_reads_is_one_the_plan_sets() -> None:
    """The recipe decides each of them (so the estimate is of the plan, not of verl's defaults), but max_num_seqs."""
    plan = _plan()
    keys = {text.split("=", 1)[0].lstrip("+") for text in plan.overrides}
    assert set(WORKLOAD_DEFAULTS) - keys == {"actor_rollout_ref.rollout.max_num_seqs"}


# --- the estimate in plan ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", ["gpu", "npu"])
def test_the_default_layouts_fit_with_a_table_of_every_term(device: str) -> None:
    plan = _plan(DEVICE=device)
    memory = plan.to_dict()["memory"]
    assert memory["problems"] == [] and memory["warnings"] == []
    names = [phase["name"].split(" (")[0] for phase in memory["phases"]]
    assert names == ["actor phase", "rollout phase", "host RAM per node"]
    text = plan.to_text()
    for phase in memory["phases"]:
        assert phase["name"] in text
        assert all(term["name"] in text for term in phase["terms"])
    assert memory["device_gib"] == (80 if device == "gpu" else 64)


def test_without_offload_the_rollout_phase_does_not_fit_and_plan_says_so_in_one_line(tmp_path: Any) -> None:
    """OFFLOAD=0 on gpu: the actor's weights and gradients (30.6 GiB) stay while vLLM takes 0.6 x 80 GiB at wake-up:
    the OOM at vLLM wake-up that upstream users report (verl#1649, #3364)."""
    result = _entrypoint(["plan"], DEVICE="gpu", OFFLOAD="0", CHECKPOINT_DIR=str(tmp_path))
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: TP=2, PP=1, CP=1, EP=8, ETP=1, GEN_TP=8 on 80 GiB per device (an H100 or A100 80GB")
    assert "the rollout phase (vLLM awake) needs 88.9 GiB per device before any batch" in line
    assert "OFFLOAD=1" in line and "gpu_memory_utilization" in line


@pytest.mark.parametrize(
    ("values", "phase"),
    [({"DEVICE_MEMORY_GIB": "24"}, "actor phase"), ({"DEVICE": "npu", "DEVICE_MEMORY_GIB": "10"}, "actor phase")],
)
def test_a_device_too_small_for_the_fixed_terms_is_refused(values: dict[str, str], phase: str) -> None:
    with pytest.raises(RecipeConfigError) as caught:
        _plan(**values)
    (line,) = caught.value.problems
    assert f"the {phase}" in line and "DEVICE_MEMORY_GIB" in line and "actor gradients" in line


@pytest.mark.parametrize(("gib", "where"), [("36", "within 10% of it"), ("33", "over it")])
def test_an_estimate_near_or_over_the_device_by_batch_terms_warns_and_the_plan_still_runs(gib: str, where: str) -> None:
    """Actor phase: 30.6 GiB fixed + 3.1 GiB that grow with the micro-batch (the vision tower's activations among
    them); only fixed terms refuse a layout."""
    plan = _plan(DEVICE_MEMORY_GIB=gib)
    (warning,) = plan.memory.warnings()
    assert "actor phase" in warning and f"33.7 of {gib}.0 GiB per device, {where}" in warning
    assert "; the largest, " in warning and "shrinks with " in warning  # the setting to change, named
    assert f"warning  {warning}" in plan.to_text()


def test_vllm_without_room_for_one_sequence_is_refused() -> None:
    with pytest.raises(RecipeConfigError) as caught:
        _plan(extra=("actor_rollout_ref.rollout.gpu_memory_utilization=0.1",))
    (line,) = caught.value.problems
    assert "vLLM's KV cache holds" in line and "gpu_memory_utilization" in line


def test_a_value_that_is_not_literal_skips_the_estimate_and_says_why() -> None:
    plan = _plan(extra=("actor_rollout_ref.rollout.gpu_memory_utilization=${oc.env:MY_UTIL,0.5}",))
    assert plan.memory is None
    assert "gpu_memory_utilization" in plan.memory_skipped and "not a literal number" in plan.memory_skipped
    assert plan.to_dict()["memory"] == {"skipped": plan.memory_skipped}


def test_a_config_without_the_sizes_keeps_the_plan_and_says_why(tmp_path: Any) -> None:
    config = json.loads(json.dumps(QWEN3_5_35B_A3B_CONFIG))
    del config["text_config"]["vocab_size"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    plan = _plan(MODEL_PATH=str(tmp_path))
    assert plan.memory is None and "vocab_size" in plan.memory_skipped
    assert plan.to_dict()["model"]["sizes"] == {"unknown": "config.json lacks vocab_size"}


_LITERALS = st.one_of(
    st.integers(-5, 10**6).map(str), st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["true", "False", "null", "abc", "'0.5'", "1e309", "-0.0"]),
)  # fmt: skip


@settings(max_examples=6, deadline=None)  # each example composes verl's config (about 1 s)
@given(key=st.sampled_from(sorted(WORKLOAD_DEFAULTS)), value=_LITERALS)
def test_any_value_of_a_key_the_estimate_reads_is_a_plan_or_a_clear_refusal(key: str, value: str) -> None:
    """Through the real plan (verl's type check included): an estimate, a skipped one, or exit-2 lines; never a crash."""
    try:
        plan = _plan(extra=(f"+{key}={value}" if "override_optimizer_config" in key else f"{key}={value}",))
    except RecipeConfigError as error:
        assert error.problems and all(isinstance(p, str) and p for p in error.problems)
        return
    assert (plan.memory is None) != (plan.memory_skipped is None)


# --- the terms -----------------------------------------------------------------------------------------------------

_WORK = Workload(
    prompt_tokens=1024, response_tokens=2048, micro_batch_tokens=4096, gpu_memory_utilization=0.6, max_num_seqs=256,
    actor_param_offload=True, ref_param_offload=True, reference=True, optimizer_host_fraction=1.0, optimizer_offload=True,
)  # fmt: skip
_LAYOUT = ParallelLayout(tp=2, pp=1, cp=1, ep=8, etp=1, gen_tp=8, nnodes=1, ndevices_per_node=8)
_SIZES = sizes_from_config(QWEN3_5_35B_A3B_CONFIG)


def _terms(device: str = "gpu", work: Workload = _WORK, layout: ParallelLayout = _LAYOUT) -> dict[str, dict[str, float]]:
    found = estimate(_SIZES, layout, work, device, 80, "test")  # type: ignore[arg-type]
    return {phase.name.split(" (")[0]: {t.name: t.bytes for t in phase.terms} for phase in found.phases}


def test_vllm_ascend_s_page_padding_doubles_the_deltanet_state_on_npu_only() -> None:
    gpu = estimate(_SIZES, _LAYOUT, _WORK, "gpu", 80, "test")
    npu = estimate(_SIZES, _LAYOUT, _WORK, "npu", 80, "test")
    kv_space = gpu.kv_sequences * ((1024 + 2048) * 10240 + _SIZES.state_bytes_per_sequence / 8)
    assert npu.kv_sequences == pytest.approx(kv_space / ((1024 + 2048) * 10240 + 2 * _SIZES.state_bytes_per_sequence / 8))


def test_what_offload_moves_leaves_the_device_and_lands_in_host_ram() -> None:
    kept = _terms(work=replace(_WORK, actor_param_offload=False, ref_param_offload=False, optimizer_host_fraction=0.0,
                               optimizer_offload=False))  # fmt: skip
    moved = _terms()
    assert "actor weights and gradients kept" in kept["rollout phase"]
    assert "reference weights kept" in kept["rollout phase"] and "optimizer state kept (fp32)" in kept["rollout phase"]
    assert set(moved["rollout phase"]) == {"vLLM pool (0.6 x device)"}
    assert kept["host RAM per node"]["optimizer state (fp32)"] == 0
    assert moved["host RAM per node"]["actor weights and gradients offloaded"] == pytest.approx(
        8 * (kept["rollout phase"]["actor weights and gradients kept"])
    )


def test_vllm_s_weights_sleep_in_host_ram_on_npu_only() -> None:
    """verl sleeps vLLM at level 1 on npu (weights to the host) and level 2 on gpu (weights dropped)."""
    assert "vLLM weights while asleep (level 1 on npu)" not in _terms("gpu")["host RAM per node"]
    asleep = _terms("npu")["host RAM per node"]["vLLM weights while asleep (level 1 on npu)"]
    assert asleep == pytest.approx(8 * 2 * _SIZES.total / 8)


def test_the_logits_term_is_the_issue_s_2_gb_at_4k_tokens_and_tp2() -> None:
    assert _terms()["actor phase"]["fp32 logits"] == 4096 * 248320 / 2 * 4
    assert _terms(layout=replace(_LAYOUT, cp=2))["actor phase"]["fp32 logits"] == 2048 * 248320 / 2 * 4


def test_a_workload_reads_dynamic_batching_and_micro_batches() -> None:
    base = [f"{k}={v}" for k, v in {
        "data.max_prompt_length": 100, "data.max_response_length": 300,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 3, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 5000,
    }.items()]  # fmt: skip
    assert workload_from_overrides(base).micro_batch_tokens == 3 * 400
    assert workload_from_overrides([*base, "actor_rollout_ref.actor.use_dynamic_bsz=True"]).micro_batch_tokens == 5000
    with pytest.raises(EstimateSkipped, match="ppo_micro_batch_size_per_gpu is not set"):
        workload_from_overrides(base[:2])


def test_plan_json_carries_the_estimate(tmp_path: Any) -> None:
    result = _entrypoint(["plan", "--json"], DEVICE="npu", CHECKPOINT_DIR=str(tmp_path))
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    memory = document["memory"]
    assert document["model"]["sizes"]["total"] == 35_107_181_936
    assert memory["device_source"].startswith("one a3 NPU")
    host = memory["phases"][2]
    assert host["capacity_gib"] is None and host["total_gib"] > 500


# --- every term of the default plans, from docs/memory.md's table written out here -------------------------------


def _terms_of(plan: Any) -> dict[str, dict[str, tuple[float, bool]]]:
    return {phase.name.split(" (")[0]: {t.name: (t.bytes, t.fixed) for t in phase.terms} for phase in plan.memory.phases}


def test_every_term_of_the_default_gpu_plan_is_docs_memory_md_s_formula() -> None:
    """TP 2, PP 1, EP 8 on 8 GPUs, OFFLOAD on, fixed micro-batches of 1 x (1024 + 2048) tokens."""
    sizes = sizes_from_config(QWEN3_5_35B_A3B_CONFIG)
    dense = (sizes.tp_sharded + sizes.embedding + sizes.vision) / 2 + sizes.replicated + sizes.embedding / 2
    experts = sizes.experts / 8
    shard, tokens, gib = dense + experts, 3072, 1 << 30
    terms = _terms_of(_plan())
    assert terms["actor phase"] == {
        "actor weights (bf16)": (2 * shard, True),
        "actor gradients (fp32)": (4 * shard, True),
        "checkpointed layer inputs": (tokens * 2048 * 2 * 40 / 2, False),
        "one layer recomputed": (34 * tokens * 2048 / 2, False),
        "MoE dispatch buffers": (tokens * 8 * (2 * 2048 + 3 * 512) * 2, False),
        "fp32 logits": (tokens * 248320 / 2 * 4, False),
        # Images: half of the micro-batch's prompt share (1024 of 3072 tokens), 2x2 patches each through 27 blocks
        # of 1152, 34 bytes an element, over TP 2.
        "vision tower activations": (tokens * 1024 / 3072 / 2 * 4 * 1152 * 27 * 34 / 2, False),
    }
    assert terms["rollout phase"] == {"vLLM pool (0.6 x device)": (0.6 * 80 * gib, True)}
    assert terms["host RAM per node"] == {
        "optimizer state (fp32)": (12 * (dense / 4 + experts / 1) * 8, True),
        "actor weights and gradients offloaded": (6 * shard * 8, True),
        "reference weights offloaded": (2 * shard * 8, True),
    }


def test_every_term_of_the_default_npu_plan_is_docs_memory_md_s_formula() -> None:
    """TP 2, PP 2, EP 8 on 16 a3 NPUs of 64 GiB, dynamic batches of 4096 tokens, vLLM asleep at level 1."""
    sizes = sizes_from_config(QWEN3_5_35B_A3B_CONFIG)
    dense = (sizes.tp_sharded / 2 + sizes.embedding + sizes.vision) / 2 + sizes.replicated / 2  # first of 2 stages
    experts = sizes.experts / (2 * 8)
    shard, tokens, gib = dense + experts, 4096, 1 << 30
    plan = _plan(DEVICE="npu")
    terms = _terms_of(plan)
    assert terms["actor phase"]["actor weights (bf16)"] == (2 * shard, True)
    assert terms["actor phase"]["checkpointed layer inputs"] == (tokens * 2048 * 2 * 40 / 2, False)
    assert terms["rollout phase"] == {"vLLM pool (0.65 x device)": (0.65 * 64 * gib, True)}
    assert terms["host RAM per node"]["optimizer state (fp32)"] == (12 * (dense / 4 + experts / 1) * 16, True)
    assert terms["host RAM per node"]["vLLM weights while asleep (level 1 on npu)"] == (2 * sizes.total / 8 * 16, True)
    per_sequence = (1024 + 2048) * 10240 + 2 * sizes.state_bytes_per_sequence / 8
    kv_space = 0.65 * 64 * gib - 2 * sizes.total / 8 - 256 * 248320 * 4
    assert plan.memory.kv_sequences == pytest.approx(kv_space / per_sequence, rel=1e-12)
    document = plan.to_dict()["memory"]
    assert document["device_gib"] == 64 and document["kv_sequences"] == round(kv_space / per_sequence, 2)
    for phase, shown in zip(plan.memory.phases, document["phases"]):
        assert shown["total_gib"] == round(phase.total / gib, 2)
        assert shown["terms"] == [{"name": t.name, "gib": round(t.bytes / gib, 2), "fixed": t.fixed, "shrink": t.shrink}
                                  for t in phase.terms]  # fmt: skip
    assert [p["capacity_gib"] for p in document["phases"]] == [64.0, 64.0, None]
