"""Layout: device and chip defaults, every Megatron/vLLM/verl divisibility rule, all problems at once.

Also the exact `plan --json` layout (sizes, world, DP, where each size came from) and the one known
upstream failure refused by name (GEN_TP=4 on npu for Qwen3.5-35B-A3B).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recipe.errors import RecipeConfigError
from recipe.layout import resolve_layout
from recipe.models import (
    QWEN3_5_35B_A3B,
    ModelArchitecture,
    architecture_from_config,
    load_architecture,
)
from recipe.settings import load_settings

from .envtools import REPO, settings_of


def _problems(device: str = "gpu", **values: object) -> list[str]:
    with pytest.raises(RecipeConfigError) as caught:
        resolve_layout(settings_of(**values), device, QWEN3_5_35B_A3B)  # type: ignore[arg-type]
    return caught.value.problems


#: Upstream's reference launch (verl examples/grpo_trainer/run_qwen3_5_35b_megatron.sh), as the
#: README's settings table gives it: written out here, never read from recipe.layout's own table.
UPSTREAM_DEFAULTS = {
    #       TP PP CP EP ETP GEN_TP, devices per node
    "gpu": ((2, 1, 1, 8, 1, 8), 8),
    "npu": ((2, 2, 1, 8, 1, 8), 16),
}


@pytest.mark.parametrize("device", ["gpu", "npu"])
def test_upstream_defaults_fill_unset_values(device: str) -> None:
    layout = resolve_layout(settings_of(), device, QWEN3_5_35B_A3B)  # type: ignore[arg-type]
    sizes, per_node = UPSTREAM_DEFAULTS[device]
    assert (layout.tp, layout.pp, layout.cp, layout.ep, layout.etp, layout.gen_tp) == sizes
    assert layout.ndevices_per_node == per_node
    label = f"default for {device}" + (" (a3)" if device == "npu" else "")  # npu: the default chip's
    assert all(source == label for name, source in layout.sources.items() if name != "NNODES")


def test_the_readme_table_gives_the_same_defaults() -> None:
    """README's settings table is what users read: its TP/PP/CP/EP/ETP/GEN_TP rows say the same numbers."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `(TP|PP|CP|EP|ETP|GEN_TP)` \| ([^|]+) \|", readme, flags=re.MULTILINE))
    assert sorted(rows) == sorted(["TP", "PP", "CP", "EP", "ETP", "GEN_TP"]), rows
    for device, (sizes, _) in UPSTREAM_DEFAULTS.items():
        for name, value in zip(["TP", "PP", "CP", "EP", "ETP", "GEN_TP"], sizes):
            cell = rows[name].strip()
            per_device = dict(re.findall(r"(gpu|npu) (\d+)", cell))
            assert int(per_device.get(device, cell)) == value, f"README's {name} row {cell!r} for {device}"


def test_a_user_value_is_kept_and_marked() -> None:
    layout = resolve_layout(settings_of(TP=4, PP=2), "npu", QWEN3_5_35B_A3B)
    assert (layout.tp, layout.pp, layout.dp) == (4, 2, 2)
    assert layout.sources["TP"] == "environment" and layout.sources["EP"] == "default for npu (a3)"


def test_tp_that_does_not_divide_the_heads() -> None:
    assert "TP=3: must divide the model's 16 attention heads" in _problems(TP=3, NDEVICES_PER_NODE=6)


def test_kv_heads_must_be_a_multiple_or_divisor_of_tp() -> None:
    model = architecture_from_config(
        {"num_hidden_layers": 4, "num_attention_heads": 12, "num_key_value_heads": 4, "num_experts": 8,
         "moe_intermediate_size": 64}, "m")
    with pytest.raises(RecipeConfigError) as caught:
        resolve_layout(settings_of(TP=6, EP=1, GEN_TP=6, NDEVICES_PER_NODE=6), "gpu", model)
    assert caught.value.problems == ["TP=6: must be a multiple or a divisor of the model's 4 KV heads (query groups)"]


def test_linear_attention_heads_over_tp_times_cp() -> None:
    problems = _problems(TP=2, CP=16, NDEVICES_PER_NODE=32, EP=8)
    assert "TP=2, CP=16: TP x CP = 32 must divide the model's 16 linear-attention key heads" in problems
    assert not any("value heads" in p for p in problems)


