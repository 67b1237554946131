"""How the export check classifies what it found: `compare` on hand-built inputs, `verify_export` on tiny files.

`compare` is pure: the tensors a model class expects (ExpectedTensors) against what the shards and
the index hold (CheckpointContents). Each test below writes both by hand, so the expected report is
known without running the check: which tensors are missing, unexpected, ghosts, unindexed, dropped,
mis-shaped, allowed and critical, and the status (complete, lenient, broken) a user's script acts on.
The last tests run `verify_export` itself on a one-layer Llama written with `safetensors`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recipe.export.expected import ExpectedGroup, ExpectedTensors
from recipe.export.hf_check import DEFAULT_ALLOWED_PATTERNS, ExportCheckError, compare, verify_export
from recipe.export.report import ExportReport, ShapeMismatch
from recipe.export.safetensors_header import TensorInfo
from recipe.export.shards import CheckpointContents

ARCH = "TinyForCausalLM"
EMBED, NORM, HEAD = "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"
ATTN0, LN0 = "model.layers.0.self_attn.o_proj.weight", "model.layers.0.input_layernorm.weight"
ATTN1, LN1 = "model.layers.1.self_attn.o_proj.weight", "model.layers.1.input_layernorm.weight"
#: The dense part of a tiny two-layer model: name -> shape.
DENSE: dict[str, tuple[int, ...]] = {EMBED: (8, 2), ATTN0: (2, 2), LN0: (2,), ATTN1: (2, 2), LN1: (2,), NORM: (2,)}


def experts(layer: int) -> tuple[str, dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
    """Layer `layer`'s 2 experts: (fused name, per-expert layout as saved, fused layout as in memory)."""
    prefix = f"model.layers.{layer}.mlp.experts."
    per_expert = {f"{prefix}{expert}.down_proj.weight": (2, 4) for expert in range(2)}
    return f"{prefix}down_proj", per_expert, {f"{prefix}down_proj": (2, 2, 4)}


def expected(
    *,
    tied_head: bool = False,
    moe: bool = False,
    ignore_missing: tuple[str, ...] = (),
    ignore_unexpected: tuple[str, ...] = (),
) -> ExpectedTensors:
    """What the tiny model class expects; a tied head comes first, as a tied embedding may in a state dict."""
    groups = [ExpectedGroup(HEAD, ({HEAD: (8, 2)},), optional=True)] if tied_head else []
    groups += [ExpectedGroup(name, ({name: shape},)) for name, shape in DENSE.items()]
    if not tied_head:
        groups.append(ExpectedGroup(HEAD, ({HEAD: (8, 2)},)))
    if moe:
        for layer in (0, 1):
            key, per_expert, fused = experts(layer)
            groups.append(ExpectedGroup(key, (per_expert, fused)))
    return ExpectedTensors(ARCH, tuple(groups), ignore_missing, ignore_unexpected)


def full(*, moe: str | None = None, head: bool = True) -> dict[str, tuple[int, ...]]:
    """Every tensor of the tiny model; experts `per_expert` or `fused` (or none)."""
    tensors = dict(DENSE)
    if head:
        tensors[HEAD] = (8, 2)
    for layer in (0, 1) if moe else ():
        _, per_expert, fused = experts(layer)
        tensors.update(per_expert if moe == "per_expert" else fused)
    return tensors


def indexed(tensors: dict[str, tuple[int, ...]], shard: str = "model-00001-of-00001.safetensors") -> CheckpointContents:
    """Shards with an index listing exactly what they hold (what save_pretrained writes)."""
    infos = {name: TensorInfo(shard, "BF16", shape) for name, shape in tensors.items()}
    return CheckpointContents(tensors=infos, index=dict.fromkeys(tensors, shard), shard_names=[shard])


def check(contents: CheckpointContents, expect: ExpectedTensors | None = None, **kwargs: object) -> ExportReport:
    expect = expect if expect is not None else expected()
    return compare(Path("/ckpt/hf"), expect, contents, **kwargs)  # type: ignore[arg-type]


def without(tensors: dict[str, tuple[int, ...]], *names: str) -> dict[str, tuple[int, ...]]:
    return {name: shape for name, shape in tensors.items() if name not in names}


# --- complete, and what a loader reads ----------------------------------------------------


