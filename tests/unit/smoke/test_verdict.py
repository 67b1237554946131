"""The smoke verdict on recorded metrics and tiny files, no trainer: PASS on a good run, FAIL naming the check.

data/recorded_metrics.jsonl holds steps 1 and 2 of a real smoke run (the CPU e2e's uninterrupted
run of the smoke Qwen3.5-MoE, recorded again with the mismatch per token: issue 53), in verl's file-logger
format, reduced to the metrics that matter.
Each broken run below is that run with one thing broken.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from recipe.smoke import SmokeAssets
from recipe.smoke.verdict import (
    ADVANTAGE_MAX,
    ADVANTAGE_MIN,
    GRAD_NORM,
    PROBS_DIFF_LIMIT,
    PROBS_DIFF_MAX,
    PROMPT_MAX,
    PROMPT_MIN,
    MetricsError,
    judge_images,
    judge_metrics,
    read_metrics,
    smoke_verdict,
)
from tests.support.needs import needs

RECORDED = Path(__file__).parent / "data" / "recorded_metrics.jsonl"
STEPS = 2
#: The first tensor (in name order) of the smoke model, and of its vision tower, that the CPU e2e's run changed.
TRAINED = "lm_head.weight"
VISION = "model.visual.blocks.0.attn.proj.bias"


def write_metrics(path: Path, change: Callable[[dict[int, dict[str, Any]]], None] = lambda _: None) -> Path:
    """The recorded metrics, changed by `change({step: data})`, as verl's file logger writes them."""
    steps = {record["step"]: record["data"] for record in map(json.loads, RECORDED.read_text().splitlines())}
    change(steps)
    path.write_text("".join(json.dumps({"step": step, "data": data}) + "\n" for step, data in sorted(steps.items())))
    return path


def export_of(model: Path, target: Path, trained: bool, vision_trained: bool | None = None) -> Path:
    """A copy of `model` as an export: its weights, with TRAINED +1 when `trained` and VISION +1 when `vision_trained`
    (by default as `trained`), so that they differ from `model`'s."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(model, target)
    changed = [name for name, on in ((TRAINED, trained), (VISION, trained if vision_trained is None else vision_trained)) if on]
    if changed:
        tensors = load_file(target / "model.safetensors")
        for name in changed:
            tensors[name] = tensors[name] + 1
        save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    return target


def failed(checks: list[Any]) -> list[str]:
    return [check.name for check in checks if not check.passed]


def test_the_recorded_run_passes() -> None:
    checks = judge_metrics(read_metrics(RECORDED), STEPS)
    assert failed(checks) == [] and len(checks) == 6


def _lengths(tokens: list[int], image_tokens: list[int]) -> Any:
    from recipe.data.prompt_lengths import PromptLengths, RowLength

    return PromptLengths.of(RowLength(t, i) for t, i in zip(tokens, image_tokens))


#: The smoke data's prompts as counted with their images (tests/unit/smoke/test_dataset.py checks the count).
SMOKE_PROMPTS = ([76] * 64, [4] * 64)


def test_the_recorded_image_run_passes_the_image_check() -> None:
    check = judge_images(read_metrics(RECORDED), STEPS, _lengths(*SMOKE_PROMPTS))
    assert check.passed, check
    assert check.measured == "4 image tokens in every prompt (prompts of 76 tokens)"


@pytest.mark.parametrize(
    ("name", "low", "high"),
    [
        # The same prompts without their 4 image tokens: the images were dropped before the processor.
        ("images dropped", 72, 72),
        # The `<image>` placeholder left as text (7 bytes) instead of the vision markers and 4 tokens (6): verl read no
        # image column.
        ("placeholder kept as text", 77, 77),
        ("one prompt of the batch without its image", 72, 76),
    ],
)
def test_a_run_whose_images_were_dropped_fails_the_image_check(name: str, low: int, high: int, tmp_path: Path) -> None:
    def drop(steps: dict[int, dict[str, Any]]) -> None:
        steps[2].update({PROMPT_MIN: low, PROMPT_MAX: high})

    check = judge_images(read_metrics(write_metrics(tmp_path / "m.jsonl", drop)), STEPS, _lengths(*SMOKE_PROMPTS))
    assert not check.passed, name
    assert check.measured == f"step 2: {low} to {high} tokens"


@given(st.lists(st.integers(1, 600), min_size=1, max_size=8), st.integers(1, 600), st.integers(1, 600))
def test_the_image_check_passes_exactly_when_both_ends_are_the_datas_lengths(
    data: list[int], low: int, high: int
) -> None:
    metrics = {1: {PROMPT_MIN: float(low), PROMPT_MAX: float(high)}}
    check = judge_images(metrics, 1, _lengths(data, [4] * len(data)))
    assert check.passed == (low in data and high in data)


@pytest.mark.parametrize(
    ("image_tokens", "said"),
    [([4, 4, 4], "4 image tokens in every prompt"), ([4, 0, 4], "4 image tokens in 2 of 3 prompts"),
     ([0, 6, 4], "4 to 6 image tokens in 2 of 3 prompts"), ([0, 0, 9], "9 image tokens in 1 of 3 prompts")],
)  # fmt: skip
def test_data_where_only_some_prompts_carry_images_is_said_so(image_tokens: list[int], said: str) -> None:
    """Issue 52: a prompt without an image is neither counted as one with 0 image tokens nor hidden by "every"; steps
    past the run's are not judged."""
    metrics = {1: {PROMPT_MIN: 100.0, PROMPT_MAX: 130.0}, 2: {PROMPT_MIN: 100.0, PROMPT_MAX: 120.0},
               3: {PROMPT_MIN: 1.0, PROMPT_MAX: 1.0}}  # fmt: skip
    check = judge_images(metrics, 2, _lengths([100, 120, 130], image_tokens))
    assert check.passed and check.measured == f"{said} (prompts of 100, 120, 130 tokens)", check


