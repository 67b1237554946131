"""megatron-core 0.19.2 and Megatron-Bridge 0.6.2 on CPU, on verl 0.9.1's Megatron engine.

megatron-core's training path assumes CUDA and Transformer Engine. On CPU it runs with
megatron-core's local (non-TE) layers, CPU initialisation, a CPU generator behind its
"CUDA" RNG tracker and a `torch` stand-in, in the modules that hard-code CUDA, whose
streams, events and device="cuda" mean the CPU. Each patch below is numbered (M1..M9)
and names the line it works around; all wait for their module to be imported.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any

import torch

from tests.e2e.cpu.hooks import after_import, log
from tests.support.megatron_py311 import install_shims

# (M1) megatron/bridge/models/model_provider.py (and others) `from typing import override`, new in
# Python 3.12; the e2e venv is 3.11 (the machine has no 3.12 with these wheels). (M2)
# megatron/bridge/peft/lora_layers.py:17 imports transformer_engine unconditionally, for LoRA
# classes this run never builds: a stub is served to that file only, so megatron-core keeps its
# local code paths. Both are tests/bridge's shims, shared.
install_shims()

#: Fused kernels that exist only in Transformer Engine / apex / CUDA: off on CPU.
FUSIONS_OFF = (
    "moe_permute_fusion",
    "apply_rope_fusion",
    "bias_activation_fusion",
    "masked_softmax_fusion",
    "bias_dropout_fusion",
    "persist_layer_norm",
    "cross_entropy_loss_fusion",
    "gradient_accumulation_fusion",
    "moe_router_fusion",
)


@after_import("megatron.bridge.models.model_provider")
def _cpu_model_provider(module: types.ModuleType) -> None:
    mixin = module.ModelProviderMixin
    original_finalize = mixin.apply_overrides_and_finalize

    def apply_overrides_and_finalize(self: Any, dtype: Any = None, overrides: dict[str, Any] | None = None) -> Any:
        """(M3) verl/workers/engine/megatron/transformer_impl.py (verl 0.9.1) finalizes the bridge's
        provider with its overrides; the provider's default layer spec is Transformer Engine's
        (megatron/bridge/models/gpt_provider.py default_layer_spec). Use megatron-core's local spec,
        local attention and no fused kernel, whatever the overrides say (what differs is logged)."""
        from megatron.bridge.models.gpt_provider import local_layer_spec
        from megatron.core.transformer.enums import AttnBackend

        merged = dict(overrides or {})
        cpu: dict[str, Any] = {
            "transformer_layer_spec": local_layer_spec,
            "moe_grouped_gemm": False,
            "attention_backend": AttnBackend.local,
        }
        cpu.update({name: False for name in FUSIONS_OFF if hasattr(self, name)})
        for key, value in cpu.items():
            if key in merged and merged[key] != value and key != "attention_backend":
                log(f"provider override {key}={merged[key]!r} -> {value!r} (CPU)")
            merged[key] = value
        return original_finalize(self, dtype=dtype, overrides={k: v for k, v in merged.items() if hasattr(self, k)})

    original_provide = mixin.provide_distributed_model

    def provide_distributed_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        """(M4) megatron/bridge/models/model_provider.py get_model() calls model.cuda(...) unless
        use_cpu_initialization, which verl never passes."""
        kwargs["use_cpu_initialization"] = True
        return original_provide(self, *args, **kwargs)

    mixin.apply_overrides_and_finalize = apply_overrides_and_finalize
    mixin.provide_distributed_model = provide_distributed_model
    log("Megatron-Bridge provider: local layer spec, local attention, CPU initialisation")


class _CpuRngCuda:
    """torch.cuda's RNG calls, answered by the CPU generator."""

    get_rng_state = staticmethod(lambda *a, **k: torch.get_rng_state())
    set_rng_state = staticmethod(lambda state, *a, **k: torch.set_rng_state(state))
    manual_seed = staticmethod(lambda seed: torch.manual_seed(seed))
    manual_seed_all = staticmethod(lambda seed: torch.manual_seed(seed))

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cuda, name)


