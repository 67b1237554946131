"""The smoke data's images and the recipe's prompt-length count, against verl's own dataset and processor.

In the e2e venv because Qwen3-VL's processor (verl's, vLLM's and the count's) needs torchvision, which the
main test venv does not install (tests/support/torchvision_cpu.py). Runs in the pytest process, in seconds.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from recipe.data.specs import SPECS
from tests.e2e.conftest import WORK
from tests.e2e.harness.assets import Assets, build_assets

#: Every smoke prompt, counted as verl counts it: 70 tokens of chat template and text (byte-level, geo3k's instruction
#: one token), the 2 vision markers and the image's 4 (a 64x64 image is 16 patches of 16 pixels, merged 2x2).
PROMPT_TOKENS, IMAGE_TOKENS = 76, 4


@pytest.fixture(scope="module")
def assets() -> Assets:
    return build_assets(WORK / "parity")


def _config(tmp_path: Path, budget: int) -> object:
    from omegaconf import OmegaConf

    return OmegaConf.create({"cache_dir": str(tmp_path / "verl-cache"), "max_prompt_length": budget,
                             "filter_overlong_prompts": True, "truncation": "error",
                             # In this process: a forked worker of `datasets` deadlocks once torch has started its threads.
                             "filter_overlong_prompts_workers": 0})  # fmt: skip


def test_verls_loader_keeps_every_smoke_prompt_with_its_image_and_the_count_is_exact(assets: Assets, tmp_path: Path) -> None:
    """verl's RLHFDataset with the smoke model's processor (as the trainer loads it) keeps every row at the smoke
    budget and at the recipe's count, drops them all one token below it, and hands each row's image on."""
    import pyarrow.parquet as pq
    from verl.utils import hf_processor
    from verl.utils.dataset.rl_dataset import RLHFDataset
    from verl.utils.tokenizer import hf_tokenizer

    from recipe.data.prompt_lengths import PromptCounter, count_parquet
    from recipe.smoke.profile import SMOKE_MAX_PROMPT_LENGTH

    tokenizer, processor = hf_tokenizer(str(assets.model)), hf_processor(str(assets.model))
    assert type(processor).__name__ == "Qwen3VLProcessor"
    rows = pq.read_metadata(assets.train_file).num_rows
    for budget, kept in ((SMOKE_MAX_PROMPT_LENGTH, rows), (PROMPT_TOKENS, rows), (PROMPT_TOKENS - 1, 0)):
        dataset = RLHFDataset(data_files=str(assets.train_file), tokenizer=tokenizer, config=_config(tmp_path, budget), processor=processor)
        assert len(dataset) == kept, budget  # one token over and verl drops every row, without a word
    lengths = count_parquet(assets.train_file, PromptCounter(assets.model))
    assert set(lengths.tokens) == {PROMPT_TOKENS} and set(lengths.image_tokens) == {IMAGE_TOKENS}
    item = RLHFDataset(data_files=str(assets.train_file), tokenizer=tokenizer, config=_config(tmp_path, SMOKE_MAX_PROMPT_LENGTH), processor=processor)[0]
    assert item["data_source"] == SPECS["geo3k"].hub_id
    assert [content["type"] for content in item["raw_prompt"][0]["content"]] == ["image", "text"]


def _png(width: int, height: int) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (90, 20, 200)).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.mark.parametrize("size", [(64, 64), (100, 37), (300, 200), (640, 480), (16, 800)])
def test_the_count_is_verls_own_filter_length_for_any_image_size(assets: Assets, size: tuple[int, int], tmp_path: Path) -> None:
    """For images of several sizes (verl resizes them by Qwen-VL's rules, then the processor does), the recipe's count
    is the length at which verl keeps a geo3k row, and one token less drops it."""
    import datasets
    from verl.utils import hf_processor
    from verl.utils.dataset.rl_dataset import RLHFDataset
    from verl.utils.tokenizer import hf_tokenizer

    from recipe.data.prompt_lengths import PromptCounter
    from recipe.data.specs import convert_geo3k, output_features

    row = convert_geo3k({"images": [{"bytes": _png(*size), "path": None}], "problem": "<image>Find x.", "answer": "3"}, 0, "train")
    path = tmp_path / "train.parquet"
    datasets.Dataset.from_list([row], features=output_features(SPECS["geo3k"])).to_parquet(str(path))
    counted = PromptCounter(assets.model).count(row)
    assert counted.image_tokens > 0
    tokenizer, processor = hf_tokenizer(str(assets.model)), hf_processor(str(assets.model))
    for budget, kept in ((counted.tokens, 1), (counted.tokens - 1, 0)):
        assert len(RLHFDataset(data_files=str(path), tokenizer=tokenizer, config=_config(tmp_path, budget), processor=processor)) == kept


def test_another_image_changes_vllms_log_probs_of_the_same_text(assets: Assets) -> None:
    """vLLM-CPU (the rollout engine, in a process of its own) with the same prompt text and row 0's or row 1's image:
    the prompt tokens are the same ids, and vLLM's log-probabilities of the text after the image differ, while those
    before it do not (the image reaches vLLM's language model through its vision tower)."""
    import json
    import os
    import subprocess
    import sys

    from tests.e2e.harness.plan import ROOT, cpu_environment

    env = {**os.environ, "PYTHONPATH": cpu_environment()["PYTHONPATH"], "VLLM_CPU_KVCACHE_SPACE": "1",
           "TORCHDYNAMO_DISABLE": "1", "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "tests.e2e.harness.vllm_images", str(assets.model), str(assets.train_file)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    # vLLM logs to stdout too: the report is the one line that is the script's JSON document.
    (line,) = [line for line in done.stdout.splitlines() if line.startswith('{"image_token_id": ')]
    report = json.loads(line)
    first, second = report["runs"]
    assert first["prompt_token_ids"] == second["prompt_token_ids"]
    ids = first["prompt_token_ids"]
    assert ids.count(report["image_token_id"]) == IMAGE_TOKENS
    after = max(i for i, token in enumerate(ids) if token == report["image_token_id"])  # the image's last token
    before = min(i for i, token in enumerate(ids) if token == report["image_token_id"])
    # prompt_logprobs[k] is the log-probability of token k + 1.
    assert first["prompt_logprobs"][: before - 1] == second["prompt_logprobs"][: before - 1]
    moved = max(abs(a - b) for a, b in zip(first["prompt_logprobs"][after:], second["prompt_logprobs"][after:]))
    assert moved > 1e-3, moved
