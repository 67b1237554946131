"""Megatron (built by Megatron-Bridge from the smoke model) computes what transformers computes, in fp32.

The trainer's model is Megatron's, built from the same HF checkpoint through Megatron-Bridge's
Qwen3.5 mappings, with the CPU layers the e2e run uses (recipe.export.cpu_layers and the torch
DeltaNet kernels of tests/e2e/cpu/qwen35.py). A mapping that swaps two tensors, a norm with the
wrong gamma convention or a DeltaNet kernel that drops a term changes the logits far beyond
fp32 rounding. Runs in this process (a one-process gloo world), no trainer.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tests.e2e.cpu  # noqa: F401  the CPU platform and patches, before megatron is imported
from tests.e2e.conftest import WORK
from tests.e2e.harness.assets import build_assets

#: fp32 logits, Megatron against transformers: measured 1.3e-6 over 100 tokens (two DeltaNet chunks of 64).
LOGITS_TOLERANCE = 1e-5
#: fp32 merged vision embeddings: the same arithmetic in another order.
VISION_TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def smoke_model() -> Path:
    return build_assets(WORK / "parity").model


@pytest.fixture(scope="module")
def megatron_and_hf(smoke_model: Path) -> Iterator[tuple[Any, Any]]:
    """(Megatron's Qwen3VLModel with the smoke weights, transformers' Qwen3_5MoeForConditionalGeneration), fp32."""
    import torch
    from megatron.bridge import AutoBridge
    from transformers import Qwen3_5MoeForConditionalGeneration

    from recipe.export.bridge_export import one_process_world, use_cpu_layers
    from tests.support.ports import free_port

    # Megatron's provider sets NVTE_*_ATTN in os.environ (and the world a MASTER_PORT): a trainer started later by
    # this process would inherit them and refuse to start ("NVTE_FLASH_ATTN set to 1, but expected 0").
    saved = dict(os.environ)
    os.environ["MASTER_PORT"] = str(free_port())
    # As in the trainer (TORCHDYNAMO_DISABLE, tests/e2e/harness/plan.py): megatron-core would torch.compile the
    # DeltaNet's fused functions on first use, for each new shape, at tens of seconds each.
    torch._dynamo.config.disable = True
    with one_process_world():
        from megatron.core import tensor_parallel

        # The vision block forks megatron-core's model-parallel RNG (transformer_block.py:304); verl seeds it.
        tensor_parallel.model_parallel_cuda_manual_seed(0)
        bridge = AutoBridge.from_hf_pretrained(str(smoke_model), dtype=torch.float32)
        provider = bridge.to_megatron_provider(load_weights=False)
        use_cpu_layers(provider)
        provider.params_dtype = torch.float32
        provider.finalize()
        model = provider.provide_distributed_model(
            wrap_with_ddp=False, use_cpu_initialization=True, bf16=False, fp16=False
        )
        bridge.load_hf_weights(model)
        megatron = model[0].eval()
        hf = Qwen3_5MoeForConditionalGeneration.from_pretrained(smoke_model, dtype=torch.float32).eval()
        yield megatron, hf
        model.clear()  # it holds process groups: gone before the world is
    os.environ.clear()
    os.environ.update(saved)
    torch._dynamo.config.disable = False


def test_text_logits_match_transformers(megatron_and_hf: tuple[Any, Any]) -> None:
    """100 tokens (DeltaNet's chunked path over a chunk boundary): logits within 1e-5, same argmax everywhere."""
    import torch

    megatron, hf = megatron_and_hf
    tokens = torch.randint(0, hf.config.text_config.vocab_size, (1, 100), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = megatron(input_ids=tokens, position_ids=None, attention_mask=None).float()
        theirs = hf(input_ids=tokens).logits.float()
    assert ours.shape == theirs.shape
    assert (ours - theirs).abs().max().item() < LOGITS_TOLERANCE
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))


