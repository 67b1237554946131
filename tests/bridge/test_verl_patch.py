"""verl 0.9.1's transformer_config.json write, with the real Qwen3.5 provider of Megatron-Bridge.

The provider is built from a tiny `qwen3_5_moe` config and finalized with the overrides
verl's Megatron engine applies (workers/engine/megatron/transformer_impl.py), minus the
fused kernels that need Transformer Engine. The manager is verl's own class; only the
attributes `_save_transformer_config` reads are set.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.needs import TRAINER_EXTRA, needs
from tests.support.tiny_qwen35 import tiny_qwen35_config

torch = needs("torch", install=TRAINER_EXTRA)
needs("verl", install=f"{TRAINER_EXTRA}: the guard patches verl (docs/export.md)")

from recipe.export import verl_patch  # noqa: E402


@pytest.fixture(scope="module")
def manager_module() -> Any:
    import verl.utils.checkpoint.megatron_checkpoint_manager as module

    return module


def qwen35_provider() -> Any:
    """Megatron-Bridge's Qwen3.5 provider, finalized the way verl's Megatron engine does it."""
    from megatron.bridge import AutoBridge
    from megatron.core.transformer.enums import AttnBackend

    provider = AutoBridge.from_hf_config(tiny_qwen35_config()).to_megatron_provider(load_weights=False)
    overrides = {
        "tensor_model_parallel_size": 1,
        "pipeline_model_parallel_size": 1,
        "expert_model_parallel_size": 1,
        "expert_tensor_parallel_size": 1,
        "virtual_pipeline_model_parallel_size": None,
        "context_parallel_size": 1,
        "sequence_parallel": False,
        "overlap_p2p_comm": False,
        "batch_p2p_comm": False,
        "variable_seq_lengths": True,
        "attention_backend": AttnBackend.flash,
        "moe_token_dispatcher_type": "alltoall",
        "moe_router_load_balancing_type": "none",
        "moe_aux_loss_coeff": 0.01,  # the recipe's override_transformer_config values
        "moe_z_loss_coeff": 0.001,
        # The recipe turns these on; they need Transformer Engine, absent on CPU.
        "moe_permute_fusion": False,
        "moe_grouped_gemm": False,
    }
    provider.apply_overrides_and_finalize(dtype=torch.bfloat16, overrides=overrides)
    return provider


def bare_manager(module: Any, transformer_config: Any) -> Any:
    manager = object.__new__(module.MegatronCheckpointManager)
    manager.rank = 0
    manager.transformer_config = transformer_config
    return manager


@pytest.fixture
def unpatched(manager_module: Any) -> Any:
    """verl's own method during the test, whatever another test installed."""
    cls = manager_module.MegatronCheckpointManager
    current = cls._save_transformer_config
    original = getattr(current, "__wrapped__", current)
    cls._save_transformer_config = original
    yield original
    cls._save_transformer_config = current


def test_verl_091_writes_the_real_provider_but_drops_fields(
    manager_module: Any, unpatched: Any, tmp_path: Path
) -> None:
    provider = qwen35_provider()
    assert type(provider).__name__ == "Qwen35VLMoEModelProvider"
    bare_manager(manager_module, provider)._save_transformer_config(str(tmp_path))
    written = json.loads((tmp_path / "transformer_config.json").read_text())
    assert written["num_moe_experts"] == 4 and written["attention_backend"] == "AttnBackend.flash"
    # The filter removes what it does not know before json.dump's default= can see it.
    for lost in ("vision_config", "transformer_layer_spec", "activation_func"):
        assert lost not in written, lost


def test_verl_091_still_raises_on_an_odd_numpy_value(manager_module: Any, unpatched: Any, tmp_path: Path) -> None:
    import numpy as np

    provider = qwen35_provider()
    provider.moe_aux_loss_coeff = np.complex128(0.01)
    with pytest.raises(ValueError, match="Circular reference"):
        bare_manager(manager_module, provider)._save_transformer_config(str(tmp_path))


def test_guard_writes_everything_and_never_raises(manager_module: Any, unpatched: Any, tmp_path: Path) -> None:
    import numpy as np

    assert verl_patch.install() is True
    patched = manager_module.MegatronCheckpointManager._save_transformer_config
    assert patched is not unpatched and patched.__wrapped__ is unpatched

    provider = qwen35_provider()
    provider.moe_aux_loss_coeff = np.complex128(0.01)
    bare_manager(manager_module, provider)._save_transformer_config(str(tmp_path))

    def reject(constant: str) -> None:
        raise ValueError(constant)

    written = json.loads((tmp_path / "transformer_config.json").read_text(), parse_constant=reject)
    assert written["vision_config"]["depth"] == 1
    assert written["vision_config"]["out_hidden_size"] == 32
    assert written["moe_aux_loss_coeff"] == "(0.01+0j)"
    assert written["activation_func"].startswith("<callable ")
    assert written["num_moe_experts"] == 4 and written["attention_backend"] == "AttnBackend.flash"
    # A rank other than 0 writes nothing, as in verl.
    other = tmp_path / "rank1"
    manager = bare_manager(manager_module, provider)
    manager.rank = 1
    manager._save_transformer_config(str(other))
    assert not (other / "transformer_config.json").exists()


def test_guard_refuses_unverified_versions(
    manager_module: Any, unpatched: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING", logger="recipe.export.verl_patch"):
        assert verl_patch.install(versions=("0.8.0",)) is False
    assert manager_module.MegatronCheckpointManager._save_transformer_config is unpatched
    assert "transformer_config.json guard not installed (checked against verl 0.8.0 only)" in caplog.text


def test_guard_applies_on_import_without_importing_megatron(tmp_path: Path) -> None:
    """In a fresh process: install() imports neither verl's module nor megatron; the import patches."""
    script = f"""
import sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
import tests.bridge.conftest  # the test-only import shims
from recipe.export import verl_patch
assert verl_patch.install() is True
assert "megatron.core" not in sys.modules and verl_patch.TARGET_MODULE not in sys.modules
import verl.utils.checkpoint.megatron_checkpoint_manager as m
assert getattr(m.MegatronCheckpointManager._save_transformer_config, "__recipe_json_safe__", False)
print("PATCHED")
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "PATCHED" in result.stdout
