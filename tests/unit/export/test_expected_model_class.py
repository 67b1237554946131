"""Which tensors the export check expects, straight from a config.json (no weights, no checkpoint).

`expected_tensors` builds the model class named by config.json on the meta device. This file
proves, with tiny configs written by hand, that:
- a dense model is expected parameter by parameter, under its own name and shape;
- fused MoE experts are expected per expert (what save_pretrained writes) or fused (the Hub's
  other layout), and a tied output head is optional;
- the model class comes from `architectures` (model classes only), else from model_type the way
  transformers picks it (vision-language first);
- a directory that cannot be checked is refused with one exact line, and remote code in the
  checked directory is never offered nor run.
The expected names and shapes are written out from the architectures' definitions (Llama:
q/k/v/o projections, gated MLP, RMS norms; Qwen3.5-MoE: 4 experts of hidden 32, intermediate 16).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.needs import TRAINER_EXTRA, needs

transformers = needs("transformers", install=f"{TRAINER_EXTRA}: the export check needs transformers")
needs("torch", install=f"{TRAINER_EXTRA}: the export check needs torch")

from recipe.export.expected import ExportCheckError, build_meta_model, expected_tensors  # noqa: E402

#: A one-layer Llama: hidden 8, 2 query heads and 1 key/value head of 4, MLP 16, vocabulary 16.
TINY_LLAMA: dict[str, Any] = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 16,
    "hidden_size": 8,
    "intermediate_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "tie_word_embeddings": False,
}
#: What that Llama holds, by its definition: (out, in) for each Linear, (hidden,) for each RMSNorm.
LLAMA_TENSORS: dict[str, tuple[int, ...]] = {
    "model.embed_tokens.weight": (16, 8),
    "model.layers.0.self_attn.q_proj.weight": (8, 8),
    "model.layers.0.self_attn.k_proj.weight": (4, 8),
    "model.layers.0.self_attn.v_proj.weight": (4, 8),
    "model.layers.0.self_attn.o_proj.weight": (8, 8),
    "model.layers.0.mlp.gate_proj.weight": (16, 8),
    "model.layers.0.mlp.up_proj.weight": (16, 8),
    "model.layers.0.mlp.down_proj.weight": (8, 16),
    "model.layers.0.input_layernorm.weight": (8,),
    "model.layers.0.post_attention_layernorm.weight": (8,),
    "model.norm.weight": (8,),
    "lm_head.weight": (16, 8),
}


def write_config(directory: Path, config: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def llama(directory: Path, **change: Any) -> Path:
    """A directory holding the tiny Llama's config.json, with `change` applied (None removes a field)."""
    config = {**TINY_LLAMA, **change}
    return write_config(directory, {key: value for key, value in config.items() if value is not None})


@pytest.fixture
def qwen35_config(tmp_path: Path) -> Path:
    """The tiny Qwen3.5-MoE's config.json (the recipe's model family), as save_pretrained writes it."""
    from tests.support.tiny_qwen35 import tiny_qwen35_config

    tiny_qwen35_config().save_pretrained(tmp_path / "qwen35")
    return tmp_path / "qwen35"


# --- what is expected ----------------------------------------------------------------------


def test_a_dense_model_expects_each_parameter_under_its_own_name(tmp_path: Path) -> None:
    expected = expected_tensors(llama(tmp_path))
    assert expected.architecture == "LlamaForCausalLM"
    assert {group.module_key: group.layouts for group in expected.groups} == {
        name: ({name: shape},) for name, shape in LLAMA_TENSORS.items()
    }
    assert not any(group.optional for group in expected.groups)
    # Llama asks the loader to ignore nothing.
    assert (expected.ignore_missing, expected.ignore_unexpected) == ((), ())


def test_a_tied_output_head_is_optional(tmp_path: Path) -> None:
    """With tie_word_embeddings the loader ties lm_head to the embedding: the export may leave it out."""
    expected = expected_tensors(llama(tmp_path, tie_word_embeddings=True))
    assert [group.module_key for group in expected.groups if group.optional] == ["lm_head.weight"]
    assert {group.module_key for group in expected.groups} == set(LLAMA_TENSORS)


