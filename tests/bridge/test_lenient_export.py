"""Megatron-Bridge's strict and lenient HF export of a real Megatron model, and our check of it.

The Megatron model is built once from a faithful source checkpoint. Each test then
exports it with a bridge made from a *derived* source (what the bridge compares
against), provoking one difference:
- the source lacks a tensor the Megatron model has (an "extra" on the Megatron side);
- the source has a tensor the Megatron model never produces (a "missing" one).
The tests pin down what Megatron-Bridge 0.6.2 really does in each case (strict=True
fails only when a source tensor goes unwritten), that strict=False writes, and that
the check reports exactly the affected tensors and classifies the result.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.needs import TRAINER_EXTRA, needs

torch = needs("torch", install=TRAINER_EXTRA)

from recipe.export.hf_check import verify_export  # noqa: E402

NORM = "model.layers.1.post_attention_layernorm.weight"
EXPERT = "model.layers.0.mlp.experts.1.up_proj.weight"
Q_PROJ = "model.layers.0.self_attn.q_proj.weight"
MTP = "mtp.layers.0.enorm.weight"
BIAS = "model.layers.0.mlp.gate.e_score_correction_bias"


def test_faithful_source_round_trips_complete(
    qwen3_moe_source: Path, tmp_path: Path, export_with_bridge, tensors_of
) -> None:
    out = tmp_path / "strict"
    export_with_bridge(qwen3_moe_source, out, True)

    report = verify_export(out)
    assert report.status == "complete", report.summary()
    assert report.architecture == "Qwen3MoeForCausalLM"
    assert report.present_count == report.expected_count == len(tensors_of(qwen3_moe_source))
    exported, original = tensors_of(out), tensors_of(qwen3_moe_source)
    assert exported.keys() == original.keys()
    for name, tensor in original.items():
        assert torch.equal(exported[name], tensor), name


def test_source_lacks_a_single_tensor_strict_does_not_notice(
    qwen3_moe_source: Path, tmp_path: Path, export_with_bridge, make_source, tensors_of
) -> None:
    """A Megatron tensor whose HF name the source lacks is dropped when the bridge builds its
    conversion tasks (only a logger warning), so even strict=True writes without error.
    The check is what notices."""
    source = make_source(qwen3_moe_source, tmp_path / "source", lambda tensors, _index: tensors.pop(NORM))
    for strict in (True, False):
        out = tmp_path / f"strict-{strict}"
        export_with_bridge(source, out, strict)
        assert NORM not in tensors_of(out)
        report = verify_export(out, allowed_missing_patterns=[r"layernorm"])
        assert report.missing == [NORM]
        assert (report.unexpected, report.ghosts, report.shape_mismatches) == ([], [], [])
        assert report.status == "broken"
        assert report.critical == [f"{NORM}: norm missing"]  # allowed or not: a norm is critical
        assert report.present_count == report.expected_count - 1


@pytest.mark.parametrize(
    "dropped, lost, allow, status",
    [
        # One of q/k/v absent: the fused QKV mapping is skipped, so k and v are lost too.
        (
            Q_PROJ,
            sorted([Q_PROJ, Q_PROJ.replace("q_proj", "k_proj"), Q_PROJ.replace("q_proj", "v_proj")]),
            (),
            "broken",
        ),
        # One of an expert's gate/up absent: its fused fc1 mapping is skipped, the partner is lost.
        (EXPERT, sorted([EXPERT, EXPERT.replace("up_proj", "gate_proj")]), (), "broken"),
        (EXPERT, sorted([EXPERT, EXPERT.replace("up_proj", "gate_proj")]), (r"\.experts\.1\.",), "lenient"),
    ],
)
def test_source_lacks_half_of_a_fused_tensor(
    qwen3_moe_source: Path,
    tmp_path: Path,
    export_with_bridge,
    make_source,
    tensors_of,
    dropped: str,
    lost: list[str],
    allow: tuple[str, ...],
    status: str,
) -> None:
    source = make_source(qwen3_moe_source, tmp_path / "source", lambda tensors, _index: tensors.pop(dropped))
    collateral = len(lost) - 1

    with pytest.raises(RuntimeError, match="tensors from the original checkpoint were not written"):
        export_with_bridge(source, tmp_path / "strict", True)
    # strict=True raised after writing the complete shards but before the index: not loadable.
    assert verify_export(tmp_path / "strict").status == "broken"

    out = tmp_path / "lenient"
    export_with_bridge(source, out, False)
    assert len(tensors_of(out)) == len(tensors_of(source)) - collateral

    report = verify_export(out, allowed_missing_patterns=allow)
    assert report.missing == lost
    assert (report.unexpected, report.ghosts, report.shape_mismatches, report.critical) == ([], [], [], [])
    assert report.status == status, report.summary()


def test_source_tensor_the_model_never_produces(
    qwen3_moe_source: Path, tmp_path: Path, export_with_bridge, make_source
) -> None:
    """A source tensor no Megatron mapping produces (here a router bias Qwen3-MoE does not have)."""

    def add_bias(tensors: dict, index: dict) -> None:
        tensors[BIAS] = torch.zeros(4)
        index[BIAS] = index["model.layers.0.mlp.gate.weight"]

    source = make_source(qwen3_moe_source, tmp_path / "source", add_bias)

    # strict=True withholds the whole shard holding the unproduced tensor, then raises.
    weight_map = json.loads((source / "model.safetensors.index.json").read_text())["weight_map"]
    shard_size = sum(1 for shard in weight_map.values() if shard == weight_map[BIAS])
    assert shard_size > 1
    strict_out = tmp_path / "strict"
    with pytest.raises(RuntimeError, match=f"^{shard_size} tensors from the original checkpoint were not written"):
        export_with_bridge(source, strict_out, True)
    left_behind = verify_export(strict_out)
    assert left_behind.status == "broken"
    assert left_behind.errors[0].startswith("no model.safetensors.index.json and no model.safetensors")

    out = tmp_path / "lenient"
    export_with_bridge(source, out, False)
    # Against the model class alone the export is whole: the bias is not Qwen3-MoE's.
    assert verify_export(out).status == "complete"
    # Against the source it started from, the check names what the export dropped.
    report = verify_export(out, reference=source)
    assert report.dropped == [BIAS]
    assert (report.missing, report.unexpected, report.ghosts) == ([], [], [])
    assert report.status == "broken"
    allowed = verify_export(out, reference=source, allowed_missing_patterns=[r"e_score_correction_bias$"])
    assert allowed.status == "lenient"
    assert allowed.allowed == [rf"{BIAS} (allowed: e_score_correction_bias$)"]


def test_mtp_tensors_are_dropped_in_both_modes_and_allowed(
    qwen3_moe_source: Path, tmp_path: Path, export_with_bridge, make_source
) -> None:
    """Megatron-Bridge 0.6.2 leaves out source `mtp.*` tensors when the model has no MTP layers,
    even with strict=True (the fix for the first-save crash of Qwen3.5 runs); the check
    reports them as dropped and, by default, allows them."""

    def add_mtp(tensors: dict, index: dict) -> None:
        tensors[MTP] = torch.ones(32)
        index[MTP] = index["model.norm.weight"]

    source = make_source(qwen3_moe_source, tmp_path / "source", add_mtp)
    for strict in (True, False):
        out = tmp_path / f"strict-{strict}"
        export_with_bridge(source, out, strict)
        report = verify_export(out, reference=source)
        assert report.dropped == [MTP]
        assert (report.missing, report.unexpected, report.ghosts) == ([], [], [])
        assert report.status == "lenient", report.summary()
        assert report.allowed == [rf"{MTP} (allowed: ^mtp\.)"]
        assert verify_export(out, reference=source, allowed_missing_patterns=()).status == "broken"
