"""prepare_smoke_assets: offline, loadable, idempotent, atomic."""

from __future__ import annotations

import hashlib
import json
import socket
from pathlib import Path
from typing import Any

import pytest

from tests.support.needs import needs

from recipe.errors import RecipeConfigError
from recipe.smoke import SmokeAssets, shipped_model_dir
from recipe.smoke.prepare import MANIFEST, TEST_ROWS, TRAIN_ROWS

from .conftest import NetworkUsed, block_network

transformers = needs("transformers", install="needs torch and transformers (the trainer extra)")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_network_guard_works(offline: pytest.MonkeyPatch) -> None:
    """The guard the build runs under does refuse connections (so the offline tests can fail)."""
    with pytest.raises(NetworkUsed):
        socket.create_connection(("huggingface.co", 443), timeout=1)
    with pytest.raises(NetworkUsed):
        socket.socket(socket.AF_INET, socket.SOCK_STREAM).connect(("127.0.0.1", 9))


def test_it_writes_every_file_where_smoke_assets_says(built: SmokeAssets) -> None:
    assert built == SmokeAssets.under(built.root)
    names = {p.name for p in built.model_path.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "preprocessor_config.json",
        "video_preprocessor_config.json",
    } <= names
    assert built.train_file.is_file() and built.val_file.is_file()
    # Nothing left beside it: the build directory was renamed into place.
    assert [p.name for p in built.root.parent.iterdir()] == [built.root.name]


def test_the_model_config_is_the_shipped_one(built: SmokeAssets) -> None:
    assert (built.model_path / "config.json").read_bytes() == (shipped_model_dir() / "config.json").read_bytes()


def test_files_are_readable_by_others(built: SmokeAssets) -> None:
    """save_pretrained's safetensors comes out 0600; a shared volume needs it readable."""
    assert (built.model_path / "model.safetensors").stat().st_mode & 0o044 == 0o044


def test_the_model_loads_offline_in_bf16_and_runs(built: SmokeAssets, offline: pytest.MonkeyPatch) -> None:
    import torch

    model = transformers.AutoModelForImageTextToText.from_pretrained(built.model_path, dtype=torch.float32)
    assert type(model).__name__ == "Qwen3_5MoeForConditionalGeneration"
    from safetensors import safe_open

    with safe_open(built.model_path / "model.safetensors", "pt") as weights:
        dtypes = {weights.get_slice(name).get_dtype() for name in weights.keys()}
    assert dtypes == {"BF16"}
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[257, 72, 105, 258]])).logits
    assert torch.isfinite(logits).all()


def test_the_tokenizer_loads_offline_from_the_directory(built: SmokeAssets, offline: pytest.MonkeyPatch) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(built.model_path)
    config = transformers.AutoConfig.from_pretrained(built.model_path)
    assert len(tokenizer) == config.text_config.vocab_size
    assert tokenizer.convert_tokens_to_ids("<|image_pad|>") == config.image_token_id
    assert tokenizer.decode(tokenizer.encode("#### 42", add_special_tokens=False)) == "#### 42"
    messages = [{"role": "user", "content": "What is 1 + 1?"}]
    assert tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False).endswith(
        "<|im_start|>assistant\n"
    )


def test_verl_loads_the_tokenizer(built: SmokeAssets, offline: pytest.MonkeyPatch) -> None:
    verl_tokenizer = needs("verl.utils.tokenizer", install="needs verl (the trainer extra)")
    tokenizer = verl_tokenizer.hf_tokenizer(str(built.model_path))
    assert tokenizer.pad_token_id == 256 and tokenizer.eos_token_id == 258


def test_the_image_processor_loads_and_matches_the_vision_tower(
    built: SmokeAssets, offline: pytest.MonkeyPatch
) -> None:
    """PIL backend: works without torchvision (the images have it; this CPU environment may not)."""
    import numpy as np
    from PIL import Image
    from transformers.models.auto.image_processing_auto import AutoImageProcessor

    processor = AutoImageProcessor.from_pretrained(built.model_path, backend="pil")
    config = transformers.AutoConfig.from_pretrained(built.model_path)
    image = Image.fromarray(np.zeros((100, 150, 3), dtype=np.uint8))
    out = processor(images=[image], return_tensors="pt")
    t, h, w = (int(v) for v in out["image_grid_thw"][0])
    vision = config.vision_config
    assert out["pixel_values"].shape == (t * h * w, 3 * vision.temporal_patch_size * vision.patch_size**2)
    # Image tokens after the 2x2 merge stay far below the prompt budget.
    assert t * h * w // vision.spatial_merge_size**2 <= 64


def _torchvision_works() -> bool:
    try:
        import torchvision.transforms.v2.functional  # noqa: F401
    except Exception:  # noqa: BLE001  (a CUDA wheel beside CPU torch raises RuntimeError)
        return False
    return True


