"""`export` on a CPU-only machine for Qwen3.5: the smoke profile's Qwen3.5-MoE VLM, through Megatron-Bridge.

Qwen3.5's Megatron model (Gated DeltaNet, gated attention, MoE with a shared expert, the vision
tower) is built from recipe.export.cpu_layers, as `export` builds it on cpu; a verl-layout dist
checkpoint of it is written with verl 0.9.1's own writer, one tensor of each kind of layer changed
first, so the test can tell the export's weights came from the checkpoint and not from MODEL_PATH.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest

from tests.support.needs import TRAINER_EXTRA, needs

torch = needs("torch", install=TRAINER_EXTRA)
needs("verl", install=TRAINER_EXTRA)

from recipe.export.bridge_export import export_latest, use_cpu_layers  # noqa: E402
from recipe.export.cpu_layers import cpu_build  # noqa: E402
from tests.bridge.conftest import write_verl_checkpoint  # noqa: E402

#: Megatron parameter -> the HF tensor it becomes: a DeltaNet layer's, the full-attention layer's, an expert's,
#: the vision tower's. Each gets +1 in the checkpoint.
CHANGED = {
    "language_model.decoder.layers.0.self_attention.A_log": "model.language_model.layers.0.linear_attn.A_log",
    "language_model.decoder.layers.3.self_attention.linear_qkv.layer_norm_weight":
        "model.language_model.layers.3.input_layernorm.weight",
    "language_model.decoder.final_layernorm.weight": "model.language_model.norm.weight",
    "vision_model.decoder.layers.0.self_attention.linear_qkv.layer_norm_weight": "model.visual.blocks.0.norm1.weight",
}


@pytest.fixture(scope="module")
def smoke_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The smoke profile's own model (recipe.smoke), built offline."""
    from recipe.smoke import prepare_smoke_assets

    return prepare_smoke_assets(tmp_path_factory.mktemp("smoke")).model_path


@pytest.fixture(scope="module")
def qwen35_checkpoint(gloo_world: None, smoke_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """verl's layout (global_step_5/actor/model/dist_ckpt) of the smoke model with the CHANGED tensors +1."""
    from megatron.bridge import AutoBridge

    bridge = AutoBridge.from_hf_pretrained(str(smoke_model), dtype=torch.float32)
    provider = bridge.to_megatron_provider(load_weights=False)
    use_cpu_layers(provider)
    provider.params_dtype = torch.float32
    with cpu_build():
        provider.finalize()
        model = provider.provide_distributed_model(
            wrap_with_ddp=False, use_cpu_initialization=True, bf16=False, fp16=False
        )
    bridge.load_hf_weights(model)
    parameters = dict(model[0].named_parameters())
    with torch.no_grad():
        for name in CHANGED:
            parameters[name].add_(1.0)
    root = tmp_path_factory.mktemp("verl") / "grpo_recipe_smoke" / "qwen3_5_moe_tiny"
    write_verl_checkpoint(model, root, 5)
    # The model and the provider hold process groups: both go before the gloo world does.
    model.clear()
    del provider, parameters
    gc.collect()
    return root


@pytest.mark.parametrize("strict", [True, False])
def test_cpu_export_of_qwen35_is_complete_and_carries_the_checkpoint(
    qwen35_checkpoint: Path, smoke_model: Path, tmp_path: Path, tensors_of: Any, strict: bool
) -> None:
    """COMPLETE against MODEL_PATH (all 193 tensors), the changed tensors +1, every other one unchanged."""
    out = tmp_path / "hf"
    report = export_latest(qwen35_checkpoint, smoke_model, out, strict=strict, device="cpu")
    assert report.status == "complete", report.summary()
    assert report.dropped == []
    exported, source = tensors_of(out), tensors_of(smoke_model)
    assert exported.keys() == source.keys() and len(source) == 193
    changed = set(CHANGED.values())
    for name, tensor in source.items():  # bf16 in MODEL_PATH; +1 is exact in the fp32 the CPU export writes
        expected = tensor.float() + 1.0 if name in changed else tensor.float()
        assert torch.equal(exported[name].float(), expected), name


def test_cpu_export_never_runs_the_model() -> None:
    """The DeltaNet kernels `export` builds with refuse to run: a forward pass would be a bug, not a slow export."""
    from recipe.export.cpu_layers import EXPORT_KERNELS

    for kernel in EXPORT_KERNELS:
        with pytest.raises(RuntimeError, match="never to run it"):
            kernel(torch.zeros(1))