def test_experts_over_ep() -> None:
    assert "EP=6: must divide the model's 256 experts" in _problems(EP=6)


def test_expert_hidden_over_etp() -> None:
    assert "ETP=3: must divide the model's expert hidden size 512" in _problems(ETP=3)


def test_layers_over_pp() -> None:
    assert "PP=3: must divide the model's 40 layers" in _problems(PP=3)


def test_world_size_over_tp_pp_cp() -> None:
    problems = _problems(TP=4, PP=4, NDEVICES_PER_NODE=8)
    assert any(p.startswith("TP=4, PP=4, CP=1: TP x PP x CP = 16 must divide the world size of 8 devices") for p in problems)


def test_world_size_over_expert_parallel() -> None:
    problems = _problems(EP=16, NDEVICES_PER_NODE=8)
    assert any(p.startswith("EP=16, ETP=1, PP=1: EP x ETP x PP = 16 must divide the world size") for p in problems)


def test_gen_tp_over_world_and_heads() -> None:
    problems = _problems(GEN_TP=32, NDEVICES_PER_NODE=8)
    assert any(p.startswith("GEN_TP=32: must divide the world size of 8 devices") for p in problems)
    assert "GEN_TP=32: must divide the model's 16 attention heads (vLLM)" in problems


def test_fixed_batches_over_data_parallel_on_gpu_only() -> None:
    # 3 nodes x 8 GPUs, TP 2: DP 12 does not divide 32 x 5 = 160 samples.
    problems = _problems(NNODES=3, MASTER_ADDR="10.0.0.1", NODE_RANK=0, RAY_AUTH_MODE="disabled")
    assert any(p.startswith("TRAIN_BATCH_SIZE=32, ROLLOUT_N=5: their product 160 must be divisible by the data-parallel size 12") for p in problems)
    # npu batches by tokens (use_dynamic_bsz), where verl pads instead.
    resolve_layout(
        settings_of(NNODES=3, MASTER_ADDR="10.0.0.1", NDEVICES_PER_NODE=8, PP=1, RAY_AUTH_MODE="disabled"), "npu", QWEN3_5_35B_A3B
    )


def test_several_nodes_need_an_address_and_a_rank_below_nnodes() -> None:
    problems = _problems(NNODES=2, NODE_RANK=2)
    assert "NODE_RANK=2: must be in [0, NNODES=2)" in problems
    assert "MASTER_ADDR=: must name the NODE_RANK=0 host when NNODES=2 and NODE_RANK=2 (or RAY_ADDRESS a running cluster)" in problems


def test_all_violations_are_reported_together() -> None:
    problems = _problems(TP=3, PP=7, EP=6)
    named = {p.split(":")[0] for p in problems}
    assert {"TP=3", "PP=7", "EP=6"} <= named


def test_architecture_is_read_from_the_vlm_config(tmp_path: Path) -> None:
    text = {"num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 2, "num_experts": 16,
            "moe_intermediate_size": 128, "linear_num_key_heads": 4, "linear_num_value_heads": 8}
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_5_moe", "text_config": text}))
    source = load_architecture(tmp_path)
    assert source.source == str(tmp_path / "config.json")
    assert (source.architecture.num_layers, source.architecture.linear_key_heads) == (8, 4)
    # The same layout now breaks rules of this smaller model.
    with pytest.raises(RecipeConfigError) as caught:
        resolve_layout(settings_of(PP=16, NDEVICES_PER_NODE=32, EP=32), "gpu", source.architecture)
    assert "PP=16: must divide the model's 8 layers" in caught.value.problems
    assert "EP=32: must divide the model's 16 experts" in caught.value.problems


def test_without_config_json_the_built_in_profile_is_used(tmp_path: Path) -> None:
    source = load_architecture(tmp_path)
    assert source.architecture == QWEN3_5_35B_A3B and "built-in profile" in source.source


def test_a_broken_config_json_names_model_path(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(RecipeConfigError) as caught:
        load_architecture(tmp_path)
    assert caught.value.problems[0].startswith(f"MODEL_PATH={str(tmp_path)!r}: config.json: not JSON (")


def test_a_config_without_the_numbers_names_each_missing_key(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"num_hidden_layers": 4}}))
    with pytest.raises(RecipeConfigError) as caught:
        load_architecture(tmp_path)
    assert len(caught.value.problems) == 4
    assert all(p.startswith("MODEL_PATH=") and "config.json lacks" in p for p in caught.value.problems)