# torchvision is in the images, not in the trainer or test extra that CI installs.
@pytest.mark.ci_may_skip("torchvision is not part of the CI install (the images carry it)")
@pytest.mark.skipif(not _torchvision_works(), reason="Qwen3VLProcessor's video half needs torchvision (in the images)")
def test_the_full_processor_loads_like_verl_loads_it(built: SmokeAssets, offline: pytest.MonkeyPatch) -> None:
    verl_tokenizer = needs("verl.utils.tokenizer", install="needs verl (the trainer extra)")
    processor = verl_tokenizer.hf_processor(str(built.model_path))
    assert type(processor).__name__ == "Qwen3VLProcessor"
    assert hasattr(processor, "get_rope_index")


def test_a_second_call_reuses_the_build(built: SmokeAssets) -> None:
    from recipe.smoke import prepare_smoke_assets

    before = {p: p.stat().st_mtime_ns for p in built.root.rglob("*")}
    again = prepare_smoke_assets(built.root)
    assert again == built
    assert {p: p.stat().st_mtime_ns for p in built.root.rglob("*")} == before


def test_the_same_seed_gives_the_same_bytes(built: SmokeAssets, tmp_path: Path) -> None:
    from recipe.smoke import prepare_smoke_assets

    with pytest.MonkeyPatch.context() as patch:
        block_network(patch)
        other = prepare_smoke_assets(tmp_path / "again", seed=0)
        different = prepare_smoke_assets(tmp_path / "seed1", seed=1)
    for name in ("model/model.safetensors", "model/tokenizer.json", "data/train.parquet", "data/test.parquet"):
        assert _sha(other.root / name) == _sha(built.root / name), name
    assert _sha(different.root / "model/model.safetensors") != _sha(built.root / "model/model.safetensors")
    assert _sha(different.train_file) != _sha(built.train_file)


def test_an_outdated_build_is_replaced(tmp_path: Path, offline: pytest.MonkeyPatch) -> None:
    from recipe.smoke import prepare_smoke_assets

    assets = prepare_smoke_assets(tmp_path / "assets")
    manifest = json.loads((assets.root / MANIFEST).read_text())
    manifest["fingerprint"]["build_version"] = -1
    (assets.root / MANIFEST).write_text(json.dumps(manifest))
    (assets.model_path / "left-over").write_text("from the old build")
    again = prepare_smoke_assets(tmp_path / "assets")
    assert not (again.model_path / "left-over").exists()
    assert json.loads((again.root / MANIFEST).read_text())["fingerprint"]["build_version"] != -1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["assets"]


def test_a_directory_that_is_not_a_build_is_never_overwritten(tmp_path: Path) -> None:
    from recipe.smoke import prepare_smoke_assets

    (tmp_path / "assets").mkdir()
    (tmp_path / "assets" / "precious.txt").write_text("user data")
    with pytest.raises(RecipeConfigError, match="is not a smoke build"):
        prepare_smoke_assets(tmp_path / "assets")
    assert (tmp_path / "assets" / "precious.txt").read_text() == "user data"


def test_an_empty_directory_is_used(tmp_path: Path, offline: pytest.MonkeyPatch) -> None:
    from recipe.smoke import prepare_smoke_assets

    (tmp_path / "assets").mkdir()
    assert prepare_smoke_assets(tmp_path / "assets").train_file.is_file()


def test_a_failed_build_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from recipe.smoke import arithmetic, prepare_smoke_assets

    def fail(*args: Any, **kwargs: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(arithmetic, "write_dataset", fail)
    with pytest.raises(OSError, match="disk full"):
        prepare_smoke_assets(tmp_path / "assets")
    assert list(tmp_path.iterdir()) == []


def test_a_failed_rebuild_keeps_the_previous_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from recipe.smoke import arithmetic, prepare_smoke_assets

    first = prepare_smoke_assets(tmp_path / "assets", seed=0)
    weights = _sha(first.model_path / "model.safetensors")
    monkeypatch.setattr(arithmetic, "write_dataset", lambda *a, **k: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError):
        prepare_smoke_assets(tmp_path / "assets", seed=1)
    assert _sha(first.model_path / "model.safetensors") == weights
    assert sorted(p.name for p in tmp_path.iterdir()) == ["assets"]


def test_an_unwritable_place_is_a_config_error(tmp_path: Path) -> None:
    from recipe.smoke import prepare_smoke_assets

    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(RecipeConfigError, match="cannot write there"):
        prepare_smoke_assets(blocker / "assets")


def test_the_row_counts(built: SmokeAssets) -> None:
    import pyarrow.parquet as pq

    assert pq.read_metadata(built.train_file).num_rows == TRAIN_ROWS
    assert pq.read_metadata(built.val_file).num_rows == TEST_ROWS