class _RngTorch(types.ModuleType):
    cuda = _CpuRngCuda()

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


@after_import("megatron.core.tensor_parallel.random")
def _cpu_rng_tracker(module: types.ModuleType) -> None:
    """(M5) verl/workers/engine/megatron/utils.py:38 model_parallel_cuda_manual_seed ->
    megatron/core/tensor_parallel/random.py:303 torch.cuda.get_rng_state(): "Torch not compiled with
    CUDA enabled". On CPU the tracker's "CUDA" states are CPU generator states."""
    module.torch = _RngTorch("torch")
    module._get_cuda_rng_state = lambda device="cuda", clone=False, graph_safe=False: (
        torch.get_rng_state().clone() if clone else torch.get_rng_state()
    )
    module._set_cuda_rng_state = lambda new_state, device=-1, graph_safe=False: torch.set_rng_state(new_state)
    log("megatron.core.tensor_parallel.random: CUDA RNG tracker on the CPU generator")


# (M6) ----------------------------------------------------------------------------------------
class _NullStream:
    """A CUDA stream or event that is always done."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_stream(self, *args: Any, **kwargs: Any) -> None:
        return None

    def wait_event(self, *args: Any, **kwargs: Any) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def record_event(self, *args: Any, **kwargs: Any) -> _NullEvent:
        return _NullEvent()

    def record(self, *args: Any, **kwargs: Any) -> None:
        return None

    def wait(self, *args: Any, **kwargs: Any) -> None:
        return None

    def query(self) -> bool:
        return True

    def elapsed_time(self, *args: Any, **kwargs: Any) -> float:
        return 0.0

    def __enter__(self) -> _NullStream:
        return self

    def __exit__(self, *args: Any) -> bool:
        return False


class _NullEvent(_NullStream):
    pass


class _CpuCuda:
    """torch.cuda as seen by megatron-core's training path: streams and devices mean the CPU."""

    Stream = _NullStream
    Event = _NullEvent
    current_stream = staticmethod(lambda *a, **k: _NullStream())
    default_stream = staticmethod(lambda *a, **k: _NullStream())
    stream = staticmethod(lambda *a, **k: _NullStream())
    current_device = staticmethod(lambda: "cpu")
    synchronize = staticmethod(lambda *a, **k: None)
    empty_cache = staticmethod(lambda: None)
    is_available = staticmethod(lambda: False)
    device_count = staticmethod(lambda: 1)
    get_rng_state = staticmethod(lambda *a, **k: torch.get_rng_state())
    set_rng_state = staticmethod(lambda state, *a, **k: torch.set_rng_state(state))
    manual_seed = staticmethod(lambda seed: torch.manual_seed(seed))
    memory_allocated = staticmethod(lambda *a, **k: 0)
    max_memory_allocated = staticmethod(lambda *a, **k: 0)
    memory_reserved = staticmethod(lambda *a, **k: 0)
    reset_peak_memory_stats = staticmethod(lambda *a, **k: None)
    # modelling_qwen3_vl/model.py:559: torch.cuda.nvtx.range_push raises "NVTX functions not installed" on CPU torch.
    nvtx = types.SimpleNamespace(
        range_push=lambda *a, **k: None, range_pop=lambda *a, **k: None, mark=lambda *a, **k: None
    )

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cuda, name)


def _cpu_device(device: Any) -> Any:
    if isinstance(device, str) and device.startswith("cuda"):
        return "cpu"
    if isinstance(device, int) and not isinstance(device, bool):
        return "cpu"
    if isinstance(device, torch.device) and device.type == "cuda":
        return torch.device("cpu")
    return device


def _on_cpu(factory: Callable[..., Any]) -> Callable[..., Any]:
    def make(*args: Any, **kwargs: Any) -> Any:
        if "device" in kwargs:
            kwargs["device"] = _cpu_device(kwargs["device"])
        return factory(*args, **kwargs)

    return make


