"""The generated arithmetic data: verl's schema, verl's loader, verl's own gsm8k reward."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from tests.support.needs import needs

from recipe.smoke import SmokeAssets
from recipe.data.specs import GSM8K_INSTRUCTION as INSTRUCTION
from recipe.data.specs import SPECS
from recipe.smoke.arithmetic import Problem, problems, to_row
from recipe.smoke.profile import SMOKE_MAX_PROMPT_LENGTH

DATA_SOURCE = SPECS["gsm8k"].hub_id

pa = needs("pyarrow", install="needs pyarrow (the trainer extra)")
import pyarrow.parquet as pq  # noqa: E402

_QUESTION = re.compile(r"^What is (\d+) ([-+*]) (\d+)\?$")


def test_problems_are_right_and_never_negative() -> None:
    for problem in problems(500, random.Random(7)):
        assert problem.result >= 0
        assert eval(f"{problem.left} {problem.operator} {problem.right}") == problem.result  # noqa: S307
        assert problem.solution.endswith(f"\n#### {problem.result}")


def test_a_row_has_verls_columns() -> None:
    row = to_row(Problem(12, "+", 7), 3, "train")
    assert row == {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": f"What is 12 + 7? {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "19"},
        "extra_info": {"split": "train", "index": 3, "answer": "12 + 7 = 19\n#### 19", "question": "What is 12 + 7?"},
    }


def test_the_files_have_the_recipes_gsm8k_schema(built: SmokeAssets) -> None:
    for path, split in ((built.train_file, "train"), (built.val_file, "test")):
        table = pq.read_table(path)
        assert table.column_names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
        assert table.schema.field("prompt").type == pa.list_(
            pa.struct([("role", pa.string()), ("content", pa.string())])
        )
        assert table.schema.field("reward_model").type == pa.struct(
            [("style", pa.string()), ("ground_truth", pa.string())]
        )
        rows = table.to_pylist()
        assert {r["data_source"] for r in rows} == {DATA_SOURCE}
        assert [r["extra_info"]["index"] for r in rows] == list(range(len(rows)))
        assert {r["extra_info"]["split"] for r in rows} == {split}
        for row in rows:
            left, operator, right = _QUESTION.match(row["extra_info"]["question"]).groups()  # type: ignore[union-attr]
            assert str(Problem(int(left), operator, int(right)).result) == row["reward_model"]["ground_truth"]


def test_train_and_validation_questions_do_not_overlap(built: SmokeAssets) -> None:
    def questions(path: Path) -> set[str]:
        return {r["question"] for r in pq.read_table(path, columns=["extra_info"]).column(0).to_pylist()}

    assert not questions(built.train_file) & questions(built.val_file)


verl = needs("verl", install="needs the trainer extra: pip install -e '.[trainer]' (CI installs it)")


@pytest.fixture
def hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """verl's loader goes through `datasets.load_dataset`: keep its cache in the test's folder."""
    import datasets

    cache = tmp_path / "hf-datasets-cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    return cache


@pytest.mark.verl
def test_verls_loader_keeps_every_prompt_within_the_smoke_budget(
    built: SmokeAssets, tmp_path: Path, hf_cache: Path, offline: pytest.MonkeyPatch
) -> None:
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset
    from verl.utils.tokenizer import hf_tokenizer

    tokenizer = hf_tokenizer(str(built.model_path))
    config = OmegaConf.create(
        {
            "cache_dir": str(tmp_path / "verl-cache"),
            "max_prompt_length": SMOKE_MAX_PROMPT_LENGTH,
            "filter_overlong_prompts": True,
            "filter_overlong_prompts_workers": 1,
            "truncation": "error",
        }
    )
    for path in (built.train_file, built.val_file):
        dataset = RLHFDataset(data_files=str(path), tokenizer=tokenizer, config=config, processor=None)
        assert len(dataset) == pq.read_metadata(path).num_rows  # nothing filtered as too long
        item = dataset[0]
        assert item["data_source"] == DATA_SOURCE
        assert item["reward_model"]["ground_truth"].isdigit()
        lengths = [
            len(tokenizer.apply_chat_template(dataset[i]["raw_prompt"], add_generation_prompt=True, tokenize=False))
            for i in range(len(dataset))
        ]
        # Byte-level: characters are tokens here; the budget leaves room for longer questions.
        assert max(lengths) <= SMOKE_MAX_PROMPT_LENGTH * 0.6


@pytest.mark.verl
def test_verls_gsm8k_reward_scores_right_and_wrong_answers(built: SmokeAssets) -> None:
    from verl.utils.reward_score import default_compute_score

    row = pq.read_table(built.val_file).to_pylist()[0]
    truth = row["reward_model"]["ground_truth"]
    score = lambda answer: default_compute_score(row["data_source"], answer, truth)  # noqa: E731
    assert score(row["extra_info"]["answer"]) == 1.0
    assert score(f"I think so.\n#### {int(truth) + 1}") == 0.0
    assert score(f"The answer is {truth}") == 0.0  # no `####`: verl's strict gsm8k format wants it