@pytest.mark.parametrize("data_format", ["thd", "bshd"])
def test_verls_packed_and_padded_forwards_give_each_sequences_own_logits(
    megatron_and_hf: tuple[Any, Any], data_format: str
) -> None:
    """verl 0.9.1's Megatron-engine forward (the one its actor runs) on two ragged sequences: packed (THD,
    use_remove_padding=True: cu_seqlens into Gated DeltaNet) and padded (BSHD) both give each sequence the
    logits of its own unpadded forward (measured 4.8e-7 to 1.3e-6). The recipe plans THD on that evidence."""
    import torch
    from verl.models.mcore.model_forward import gptmodel_forward_model_engine

    megatron, hf = megatron_and_hf
    generator = torch.Generator().manual_seed(4)
    vocab = hf.config.text_config.vocab_size
    sequences = [torch.randint(0, vocab, (length,), generator=generator) for length in (37, 90)]
    batch = torch.nested.nested_tensor(sequences, layout=torch.jagged)
    with torch.no_grad():
        out = gptmodel_forward_model_engine(
            megatron, batch, {}, vision_model=True, pad_token_id=hf.config.text_config.pad_token_id or 0,
            data_format=data_format,
        )  # fmt: skip
        for index, sequence in enumerate(sequences):
            alone = megatron(input_ids=sequence[None], position_ids=None, attention_mask=None)[0]
            assert (out[index].float() - alone.float()).abs().max().item() < LOGITS_TOLERANCE, index


def _image(hf: Any) -> tuple[Any, Any]:
    """Synthetic pixel_values of one 4x6-patch image and its grid_thw (no image processor needed)."""
    import torch

    vision = hf.config.vision_config
    grid_thw = torch.tensor([[1, 4, 6]])
    patch = vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
    return torch.randn(int(grid_thw.prod()), patch, generator=torch.Generator().manual_seed(2)), grid_thw


def test_vision_tower_matches_transformers(megatron_and_hf: tuple[Any, Any]) -> None:
    """The vision blocks' output, and the merged image embeddings with the merger's GELU as transformers has it,
    within 1e-5 (measured 2.4e-7 and 1.2e-7). See the next test for the merger's activation."""
    import torch
    import torch.nn.functional as F

    megatron, hf = megatron_and_hf
    pixels, grid_thw = _image(hf)
    vision = megatron.vision_model
    blocks_out: list[Any] = []
    hook = vision.merger.register_forward_pre_hook(lambda _module, args: blocks_out.append(args[0]))
    merger_activation = vision.merger.activation_func
    vision.merger.activation_func = F.gelu
    try:
        with torch.no_grad():
            ours, _deepstack = vision(pixels, grid_thw)
            theirs = hf.model.visual(pixels, grid_thw=grid_thw)
    finally:
        hook.remove()
        vision.merger.activation_func = merger_activation
    merged = (int(grid_thw.prod()) // hf.config.vision_config.spatial_merge_size**2, hf.config.vision_config.out_hidden_size)
    assert ours.shape == theirs.pooler_output.shape == merged
    blocks = blocks_out[0].reshape(theirs.last_hidden_state.shape)
    assert (blocks - theirs.last_hidden_state).abs().max().item() < VISION_TOLERANCE
    assert (ours - theirs.pooler_output).abs().max().item() < VISION_TOLERANCE


def test_vision_merger_activation_differs_from_transformers(megatron_and_hf: tuple[Any, Any]) -> None:
    """Known upstream difference, pinned: Megatron-Bridge 0.6.2's Qwen3.5 patch merger applies the vision config's
    tanh-approximate GELU (modelling_qwen3_vl/utils.py:176, transformer_config.py `activation_func`), where
    transformers' Qwen3_5MoeVisionPatchMerger uses exact GELU (nn.GELU()). Image embeddings then differ from
    transformers' by about 1e-4 (measured 8.3e-5 on values up to 0.26). When this fails, upstream changed it:
    drop the swap in the test above."""
    import torch
    import torch.nn.functional as F

    megatron, hf = megatron_and_hf
    activation = megatron.vision_model.merger.activation_func
    probe = torch.linspace(-3, 3, 61)
    assert torch.equal(activation(probe), F.gelu(probe, approximate="tanh"))
    assert not torch.equal(activation(probe), hf.model.visual.merger.act_fn(probe))
