"""Megatron-Bridge on CPU: import shims, a gloo world of one, and a tiny Qwen3-MoE.

Megatron-Bridge 0.6.2 and megatron-core 0.19.2 declare Python >= 3.12 and import
GPU-only packages; they work on CPU with Python 3.11 after the two import shims of
tests/support/megatron_py311.py (installed below when the packages are there).
"""

from __future__ import annotations

import gc
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from tests.support.needs import MEGATRON_BRIDGE, installed
from tests.support.ports import free_port
from tests.support.skip_policy import pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401
from tests.support.megatron_py311 import install_shims
from tests.support.threads import distributed_threads, thread_names
from tests.support.tiny_qwen35 import load_all

REQUIRED = ("torch", "transformers", "megatron.core", "megatron.bridge", "modelopt", "triton")

#: Not installed at all (a package that is there but fails to import is not "missing": the
#: tests that import it fail with its real error).
_MISSING = [name for name in REQUIRED if not installed(name)]
#: Why every test here is skipped on this machine, or None when they can run (under CI=true
#: such a skip is a failure: tests/support/skip_policy.py).
SKIP_REASON = (
    f"Megatron-Bridge CPU tests need {', '.join(_MISSING)}, which is not installed "
    f"(install step: {MEGATRON_BRIDGE})"
    if _MISSING
    else None
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip (with the reason) every test of this directory when the packages are absent."""
    if SKIP_REASON is None:
        return
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


if SKIP_REASON is None:
    install_shims()
    import torch
    from safetensors.torch import save_file


def _stop_megatrons_write_results_manager() -> None:
    """megatron-core's torch_dist save keeps its write results in a multiprocessing Manager's queue, a process of its
    own made once per interpreter (dist_checkpointing/strategies/filesystem_async.py, `_results_queue`) and never
    shut down: a pytest that ends with os._exit (tests/support/process_end.py) left it running, an orphan of 270 MB.
    """
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    queue = filesystem_async._results_queue
    if queue is not None:
        queue._manager.shutdown()
        filesystem_async._results_queue = None


@pytest.fixture(scope="session")
def gloo_world() -> Iterator[None]:
    """torch.distributed (gloo, world size 1) and Megatron's parallel state, all sizes 1: the export's own."""
    from recipe.export.bridge_export import one_process_world

    os.environ["MASTER_PORT"] = str(free_port())
    with one_process_world():
        yield
    _stop_megatrons_write_results_manager()
    # A process group ends its threads only when the last reference to it goes (the models
    # hold some). One still running when the interpreter exits can crash the exit.
    gc.collect()
    left = distributed_threads(thread_names())
    assert not left, f"{len(left)} torch.distributed threads outlive the gloo world: {sorted(set(left))}"


def tiny_qwen3_moe_config() -> Any:
    """A Qwen3-MoE small enough for CPU: 2 layers, 4 experts, hidden 32."""
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )


@pytest.fixture(scope="session")
def qwen3_moe_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen3-MoE as an HF checkpoint in several shards with an index (like a Hub model)."""
    from transformers import Qwen3MoeForCausalLM

    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("qwen3moe") / "source"
    Qwen3MoeForCausalLM(tiny_qwen3_moe_config()).save_pretrained(directory, max_shard_size="20KB")
    assert len(list(directory.glob("*.safetensors"))) > 2
    return directory


def cpu_provider(bridge: Any, load_weights: bool) -> Any:
    """The bridge's provider set up for CPU: local layer specs, no fused kernels, fp32."""
    from recipe.export.bridge_export import use_cpu_layers

    provider = bridge.to_megatron_provider(load_weights=load_weights)
    use_cpu_layers(provider)
    provider.params_dtype = torch.float32
    provider.finalize()
    return provider


@pytest.fixture(scope="session")
def megatron_model(gloo_world: None, qwen3_moe_source: Path) -> Iterator[list[Any]]:
    """The tiny Qwen3-MoE as a Megatron GPTModel, weights loaded from the source by the bridge."""
    from megatron.bridge import AutoBridge

    bridge = AutoBridge.from_hf_pretrained(str(qwen3_moe_source), dtype=torch.float32)
    model = cpu_provider(bridge, load_weights=True).provide_distributed_model(
        wrap_with_ddp=False, use_cpu_initialization=True, bf16=False, fp16=False
    )
    yield model
    model.clear()  # the model holds process groups: it goes before the gloo world does


def derive_source(
    source: Path, target: Path, change: Callable[[dict[str, torch.Tensor], dict[str, str]], None]
) -> Path:
    """A copy of `source` whose tensors and index were changed by `change(tensors, weight_map)`.

    Tensors keep their shard when they stay; a new tensor goes to the shard `weight_map` names.
    """
    shutil.copytree(source, target)
    index_path = target / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    tensors = load_all(target)
    change(tensors, index["weight_map"])
    for shard in target.glob("*.safetensors"):
        shard.unlink()
    by_shard: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        by_shard.setdefault(index["weight_map"][name], {})[name] = tensor.contiguous()
    index["weight_map"] = {name: shard for name, shard in index["weight_map"].items() if name in tensors}
    for shard, content in by_shard.items():
        save_file(content, target / shard)
    index_path.write_text(json.dumps(index, indent=2))
    return target


@pytest.fixture
def tensors_of() -> Callable[[Path], dict[str, torch.Tensor]]:
    """load_all, as a fixture."""
    return load_all


@pytest.fixture
def make_source() -> Callable[..., Path]:
    """derive_source, as a fixture."""
    return derive_source


@pytest.fixture
def export_with_bridge(megatron_model: list[Any]) -> Callable[[Path, Path, bool], None]:
    """Save the Megatron model as HF weights with a bridge made from `source`, as verl does at a save.

    verl writes config.json (hf_config.save_pretrained) next to the weights; so does this.
    """
    from megatron.bridge import AutoBridge

    def export(source: Path, out: Path, strict: bool) -> None:
        bridge = AutoBridge.from_hf_pretrained(str(source), dtype=torch.float32)
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy(source / "config.json", out / "config.json")
        bridge.save_hf_weights(megatron_model, str(out), strict=strict, show_progress=False)

    return export


def write_verl_checkpoint(model: list[Any], default_local_dir: Path, step: int) -> Path:
    """What verl's save_checkpoint writes for save_contents=[model] with use_dist_checkpointing=True."""
    from megatron.core import parallel_state
    from verl.utils.megatron.dist_checkpointing import save_dist_checkpointing

    actor = default_local_dir / f"global_step_{step}" / "actor"
    content_metadata = {"singleton_local_shards": False, "chained_optim_avoid_prefix": True}
    metadata = dict(content_metadata, dp_cp_group=parallel_state.get_data_parallel_group(with_context_parallel=True))
    sharded = {"model": model[0].sharded_state_dict(metadata=metadata)}
    (actor / "model" / "dist_ckpt").mkdir(parents=True)  # verl's local_mkdir_safe
    # megatron-core's torch_dist writer calls torch.cuda.synchronize() after its device-to-host
    # copy and puts its failure flag on torch.cuda.current_device(); a CPU-only torch refuses
    # both. On CPU there is nothing to synchronise and the flag can live on the CPU (gloo).
    with (
        mock.patch.object(torch.cuda, "synchronize", lambda *args, **kwargs: None),
        mock.patch.object(torch.cuda, "current_device", lambda: "cpu"),
    ):
        save_dist_checkpointing(sharded, str(actor / "model" / "dist_ckpt"), content_metadata=content_metadata)
    (actor / "ckpt_contents.json").write_text(json.dumps({"global_step": step}))
    (default_local_dir / "latest_checkpointed_iteration.txt").write_text(str(step))
    return actor
