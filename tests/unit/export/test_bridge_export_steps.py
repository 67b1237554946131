"""The export's steps that hand values to Megatron-Bridge and megatron-core: the CPU set-up of the provider, the
one-process model it builds, the keys it loads verl's dist checkpoint under, and what it writes where.

Megatron-Bridge needs Python >= 3.12 and is not in the development venv: its objects are small recording
stand-ins here, so these tests pin what the recipe asks of it (sizes, flags, dtypes, keys, paths). Whether
Megatron-Bridge does the right thing with them is tests/bridge's job, in the image.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from recipe.export import bridge_export
from recipe.export.bridge_export import (
    _build_model,
    _write_export,
    load_verl_dist_checkpoint,
    use_cpu_layers,
)

torch = pytest.importorskip("torch")

#: Megatron's kernel switches that need Transformer Engine or CUDA (docs/export.md: the CPU export runs none).
FUSED = (
    "moe_permute_fusion",
    "apply_rope_fusion",
    "bias_activation_fusion",
    "masked_softmax_fusion",
    "bias_dropout_fusion",
    "persist_layer_norm",
    "cross_entropy_loss_fusion",
    "gradient_accumulation_fusion",
)
LOCAL_SPEC = object()  # stands for megatron.bridge.models.gpt_provider.local_layer_spec


@pytest.fixture
def bridge_modules(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """An importable stand-in for the parts of megatron.bridge the export imports."""
    bridge = types.ModuleType("megatron.bridge")
    models = types.ModuleType("megatron.bridge.models")
    gpt_provider = types.ModuleType("megatron.bridge.models.gpt_provider")
    gpt_provider.local_layer_spec = LOCAL_SPEC  # type: ignore[attr-defined]
    for module in (bridge, models, gpt_provider):
        monkeypatch.setitem(sys.modules, module.__name__, module)
    return bridge


class Provider(types.SimpleNamespace):
    """A Megatron-Bridge model provider that records what is done with it."""

    def __init__(self, **fields: Any) -> None:
        super().__init__(**fields)
        self.events: list[Any] = []

    def finalize(self) -> None:
        self.events.append("finalize")

    def provide_distributed_model(self, **kwargs: Any) -> list[str]:
        self.events.append(("provide", kwargs))
        return ["the model"]


def test_cpu_layers_are_local_unfused_fp32_and_never_initialised(
    bridge_modules: types.ModuleType,
) -> None:
    provider = Provider(
        **{name: True for name in FUSED}, bf16=True, fp16=True, moe_grouped_gemm=True
    )
    use_cpu_layers(provider)
    assert (
        {k: v for k, v in vars(provider).items() if k != "events"}
        == {
            **{name: False for name in FUSED},
            "transformer_layer_spec": LOCAL_SPEC,
            "use_cpu_initialization": True,
            "moe_token_dispatcher_type": "allgather",  # the one dispatcher without a fused (CUDA) path
            "moe_grouped_gemm": False,
            "bf16": False,
            "fp16": False,
            "perform_initialization": False,  # the weights all come from the checkpoint
        }
    )


def test_cpu_layers_leave_switches_a_provider_lacks_unset(
    bridge_modules: types.ModuleType,
) -> None:
    provider = Provider()  # an older provider without any fused-kernel field
    use_cpu_layers(provider)
    assert not any(hasattr(provider, name) for name in FUSED)


class Bridge:
    """An AutoBridge that hands out one Provider and records the weights it is asked to save."""

    def __init__(self) -> None:
        self.provider = Provider(bf16=True, fp16=False)
        self.asked: list[Any] = []

    def to_megatron_provider(self, load_weights: bool) -> Provider:
        self.asked.append(("provider", load_weights))
        return self.provider

    def save_hf_weights(self, model: Any, path: str, **kwargs: Any) -> None:
        self.asked.append(("save", model, path, kwargs))


@pytest.fixture
def cpu_steps(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """use_cpu_layers and cpu_build recorded: which CPU steps a build took, and in what order."""
    steps: list[str] = []

    @contextlib.contextmanager
    def cpu_build() -> Iterator[None]:
        steps.append("cpu_build entered")
        yield
        steps.append("cpu_build left")

    monkeypatch.setattr(
        bridge_export,
        "use_cpu_layers",
        lambda provider: steps.append(f"use_cpu_layers({type(provider).__name__})"),
    )
    monkeypatch.setattr(bridge_export, "cpu_build", cpu_build)
    return steps


ONE_PROCESS = {
    "tensor_model_parallel_size": 1,
    "pipeline_model_parallel_size": 1,
    "expert_model_parallel_size": 1,
    "context_parallel_size": 1,
    "expert_tensor_parallel_size": 1,
    "sequence_parallel": False,
}


def test_a_cpu_model_is_one_process_local_fp32_and_built_inside_cpu_build(
    cpu_steps: list[str],
) -> None:
    bridge = Bridge()
    assert _build_model(bridge, "cpu") == ["the model"]
    provider = bridge.provider
    assert bridge.asked == [
        ("provider", False)
    ]  # an empty model: the weights come from the checkpoint
    assert {k: getattr(provider, k) for k in ONE_PROCESS} == ONE_PROCESS
    assert provider.params_dtype is torch.float32
    assert cpu_steps == [
        "use_cpu_layers(Provider)",
        "cpu_build entered",
        "cpu_build left",
    ]
    assert provider.events == [
        "finalize",
        (
            "provide",
            {
                "wrap_with_ddp": False,
                "use_cpu_initialization": True,
                "bf16": True,
                "fp16": False,
            },
        ),
    ]


def test_a_cuda_model_is_one_process_with_the_providers_own_layers(
    cpu_steps: list[str],
) -> None:
    bridge = Bridge()
    assert _build_model(bridge, "cuda") == ["the model"]
    provider = bridge.provider
    assert {k: getattr(provider, k) for k in ONE_PROCESS} == ONE_PROCESS
    assert not hasattr(provider, "params_dtype") and cpu_steps == []
    assert provider.events == [
        "finalize",
        (
            "provide",
            {
                "wrap_with_ddp": False,
                "use_cpu_initialization": False,
                "bf16": True,
                "fp16": False,
            },
        ),
    ]


class Chunk:
    """One virtual-pipeline stage of a Megatron model: hands out its sharded state dict, records its load."""

    def __init__(self, name: str) -> None:
        self.name, self.loaded = name, []  # type: str, list[Any]
        self.metadata: dict[str, Any] | None = None

    def sharded_state_dict(self, metadata: dict[str, Any]) -> str:
        self.metadata = metadata
        return f"sharded {self.name}"

    def load_state_dict(self, state: Any, strict: bool) -> None:
        self.loaded.append((state, strict))


@pytest.fixture
def dist_checkpointing(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """megatron-core's dist_checkpointing and data-parallel group recorded (no world, no files)."""
    from megatron.core import dist_checkpointing as dc
    from megatron.core import parallel_state

    calls: list[Any] = []

    def load(sharded: dict[str, str], path: str) -> dict[str, str]:
        calls.append(("load", sharded, path))
        return {key: f"state of {value}" for key, value in sharded.items()}

    monkeypatch.setattr(
        dc,
        "load_content_metadata",
        lambda path: calls.append(("metadata", path)) or {"format": "verl"},
    )
    monkeypatch.setattr(dc, "load", load)
    monkeypatch.setattr(
        parallel_state,
        "get_data_parallel_group",
        lambda with_context_parallel: f"dp-cp={with_context_parallel}",
    )
    return calls


