"""The export check against a real (tiny) Qwen3.5-MoE checkpoint written by transformers.

Each test damages the checkpoint in one way and asserts the report names exactly
the damaged tensors and classifies the result.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from recipe.export.hf_check import ExportCheckError, verify_export

LAYER1 = "model.language_model.layers.1."
EXPERT = "model.language_model.layers.2.mlp.experts.3.down_proj.weight"


def test_saved_model_is_complete(qwen35_saved: Path) -> None:
    report = verify_export(qwen35_saved)
    assert report.status == "complete", report.summary()
    assert report.architecture == "Qwen3_5MoeForConditionalGeneration"
    assert report.expected_count == report.present_count > 100
    assert (report.missing, report.unexpected, report.ghosts, report.shape_mismatches) == ([], [], [], [])
    assert report.exit_code == 0


def test_missing_layer_is_broken_and_named(qwen35_copy: Path, tensors_of, rewrite_checkpoint) -> None:
    removed = sorted(name for name in tensors_of(qwen35_copy) if name.startswith(LAYER1))
    assert len(removed) > 10  # the Gated DeltaNet layer and its experts

    rewrite_checkpoint(qwen35_copy, lambda t: [t.pop(name) for name in removed])
    report = verify_export(qwen35_copy)

    assert report.status == "broken"
    assert report.missing == removed
    assert f"{LAYER1[:-1]}: whole layer missing ({len(removed)} tensors)" in report.critical
    assert report.unexpected == [] and report.ghosts == []
    assert report.exit_code == 1
    assert removed[0] in report.summary(limit=100)


def test_ghost_index_entry_is_broken(qwen35_copy: Path, rewrite_index) -> None:
    index = json.loads((qwen35_copy / "model.safetensors.index.json").read_text())["weight_map"]
    real = "model.language_model.norm.weight"
    wrong_shard = next(f for f in sorted(set(index.values())) if f != index[real])
    ghost = "model.language_model.layers.0.mlp.gate.bias"

    def damage(weight_map: dict[str, str]) -> None:
        weight_map[ghost] = wrong_shard  # listed, in no shard
        weight_map[real] = wrong_shard  # listed, but in another shard than the one named

    rewrite_index(qwen35_copy, damage)
    report = verify_export(qwen35_copy)

    assert report.status == "broken"
    assert report.ghosts == sorted([ghost, real])
    # The real tensor is unreachable through the index, so a loader misses it too.
    assert report.missing == [real]
    assert report.critical == [f"{real}: norm missing"]


def test_shape_mismatch_is_broken(qwen35_copy: Path, rewrite_checkpoint) -> None:
    name = "model.language_model.layers.3.self_attn.o_proj.weight"

    def damage(tensors: dict) -> None:
        tensors[name] = tensors[name][:, :-1].clone()

    rewrite_checkpoint(qwen35_copy, damage)
    report = verify_export(qwen35_copy)
    assert report.status == "broken"
    assert [(m.name, m.expected, m.actual) for m in report.shape_mismatches] == [(name, [32, 32], [32, 31])]
    assert report.missing == [] and report.unexpected == []


def test_missing_expert_allowed_is_lenient_else_broken(qwen35_copy: Path, rewrite_checkpoint) -> None:
    rewrite_checkpoint(qwen35_copy, lambda t: t.pop(EXPERT))

    strict = verify_export(qwen35_copy)
    assert strict.status == "broken"
    assert strict.missing == [EXPERT] and strict.critical == []

    lenient = verify_export(qwen35_copy, allowed_missing_patterns=[r"\.mlp\.experts\.3\."])
    assert lenient.status == "lenient"
    assert lenient.missing == [EXPERT]
    assert lenient.allowed == [rf"{EXPERT} (allowed: \.mlp\.experts\.3\.)"]


def test_critical_parts_stay_broken_even_if_allowed(qwen35_copy: Path, rewrite_checkpoint) -> None:
    embedding = "model.language_model.embed_tokens.weight"
    rewrite_checkpoint(qwen35_copy, lambda t: t.pop(embedding))
    report = verify_export(qwen35_copy, allowed_missing_patterns=[".*"])
    assert report.status == "broken"
    assert report.critical == [f"{embedding}: embedding or output head missing"]


def test_mtp_tensors_are_allowed(qwen35_copy: Path, rewrite_checkpoint) -> None:
    import torch

    mtp = "mtp.layers.0.input_layernorm.weight"
    rewrite_checkpoint(qwen35_copy, lambda t: t.__setitem__(mtp, torch.ones(32)))

    report = verify_export(qwen35_copy)
    assert report.status == "lenient"
    assert report.unexpected == [mtp]
    assert report.allowed == [rf"{mtp} (allowed: ^mtp\.)"]
    # Without the default pattern the model class's own ignore list still excuses it.
    by_class = verify_export(qwen35_copy, allowed_missing_patterns=())
    assert by_class.status == "lenient"
    assert by_class.allowed == [f"{mtp} (Qwen3_5MoeForConditionalGeneration ignores it on load: ^mtp.*)"]


def test_unknown_extra_tensor_is_broken(qwen35_copy: Path, rewrite_checkpoint) -> None:
    import torch

    extra = "model.language_model.layers.0.mlp.router_bias"
    rewrite_checkpoint(qwen35_copy, lambda t: t.__setitem__(extra, torch.zeros(4)))
    report = verify_export(qwen35_copy)
    assert report.status == "broken"
    assert report.unexpected == [extra] and report.missing == []


def test_fused_expert_layout_is_complete(tmp_path: Path, make_qwen35) -> None:
    """Hub checkpoints may store experts fused (`experts.gate_up_proj`): also a complete export."""
    from safetensors.torch import save_file

    model = make_qwen35()
    model.config.save_pretrained(tmp_path)
    state = {name: tensor.contiguous() for name, tensor in model.state_dict().items()}
    state.pop("lm_head.weight", None) if model.config.tie_word_embeddings else None
    save_file(state, tmp_path / "model.safetensors")
    assert "model.language_model.layers.0.mlp.experts.gate_up_proj" in state

    report = verify_export(tmp_path)
    assert report.status == "complete", report.summary()

    # A wholly absent fused expert tensor is then named as the fused tensor.
    del state["model.language_model.layers.2.mlp.experts.down_proj"]
    save_file(state, tmp_path / "model.safetensors")
    report = verify_export(tmp_path)
    assert report.missing == ["model.language_model.layers.2.mlp.experts.down_proj"]


def test_tied_lm_head_may_be_absent_or_present(tmp_path: Path, make_qwen35, rewrite_checkpoint) -> None:
    model = make_qwen35(tie_word_embeddings=True)
    model.save_pretrained(tmp_path)
    report = verify_export(tmp_path)
    assert report.status == "complete", report.summary()
    assert "lm_head.weight" not in report.missing

    def add_head(tensors: dict) -> None:
        tensors["lm_head.weight"] = tensors["model.language_model.embed_tokens.weight"].clone()

    rewrite_checkpoint(tmp_path, add_head)
    assert verify_export(tmp_path).status == "complete"


def test_untied_lm_head_missing_is_critical(qwen35_copy: Path, rewrite_checkpoint) -> None:
    rewrite_checkpoint(qwen35_copy, lambda t: t.pop("lm_head.weight"))
    report = verify_export(qwen35_copy)
    assert report.status == "broken"
    assert report.critical == ["lm_head.weight: embedding or output head missing"]


def test_reference_reports_dropped_tensors(qwen35_copy: Path, tmp_path: Path, rewrite_checkpoint) -> None:
    import torch

    reference = tmp_path / "reference"
    shutil.copytree(qwen35_copy, reference)
    rewrite_checkpoint(reference, lambda t: t.update({"mtp.fc.weight": torch.ones(2, 2), "extra.scale": torch.ones(1)}))

    report = verify_export(qwen35_copy, reference=reference)
    assert report.dropped == ["extra.scale", "mtp.fc.weight"]
    assert report.status == "broken"  # extra.scale is not allowed
    assert report.reference == str(reference)
    report = verify_export(qwen35_copy, reference=reference, allowed_missing_patterns=[r"^mtp\.", r"^extra\."])
    assert report.status == "lenient"


def test_index_without_shards_and_garbage_shard(qwen35_copy: Path) -> None:
    shard = sorted(qwen35_copy.glob("*.safetensors"))[0]
    shard.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    report = verify_export(qwen35_copy)
    assert report.status == "broken"
    assert any(e.startswith(f"{shard.name}: header is not JSON") for e in report.errors)
    assert report.missing and set(report.ghosts) == set(report.missing)


def test_shards_without_index_are_unreadable_to_loaders(qwen35_copy: Path) -> None:
    """What a strict=True export leaves behind when it raises: shards, no index."""
    (qwen35_copy / "model.safetensors.index.json").unlink()
    report = verify_export(qwen35_copy)
    assert report.status == "broken"
    assert report.errors[0].startswith("no model.safetensors.index.json and no model.safetensors")
    assert report.present_count == 0 and len(report.unindexed) == report.expected_count


def test_stale_unindexed_shard_is_reported(qwen35_copy: Path) -> None:
    import torch
    from safetensors.torch import save_file

    norm = "model.language_model.norm.weight"
    indexed_shard = json.loads((qwen35_copy / "model.safetensors.index.json").read_text())["weight_map"][norm]
    save_file({norm: torch.ones(32)}, qwen35_copy / "model-stale.safetensors")
    report = verify_export(qwen35_copy)
    assert report.status == "broken"
    assert report.errors == [f"{norm}: in two shards ({indexed_shard}, model-stale.safetensors)"]


def test_report_is_machine_readable(qwen35_copy: Path, rewrite_checkpoint) -> None:
    rewrite_checkpoint(qwen35_copy, lambda t: t.pop(EXPERT))
    report = verify_export(qwen35_copy)
    data = json.loads(report.to_json())
    assert data["status"] == "broken"
    assert data["missing"] == [EXPERT]
    assert data["shape_mismatches"] == []
    assert data["directory"] == str(qwen35_copy)
    assert set(data) >= {"missing", "unexpected", "ghosts", "dropped", "allowed", "critical", "errors"}


def test_summary_is_truncated_but_counts_everything(qwen35_copy: Path, tensors_of, rewrite_checkpoint) -> None:
    removed = sorted(n for n in tensors_of(qwen35_copy) if n.startswith(LAYER1))
    rewrite_checkpoint(qwen35_copy, lambda t: [t.pop(n) for n in removed])
    report = verify_export(qwen35_copy)
    text = report.summary(limit=3)
    assert text.splitlines()[0] == (
        f"HF export {qwen35_copy}: BROKEN ({report.present_count} tensors present, "
        f"{report.expected_count} expected by Qwen3_5MoeForConditionalGeneration)"
    )
    assert f"missing (expected by the model class, in no shard) ({len(removed)}):" in text
    assert f"    - {removed[0]}" in text and f"    - {removed[3]}" not in text
    assert f"... and {len(removed) - 3} more (see --json)" in text
    assert text.splitlines()[-1].startswith("  NOT usable")


@pytest.mark.parametrize(
    "setup, message",
    [
        ("missing_dir", "not a directory"),
        ("no_config", "no config.json"),
        ("unknown_arch", "not a class of the installed transformers"),
        ("bad_pattern", "not a regular expression"),
    ],
)
def test_unusable_input_raises(qwen35_copy: Path, tmp_path: Path, setup: str, message: str) -> None:
    kwargs: dict = {}
    target = qwen35_copy
    if setup == "missing_dir":
        target = tmp_path / "nowhere"
    elif setup == "no_config":
        (qwen35_copy / "config.json").unlink()
    elif setup == "unknown_arch":
        config = json.loads((qwen35_copy / "config.json").read_text())
        config["architectures"] = ["NoSuchModelForCausalLM"]
        (qwen35_copy / "config.json").write_text(json.dumps(config))
    else:
        kwargs["allowed_missing_patterns"] = ["("]
    with pytest.raises(ExportCheckError, match=message):
        verify_export(target, **kwargs)