class _CpuTorch(types.ModuleType):
    """`torch` with CUDA meaning the CPU, for the modules listed in CUDA_MODULES only."""

    cuda = _CpuCuda()

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


for _factory in ("zeros", "ones", "full", "tensor", "arange", "zeros_like", "ones_like",
                 "full_like", "randn", "rand", "as_tensor"):
    setattr(_CpuTorch, _factory, staticmethod(_on_cpu(getattr(torch, _factory))))
# (M11) torch.empty means zeros in these modules: megatron/core/optimizer/distrib_optimizer.py:1922 fills the gaps
# between parameters in the optimizer checkpoint (each parameter starts at a multiple of 64 in the grad buffer) with
# torch.empty, so two saves of the same optimizer state differ in those bytes. Nothing reads them as state; with
# zeros, the resume tests compare the checkpoints of two runs element by element.
_CpuTorch.empty = staticmethod(_on_cpu(torch.zeros))  # type: ignore[attr-defined]
_CpuTorch.empty_like = staticmethod(_on_cpu(torch.zeros_like))  # type: ignore[attr-defined]
_CpuTorch.device = staticmethod(  # type: ignore[attr-defined]
    lambda *a, **k: torch.device(_cpu_device(a[0]) if a else k.get("type"), *a[1:])
)
_CpuTorch.autocast = staticmethod(  # type: ignore[attr-defined]
    lambda device_type="cpu", *a, **k: torch.autocast(_cpu_device(device_type), *a, **k)
)
CPU_TORCH = _CpuTorch("torch")

#: (M6) megatron-core modules that hard-code CUDA (torch.cuda.Stream()/current_stream()/stream(),
#: device="cuda", torch.cuda.current_device()), each with its first failing line on CPU where known.
CUDA_MODULES: tuple[str, ...] = (
    "megatron.training.models.dist_utils",  # dist_utils.py:303 torch.cuda.Stream()
    "megatron.core.distributed.distributed_data_parallel",
    "megatron.core.distributed.param_and_grad_buffer",
    "megatron.core.distributed.finalize_model_grads",
    "megatron.core.optimizer.optimizer",
    "megatron.core.optimizer.distrib_optimizer",
    "megatron.core.optimizer.clip_grads",
    "megatron.core.optimizer",
    "megatron.core.pipeline_parallel.schedules",
    # rotary_pos_embedding.py:162 inv_freq.to(torch.cuda.current_device())
    "megatron.core.models.common.embeddings.rotary_pos_embedding",
    "megatron.core.models.common.embeddings.yarn_rotary_pos_embedding",
    "megatron.core.models.gpt.gpt_model",
    "megatron.core.transformer.attention",
    "megatron.core.transformer.dot_product_attention",
    "megatron.core.transformer.module",
    "megatron.core.transformer.transformer_layer",
    "megatron.core.transformer.transformer_block",
    "megatron.core.transformer.utils",
    "megatron.core.transformer.moe.moe_layer",
    "megatron.core.transformer.moe.moe_utils",
    "megatron.core.transformer.moe.moe_logging",
    "megatron.core.transformer.moe.router",
    "megatron.core.transformer.moe.shared_experts",
    "megatron.core.transformer.moe.token_dispatcher",
    "megatron.core.transformer.moe.experts",
    "megatron.core.tensor_parallel.data",
    "megatron.core.tensor_parallel.layers",
    "megatron.core.tensor_parallel.mappings",
    "megatron.core.tensor_parallel.utils",
    "megatron.core.pipeline_parallel.p2p_communication",
    "megatron.core.pipeline_parallel.utils",
    "megatron.core.utils",  # utils.py:715 GlobalMemoryBuffer.get_tensor(device=torch.cuda.current_device())
    "megatron.core.rerun_state_machine",
    "megatron.core.parallel_state",
    # dist_checkpointing/strategies/filesystem_async.py:248 torch.cuda.synchronize() at a save
    "megatron.core.dist_checkpointing.tensor_aware_state_dict",
    "megatron.core.dist_checkpointing.strategies.filesystem_async",
    "megatron.core.dist_checkpointing.strategies.state_dict_saver",
    "megatron.core.dist_checkpointing.strategies.fully_parallel",
    "megatron.core.dist_checkpointing.strategies.async_utils",
    "megatron.core.dist_checkpointing.exchange_utils",
    # Qwen3.5: gated_delta_net/common.py:230-249 nn.Conv1d/empty(device=torch.cuda.current_device())
    "megatron.core.ssm.gated_delta_net.common",
    "megatron.core.ssm.gated_delta_net.gdn",
    # modelling_qwen3_vl/rope.py:134 inv_freq on torch.cuda.current_device(); model.py:559 torch.cuda.nvtx
    "megatron.bridge.models.qwen_vl.modelling_qwen3_vl.rope",
    "megatron.bridge.models.qwen_vl.modelling_qwen3_vl.model",
    "megatron.bridge.models.qwen_vl.modelling_qwen3_vl.vision_model",
    "megatron.bridge.models.qwen_vl.modelling_qwen3_vl.text_model",
    "megatron.bridge.models.qwen_vl.modelling_qwen3_vl.attention",
    "megatron.bridge.models.qwen_vl.modelling_qwen3_vl.transformer_block",
    "megatron.bridge.models.qwen_vl.modelling_qwen3_vl.utils",
)