def test_a_single_stage_model_loads_verls_model_key_strictly(
    tmp_path: Path, dist_checkpointing: list[Any]
) -> None:
    chunk = Chunk("stage")
    load_verl_dist_checkpoint([chunk], tmp_path)
    assert dist_checkpointing == [
        ("metadata", str(tmp_path)),
        ("load", {"model": "sharded stage"}, str(tmp_path)),
    ]
    # The checkpoint's own content metadata, plus the group that shards it on load.
    assert chunk.metadata == {"format": "verl", "dp_cp_group": "dp-cp=True"}
    assert chunk.loaded == [("state of sharded stage", True)]


def test_virtual_stages_load_under_model0_model1(
    tmp_path: Path, dist_checkpointing: list[Any]
) -> None:
    chunks = [Chunk("a"), Chunk("b")]
    load_verl_dist_checkpoint(chunks, tmp_path)
    assert dist_checkpointing[1] == (
        "load",
        {"model0": "sharded a", "model1": "sharded b"},
        str(tmp_path),
    )
    assert [c.loaded for c in chunks] == [
        [("state of sharded a", True)],
        [("state of sharded b", True)],
    ]


def test_a_checkpoint_without_content_metadata_still_gets_the_group(
    tmp_path: Path, dist_checkpointing: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from megatron.core import dist_checkpointing as dc

    monkeypatch.setattr(dc, "load_content_metadata", lambda path: None)
    chunk = Chunk("stage")
    load_verl_dist_checkpoint([chunk], tmp_path)
    assert chunk.metadata == {"dp_cp_group": "dp-cp=True"}


@pytest.mark.parametrize(
    ("device", "dtype"), [("cpu", "float32"), ("cuda", "bfloat16")]
)
def test_the_export_writes_config_and_tokenizer_then_the_weights_with_the_strictness_asked(
    tmp_path: Path, bridge_modules: types.ModuleType, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    device: str, dtype: str,
) -> None:  # fmt: skip
    bridge = Bridge()
    made: list[Any] = []

    class AutoBridge:
        @staticmethod
        def from_hf_pretrained(path: str, dtype: Any) -> Bridge:
            made.append((path, dtype))
            return bridge

    def load(model: Any, dist_ckpt: Path) -> None:
        made.append(("load", model, dist_ckpt, sorted(p.name for p in out.glob("*"))))

    bridge_modules.AutoBridge = AutoBridge  # type: ignore[attr-defined]
    monkeypatch.setattr(
        bridge_export,
        "_build_model",
        lambda b, d: made.append(("build", b, d)) or ["m"],
    )
    monkeypatch.setattr(bridge_export, "load_verl_dist_checkpoint", load)
    source, out = tmp_path / "model", tmp_path / "new" / "out"
    source.mkdir()
    if device == "cuda":
        out.mkdir(
            parents=True
        )  # an empty target the user made is fine (export_latest refuses a non-empty one)
    (source / "config.json").write_text("{}")
    (source / "model.safetensors").write_text("source weights")
    with caplog.at_level(logging.INFO, logger="recipe.export.bridge_export"):
        _write_export(tmp_path / "dist_ckpt", source, out, True, device)  # type: ignore[arg-type]
    # The model is loaded before anything is written: a failed load leaves no half export.
    assert made == [
        (str(source), getattr(torch, dtype)),
        ("build", bridge, device),
        ("load", ["m"], tmp_path / "dist_ckpt", []),
    ]
    assert bridge.asked == [
        ("save", ["m"], str(out), {"strict": True, "show_progress": False})
    ]
    assert sorted(p.name for p in out.iterdir()) == ["config.json"]
    assert [r.getMessage() for r in caplog.records] == [
        f"loading {tmp_path / 'dist_ckpt'}",
        f"writing HF weights to {out} (strict=True)",
    ]