def test_text_only_data_and_uncountable_data() -> None:
    metrics = read_metrics(RECORDED)
    assert judge_images(metrics, STEPS, _lengths([120, 130], [0, 0])).passed  # the user's text data: nothing to see
    uncountable = judge_images(metrics, STEPS, "OSError: no processor")
    assert not uncountable.passed and uncountable.measured == "the data's prompts cannot be counted: OSError: no processor"
    missing = judge_images({1: {}, 2: {}}, STEPS, _lengths(*SMOKE_PROMPTS))
    assert not missing.passed and missing.measured == "step 1: not logged; step 2: not logged"


@pytest.mark.parametrize(
    ("name", "change", "check"),
    [
        ("zero reward", lambda s: [d.update({ADVANTAGE_MAX: 0.0, ADVANTAGE_MIN: 0.0}) for d in s.values()],
         "rewards vary within a prompt's group"),
        ("zero grad_norm", lambda s: s[2].update({GRAD_NORM: 0.0}), "gradients"),
        ("probabilities apart", lambda s: s[1].update({PROBS_DIFF_MAX: 3 * PROBS_DIFF_LIMIT}), "rollout matches actor"),
        ("missing step", lambda s: s.pop(2), "steps"),
        ("metric not logged", lambda s: s[1].pop(GRAD_NORM), "gradients"),
        ("NaN grad_norm", lambda s: s[2].update({GRAD_NORM: float("nan")}), "gradients"),
    ],
)  # fmt: skip
def test_a_broken_run_fails_its_check(name: str, change: Callable[..., Any], check: str, tmp_path: Path) -> None:
    checks = judge_metrics(read_metrics(write_metrics(tmp_path / "m.jsonl", change)), STEPS)
    assert failed(checks) == [check], name


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"step": 1, "data": {}}\nnot json\n', r"m\.jsonl:2: not a JSON line"),
        ('{"step": "1", "data": {}}\n', r"m\.jsonl:1: not a metrics line"),
        ('{"step": true, "data": {}}\n', r"m\.jsonl:1: not a metrics line"),
        ('[1, 2]\n', r"m\.jsonl:1: not a metrics line"),
    ],
)
def test_a_malformed_metrics_file_is_named_with_its_line(content: str, message: str, tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text(content)
    with pytest.raises(MetricsError, match=message):
        read_metrics(path)


@given(st.text(max_size=400))
def test_any_file_content_is_metrics_or_a_metrics_error(content: str) -> None:
    """Hostile input, through the real JSON parser: a dict of finite-or-not floats, or MetricsError; nothing else."""
    import tempfile  # a fixture's tmp_path would be shared by every generated example

    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "m.jsonl"
        path.write_text(content, encoding="utf-8")
        try:
            metrics = read_metrics(path)
        except MetricsError:
            return
        assert all(isinstance(step, int) for step in metrics)
        assert all(isinstance(value, float) for data in metrics.values() for value in data.values())


# --- the whole verdict: metrics and the newest save -------------------------------------------------------------


def _run(
    tmp_path: Path, built: SmokeAssets, trained: bool, report: bool = True, vision_trained: bool | None = None
) -> tuple[Path, Path]:
    """A finished smoke run: its metrics file and root (global_step_2 with an HF export, its manifest, the watcher's report)."""
    needs("safetensors", install="the trainer extra")
    from recipe.export.watch import HFExport, check_export

    root = tmp_path / "root"
    actor = root / "global_step_2" / "actor"
    export = export_of(built.model_path, actor / "model" / "huggingface", trained, vision_trained)
    (actor / "ckpt_contents.json").write_text("{}")
    if report:
        check_export(HFExport(2, export, True), reference=built.model_path)
    return write_metrics(tmp_path / "m.jsonl"), root


def test_a_good_run_passes_with_every_check(tmp_path: Path, built: SmokeAssets) -> None:
    metrics, root = _run(tmp_path, built, trained=True)
    verdict = smoke_verdict(metrics, STEPS, root, built.model_path, _lengths(*SMOKE_PROMPTS))
    assert verdict.passed, verdict.to_text()
    assert [check.name for check in verdict.checks] == [
        "steps", "rewards vary within a prompt's group", "gradients", "rollout matches actor", "mismatch as KL",
        "mismatch per token", "images reached the rollout", "HF export", "export was trained", "vision tower was trained", "export watcher",
    ]  # fmt: skip
    assert verdict.to_text().splitlines()[-1] == "smoke: PASS"
    assert json.loads(verdict.to_json())["passed"] is True


def test_an_export_of_the_initial_weights_fails(tmp_path: Path, built: SmokeAssets) -> None:
    metrics, root = _run(tmp_path, built, trained=False)
    verdict = smoke_verdict(metrics, STEPS, root, built.model_path, _lengths(*SMOKE_PROMPTS))
    assert failed(list(verdict.checks)) == ["export was trained", "vision tower was trained"]
    assert verdict.to_text().splitlines()[-1] == "smoke: FAIL"
    assert "export was trained: the export holds the initial weights" in verdict.to_text()


def test_a_broken_export_and_no_watcher_report_fail(tmp_path: Path, built: SmokeAssets) -> None:
    from safetensors.torch import load_file, save_file

    metrics, root = _run(tmp_path, built, trained=True, report=False)
    shard = root / "global_step_2" / "actor" / "model" / "huggingface" / "model.safetensors"
    tensors = load_file(shard)
    del tensors["model.language_model.layers.0.mlp.shared_expert.down_proj.weight"]
    save_file(tensors, shard, metadata={"format": "pt"})
    verdict = smoke_verdict(metrics, STEPS, root, built.model_path, _lengths(*SMOKE_PROMPTS))
    assert failed(list(verdict.checks)) == ["HF export", "export watcher"]
    assert "BROKEN" in verdict.to_text()


def test_no_metrics_file_fails_the_steps_check(tmp_path: Path, built: SmokeAssets) -> None:
    _, root = _run(tmp_path, built, trained=True)
    verdict = smoke_verdict(tmp_path / "absent.jsonl", STEPS, root, built.model_path, _lengths(*SMOKE_PROMPTS))
    assert failed(list(verdict.checks)) == ["steps"]
    assert "cannot read the metrics" in verdict.checks[0].measured


def test_an_export_whose_vision_tower_never_moved_fails_that_check(tmp_path: Path, built: SmokeAssets) -> None:
    """The language model trained, the vision tower did not (no image reached the actor, or a frozen tower)."""
    metrics, root = _run(tmp_path, built, trained=True, vision_trained=False)
    verdict = smoke_verdict(metrics, STEPS, root, built.model_path, _lengths(*SMOKE_PROMPTS))
    assert failed(list(verdict.checks)) == ["vision tower was trained"]
    check = next(check for check in verdict.checks if check.name == "vision tower was trained")
    assert check.measured == "all 33 shared visual tensors equal the initial model's"


def test_the_docs_example_is_what_the_recorded_run_prints(tmp_path: Path, built: SmokeAssets) -> None:
    """docs/smoke.md shows the block of the CPU e2e's uninterrupted run: its recorded metrics, the smoke data's
    prompt lengths and an export of the real smoke model that changed the tensors that run changed first print it
    byte for byte."""
    metrics, root = _run(tmp_path, built, trained=True)
    verdict = smoke_verdict(metrics, STEPS, root, built.model_path, _lengths(*SMOKE_PROMPTS))
    assert verdict.passed
    block = "".join(f"    {line}\n" for line in verdict.to_text().splitlines())
    docs = Path(__file__).resolve().parents[3] / "docs" / "smoke.md"
    assert block in docs.read_text(encoding="utf-8"), block