def qwen_layer0_experts(prefix: str = "model.language_model.layers.0.mlp.experts.") -> dict[str, tuple[Any, ...]]:
    """Layer 0's experts of the tiny Qwen3.5-MoE: per-expert layout first, then the fused one."""
    per_expert_gate_up = {
        f"{prefix}{expert}.{projection}.weight": (16, 32)
        for projection in ("gate_proj", "up_proj")
        for expert in range(4)
    }
    per_expert_down = {f"{prefix}{expert}.down_proj.weight": (32, 16) for expert in range(4)}
    return {
        f"{prefix}gate_up_proj": (per_expert_gate_up, {f"{prefix}gate_up_proj": (4, 32, 32)}),
        f"{prefix}down_proj": (per_expert_down, {f"{prefix}down_proj": (4, 32, 16)}),
    }


def test_fused_experts_are_expected_per_expert_or_fused(qwen35_config: Path) -> None:
    """save_pretrained writes experts one by one; Hub checkpoints may hold them fused: both layouts count."""
    expected = expected_tensors(qwen35_config)
    assert expected.architecture == "Qwen3_5MoeForConditionalGeneration"
    layouts = {group.module_key: group.layouts for group in expected.groups}
    for key, both in qwen_layer0_experts().items():
        assert layouts[key] == both
    # Everything that is not an expert is expected under its own name only.
    plain = [group for group in expected.groups if ".mlp.experts." not in group.module_key]
    assert plain
    assert all(len(group.layouts) == 1 and list(group.layouts[0]) == [group.module_key] for group in plain)
    # The class ignores multi-token-prediction weights on load (Qwen3.5 checkpoints carry mtp.*).
    assert (expected.ignore_missing, expected.ignore_unexpected) == ((), ("^mtp.*",))


