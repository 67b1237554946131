"""A tiny Qwen3.5-MoE (transformers `qwen3_5_moe`, the recipe's model family) saved to disk,
and helpers that damage a checkpoint the way a lenient export can."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.needs import TRAINER_EXTRA, needs
from tests.support.tiny_qwen35 import load_all, tiny_qwen35_config

torch = needs("torch", install=f"{TRAINER_EXTRA}: the export check needs torch")
transformers = needs("transformers", install=f"{TRAINER_EXTRA}: the export check needs transformers")
from safetensors.torch import save_file  # noqa: E402


def tiny_qwen35_moe(tie_word_embeddings: bool = False):
    """A randomly initialised Qwen3_5MoeForConditionalGeneration with about 30k parameters."""
    from transformers.models.qwen3_5_moe import Qwen3_5MoeForConditionalGeneration

    torch.manual_seed(0)
    return Qwen3_5MoeForConditionalGeneration(tiny_qwen35_config(tie_word_embeddings))


@pytest.fixture(scope="session")
def qwen35_saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model written by save_pretrained in several shards with an index."""
    directory = tmp_path_factory.mktemp("qwen35") / "hf"
    tiny_qwen35_moe().save_pretrained(directory, max_shard_size="20KB")
    assert (directory / "model.safetensors.index.json").is_file()
    return directory


@pytest.fixture
def qwen35_copy(qwen35_saved: Path, tmp_path: Path) -> Path:
    """A private copy of the saved tiny model, free to damage."""
    target = tmp_path / "export"
    shutil.copytree(qwen35_saved, target)
    return target


def rewrite(directory: Path, change: Callable[[dict[str, torch.Tensor]], None]) -> None:
    """Apply `change` to the tensors, then write them back as one shard with a consistent index."""
    tensors = load_all(directory)
    change(tensors)
    for shard in directory.glob("*.safetensors"):
        shard.unlink()
    save_file({k: v.contiguous() for k, v in tensors.items()}, directory / "model-00001-of-00001.safetensors")
    index = {"metadata": {}, "weight_map": {name: "model-00001-of-00001.safetensors" for name in tensors}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))


def edit_index(directory: Path, change: Callable[[dict[str, str]], None]) -> None:
    """Apply `change` to the index's weight_map only (the shards stay as they are)."""
    path = directory / "model.safetensors.index.json"
    index = json.loads(path.read_text())
    change(index["weight_map"])
    path.write_text(json.dumps(index))


@pytest.fixture
def tensors_of() -> Callable[[Path], dict[str, torch.Tensor]]:
    """load_all, as a fixture (test modules do not import conftest)."""
    return load_all


@pytest.fixture
def rewrite_checkpoint() -> Callable[[Path, Callable[[dict[str, torch.Tensor]], None]], None]:
    """rewrite, as a fixture."""
    return rewrite


@pytest.fixture
def rewrite_index() -> Callable[[Path, Callable[[dict[str, str]], None]], None]:
    """edit_index, as a fixture."""
    return edit_index


@pytest.fixture
def make_qwen35() -> Callable[..., object]:
    """tiny_qwen35_moe, as a fixture."""
    return tiny_qwen35_moe


# --- run records: real inputs, plans of them, and a checkpoint root a run left ----------------

TRACKER = "latest_checkpointed_iteration.txt"


@pytest.fixture
def inputs(tmp_path: Path, qwen35_saved: Path) -> dict[str, str]:
    """Real inputs: the tiny model's directory and parquet files from the smoke data writer."""
    from recipe.smoke.arithmetic import write_dataset
    from tests.unit.runtools import layout_of_one

    data = tmp_path / "data"
    data.mkdir()
    write_dataset(data, seed=0, train_rows=12, test_rows=4)
    return {
        **layout_of_one(),
        "MODEL_PATH": str(qwen35_saved),
        "TRAIN_FILES": str(data / "train.parquet"),
        "VAL_FILES": str(data / "test.parquet"),
        "CHECKPOINT_DIR": str(tmp_path / "ck"),
        "PROJECT_NAME": "p",
        "EXPERIMENT_NAME": "e",
    }


def plan_of(values: dict[str, str], extra: tuple[str, ...] = (), environ: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    """build_plan of these settings (and overrides after `--`), as `plan` makes it."""
    from recipe.plan import build_plan
    from tests.unit.envtools import settings_of

    return build_plan(settings_of(**values), environ=environ or {}, extra_overrides=extra)


def saved_run(values: dict[str, str], extra: tuple[str, ...] = (), environ: dict[str, str] | None = None) -> Path:
    """A checkpoint root as a run of these values leaves it: its record, a step, verl's tracker."""
    from recipe.record_file import record_bytes, write_record

    root = Path(values["CHECKPOINT_DIR"]) / values.get("PROJECT_NAME", "p") / values.get("EXPERIMENT_NAME", "e")
    write_record(root, record_bytes(plan_of(values, extra, environ).provenance))
    finished_step(root, 1)
    (root / TRACKER).write_text("1")
    return root


def finished_step(root: Path, step: int) -> Path:
    """global_step_<step> as verl leaves a save it finished: the HF export folder, and its manifest written last."""
    step_dir = root / f"global_step_{step}"
    (step_dir / "actor" / "model" / "huggingface").mkdir(parents=True, exist_ok=True)
    (step_dir / "actor" / "ckpt_contents.json").write_text("{}")
    return step_dir