def _swap_torch(module: types.ModuleType) -> None:
    if getattr(module, "torch", None) is torch:
        module.torch = CPU_TORCH


for _name in CUDA_MODULES:
    after_import(_name)(_swap_torch)


# (M7, M9) --------------------------------------------------------------------------------------
_original_type = torch.Tensor.type


def _cuda_type_name(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    if not args and not kwargs:
        name = _original_type(self)
        return name.replace("torch.", "torch.cuda.", 1) if self.device.type == "cpu" else name
    return _original_type(self, *args, **kwargs)


def with_cuda_type_names(function: Callable[..., Any]) -> Callable[..., Any]:
    """`function` run while CPU tensors report CUDA type names (torch.Tensor.type())."""

    def run(*args: Any, **kwargs: Any) -> Any:
        torch.Tensor.type = _cuda_type_name  # type: ignore[method-assign]
        try:
            return function(*args, **kwargs)
        finally:
            torch.Tensor.type = _original_type  # type: ignore[method-assign]

    run.__wrapped__ = function  # type: ignore[attr-defined]
    return run


@after_import("megatron.core.optimizer.optimizer")
def _optimizer_type_names(module: types.ModuleType) -> None:
    """(M7) megatron/core/optimizer/optimizer.py:1009-1038 accepts only params whose .type() is
    'torch.cuda.{Half,BFloat16,Float}Tensor'."""
    cls = module.Float16OptimizerWithFloat16Params
    cls.__init__ = with_cuda_type_names(cls.__init__)
    _rebind_clip(module)


@after_import("megatron.core.optimizer.distrib_optimizer")
def _distributed_optimizer_type_names(module: types.ModuleType) -> None:
    """(M7) megatron/core/optimizer/distrib_optimizer.py:401-481, the same check while building groups."""
    cls = module.DistributedOptimizer
    cls.__init__ = with_cuda_type_names(cls.__init__)
    _rebind_clip(module)


CLIP_FUNCTIONS = ("clip_grad_by_total_norm_fp32", "count_zeros_fp32", "get_grad_norm_fp32")


@after_import("megatron.core.optimizer.clip_grads")
def _clip_type_names(module: types.ModuleType) -> None:
    """(M9) megatron/core/optimizer/clip_grads.py:174 asserts param.grad.type() == 'torch.cuda.FloatTensor'."""
    for name in CLIP_FUNCTIONS:
        if hasattr(module, name):
            setattr(module, name, with_cuda_type_names(getattr(module, name)))
    for user in ("megatron.core.optimizer.optimizer", "megatron.core.optimizer.distrib_optimizer"):
        if user in sys.modules:
            _rebind_clip(sys.modules[user])


def _rebind_clip(module: types.ModuleType) -> None:
    """The optimizers import the clip functions by name: point them at the wrapped ones."""
    clip = sys.modules.get("megatron.core.optimizer.clip_grads")
    if clip is None:
        return
    for name in CLIP_FUNCTIONS:
        if hasattr(module, name) and hasattr(clip, name):
            setattr(module, name, getattr(clip, name))


@after_import("megatron.core.transformer.dot_product_attention")
def _no_padding_mask_on_local_attention(module: types.ModuleType) -> None:
    """(M8) verl/models/mcore/model_forward.py:143-153 (bshd path, use_remove_padding=False) passes a
    [batch, seq] padding mask, already right-padded by preprocess_bshd. TE and flash attention ignore it
    for causal attention; megatron's local DotProductAttention masked_fill_s it into [b, heads, s, s]
    scores (megatron/core/transformer/utils.py:54): a shape error, and it would mask the valid tokens.
    Right-padded causal attention needs no mask: pass None (the causal mask is the default)."""
    cls = module.DotProductAttention
    original = cls.forward

    def forward(self: Any, query: Any, key: Any, value: Any, attention_mask: Any, *args: Any, **kwargs: Any) -> Any:
        if attention_mask is not None and attention_mask.dim() == 2:
            attention_mask = None
        packed = kwargs.pop("packed_seq_params", None)
        if packed is not None:
            return _packed_attention(original, self, query, key, value, packed, *args, **kwargs)
        return original(self, query, key, value, attention_mask, *args, **kwargs)

    cls.forward = forward


def _packed_attention(original: Any, self: Any, query: Any, key: Any, value: Any, packed: Any, *args: Any,
                      **kwargs: Any) -> Any:  # fmt: skip
    """(M13) megatron/core/transformer/dot_product_attention.py:153 refuses packed (THD) sequences; TE's attention
    takes them. Qwen3.5's vision tower always packs its images (modelling_qwen3_vl/vision_model.py:346), and
    verl's remove-padding path packs the text. Here each packed sequence is attended on its own, with the
    layer's own mask type: [t, heads, dim] (attention.py:1468 squeezes the batch) -> [t, 1, heads * dim]."""
    if packed.qkv_format != "thd":
        raise NotImplementedError(f"packed sequences in {packed.qkv_format!r} format on CPU")
    bounds = packed.cu_seqlens_q_padded if packed.cu_seqlens_q_padded is not None else packed.cu_seqlens_q
    edges = [int(edge) for edge in bounds.tolist()]
    outputs = [
        original(self, query[a:b].unsqueeze(1), key[a:b].unsqueeze(1), value[a:b].unsqueeze(1), None, *args, **kwargs)
        for a, b in zip(edges[:-1], edges[1:])
    ]
    return torch.cat(outputs, dim=0)


@after_import("megatron.core.optimizer.distrib_optimizer")
def _state_before_first_step(module: types.ModuleType) -> None:
    """(M10) megatron/core/optimizer/distrib_optimizer.py:838-839 (state_dict): without Apex or Transformer
    Engine (HAVE_APEX_OR_TE=False, line 35) the step is read from the torch optimizer's per-parameter state
    and `assert len(steps) == 1`. On resume verl loads the checkpoint into a freshly built optimizer, whose
    state is still empty (sharded_state_dict -> state_dict, line 1532): AssertionError. Allocate the state
    as torch's Adam(W) does at its first step (step 0, zero moments); the checkpoint then overwrites it."""
    if module.HAVE_APEX_OR_TE:
        return
    cls = module.DistributedOptimizer
    original = cls.state_dict

    def state_dict(self: Any) -> Any:
        inner = self.optimizer
        if isinstance(inner, torch.optim.Optimizer) and len(inner.state) == 0:
            for group in inner.param_groups:
                for param in group["params"]:
                    state = {
                        "step": torch.tensor(0.0),
                        "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
                        "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format),
                    }
                    if group.get("amsgrad"):
                        state["max_exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                    inner.state[param] = state
            log("DistributedOptimizer: optimizer state allocated before loading a checkpoint (no Apex/TE)")
        return original(self)

    cls.state_dict = state_dict


@after_import("megatron.core.optimizer.distrib_optimizer")
def _adam_step_from_the_checkpoint(module: types.ModuleType) -> None:
    """(M12) Without Apex or Transformer Engine, megatron-core 0.19.2's DistributedOptimizer.load_state_dict loses
    Adam's step on a resume, twice over (found by tests/e2e/test_resume.py: the resumed run's step was 146, then,
    with the first fixed, 1, where the uninterrupted run's was 2):
    - distrib_optimizer.py:1024-1032 gives every parameter's state the same `step` tensor, which torch's AdamW
      then increments in place once per parameter (`step_t += 1`): 146 per optimizer step on the smoke model;
    - distrib_optimizer.py:1958-1962 keeps `step` out of the dp_reshardable checkpoint as a
      LocalNonpersistentObject holding the template's tensor, i.e. the step before the load (0 in a fresh
      process), and _set_main_param_and_optimizer_states (line 1193) then copies it over the loaded one.
    With Transformer Engine's FusedAdam the step lives in the param groups, not per parameter. Here each
    parameter gets its own tensor holding the step of the checkpoint's param groups, after the load."""
    if module.HAVE_APEX_OR_TE:
        return
    cls = module.DistributedOptimizer
    original = cls.load_state_dict

    def load_state_dict(self: Any, state_dict: Any) -> Any:
        steps = {float(group["step"]) for group in state_dict["optimizer"]["param_groups"] if "step" in group}
        result = original(self, state_dict)
        inner = self.optimizer
        if len(steps) == 1 and isinstance(inner, torch.optim.Optimizer):
            step = steps.pop()
            for state in inner.state.values():
                if isinstance(state.get("step"), torch.Tensor):
                    state["step"] = torch.tensor(step, dtype=state["step"].dtype)
        return result

    cls.load_state_dict = load_state_dict


#: Logged once per process, after the actor's first optimizer step: what the Megatron worker really holds
#: (tests/e2e/test_memory_fit.py compares it with recipe.memory_fit's estimate of the same model and layout).
HELD_LINE = "actor holds after its first optimizer step: weights={weights} gradients={gradients} optimizer={optimizer} bytes"


def _bytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@after_import("megatron.core.optimizer.optimizer")
def _report_held_bytes(module: types.ModuleType) -> None:
    """A measurement, not a workaround: after the first ChainedOptimizer.step, the bytes of the model's parameters,
    of their main gradients (views into the DDP buffers, without the buffers' padding), and of the optimizer's
    fp32 master parameters and per-parameter state (Adam's moments; the step counters are scalars)."""
    cls = module.ChainedOptimizer
    original = cls.step
    reported: list[bool] = []

    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        if not reported:
            reported.append(True)
            params = list({id(p): p for chunk in self.model_chunks for p in chunk.parameters()}.values())
            grads = [p.main_grad for p in params if getattr(p, "main_grad", None) is not None]
            master, state = [], []
            for optimizer in self.chained_optimizers:
                inner = optimizer.optimizer
                for group in inner.param_groups:
                    master += list(group["params"])
                state += [t for s in inner.state.values() for t in s.values() if isinstance(t, torch.Tensor) and t.numel() > 1]
            log(HELD_LINE.format(weights=_bytes(params), gradients=_bytes(grads), optimizer=_bytes(master) + _bytes(state)))
        return result

    cls.step = step