def test_everything_present_and_indexed_is_complete() -> None:
    report = check(indexed(full()))
    assert report == ExportReport(
        directory="/ckpt/hf", status="complete", architecture=ARCH, expected_count=7, present_count=7
    )


def test_one_model_safetensors_without_index_is_read_alone() -> None:
    """Without an index, loaders read model.safetensors only: a tensor in another file is unindexed."""
    tensors = {name: TensorInfo("model.safetensors", "F32", shape) for name, shape in full().items()}
    tensors["stray.weight"] = TensorInfo("other.safetensors", "F32", (1,))
    contents = CheckpointContents(tensors=tensors, shard_names=["model.safetensors", "other.safetensors"])
    report = check(contents)
    assert (report.status, report.present_count) == ("broken", 7)
    assert (report.unindexed, report.unexpected) == (["stray.weight"], [])


def test_shards_without_index_or_model_safetensors_are_unreadable() -> None:
    contents = indexed(full(), shard="model-00001-of-00002.safetensors")
    contents.index = None
    contents.shard_names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    report = check(contents)
    assert report.errors == [
        (
            "no model.safetensors.index.json and no model.safetensors: loaders read none of the "
            "2 shard file(s) (an export that failed before writing its index?)"
        )
    ]
    assert (report.status, report.present_count, report.expected_count) == ("broken", 0, 7)
    assert report.unindexed == sorted(full()) and report.missing == sorted(full())


def test_no_safetensors_at_all_is_broken() -> None:
    report = check(CheckpointContents())
    assert (report.status, report.errors, report.missing) == ("broken", ["no safetensors files"], sorted(full()))


def test_index_entries_not_in_the_shard_named_are_ghosts_and_missing() -> None:
    contents = indexed(full())
    contents.index[NORM] = "model-00002-of-00002.safetensors"  # in a shard, but not the one the index names
    contents.index["model.ghost.weight"] = "model-00001-of-00001.safetensors"  # in no shard
    report = check(contents)
    assert report.ghosts == ["model.ghost.weight", NORM]
    assert report.missing == [NORM] and report.unexpected == []
    assert (report.status, report.present_count) == ("broken", 6)


def test_a_tensor_missing_from_the_index_is_unindexed_and_missing() -> None:
    contents = indexed(full())
    del contents.index[ATTN1]
    report = check(contents)
    assert (report.unindexed, report.missing, report.ghosts) == ([ATTN1], [ATTN1], [])
    assert report.status == "broken"


def test_shard_errors_are_reported_sorted_and_break_the_export() -> None:
    contents = indexed(full())
    contents.errors = ["b.safetensors: header is not JSON", "a.safetensors: cannot open"]
    report = check(contents)
    assert report.errors == ["a.safetensors: cannot open", "b.safetensors: header is not JSON"]
    assert report.status == "broken"


def test_a_wrong_shape_is_a_mismatch_naming_both_shapes() -> None:
    tensors = full()
    tensors[ATTN1] = (2, 3)
    tensors[EMBED] = (9, 2)
    report = check(indexed(tensors))
    assert report.shape_mismatches == [ShapeMismatch(EMBED, [8, 2], [9, 2]), ShapeMismatch(ATTN1, [2, 2], [2, 3])]
    assert (report.status, report.missing, report.unexpected) == ("broken", [], [])


# --- fused and per-expert layouts, tied weights ---------------------------------------------


@pytest.mark.parametrize("layout", ["per_expert", "fused"])
def test_experts_in_either_layout_are_complete(layout: str) -> None:
    report = check(indexed(full(moe=layout)), expected(moe=True))
    assert report.status == "complete", report.summary()
    # Counted in the layout found: 2 per-expert tensors a layer, or 1 fused.
    assert report.expected_count == report.present_count == 7 + (4 if layout == "per_expert" else 2)


@pytest.mark.parametrize("layout", ["per_expert", "fused"])
def test_a_wholly_absent_expert_group_is_named_in_the_layout_the_export_uses(layout: str) -> None:
    _, per_expert, fused = experts(1)
    report = check(indexed(without(full(moe=layout), *per_expert, *fused, ATTN0)), expected(moe=True))
    # A dense tensor has one layout whichever the experts use.
    assert report.missing == sorted([ATTN0, *(per_expert if layout == "per_expert" else fused)])
    assert report.status == "broken"