# --- Ray's authentication across machines (issue 11, item 19) ---------------------------------

TWO_NODES = {"NNODES": 2, "MASTER_ADDR": "10.0.0.1", "EP": 16}
AUTH_RULE = "RAY_AUTH_MODE=: must be token when NNODES=2 starts Ray across machines"


def test_several_nodes_without_ray_auth_are_refused() -> None:
    problems = _problems(**TWO_NODES)
    assert any(p.startswith(AUTH_RULE) for p in problems), problems
    # The token the mode needs is asked for in the same round (issue 43: errors came in two rounds).
    assert any(p.startswith("RAY_AUTH_TOKEN=: must be set") for p in problems), problems


def test_token_mode_needs_the_token_and_never_shows_it() -> None:
    assert "RAY_AUTH_TOKEN=: must be set (the same on every node) when RAY_AUTH_MODE=token" in _problems(
        **TWO_NODES, RAY_AUTH_MODE="token"
    )
    resolve_layout(settings_of(**TWO_NODES, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="s3cr3t" * 6), "gpu", QWEN3_5_35B_A3B)


def test_disabled_by_name_or_a_kuberay_cluster_is_accepted() -> None:
    resolve_layout(settings_of(**TWO_NODES, RAY_AUTH_MODE="disabled"), "gpu", QWEN3_5_35B_A3B)
    # KubeRay's cluster: RAY_ADDRESS set, KubeRay made and distributed its own token.
    resolve_layout(settings_of(NNODES=2, EP=16, RAY_ADDRESS="10.0.0.1:6379"), "gpu", QWEN3_5_35B_A3B)


def test_one_node_needs_no_ray_auth() -> None:
    resolve_layout(settings_of(), "gpu", QWEN3_5_35B_A3B)


@settings(max_examples=40, deadline=None)
@given(mode=st.text(min_size=1, max_size=12).filter(lambda s: s.strip() not in ("token", "disabled", "") and "\x00" not in s))
def test_any_other_ray_auth_mode_is_a_named_error(mode: str) -> None:
    # Read from the environment by the real loader, as the entrypoint does.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_AUTH_MODE", mode)
        with pytest.raises(RecipeConfigError) as caught:
            load_settings()
    assert any(p.startswith("RAY_AUTH_MODE=") for p in caught.value.problems), caught.value.problems


