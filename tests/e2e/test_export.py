"""The Hugging Face export Megatron-Bridge wrote at the saves, checked by the recipe's own tools."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.e2e.conftest import E2ERun
from tests.e2e.harness.checks import changed_tensors, hf_weights, verify_export
from tests.e2e.harness.withhold import copy_without
from tests.support.recipe_strings import recipe_strings

#: A tensor the model needs but whose absence is not critical (not embeddings, lm_head, a norm, a whole layer).
ORDINARY = "model.language_model.layers.0.mlp.shared_expert.down_proj.weight"
#: A critical one: the export is broken without it whatever is allowed (docs/export.md).
CRITICAL = "model.language_model.embed_tokens.weight"


def test_step_2_export_exists(e2e: E2ERun) -> None:
    """verl saved step 2 with hf_model: Megatron-Bridge's safetensors and the config beside them."""
    export = e2e.hf_export(2)
    assert (export / "config.json").is_file()
    assert list(export.glob("*.safetensors")), f"no safetensors in {export}"


def test_step_2_export_loads_and_was_trained(e2e: E2ERun) -> None:
    """transformers loads the export with every tensor of the initial model, and the weights moved."""
    changed = changed_tensors(hf_weights(e2e.assets.model), hf_weights(e2e.hf_export(2)))
    assert changed, "the exported weights equal the initial ones: no update reached the export"


def test_verify_export_says_complete(e2e: E2ERun) -> None:
    """The recipe's verify-export, on the checkpoint directory (it picks the newest export), says COMPLETE."""
    code, report = verify_export(e2e.root, "--reference", str(e2e.assets.model))
    assert (code, report["status"]) == (0, "complete"), report
    assert Path(report["directory"]) == e2e.hf_export(2)
    assert report["dropped"] == []


def test_watcher_reported_every_save(e2e: E2ERun) -> None:
    """The recipe's watcher, beside the trainer, checked both saves and wrote its report beside each."""
    assert sorted(e2e.watcher_reports) == [1, 2]
    for step in (1, 2):
        assert e2e.watcher_reports[step] is not None and e2e.watcher_reports[step].status == "complete"
        report = json.loads((e2e.hf_export(step).parent / "hf_export_report.json").read_text())
        assert report["status"] == "complete"


def test_withheld_tensor_is_broken_unless_allowed(e2e: E2ERun, tmp_path: Path) -> None:
    """A lenient export missing an ordinary tensor: BROKEN (exit 1); LENIENT (exit 0) when --allow names it."""
    lenient = copy_without(e2e.hf_export(2), tmp_path / "lenient", [ORDINARY])
    code, report = verify_export(lenient)
    assert (code, report["status"], report["missing"]) == (1, "broken", [ORDINARY])
    code, report = verify_export(lenient, "--allow", r"^model\.language_model\.layers\.0\.mlp\.shared_expert\.down_proj\.")
    assert (code, report["status"]) == (0, "lenient")
    assert report["allowed"] and ORDINARY in report["allowed"][0]


def test_withheld_critical_tensor_is_broken_even_if_allowed(e2e: E2ERun, tmp_path: Path) -> None:
    """Without the embeddings an export is BROKEN whatever --allow says."""
    damaged = copy_without(e2e.hf_export(2), tmp_path / "critical", [CRITICAL])
    code, report = verify_export(damaged, "--allow", "embed_tokens")
    assert (code, report["status"]) == (1, "broken")
    assert any(CRITICAL in line for line in report["critical"])


def test_the_export_carries_the_trained_vision_tower_and_transformers_runs_an_image_prompt(e2e: E2ERun) -> None:
    """The step-2 export's vision tower moved from the initial weights (gradients reached it, and Megatron-Bridge
    exported the trained values), and transformers loads the export and runs a smoke image prompt: finite logits,
    other than the initial model's for the same prompt and image."""
    import torch
    from transformers import AutoProcessor, Qwen3_5MoeForConditionalGeneration

    from tests.e2e.harness.image_rows import prompt_and_image, smoke_rows

    before, after = hf_weights(e2e.assets.model), hf_weights(e2e.hf_export(2))
    vision = [name for name in changed_tensors(before, after) if ".visual." in name]
    assert vision, "no vision tensor of the export differs from the initial model's"
    processor = AutoProcessor.from_pretrained(e2e.assets.model)
    text, image = prompt_and_image(processor, smoke_rows(e2e.assets.train_file, 1)[0])
    inputs = processor(text=[text], images=[image], return_tensors="pt")
    logits = []
    for directory in (e2e.assets.model, e2e.hf_export(2)):
        model = Qwen3_5MoeForConditionalGeneration.from_pretrained(directory, dtype=torch.float32).eval()
        with torch.no_grad():
            logits.append(model(**inputs).logits[0])
    assert torch.isfinite(logits[1]).all()
    assert not torch.equal(logits[0], logits[1])


#: A path below a step in the recipe's messages and help (global_step_N/..., global_step_20/...).
_BELOW_A_STEP = re.compile(r"global_step_(?:N|<N>|[0-9]+|\{[^}]*\})/(?P<below>[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*)")


def test_every_path_below_a_step_the_recipe_names_is_one_verl_wrote(e2e: E2ERun) -> None:
    """Issue 43: an example path (verify-export's help said actor/huggingface) must have the shape verl 0.9.1 writes:
    each path below a global_step_N in recipe/'s strings exists in this run's step 2, as verl saved it."""
    named = {
        match.group("below").rstrip(".")
        for _, text in recipe_strings()
        for match in _BELOW_A_STEP.finditer(text)
    }
    assert "actor/model/huggingface" in named and "actor/ckpt_contents.json" in named, sorted(named)
    step = e2e.step_dir(2)
    missing = sorted(path for path in named if not (step / path).exists())
    assert missing == [], f"named by the recipe, not written by verl under {step}: {missing}"