def test_without_a_reverse_conversion_the_in_memory_layout_is_expected(
    qwen35_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If transformers cannot tell the on-disk names, the check still runs, on the in-memory names."""
    from transformers import core_model_loading

    def cannot_revert(model: Any, state: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError("no conversion rule")

    monkeypatch.setattr(core_model_loading, "revert_weight_conversion", cannot_revert)
    layouts = {group.module_key: group.layouts for group in expected_tensors(qwen35_config).groups}
    for key, (_, fused) in qwen_layer0_experts().items():
        assert layouts[key] == (fused,)
    assert layouts["model.language_model.norm.weight"] == ({"model.language_model.norm.weight": (32,)},)


def test_the_model_classs_ignore_lists_are_carried(tmp_path: Path) -> None:
    """BART tells the loader to ignore a missing final_logits_bias and stale `*.version` entries."""
    config = {
        "model_type": "bart",
        "architectures": ["BartForConditionalGeneration"],
        **{"vocab_size": 16, "d_model": 8, "encoder_layers": 1, "decoder_layers": 1, "max_position_embeddings": 8},
        **{"encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 8, "decoder_ffn_dim": 8},
    }
    expected = expected_tensors(write_config(tmp_path, config))
    assert expected.ignore_missing == ("final_logits_bias",)
    assert expected.ignore_unexpected == ("decoder.version", "encoder.version")


# --- which model class ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "change, architecture",
    [
        ({}, "LlamaForCausalLM"),
        # A transformers attribute that is not a model class is skipped, never built.
        ({"architectures": ["LlamaConfig", "AutoModelForCausalLM", "LlamaModel"]}, "LlamaModel"),
        # No architectures (a config written without a model): the class transformers picks.
        ({"architectures": None}, "LlamaForCausalLM"),
        ({"architectures": []}, "LlamaForCausalLM"),
    ],
    ids=["named", "first model class named", "no architectures", "empty architectures"],
)
def test_the_model_class_comes_from_architectures_else_model_type(
    tmp_path: Path, change: dict[str, Any], architecture: str
) -> None:
    assert type(build_meta_model(llama(tmp_path, **change))).__name__ == architecture


def test_without_architectures_a_vision_language_class_comes_first(qwen35_config: Path) -> None:
    """Qwen3.5 is a VLM: its checkpoints hold the vision tower too, so the VLM class is the one checked."""
    config = json.loads((qwen35_config / "config.json").read_text())
    del config["architectures"]
    write_config(qwen35_config, config)
    assert type(build_meta_model(qwen35_config)).__name__ == "Qwen3_5MoeForConditionalGeneration"


def test_a_config_symlinked_inside_the_directory_is_read(tmp_path: Path) -> None:
    llama(tmp_path / "export" / "store")
    (tmp_path / "export" / "config.json").symlink_to(Path("store") / "config.json")
    assert expected_tensors(tmp_path / "export").architecture == "LlamaForCausalLM"


def cannot_check(directory: Path) -> str:
    with pytest.raises(ExportCheckError) as raised:
        expected_tensors(directory)
    return str(raised.value)


@pytest.mark.parametrize(
    "architectures",
    [["NoSuchModelForCausalLM"], ["LlamaConfig"], ["AutoModelForCausalLM", "__class__", "../x"]],
    ids=["unknown name", "not a model", "auto class, dunder, path"],
)
def test_no_model_class_named_is_refused_naming_the_list(tmp_path: Path, architectures: list[str]) -> None:
    message = cannot_check(llama(tmp_path, architectures=architectures))
    assert message == (
        f"config.json architectures={architectures!r}: not a class of the installed transformers "
        f"{transformers.__version__} that is a model (PreTrainedModel); only model classes are built, "
        "and remote code is not run by the check"
    )


def test_no_architectures_and_no_language_model_class_is_refused(tmp_path: Path) -> None:
    """ViT has neither a causal-LM nor an image-text-to-text class: nothing to check against."""
    message = cannot_check(write_config(tmp_path, {"model_type": "vit", "hidden_size": 8}))
    assert message == (
        "config.json has no `architectures` and model_type='vit' has no causal-LM or image-text-to-text class: "
        "cannot tell which model class to check against"
    )


def test_no_config_is_refused(tmp_path: Path) -> None:
    assert cannot_check(tmp_path) == f"{tmp_path}: no config.json (the export must carry the HF config)"


def test_a_config_that_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").mkdir()
    assert cannot_check(tmp_path) == f"{tmp_path / 'config.json'}: not a regular file"


def test_a_config_symlinked_outside_the_directory_is_not_read(tmp_path: Path) -> None:
    outside = llama(tmp_path / "elsewhere") / "config.json"
    export = tmp_path / "export"
    export.mkdir()
    (export / "config.json").symlink_to(outside)
    assert cannot_check(export) == (
        f"{export}/config.json: a symlink to {str(outside)!r}, outside the checkpoint directory "
        "and not a Hugging Face cache blob (not opened)"
    )


@pytest.mark.parametrize(
    "config, prefix",
    [
        ("{not json", "{directory}/config.json: transformers cannot read it ("),
        # Read by transformers, but no Linear layer has -8 inputs.
        (
            json.dumps({**TINY_LLAMA, "hidden_size": -8}),
            "LlamaForCausalLM: cannot be built from {directory}/config.json (",
        ),
    ],
    ids=["not JSON", "cannot be built"],
)
def test_a_config_transformers_refuses_is_one_line_naming_the_file(tmp_path: Path, config: str, prefix: str) -> None:
    (tmp_path / "config.json").write_text(config)
    message = cannot_check(tmp_path)
    # transformers' own reason follows in parentheses; its wording is transformers', not ours.
    assert message.startswith(prefix.format(directory=tmp_path)) and message.endswith(")"), message


def test_remote_code_in_the_checked_directory_is_never_offered_nor_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An export is untrusted input: its auto_map must not run code, even for a user who would say yes."""
    ran = tmp_path / "remote code ran"
    export = write_config(
        tmp_path / "export",
        {"model_type": "evil_model", "auto_map": {"AutoConfig": "evil.EvilConfig"}, "architectures": ["EvilModel"]},
    )
    (export / "evil.py").write_text(
        f"from pathlib import Path\nPath({str(ran)!r}).touch()\n\n"
        "from transformers import PretrainedConfig\n\n\n"
        "class EvilConfig(PretrainedConfig):\n    model_type = 'evil_model'\n"
    )
    prompts: list[str] = []

    def say_yes(prompt: str = "") -> str:
        prompts.append(prompt)
        return "y"

    monkeypatch.setattr("builtins.input", say_yes)
    message = cannot_check(export)
    assert message.startswith(f"{export}/config.json: transformers cannot read it ("), message
    assert prompts == []
    assert not ran.exists()