@settings(max_examples=40, deadline=None)
@given(token=st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=8, max_size=40))
def test_the_token_never_appears_in_a_layout_error(token: str) -> None:
    # A bad layout beside a token: the errors name the rule, never the token.
    problems = _problems(**TWO_NODES, TP=3, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    assert problems and not any(token in p for p in problems)


# --- Exact outcomes: sources, chips, the smoke profile, every product rule (issue 27) ------------

GPU_WORLD_8 = "8 devices (NNODES=1 x NDEVICES_PER_NODE=8)"


def test_plan_json_shows_every_size_the_world_dp_and_where_each_came_from() -> None:
    layout = resolve_layout(settings_of(TP=4), "gpu", QWEN3_5_35B_A3B)
    default = "default for gpu"
    assert layout.to_dict() == {
        "tp": 4, "pp": 1, "cp": 1, "ep": 8, "etp": 1, "gen_tp": 8, "nnodes": 1, "ndevices_per_node": 8,
        "world_size": 8, "dp": 2,  # 8 devices / TP 4
        "sources": {"TP": "environment", "PP": default, "CP": default, "EP": default, "ETP": default,
                    "GEN_TP": default, "NDEVICES_PER_NODE": default, "NNODES": "default"},
    }


@pytest.mark.parametrize(("values", "source"), [({}, "default"), ({"NNODES": 1}, "environment")])
def test_nnodes_source_says_whether_the_user_set_it(values: dict[str, object], source: str) -> None:
    # Even a value equal to the default is the user's when they wrote it.
    assert resolve_layout(settings_of(**values), "gpu", QWEN3_5_35B_A3B).sources["NNODES"] == source


def test_a_910b_node_gets_eight_devices_and_pp_1() -> None:
    # An Atlas A2 node has 8 NPUs (docs: chip.py); upstream's PP=2 with EP=8 would need 16.
    layout = resolve_layout(settings_of(), "npu", QWEN3_5_35B_A3B, chip="910b")
    assert (layout.tp, layout.pp, layout.cp, layout.ep, layout.etp, layout.gen_tp) == (2, 1, 1, 8, 1, 8)
    assert layout.ndevices_per_node == 8
    assert set(layout.sources.values()) == {"default for npu (910b)", "default"}


@pytest.mark.parametrize("device", ["gpu", "npu"])
def test_the_smoke_profile_runs_everything_on_one_device(device: str) -> None:
    # docs/smoke.md: the smoke profile is the whole stack on one device.
    layout = resolve_layout(settings_of(PROFILE="smoke"), device, QWEN3_5_35B_A3B)  # type: ignore[arg-type]
    assert (layout.tp, layout.pp, layout.cp, layout.ep, layout.etp, layout.gen_tp, layout.world_size) == (1,) * 7
    assert {name: source for name, source in layout.sources.items() if name != "NNODES"} == {
        name: "smoke profile" for name in ("TP", "PP", "CP", "EP", "ETP", "GEN_TP", "NDEVICES_PER_NODE")
    }


@pytest.mark.parametrize("device", ["gpu", "npu"])
def test_a_full_runs_layout_under_the_smoke_profile_is_named_with_both_ways_out(device: str) -> None:
    """Issue 54: PROFILE=smoke with the full run's TP and EP still in .env: besides the rules broken, one line names
    the profile, the sizes set and the fix; a smoke run with a layout that happens to fit gets no such line."""
    with pytest.raises(RecipeConfigError) as caught:
        resolve_layout(settings_of(PROFILE="smoke", TP=4, EP=8), device, QWEN3_5_35B_A3B)  # type: ignore[arg-type]
    assert caught.value.problems[-1] == (
        "PROFILE=smoke: trains its own tiny model on its own layout (TP=1 PP=1 CP=1 EP=1 ETP=1 GEN_TP=1 "
        "NDEVICES_PER_NODE=1), and TP=4 EP=8 (set here, e.g. in .env for the full run) replace it; unset them for "
        "the smoke run, or set PROFILE=full"
    )
    with pytest.raises(RecipeConfigError) as full:
        resolve_layout(settings_of(TP=3), device, QWEN3_5_35B_A3B)  # type: ignore[arg-type]
    assert not any("PROFILE=smoke" in line for line in full.value.problems)


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_tp_that_divides_or_is_a_multiple_of_the_kv_heads_is_accepted(tp: int) -> None:
    # Qwen3.5-35B-A3B has 2 KV heads: TP 1 divides them, 4 and 8 are multiples (Megatron replicates).
    layout = resolve_layout(settings_of(TP=tp), "gpu", QWEN3_5_35B_A3B)
    assert layout.tp == tp


def _small_model(**overrides: int | None) -> ModelArchitecture:
    """A small model's config.json numbers with `overrides` applied; None leaves the key out."""
    config: dict[str, int | None] = {"num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 8,
                                     "num_experts": 8, "moe_intermediate_size": 64, "linear_num_key_heads": 4,
                                     "linear_num_value_heads": 8}
    config.update(overrides)
    return architecture_from_config({k: v for k, v in config.items() if v is not None}, "small")


@pytest.mark.parametrize(
    ("model_numbers", "tp", "problems"),
    [
        # Only the value heads fail to split: the line names the value heads.
        ({"linear_num_key_heads": 4, "linear_num_value_heads": 6}, 4,
         ["TP=4, CP=1: TP x CP = 4 must divide the model's 6 linear-attention value heads"]),
        # A single linear-attention head cannot be split over two ranks either.
        ({"linear_num_key_heads": 1, "linear_num_value_heads": 2}, 2,
         ["TP=2, CP=1: TP x CP = 2 must divide the model's 1 linear-attention key heads"]),
        # A model without linear attention (no such keys in config.json) has no such rule at any TP.
        ({"linear_num_key_heads": None, "linear_num_value_heads": None}, 8, []),
    ],
    ids=["value-heads", "one-key-head", "no-linear-attention"],
)
def test_linear_attention_heads_are_checked_one_kind_at_a_time(
    model_numbers: dict[str, int | None], tp: int, problems: list[str]
) -> None:
    values = {"TP": tp, "EP": 8, "GEN_TP": 8, "NDEVICES_PER_NODE": 8}
    if problems:
        with pytest.raises(RecipeConfigError) as caught:
            resolve_layout(settings_of(**values), "gpu", _small_model(**model_numbers))
        assert caught.value.problems == problems
    else:
        assert resolve_layout(settings_of(**values), "gpu", _small_model(**model_numbers)).tp == tp


@pytest.mark.parametrize(
    ("values", "problems"),
    [
        # CP counts in the dense product: 2 x 1 x 2 = 4 does not divide 14. The batch rule is left out,
        # since no whole data-parallel size exists to name.
        ({"TP": 2, "CP": 2, "EP": 2, "GEN_TP": 2, "NDEVICES_PER_NODE": 14},
         ["TP=2, PP=1, CP=2: TP x PP x CP = 4 must divide the world size of 14 devices (NNODES=1 x NDEVICES_PER_NODE=14)"]),
        # PP counts in the expert product: upstream's npu PP=2 with EP=8 needs 16 devices, not 8.
        ({"PP": 2, "NDEVICES_PER_NODE": 8},
         [f"EP=8, ETP=1, PP=2: EP x ETP x PP = 16 must divide the world size of {GPU_WORLD_8}"]),
        # ETP counts in the expert product too: 4 x 2 = 8 does not divide 4.
        ({"EP": 4, "ETP": 2, "GEN_TP": 4, "NDEVICES_PER_NODE": 4},
         ["EP=4, ETP=2, PP=1: EP x ETP x PP = 8 must divide the world size of 4 devices (NNODES=1 x NDEVICES_PER_NODE=4)"]),
    ],
    ids=["cp-in-dense-product", "pp-in-expert-product", "etp-in-expert-product"],
)
def test_every_size_counts_in_the_products_that_must_divide_the_world(values: dict[str, object], problems: list[str]) -> None:
    assert _problems(**values) == problems


GEN_TP4_REFUSED = (
    "GEN_TP=4: vllm-ascend fails to load Qwen3.5-35B-A3B with rollout TP 4 (an NZ-format matmul on a [2048, 1] "
    "weight: vllm-ascend#10014, vllm-ascend#11621; verl's A3 settings moved to 8, verl#6972); use GEN_TP=8, or "
    "set ALLOW_UPSTREAM_ISSUE=vllm-ascend#10014 to try a vllm-ascend that fixes it"
)
#: Qwen3.5-35B-A3B's text_config numbers as its config.json on the hub gives them, read under the path's name.
QWEN_CONFIG = {"num_hidden_layers": 40, "num_attention_heads": 16, "num_key_value_heads": 2, "num_experts": 256,
               "moe_intermediate_size": 512, "linear_num_key_heads": 16, "linear_num_value_heads": 32}


@pytest.mark.parametrize(
    "model",
    [QWEN3_5_35B_A3B, architecture_from_config(QWEN_CONFIG, "/models/Qwen3.5-35B-A3B")],
    ids=["built-in-profile", "read-from-config-json"],
)
def test_gen_tp_4_on_npu_is_refused_for_this_model_naming_the_upstream_issue(model: ModelArchitecture) -> None:
    with pytest.raises(RecipeConfigError) as caught:
        resolve_layout(settings_of(GEN_TP=4), "npu", model)
    assert caught.value.problems == [GEN_TP4_REFUSED]


@pytest.mark.parametrize(
    ("device", "model", "values"),
    [
        # The user has read the issue and names it: let through.
        ("npu", QWEN3_5_35B_A3B, {"ALLOW_UPSTREAM_ISSUE": "vllm-ascend#10014"}),
        # vLLM on gpu loads it with TP 4.
        ("gpu", QWEN3_5_35B_A3B, {}),
        # Another model's numbers: the report is about Qwen3.5-35B-A3B only.
        ("npu", architecture_from_config({**QWEN_CONFIG, "num_hidden_layers": 48}, "other"), {}),
    ],
    ids=["allowed", "gpu", "other-model"],
)
def test_gen_tp_4_is_accepted_where_the_upstream_failure_does_not_apply(
    device: str, model: ModelArchitecture, values: dict[str, object]
) -> None:
    layout = resolve_layout(settings_of(GEN_TP=4, **values), device, model)  # type: ignore[arg-type]
    assert layout.gen_tp == 4