def test_a_complete_fused_tensor_wins_over_stray_per_expert_pieces() -> None:
    """Layer 1 fused, plus expert 0 of it saved again per expert: judged on the fused tensor."""
    _, per_expert, _ = experts(1)
    stray = "model.layers.1.mlp.experts.0.down_proj.weight"
    report = check(indexed({**full(moe="fused"), stray: per_expert[stray]}), expected(moe=True))
    assert (report.missing, report.unexpected, report.status) == ([], [stray], "broken")


def test_one_absent_expert_is_named_alone_even_next_to_a_fused_layer() -> None:
    """Layer 0 fused, layer 1 per expert with expert 1 gone: only that expert is missing."""
    _, per_expert_1, _ = experts(1)
    _, _, fused_0 = experts(0)
    present = {**full(), **fused_0, **per_expert_1}
    gone = "model.layers.1.mlp.experts.1.down_proj.weight"
    report = check(indexed(without(present, gone)), expected(moe=True))
    assert (report.missing, report.unexpected) == ([gone], [])
    assert report.expected_count == 7 + 1 + 2


def test_a_tied_head_may_be_absent_and_is_checked_when_present() -> None:
    """The tied group comes first: the groups after it are still checked."""
    absent = check(indexed(without(full(), HEAD, NORM)), expected(tied_head=True))
    assert (absent.missing, absent.critical, absent.expected_count) == ([NORM], [f"{NORM}: norm missing"], 6)
    present = check(indexed(full()), expected(tied_head=True))
    assert (present.status, present.unexpected, present.expected_count, present.present_count) == ("complete", [], 6, 7)
    tensors = full()
    tensors[HEAD] = (8, 3)
    assert check(indexed(tensors), expected(tied_head=True)).shape_mismatches == [ShapeMismatch(HEAD, [8, 2], [8, 3])]


# --- what makes an export unusable whatever is allowed -------------------------------------


@pytest.mark.parametrize(
    "name, reason",
    [
        (EMBED, "embedding or output head missing"),
        ("transformer.wte.weight", "embedding or output head missing"),
        ("bert.embeddings.word_embeddings.weight", "embedding or output head missing"),
        ("embeddings.weight", "embedding or output head missing"),
        (HEAD, "embedding or output head missing"),
        (NORM, "norm missing"),
        ("model.final_layernorm.bias", "norm missing"),
        ("norm.weight", "norm missing"),
        ("model.lm_head_scale.weight", None),  # lm_head only as a whole name part
        ("model.xembed_tokens.weight", None),
        ("model.norm.scale", None),  # a norm's weight or bias only
        ("model.normalizer", None),
    ],
)
def test_missing_embeddings_heads_and_norms_are_critical(name: str, reason: str | None) -> None:
    expect = ExpectedTensors(ARCH, (ExpectedGroup(name, ({name: (2,)},)),), (), ())
    report = compare(Path("/x"), expect, indexed({}), allowed_patterns=[".*"])
    assert report.critical == ([f"{name}: {reason}"] if reason else [])
    assert report.status == ("broken" if reason else "lenient")


@pytest.mark.parametrize(
    "prefix", ["model.layers.1", "transformer.h.1", "vision.blocks.1", "model.language_model.layers.1"]
)
def test_a_whole_missing_layer_is_critical_with_its_size(prefix: str) -> None:
    names = [f"{prefix}.attn.o_proj.weight", f"{prefix}.mlp.up_proj.weight", f"{prefix}.mlp.down_proj.weight"]
    kept = names[0].replace(".1.", ".0.")
    expect = ExpectedTensors(ARCH, tuple(ExpectedGroup(n, ({n: (2,)},)) for n in [kept, *names]), (), ())
    report = compare(Path("/x"), expect, indexed({kept: (2,)}), allowed_patterns=[".*"])
    assert report.critical == [f"{prefix}: whole layer missing (3 tensors)"]
    assert report.status == "broken"
    # One tensor of the layer left: no longer a whole layer.
    partial = compare(Path("/x"), expect, indexed({kept: (2,), names[1]: (2,)}), allowed_patterns=[".*"])
    assert (partial.critical, partial.status) == ([], "lenient")


