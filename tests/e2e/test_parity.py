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

    megatron, hf = megatron_and_hf
    pixels, grid_thw = _image(hf)
    vision = megatron.vision_model
    blocks_out: list[Any] = []
    hook = vision.merger.register_forward_pre_hook(lambda _module, args: blocks_out.append(args[0]))
    try:
        with torch.no_grad(), _ExactMergerGelu(megatron):
            ours, _deepstack = vision(pixels, grid_thw)
            theirs = hf.model.visual(pixels, grid_thw=grid_thw)
    finally:
        hook.remove()
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


# --- image prompts: the smoke data's own rows through the model's processor ---------------------------------------------

#: fp32 logits and input gradients on image prompts, Megatron (packed or padded) against transformers.
IMAGE_LOGITS_TOLERANCE = 1e-5
#: Relative difference of d(log-likelihood)/d(pixel_values): the whole backward, language model and vision tower.
IMAGE_GRADIENT_TOLERANCE = 1e-5


def _image_prompts(smoke_model: Path, extra: tuple[int, ...]) -> list[dict[str, Any]]:
    """Rows 0 and 1 of the smoke training data as verl's agent loop encodes them (processor: input_ids, pixel_values,
    image_grid_thw), each followed by `extra[i]` random tokens standing in for a response (ragged lengths)."""
    import torch
    from transformers import AutoProcessor

    from tests.e2e.harness.image_rows import prompt_and_image, smoke_rows

    processor = AutoProcessor.from_pretrained(smoke_model)
    generator = torch.Generator().manual_seed(5)
    encoded = []
    for row, n in zip(smoke_rows(smoke_model.parent / "data" / "train.parquet", len(extra)), extra):
        text, image = prompt_and_image(processor, row)
        inputs = processor(text=[text], images=[image], return_tensors="pt")
        response = torch.randint(0, 256, (n,), generator=generator)  # byte tokens
        encoded.append({
            "input_ids": torch.cat([inputs["input_ids"][0], response]),
            # transformers computes mrope from which tokens are the image's (0: text, for the response too).
            "mm_token_type_ids": torch.cat([inputs["mm_token_type_ids"][0], torch.zeros_like(response)]),
            "pixel_values": inputs["pixel_values"].float(),
            "image_grid_thw": inputs["image_grid_thw"],
        })  # fmt: skip
    return encoded


class _ExactMergerGelu:
    """Megatron-Bridge 0.6.2's merger with transformers' exact GELU (see test_vision_merger_activation_differs...)."""

    def __init__(self, megatron: Any) -> None:
        self.merger = megatron.vision_model.merger

    def __enter__(self) -> None:
        import torch.nn.functional as F

        self.saved = self.merger.activation_func
        self.merger.activation_func = F.gelu

    def __exit__(self, *exc: object) -> None:
        self.merger.activation_func = self.saved


def _log_likelihood(logits: Any, input_ids: Any) -> Any:
    """Sum of each next token's fp32 log-probability: what GRPO's loss is made of."""
    import torch

    return torch.log_softmax(logits[:-1].float(), -1).gather(-1, input_ids[1:, None]).sum()


def _verl_forward(megatron: Any, hf: Any, prompts: list[dict[str, Any]], data_format: str) -> list[Any]:
    """verl 0.9.1's Megatron-engine forward (the actor's) on the prompts as one batch: each sequence's logits."""
    import torch
    from verl.models.mcore.model_forward import gptmodel_forward_model_engine

    batch = torch.nested.nested_tensor([p["input_ids"] for p in prompts], layout=torch.jagged)
    multi_modal = {key: torch.cat([p[key] for p in prompts]) for key in ("pixel_values", "image_grid_thw")}
    out = gptmodel_forward_model_engine(
        megatron, batch, multi_modal, vision_model=True, pad_token_id=hf.config.text_config.pad_token_id or 0,
        data_format=data_format,
    )  # fmt: skip
    return [out[index] for index in range(len(prompts))]


