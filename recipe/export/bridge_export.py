"""Export the latest verl Megatron checkpoint to Hugging Face with Megatron-Bridge, then check it.

Where the weights come from: verl 0.9.1 saves Megatron model shards under
`global_step_<N>/actor/model/dist_ckpt/` only with `megatron.use_dist_checkpointing=True`.
With it off (verl's default, and the recipe's), a checkpoint's model weights exist only
as the HF export verl wrote at that save (`actor/model/huggingface/`): there is nothing
to re-export, and this module says so and points at `verify-export`.

How: the Megatron model is built from MODEL_PATH's config by Megatron-Bridge (as verl's
engine does), the dist checkpoint is loaded into it with megatron-core's
dist_checkpointing (which reshards: the export may use other parallel sizes than
training), the bridge writes HF safetensors with the chosen strictness, the config and
tokenizer files are copied from MODEL_PATH, and the result is checked against the
model class and against MODEL_PATH.

Limits (measured, see docs/export.md): it runs as one process (world size 1), with the
whole model in that process's memory. On cpu it builds Megatron's local (non-Transformer
Engine) layers: megatron-core's local spec for Qwen3 / Qwen3-MoE, and for Qwen3.5's hybrid
block and vision tower the stand-ins of recipe.export.cpu_layers, which keep TE's parameter
names. An export never runs the model: it only needs the modules and their parameter names.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Literal

from recipe.export.cpu_layers import cpu_build
from recipe.export.expected import ExportCheckError
from recipe.export.hf_check import DEFAULT_ALLOWED_PATTERNS, verify_export
from recipe.export.report import ExportReport
from recipe.export.watch import MANIFEST, STEP_DIR, _step_dirs

logger = logging.getLogger("recipe.export.bridge_export")

DIST_CKPT_SUBDIR = "actor/model/dist_ckpt"
DIST_CKPT_METADATA = "metadata.json"
#: Files of MODEL_PATH that are weights; everything else (config, tokenizer, processor) is copied.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
_WEIGHT_NAMES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


class ExportError(Exception):
    """The export cannot be made (no finished checkpoint, no Megatron weights in it, ...)."""


def latest_checkpoint(checkpoint_dir: Path) -> Path:
    """The finished `global_step_<N>` directory with the highest N (verl writes the manifest last)."""
    finished = [d for d in _step_dirs(Path(checkpoint_dir), 3) if (d / MANIFEST).is_file()]
    if not finished:
        raise ExportError(f"{checkpoint_dir}: no finished verl checkpoint (global_step_N/{MANIFEST}) found")
    return max(finished, key=lambda d: int(STEP_DIR.match(d.name).group(1)))  # type: ignore[union-attr]


@contextmanager
def one_process_world() -> Iterator[None]:
    """torch.distributed and Megatron's parallel state for one process; what it sets up, it tears down.

    A process group left in place keeps its gloo threads and the TCP store's server thread
    running while the interpreter exits, where a thread can use memory the exit already
    freed: a finished export would then end in a segmentation fault (exit 139). A world that
    already existed (a caller's) is left to that caller.
    """
    import torch  # lazy: torch is heavy or absent where this module is imported; loaded only here
    # lazy: megatron is heavy or absent where this module is imported; loaded only here
    from megatron.core import parallel_state

    made_world = not torch.distributed.is_initialized()
    if made_world:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" not in os.environ:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                os.environ["MASTER_PORT"] = str(sock.getsockname()[1])
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        torch.distributed.init_process_group(backend=backend, rank=0, world_size=1)
    made_parallel_state = False
    try:
        if torch.distributed.get_world_size() != 1:
            raise ExportError(f"export runs as one process; world size is {torch.distributed.get_world_size()}")
        made_parallel_state = not parallel_state.model_parallel_is_initialized()
        if made_parallel_state:
            parallel_state.initialize_model_parallel()
        yield
    finally:
        if made_parallel_state:
            parallel_state.destroy_model_parallel()
            _forget_leftover_groups(parallel_state, torch.distributed.ProcessGroup)
        if made_world:
            torch.distributed.destroy_process_group()


def _forget_leftover_groups(parallel_state: Any, group_type: type) -> None:
    """Reset the module globals of Megatron's parallel state that still hold a process group.

    megatron-core 0.19.2's destroy_model_parallel leaves _INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP
    and its _GLOO twin set; a group kept alive there keeps its threads after the world is
    destroyed. Any global of that kind is reset, so a later version's new group is covered too.
    """
    for name, value in list(vars(parallel_state).items()):
        values = value if isinstance(value, (list, tuple)) else value.values() if isinstance(value, dict) else [value]
        if name.startswith("_") and name.isupper() and any(isinstance(item, group_type) for item in values):
            setattr(parallel_state, name, None)


def use_cpu_layers(provider: Any) -> None:
    """Set a Megatron-Bridge provider up for CPU: local (non-TE) layers, no fused kernels, no bf16.

    Those kernels need Transformer Engine / CUDA. Qwen3.5's providers ignore
    `transformer_layer_spec`: build them inside recipe.export.cpu_layers.cpu_build().
    No initialisation either: the weights all come from the checkpoint (and Gated DeltaNet's
    initialisation forks megatron-core's CUDA RNG tracker, gated_delta_net/common.py:302).
    """
    # lazy: megatron is heavy or absent where this module is imported; loaded only here
    from megatron.bridge.models.gpt_provider import local_layer_spec

    provider.transformer_layer_spec = local_layer_spec
    provider.use_cpu_initialization = True
    provider.moe_token_dispatcher_type = "allgather"
    provider.moe_grouped_gemm = False
    for fused in (
        "moe_permute_fusion",
        "apply_rope_fusion",
        "bias_activation_fusion",
        "masked_softmax_fusion",
        "bias_dropout_fusion",
        "persist_layer_norm",
        "cross_entropy_loss_fusion",
        "gradient_accumulation_fusion",
    ):
        if hasattr(provider, fused):
            setattr(provider, fused, False)
    provider.bf16 = provider.fp16 = False
    provider.perform_initialization = False


def _build_model(bridge: Any, device: Literal["cpu", "cuda"]) -> list[Any]:
    """An empty Megatron model for the bridge's config, on one process."""
    import torch  # lazy: torch is heavy or absent where this module is imported; loaded only here

    provider = bridge.to_megatron_provider(load_weights=False)
    provider.tensor_model_parallel_size = provider.pipeline_model_parallel_size = 1
    provider.expert_model_parallel_size = provider.context_parallel_size = 1
    provider.expert_tensor_parallel_size = 1
    provider.sequence_parallel = False
    if device == "cpu":
        use_cpu_layers(provider)
        provider.params_dtype = torch.float32
    build = cpu_build() if device == "cpu" else nullcontext()
    with build:
        provider.finalize()
        return provider.provide_distributed_model(  # type: ignore[no-any-return]
            wrap_with_ddp=False,
            use_cpu_initialization=device == "cpu",
            bf16=provider.bf16,
            fp16=provider.fp16,
        )


def load_verl_dist_checkpoint(model: list[Any], dist_ckpt_dir: Path) -> None:
    """Load verl's `model/dist_ckpt` (keys `model`, or `model<i>` per virtual stage) into `model`."""
    # lazy: megatron is heavy or absent where this module is imported; loaded only here
    from megatron.core import dist_checkpointing, parallel_state

    metadata = dict(dist_checkpointing.load_content_metadata(str(dist_ckpt_dir)) or {})
    metadata["dp_cp_group"] = parallel_state.get_data_parallel_group(with_context_parallel=True)
    keys = ["model"] if len(model) == 1 else [f"model{i}" for i in range(len(model))]
    sharded = {key: chunk.sharded_state_dict(metadata=metadata) for key, chunk in zip(keys, model)}
    state = dist_checkpointing.load(sharded, str(dist_ckpt_dir))
    for key, chunk in zip(keys, model):
        chunk.load_state_dict(state[key], strict=True)


def _copy_non_weights(model_path: Path, out_dir: Path) -> None:
    for item in model_path.iterdir():
        if item.is_file() and not item.name.endswith(_WEIGHT_SUFFIXES) and item.name not in _WEIGHT_NAMES:
            shutil.copy2(item, out_dir / item.name)


def export_latest(
    checkpoint_dir: Path,
    model_path: Path,
    out_dir: Path,
    strict: bool = False,
    allowed_patterns: Sequence[str] = DEFAULT_ALLOWED_PATTERNS,
    device: Literal["cpu", "cuda"] | None = None,
) -> ExportReport:
    """Export the newest finished checkpoint's Megatron weights to `out_dir` as HF, and check it.

    `strict` is Megatron-Bridge's strict key matching (False writes what matches). The
    returned report compares the export with its model class and with `model_path`.
    Raises ExportError when there is nothing to export, and whatever Megatron-Bridge
    raises when strict=True finds a mismatch.
    """
    # The inputs first: a missing checkpoint or model is one line, before seconds of imports.
    step_dir = latest_checkpoint(Path(checkpoint_dir))
    dist_ckpt = step_dir / DIST_CKPT_SUBDIR
    # verl 0.9.1 creates model/dist_ckpt at every save, empty unless use_dist_checkpointing is on:
    # the weights are there only when megatron-core's dist_checkpointing wrote its metadata.json.
    if not (dist_ckpt / DIST_CKPT_METADATA).is_file():
        hf_dir = step_dir / "actor" / "model" / "huggingface"
        raise ExportError(
            f"{step_dir}: no Megatron model weights ({DIST_CKPT_SUBDIR}); with use_dist_checkpointing off the "
            f"HF export verl wrote is the only copy of them: check it with `verify-export {hf_dir}`"
        )
    model_path, out_dir = Path(model_path), Path(out_dir)
    if not (model_path / "config.json").is_file():
        raise ExportError(f"MODEL_PATH={str(model_path)!r}: no config.json there")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ExportError(f"{out_dir}: not empty (an export never mixes with older files)")
    try:
        import torch  # lazy: torch is heavy or absent where this module is imported; loaded only here
        # lazy: megatron is heavy or absent where this module is imported; loaded here to refuse early
        from megatron.bridge import AutoBridge  # noqa: F401 - only whether it loads; _write_export uses it
    except Exception as error:  # noqa: BLE001 - any failure to load is the same answer: not here
        # Megatron-Bridge 0.6.2 needs Python >= 3.12 (typing.override) and its GPU stack; a
        # development venv on 3.11 has neither. One line, not the import's traceback.
        raise ExportError(
            f"Megatron-Bridge cannot be loaded here ({type(error).__name__}: {error}); export runs in the "
            "image: docker compose run --rm gpu export --out DIR (or npu)"
        ) from None
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    with one_process_world():
        # The model lives in _write_export's frame only, so that it (and the process groups
        # it holds) is gone before the world is torn down.
        _write_export(dist_ckpt, model_path, out_dir, strict, device)
    try:
        return verify_export(out_dir, allowed_patterns, reference=model_path)
    except ExportCheckError as error:
        raise ExportError(str(error)) from error


def _write_export(dist_ckpt: Path, model_path: Path, out_dir: Path, strict: bool, device: Literal["cpu", "cuda"]) -> None:
    """Build the model, load the dist checkpoint into it, write HF weights and the non-weight files."""
    import torch  # lazy: torch is heavy or absent where this module is imported; loaded only here
    # lazy: megatron is heavy or absent where this module is imported; loaded only here
    from megatron.bridge import AutoBridge

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    bridge = AutoBridge.from_hf_pretrained(str(model_path), dtype=dtype)
    model = _build_model(bridge, device)
    logger.info("loading %s", dist_ckpt)
    load_verl_dist_checkpoint(model, dist_ckpt)
    out_dir.mkdir(parents=True, exist_ok=True)
    _copy_non_weights(model_path, out_dir)
    logger.info("writing HF weights to %s (strict=%s)", out_dir, strict)
    bridge.save_hf_weights(model, str(out_dir), strict=strict, show_progress=False)