def test_an_absent_tied_head_is_not_part_of_a_whole_missing_layer() -> None:
    head = "model.layers.1.lm_out.weight"
    expect = ExpectedTensors(
        ARCH, (ExpectedGroup(head, ({head: (2,)},), optional=True), ExpectedGroup(ATTN1, ({ATTN1: (2,)},))), (), ()
    )
    report = compare(Path("/x"), expect, indexed({head: (2,)}))
    assert report.critical == ["model.layers.1: whole layer missing (1 tensors)"]


# --- allowed differences: the user's patterns, then the model class's ---------------------


def test_a_missing_tensor_the_user_allows_is_lenient_naming_the_pattern() -> None:
    report = check(indexed(without(full(), ATTN1)), allowed_patterns=[r"^nothing", r"self_attn\.o_proj"])
    assert report.status == "lenient"
    assert (report.missing, report.allowed) == ([ATTN1], [rf"{ATTN1} (allowed: self_attn\.o_proj)"])


def test_the_model_classs_ignore_lists_allow_what_it_ignores() -> None:
    expect = expected(ignore_missing=(r"o_proj",), ignore_unexpected=(r"^mtp\.",))
    tensors = {**without(full(), ATTN1), "mtp.fc.weight": (2,)}
    report = check(indexed(tensors), expect, allowed_patterns=())
    assert report.status == "lenient"
    assert report.allowed == [
        f"{ATTN1} ({ARCH} ignores it when missing: o_proj)",
        rf"mtp.fc.weight ({ARCH} ignores it on load: ^mtp\.)",
    ]
    # The user's pattern is named first when both would allow it.
    both = check(indexed(tensors), expect, allowed_patterns=[r"^mtp\."])
    assert r"mtp.fc.weight (allowed: ^mtp\.)" in both.allowed


def test_each_difference_is_triaged_on_its_own() -> None:
    """An allowed tensor does not excuse, nor hide, the ones after it."""
    expect = expected(ignore_unexpected=(r"^mtp\.",))
    report = check(indexed({**full(), "mtp.a": (2,), "mtp.b": (2,), "zz.weight": (2,)}), expect, allowed_patterns=())
    assert report.allowed == [rf"{name} ({ARCH} ignores it on load: ^mtp\.)" for name in ("mtp.a", "mtp.b")]
    assert (report.unexpected, report.status) == (["mtp.a", "mtp.b", "zz.weight"], "broken")


def test_by_default_only_multi_token_prediction_tensors_are_allowed() -> None:
    assert DEFAULT_ALLOWED_PATTERNS == (r"^mtp\.",)
    report = check(indexed({**full(), "mtp.layers.0.norm.weight": (2,), "model.mtp.x": (2,)}))
    assert report.unexpected == ["model.mtp.x", "mtp.layers.0.norm.weight"]
    assert report.allowed == [r"mtp.layers.0.norm.weight (allowed: ^mtp\.)"]
    assert report.status == "broken"  # model.mtp.x is not allowed


def test_unindexed_tensors_are_never_allowed() -> None:
    contents = indexed({**full(), "mtp.fc.weight": (2,)})
    del contents.index["mtp.fc.weight"]
    report = check(contents, allowed_patterns=[".*"])
    assert (report.unindexed, report.status) == (["mtp.fc.weight"], "lenient")
    assert report.allowed == ["mtp.fc.weight (allowed: .*)"]
    strict = check(contents, allowed_patterns=())
    assert (strict.unindexed, strict.allowed, strict.status) == (["mtp.fc.weight"], [], "broken")


# --- against a reference checkpoint ---------------------------------------------------------


def test_a_reference_names_what_the_export_dropped() -> None:
    """Dropped: loadable in the reference, absent from the export, and not already missing."""
    reference = indexed({**full(), "extra.scale": (1,), "mtp.fc.weight": (2,), "stale.bias": (1,)})
    del reference.index["stale.bias"]  # in the reference's shard, but not loadable there
    export = indexed(without(full(), NORM))
    report = check(export, reference=reference, reference_path=Path("/models/base"))
    assert report.dropped == ["extra.scale", "mtp.fc.weight"]
    assert report.missing == [NORM]
    assert report.reference == "/models/base"
    assert report.allowed == [r"mtp.fc.weight (allowed: ^mtp\.)"]
    assert report.status == "broken"