@pytest.mark.parametrize("data_format", ["thd", "bshd"])
def test_image_prompts_give_transformers_logits_and_gradients_packed_and_padded(
    smoke_model: Path, megatron_and_hf: tuple[Any, Any], data_format: str
) -> None:
    """Two smoke rows (an image each, mrope position ids from their grids) of ragged lengths as one batch through the
    actor's forward, packed (THD) and padded (BSHD): each sequence's fp32 logits are transformers' own, and so is the
    gradient of its log-likelihood with respect to its image's pixels (the whole backward: language model, merger,
    vision blocks). Measured: logits within 9.1e-7 and gradients within 1.1e-6 of the largest, packed and padded
    alike. So the 7-9x larger actor/grad_norm of verl's padded runs (../shared/probes/cpu-images-e2e) is not the model's
    gradient: verl 0.9.1's Megatron engine passes the MoE router no padding mask on BSHD batches (engine/megatron/
    transformer_impl.py: only with dynamic context parallelism), so the pad tokens count in the router's auxiliary
    load-balancing loss (moe_aux_loss_coeff 0.01 in the recipe). The recipe packs (THD), where there are no pads."""
    megatron, hf = megatron_and_hf
    prompts = _image_prompts(smoke_model, extra=(9, 40))
    for prompt in prompts:
        prompt["pixel_values"].requires_grad_(True)
    with _ExactMergerGelu(megatron):
        ours = _verl_forward(megatron, hf, prompts, data_format)
        sum(_log_likelihood(logits, p["input_ids"]) for logits, p in zip(ours, prompts)).backward()
    our_grads = [p["pixel_values"].grad.clone() for p in prompts]
    for index, prompt in enumerate(prompts):
        pixels = prompt["pixel_values"].detach().clone().requires_grad_(True)
        theirs = hf(input_ids=prompt["input_ids"][None], mm_token_type_ids=prompt["mm_token_type_ids"][None],
                    pixel_values=pixels, image_grid_thw=prompt["image_grid_thw"]).logits[0]  # fmt: skip
        _log_likelihood(theirs, prompt["input_ids"]).backward()
        assert ours[index].shape == theirs.shape
        assert (ours[index].float() - theirs.float()).abs().max().item() < IMAGE_LOGITS_TOLERANCE, index
        scale = pixels.grad.abs().max().item()
        assert scale > 0, "no gradient reached the pixels"
        assert (our_grads[index] - pixels.grad).abs().max().item() < IMAGE_GRADIENT_TOLERANCE * scale, index


def test_another_image_changes_the_actors_log_probs_of_the_same_text(
    smoke_model: Path, megatron_and_hf: tuple[Any, Any]
) -> None:
    """The same prompt text with row 1's image instead of row 0's: the actor's log-probs of the text after the image
    change (the image reaches the language model; measured up to 0.19), while those before it do not (causal
    attention)."""
    import torch

    megatron, hf = megatron_and_hf
    first, second = _image_prompts(smoke_model, extra=(0, 0))
    swapped = {**first, "pixel_values": second["pixel_values"], "image_grid_thw": second["image_grid_thw"]}
    assert torch.equal(first["input_ids"], swapped["input_ids"]) and not torch.equal(first["pixel_values"], swapped["pixel_values"])
    with torch.no_grad():
        a, b = (_verl_forward(megatron, hf, [prompt], "thd")[0].float() for prompt in (first, swapped))
    image_end = int((first["input_ids"] == hf.config.vision_end_token_id).nonzero()[0])
    assert torch.equal(a[: image_end - 4], b[: image_end - 4])  # before the image's 4 tokens
    assert (a[image_end:] - b[image_end:]).abs().max().item() > 1e-3


#: How far Megatron-Bridge 0.6.2's tanh GELU in the merger moves the next-token probabilities of an image prompt
#: (fp32, against transformers' exact GELU). Measured 6.3e-7; the rollout-vs-actor gap on CPU is 1e-3.
MERGER_GELU_PROBS_EFFECT = 1e-5


def test_the_merger_gelu_moves_image_prompt_probabilities_far_less_than_the_rollout_gap(
    smoke_model: Path, megatron_and_hf: tuple[Any, Any]
) -> None:
    """The cause of the rollout-vs-actor gap on image prompts is not the merger's activation: with the tanh GELU
    Megatron-Bridge ships and with transformers' (and vLLM's) exact one, the actor's fp32 probabilities of every
    next token of two image prompts differ by far less than the gap the e2e measures between vLLM and the actor
    (about 1e-3 at most, with text prompts as with images: bf16 and two sets of kernels). The recipe therefore
    trains with Megatron-Bridge's merger as shipped (docs/smoke.md)."""
    import torch

    megatron, hf = megatron_and_hf
    prompts = _image_prompts(smoke_model, extra=(20, 20))
    with torch.no_grad():
        shipped = [logits.float().softmax(-1) for logits in _verl_forward(megatron, hf, prompts, "thd")]
        with _ExactMergerGelu(megatron):
            exact = [logits.float().softmax(-1) for logits in _verl_forward(megatron, hf, prompts, "thd")]
    effect = max((a - b).abs().max().item() for a, b in zip(shipped, exact))
    print(f"merger GELU (tanh vs exact): next-token probabilities differ by {effect:.3g} at most")
    assert 0 < effect < MERGER_GELU_PROBS_EFFECT
