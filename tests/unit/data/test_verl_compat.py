"""The written parquet goes through the INSTALLED verl 0.9.1's own loader and reward functions, on CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.needs import needs

verl = needs("verl", install="needs the trainer extra: pip install -e '.[trainer]' (CI installs it)")
pytestmark = pytest.mark.verl

from recipe.data import PreparedData, prepare_dataset  # noqa: E402

from .conftest import GEO3K_ROWS, GSM8K_ROWS  # noqa: E402
from .tiny_vl import import_qwen_vl_utils, tiny_processor, tiny_tokenizer  # noqa: E402


def quiet(_: str) -> None:
    """A progress sink for tests that do not look at progress."""


@pytest.fixture
def hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """verl's loader goes through `datasets.load_dataset`: keep its cache in the test's folder."""
    import datasets

    cache = tmp_path / "hf-datasets-cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    return cache


def rl_dataset(path: Path, tmp_path: Path, processor: Any = None, max_prompt_length: int = 1024) -> Any:
    """verl's RLHFDataset over one parquet file, with the trainer's default data keys."""
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    config = OmegaConf.create(
        {
            "cache_dir": str(tmp_path / "verl-cache"),
            "prompt_key": "prompt",
            "image_key": "images",
            "max_prompt_length": max_prompt_length,
            "filter_overlong_prompts": True,
            "filter_overlong_prompts_workers": 1,
        }
    )
    return RLHFDataset(data_files=str(path), tokenizer=tiny_tokenizer(), config=config, processor=processor)


@pytest.fixture
def geo3k(geo3k_source: Path, tmp_path: Path, hf_cache: Path) -> PreparedData:
    return prepare_dataset("geo3k", tmp_path / "geo3k", geo3k_source, progress=quiet)


@pytest.fixture
def gsm8k(gsm8k_hub_snapshot: Path, tmp_path: Path, hf_cache: Path) -> PreparedData:
    return prepare_dataset("gsm8k", tmp_path / "gsm8k", gsm8k_hub_snapshot, progress=quiet)


def test_geo3k_loads_in_rlhfdataset_with_a_vl_processor_and_keeps_every_row(
    geo3k: PreparedData, tmp_path: Path
) -> None:
    import_qwen_vl_utils()
    from PIL import Image

    for split in ("train", "test"):
        dataset = rl_dataset(geo3k.path(split), tmp_path, processor=tiny_processor())
        # verl's length filter drops a row whose messages or images fail to process (it catches
        # the error and counts the row as too long): every row kept means every row processed.
        assert len(dataset) == len(GEO3K_ROWS[split])
        for index in range(len(dataset)):
            item = dataset[index]
            assert item["index"] == index
            assert item["data_source"] == "hiyouga/geometry3k"
            content = item["raw_prompt"][0]["content"]
            images = [part["image"] for part in content if part["type"] == "image"]
            texts = [part["text"] for part in content if part["type"] == "text"]
            assert len(images) == len(GEO3K_ROWS[split][index][0])
            assert all(isinstance(image, Image.Image) and image.mode == "RGB" for image in images)
            assert [image.size for image in images] == GEO3K_ROWS[split][index][0]
            assert texts and texts[-1].endswith(r"The final answer MUST BE put in \boxed{}.")


def test_geo3k_rows_become_image_tokens_the_way_the_rollout_builds_them(geo3k: PreparedData, tmp_path: Path) -> None:
    import_qwen_vl_utils()
    from verl.utils.dataset.rl_dataset import RLHFDataset
    from verl.utils.tokenizer import build_multimodal_processor_inputs

    processor = tiny_processor()
    dataset = rl_dataset(geo3k.path("train"), tmp_path, processor=processor)
    pad_id = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    for index in range(len(dataset)):
        messages = dataset[index]["raw_prompt"]
        images, videos, _ = RLHFDataset._process_multi_modal_info(messages, dataset.image_patch_size, dataset.config)
        assert videos is None and len(images) == len(GEO3K_ROWS["train"][index][0])
        text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        inputs = build_multimodal_processor_inputs(processor, text=[text], images=images)
        merge = processor.image_processor.merge_size**2
        expected_tokens = int(sum(int(thw.prod()) // merge for thw in inputs["image_grid_thw"]))
        assert int((inputs["input_ids"][0] == pad_id).sum()) == expected_tokens > 0


def test_length_filter_is_real(geo3k: PreparedData, tmp_path: Path) -> None:
    """Control for the 'every row kept' checks above: a tiny limit drops every row."""
    import_qwen_vl_utils()
    assert len(rl_dataset(geo3k.path("test"), tmp_path, processor=tiny_processor(), max_prompt_length=4)) == 0


def test_gsm8k_loads_in_rlhfdataset_with_a_tokenizer(gsm8k: PreparedData, tmp_path: Path) -> None:
    for split in ("train", "test"):
        dataset = rl_dataset(gsm8k.path(split), tmp_path)
        assert len(dataset) == len(GSM8K_ROWS[split])
        item = dataset[1]
        assert item["index"] == 1
        assert item["raw_prompt"] == [
            {
                "role": "user",
                "content": GSM8K_ROWS[split][1][0]
                + ' Let\'s think step by step and output the final answer after "####".',
            }
        ]


def _rows(prepared: PreparedData, split: str) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    return pq.read_table(prepared.path(split), columns=["data_source", "reward_model"]).to_pylist()


def test_verls_geo3k_reward_scores_right_and_wrong_answers(geo3k: PreparedData) -> None:
    needs("mathruler", install="verl's geo3k reward needs mathruler (verl's verl-core extra)")
    from verl.utils.reward_score import default_compute_score

    for row in _rows(geo3k, "train") + _rows(geo3k, "test"):
        truth = row["reward_model"]["ground_truth"]
        right = f"<think>The angles add up.</think> So the answer is \\boxed{{{truth}}}."
        wrong = "<think>The angles add up.</think> So the answer is \\boxed{999}."
        source = row["data_source"]
        assert default_compute_score(source, right, truth) == pytest.approx(1.0), truth
        assert default_compute_score(source, wrong, truth) == pytest.approx(0.1), truth  # format credit only
        assert default_compute_score(source, truth, truth) == pytest.approx(0.0), truth  # no \boxed{}: no credit


def test_verls_gsm8k_reward_scores_right_and_wrong_answers(gsm8k: PreparedData) -> None:
    from verl.utils.reward_score import default_compute_score

    rows = _rows(gsm8k, "train") + _rows(gsm8k, "test")
    for row, (_, answer) in zip(rows, GSM8K_ROWS["train"] + GSM8K_ROWS["test"], strict=True):
        truth = row["reward_model"]["ground_truth"]
        # The reference solution itself (which may write 3,600) is a right answer.
        assert default_compute_score(row["data_source"], answer, truth) == 1.0, answer
        assert default_compute_score(row["data_source"], "I think it is\n#### 999", truth) == 0.0
        assert default_compute_score(row["data_source"], f"It is {truth}.", truth) == 0.0  # no ####