def test_dropped_tensors_the_class_ignores_on_load_are_allowed() -> None:
    reference = indexed({**full(), "extra.scale": (1,)})
    report = check(indexed(full()), expected(ignore_unexpected=(r"^extra\.",)), reference=reference)
    assert (report.dropped, report.status, report.reference) == (["extra.scale"], "lenient", None)
    assert report.allowed == [rf"extra.scale ({ARCH} ignores it on load: ^extra\.)"]


# --- verify_export on files -----------------------------------------------------------------

LLAMA_CONFIG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    **{"vocab_size": 16, "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1},
    **{"num_attention_heads": 2, "num_key_value_heads": 1, "tie_word_embeddings": False},
}
#: The one-layer Llama above, by its definition.
LLAMA: dict[str, tuple[int, ...]] = {
    "model.embed_tokens.weight": (16, 8),
    **{f"model.layers.0.self_attn.{p}_proj.weight": (8 if p in "qo" else 4, 8) for p in "qkvo"},
    "model.layers.0.mlp.gate_proj.weight": (16, 8),
    "model.layers.0.mlp.up_proj.weight": (16, 8),
    "model.layers.0.mlp.down_proj.weight": (8, 16),
    "model.layers.0.input_layernorm.weight": (8,),
    "model.layers.0.post_attention_layernorm.weight": (8,),
    "model.norm.weight": (8,),
    "lm_head.weight": (16, 8),
}


def save_llama(directory: Path, tensors: dict[str, tuple[int, ...]], config: bool = True) -> Path:
    """A one-shard export (model.safetensors) of `tensors`, zero-filled, with the Llama's config.json."""
    numpy = pytest.importorskip("numpy")
    from safetensors.numpy import save_file

    directory.mkdir(parents=True, exist_ok=True)
    zeros = {name: numpy.zeros(shape, dtype=numpy.float32) for name, shape in tensors.items()}
    save_file(zeros, directory / "model.safetensors")
    if config:
        (directory / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    return directory


@pytest.fixture
def llama_export(tmp_path: Path) -> Path:
    pytest.importorskip("transformers")
    return save_llama(tmp_path / "export", LLAMA)


def test_verify_export_of_a_complete_export(llama_export: Path) -> None:
    report = verify_export(llama_export)
    assert (report.status, report.architecture, report.directory) == ("complete", "LlamaForCausalLM", str(llama_export))
    assert report.expected_count == report.present_count == 12


def test_verify_export_reads_the_config_from_config_dir(llama_export: Path, tmp_path: Path) -> None:
    """verl may write the HF config elsewhere: config_dir names it; the weights stay in the directory."""
    weights = save_llama(tmp_path / "weights", LLAMA, config=False)
    with pytest.raises(ExportCheckError, match=r"no config\.json"):
        verify_export(weights)
    assert verify_export(weights, config_dir=llama_export).status == "complete"


def test_verify_export_with_a_reference_and_patterns(llama_export: Path, tmp_path: Path) -> None:
    reference = save_llama(tmp_path / "reference", {**LLAMA, "mtp.fc.weight": (2,), "extra.bias": (1,)})
    report = verify_export(llama_export, allowed_missing_patterns=[r"^extra\."], reference=reference)
    assert report.dropped == ["extra.bias", "mtp.fc.weight"]
    assert (report.reference, report.status) == (str(reference), "broken")
    assert report.allowed == [r"extra.bias (allowed: ^extra\.)"]


@pytest.mark.parametrize("what", ["directory", "reference", "pattern"])
def test_verify_export_refuses_what_cannot_be_checked(llama_export: Path, tmp_path: Path, what: str) -> None:
    nowhere = tmp_path / "nowhere"
    with pytest.raises(ExportCheckError) as raised:
        if what == "directory":
            verify_export(nowhere)
        elif what == "reference":
            verify_export(llama_export, reference=nowhere)
        else:
            verify_export(llama_export, allowed_missing_patterns=[r"^mtp\.", "("])
    message = str(raised.value)
    if what == "directory":
        assert message == f"{nowhere}: not a directory"
    elif what == "reference":
        assert message == f"{nowhere}: reference checkpoint is not a directory"
    else:
        # re's own reason follows in parentheses.
        assert message.startswith("allowed pattern '(': not a regular expression (") and message.endswith(")")
