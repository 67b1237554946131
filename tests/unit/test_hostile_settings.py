"""Hostile settings (issue 11, items 1, 2, 5, 7, 8): every one is refused at plan time, exit 2,
one line naming the variable, or reaches verl exactly as written.

The round trip is proven against Hydra's own override parser and OmegaConf's own resolution
(including the in-place `OmegaConf.resolve` verl's TaskRunner runs before it reads its config).
The composition against verl's whole config is in test_hostile_overrides.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path
from random import Random

import pytest
from hypothesis import HealthCheck, assume, given, settings as hsettings, strategies as st

from recipe.cluster import rules
from recipe.errors import RecipeConfigError
from recipe.launch import checkpoint_root, hydra_string
from recipe.models import load_architecture
from recipe.plan import build_plan
from recipe.settings import Settings, load_settings

from tests.support.needs import TRAINER_EXTRA, needs

from .envtools import ENTRYPOINT, HANG_GUARD_S, clear_settings, entrypoint_env, settings_of


def _run(*args: str, **settings: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ENTRYPOINT, *args], env=entrypoint_env(**settings), capture_output=True, text=True, timeout=HANG_GUARD_S)


def _refusal(**values: str) -> list[str]:
    """The problem lines `plan` reports for these settings (they must be refused)."""
    with pytest.MonkeyPatch.context() as mp:
        clear_settings(mp)
        for name, value in values.items():
            mp.setenv(name, value)
        with pytest.raises(RecipeConfigError) as caught:
            build_plan(load_settings(), os.environ)
    return caught.value.problems


def _hydra_reads(override: str) -> object:
    """What Hydra's own parser makes of one override's value, then what OmegaConf resolves it to."""
    OverridesParser = needs("hydra.core.override_parser.overrides_parser", install=TRAINER_EXTRA).OverridesParser
    from omegaconf import OmegaConf

    value = OverridesParser.create().parse_override(override).value()
    config = OmegaConf.create({"k": value})
    return OmegaConf.to_container(config, resolve=True)["k"]


# --- item 1: interpolation in settings ------------------------------------------------------


@pytest.mark.parametrize("name", ["EXPERIMENT_NAME", "PROJECT_NAME", "CHECKPOINT_DIR", "VAL_FILES", "TRAIN_FILES", "MODEL_PATH", "DATA_DIR"])
def test_an_interpolation_in_a_setting_is_refused_naming_it(name: str) -> None:
    value = "${oc.env:HF_TOKEN}" if name.endswith("NAME") else "/x/${oc.env:HF_TOKEN}"
    done = _run("plan", "--json", HF_TOKEN="hf_leak_canary", **{name: value})
    assert done.returncode == 2, done.stdout
    assert f"error: {name}={value!r}: " in done.stderr
    assert "hf_leak_canary" not in done.stdout + done.stderr
    assert "Traceback" not in done.stderr


def test_an_interpolation_in_a_variable_the_workers_get_is_refused() -> None:
    done = _run("plan", "--json", DEVICE="gpu", HF_TOKEN="hf_leak_canary", PYTORCH_CUDA_ALLOC_CONF="max_split_size_mb:${oc.env:HF_TOKEN}")
    assert done.returncode == 2
    assert "error: PYTORCH_CUDA_ALLOC_CONF='max_split_size_mb:${oc.env:HF_TOKEN}': " in done.stderr
    assert "hf_leak_canary" not in done.stdout + done.stderr


def test_a_broken_interpolation_is_caught_by_plan() -> None:
    assert _refusal(EXPERIMENT_NAME="a${b") == [
        "EXPERIMENT_NAME='a${b': must be a literal string: `${` starts an OmegaConf interpolation, "
        "which verl would resolve (and re-resolve after its in-place OmegaConf.resolve)"
    ]


def test_escaping_is_no_remedy_because_verl_resolves_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """Why `${` is refused rather than escaped: OmegaConf.resolve (which verl's TaskRunner runs on its
    config) stores the unescaped text, and the next read resolves it (test_hostile_overrides checks
    that verl 0.9.1 does run it)."""
    omegaconf = needs("omegaconf", install=TRAINER_EXTRA)
    monkeypatch.setenv("HF_TOKEN", "hf_leak_canary")
    config = omegaconf.OmegaConf.create({"experiment_name": "\\${oc.env:HF_TOKEN}"})
    assert config.experiment_name == "${oc.env:HF_TOKEN}"  # escaped: literal on the first read
    omegaconf.OmegaConf.resolve(config)
    assert config.experiment_name == "hf_leak_canary"  # and the secret after the in-place resolve


def test_omegaconfs_missing_marker_is_refused() -> None:
    problems = _refusal(EXPERIMENT_NAME="???")
    assert len(problems) == 1 and problems[0].startswith("EXPERIMENT_NAME='???': ")


# --- item 2: quoting round-trips --------------------------------------------------------------


@pytest.mark.parametrize("text", ["run\\2024", "a\\", "\\\\", "it's", "it\\'s", "\\'", "'", "", " x ", "a\nb", "$", "{", "}", "$ {", "%", "null", "123"])
def test_hydra_reads_back_exactly_the_string(text: str) -> None:
    assert _hydra_reads("k=" + hydra_string(text)) == text


def test_a_backslash_in_a_name_reaches_verl_unchanged(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("EXPERIMENT_NAME", "run\\2024")
    plan = build_plan(load_settings(), os.environ)
    override = next(o for o in plan.overrides if o.startswith("trainer.experiment_name="))
    assert _hydra_reads(override) == "run\\2024"


_setting_text = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=30)


@hsettings(max_examples=300, deadline=None)
@given(text=_setting_text)
def test_any_string_round_trips_through_hydra_and_omegaconf_or_is_refused(text: str) -> None:
    """hydra_string refuses what cannot round-trip; everything else Hydra + OmegaConf read back exactly."""
    OverridesParser = needs("hydra.core.override_parser.overrides_parser", install=TRAINER_EXTRA).OverridesParser
    from omegaconf import OmegaConf

    try:
        quoted = hydra_string(text)
    except ValueError:
        assert "${" in text or text == "???"
        return
    assert "${" not in text and text != "???"
    assert _hydra_reads("k=" + quoted) == text
    # verl's TaskRunner resolves in place, then reads the values again: still the same string.
    config = OmegaConf.create({"k": OverridesParser.create().parse_override("k=" + quoted).value()})
    OmegaConf.resolve(config)
    assert config.k == text and OmegaConf.to_container(config, resolve=False)["k"] == text


@hsettings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(["EXPERIMENT_NAME", "PROJECT_NAME", "CHECKPOINT_DIR", "VAL_FILES"]), text=_setting_text.filter(bool))
def test_any_setting_string_is_refused_naming_it_or_reaches_hydra_exactly(name: str, text: str) -> None:
    with pytest.MonkeyPatch.context() as mp:
        clear_settings(mp)
        mp.setenv("DEVICE", "gpu")
        mp.setenv(name, text)
        try:
            plan = build_plan(load_settings(), os.environ)
        except RecipeConfigError as error:
            assert error.problems and all(p.startswith(f"{name}=") for p in error.problems), error.problems
            return
    key = {"EXPERIMENT_NAME": "trainer.experiment_name", "PROJECT_NAME": "trainer.project_name",
           "CHECKPOINT_DIR": "trainer.default_local_dir", "VAL_FILES": "data.val_files"}[name]
    override = next(o for o in plan.overrides if o.split("=", 1)[0] == key)
    expected = {"EXPERIMENT_NAME": plan.settings.experiment_name, "PROJECT_NAME": plan.settings.project_name,
                "CHECKPOINT_DIR": str(checkpoint_root(plan.settings)), "VAL_FILES": str(plan.settings.resolved_val_files)}[name]
    assert _hydra_reads(override) == expected
    if name.endswith("_NAME"):
        assert expected == text  # names are never normalised


# --- item 5: names are single path components ---------------------------------------------------


@pytest.mark.parametrize(
    "value", ["/abs/path", "../../../etc", "..", ".", "a/b", "a/../../b", "x\ny", "tab\there", "esc\x1b[2J"]
)
@pytest.mark.parametrize("name", ["EXPERIMENT_NAME", "PROJECT_NAME"])
def test_a_name_that_is_not_one_path_component_is_refused(name: str, value: str) -> None:
    problems = _refusal(**{name: value})
    assert len(problems) == 1 and problems[0].startswith(f"{name}={value!r}: must be a single path component")


def test_a_nul_in_a_name_is_refused() -> None:
    with pytest.raises(Exception) as caught:
        settings_of(EXPERIMENT_NAME="a\x00b")
    assert "single path component" in str(caught.value)


@hsettings(max_examples=300, deadline=None)
@given(project=_setting_text.filter(bool), experiment=_setting_text.filter(bool))
def test_accepted_names_keep_checkpoints_inside_checkpoint_dir(project: str, experiment: str) -> None:
    try:
        settings = settings_of(PROJECT_NAME=project, EXPERIMENT_NAME=experiment, CHECKPOINT_DIR="/ck")
    except Exception:
        return
    root = checkpoint_root(settings)
    assert os.path.normpath(root) == str(root)  # nothing to normalise away: no '..', '.', '//'
    assert root.parent.parent == Path("/ck") and root.is_relative_to("/ck")
    assert len(root.relative_to("/ck").parts) == 2


# --- item 7: RAY_ADDRESS and MASTER_ADDR ----------------------------------------------------------


@pytest.mark.parametrize(
    "value", ["auto", "ray://head:10001", "head", "head:0", "head:65536", ":6379", "head:port", "::1:6379",
              "-head:6379", "he_ad:6379", "head..x:6379", "999.1.1.1:6379", "head :6379", "http://head:8265"]
)
def test_a_ray_address_the_recipe_cannot_join_is_refused_at_plan(value: str) -> None:
    done = _run("plan", "--json", RAY_ADDRESS=value)
    assert done.returncode == 2, done.stdout
    assert f"error: RAY_ADDRESS={value!r}: " in done.stderr


@pytest.mark.parametrize("value", ["10.0.0.9:6379", "head-svc.ns.svc.cluster.local:6379", "[::1]:6379", "localhost:1", "h:65535"])
def test_a_gcs_address_passes(value: str) -> None:
    settings = settings_of(RAY_ADDRESS=value)
    role = rules.plan_ray_role(settings.nnodes, settings.node_rank, settings.master_addr, settings.ray_port, settings.ray_address)
    assert role.kind == "join-existing" and role.address == value


@pytest.mark.parametrize("value", ["head:6379", "a b", "-h", "h_", "10.0.0.1/24", "999.1.1.1", "x" * 64, "http://h", "h..x"])
def test_a_master_addr_that_is_not_a_host_is_refused(value: str) -> None:
    problems = _refusal(NNODES="2", NODE_RANK="1", MASTER_ADDR=value, EP="16", RAY_AUTH_MODE="disabled")
    assert len(problems) == 1 and problems[0].startswith(f"MASTER_ADDR={value!r}: "), problems


@pytest.mark.parametrize("value", ["10.0.0.1", "head.local", "node-1", "fe80::1", "[fe80::1]", "a" * 63])
def test_a_master_addr_host_passes_and_workers_get_a_joinable_address(value: str) -> None:
    settings = settings_of(NNODES=2, NODE_RANK=1, MASTER_ADDR=value)
    role = rules.plan_ray_role(settings.nnodes, settings.node_rank, settings.master_addr, settings.ray_port, settings.ray_address)
    host, port = rules.split_address(role.address)
    assert port == 6379 and host == value.strip("[]")


_address = st.one_of(
    st.text(st.sampled_from("ab1.-:[]_ /9"), max_size=20),
    st.builds(lambda h, p: f"{h}:{p}", st.sampled_from(["h", "10.0.0.1", "[::1]", "::1", "auto", "a.b-c", ""]), st.integers(-5, 70000)),
)


@hsettings(max_examples=300, deadline=None)
@given(value=_address)
def test_an_accepted_ray_address_never_fails_the_bootstrap_with_exit_3(value: str) -> None:
    """plan's verdict on RAY_ADDRESS agrees with what run's Ray bootstrap needs (recipe/cluster/rules.py)."""
    assume(value.strip())
    try:
        settings = settings_of(RAY_ADDRESS=value)
    except Exception:
        return
    role = rules.plan_ray_role(1, 0, None, 6379, settings.ray_address)  # raises ClusterError (exit 3) if not
    host, port = rules.split_address(role.address)
    assert host and 1 <= port <= 65535


# --- item 8: MODEL_PATH/config.json ----------------------------------------------------------------

GOOD = {
    "num_hidden_layers": 40, "num_attention_heads": 16, "num_key_value_heads": 2, "num_experts": 256,
    "moe_intermediate_size": 512, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
}


def _load(model: Path, config: object | None = None, raw: str | None = None) -> list[str]:
    model.mkdir(parents=True, exist_ok=True)
    if raw is not None:
        (model / "config.json").write_text(raw)
    elif config is not None:
        (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(RecipeConfigError) as caught:
        load_architecture(model)
    assert caught.value.problems and all(p.startswith(f"MODEL_PATH={str(model)!r}: ") for p in caught.value.problems)
    return caught.value.problems


def test_a_text_config_that_is_not_an_object_is_refused(tmp_path: Path) -> None:
    (problem,) = _load(tmp_path / "m", {"text_config": [GOOD]})
    assert "text_config" in problem


def test_json_nested_100k_deep_is_refused_without_a_traceback(tmp_path: Path) -> None:
    (problem,) = _load(tmp_path / "m", raw='{"text_config": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert "config.json" in problem


@pytest.mark.parametrize("key", list(GOOD))
@pytest.mark.parametrize("bad", [0, -2, True, False, 16.0, "16", None, [16]])
def test_a_count_that_is_not_a_positive_whole_number_is_refused(tmp_path: Path, key: str, bad: object) -> None:
    if bad is None and key.startswith("linear_"):
        return  # absent linear-attention heads mean a model without linear attention
    problems = _load(tmp_path / "m", {"text_config": {**GOOD, key: bad}})
    assert any(key in p for p in problems), problems


def test_all_zero_counts_are_refused_one_line_each(tmp_path: Path) -> None:
    problems = _load(tmp_path / "m", {k: 0 for k in GOOD})
    assert len(problems) == len(GOOD)


def test_a_config_json_that_is_a_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "m" / "config.json").mkdir(parents=True)
    (problem,) = _load(tmp_path / "m")
    assert "not a regular file" in problem


def test_a_config_json_that_is_a_fifo_is_refused_without_opening_it_blocking(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    os.mkfifo(tmp_path / "m" / "config.json")
    result: list[object] = []
    worker = threading.Thread(target=lambda: result.append(_load(tmp_path / "m")), daemon=True)
    worker.start()
    worker.join(timeout=HANG_GUARD_S)
    assert not worker.is_alive(), "load_architecture blocked on a FIFO"
    assert result and "not a regular file" in result[0][0]  # type: ignore[index]


def test_a_dangling_config_symlink_is_refused(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").symlink_to(tmp_path / "nowhere.json")
    (problem,) = _load(tmp_path / "m")
    assert "config.json" in problem


def test_a_model_path_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(RecipeConfigError) as caught:
        load_architecture(tmp_path / "weights.bin")
    assert caught.value.problems[0].startswith(f"MODEL_PATH={str(tmp_path / 'weights.bin')!r}: ")


def test_plan_names_model_path_for_a_bad_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"text_config": "x"}))
    done = _run("plan", MODEL_PATH=str(tmp_path))
    assert done.returncode == 2 and f"error: MODEL_PATH={str(tmp_path)!r}: " in done.stderr
    assert "Traceback" not in done.stderr


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 300) | st.floats(allow_nan=False) | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=8,
)


@hsettings(max_examples=200, deadline=None)
@given(config=st.dictionaries(st.sampled_from([*GOOD, "text_config"]), _json | st.sampled_from([16, 2, 1]), max_size=9))
def test_any_config_json_gives_sound_numbers_or_lines_naming_model_path(tmp_path_factory: pytest.TempPathFactory, config: dict) -> None:
    model = tmp_path_factory.mktemp("m")
    (model / "config.json").write_text(json.dumps(config))
    try:
        source = load_architecture(model)
    except RecipeConfigError as error:
        assert error.problems and all(p.startswith(f"MODEL_PATH={str(model)!r}: ") for p in error.problems)
        return
    arch = source.architecture
    for field in ("num_layers", "num_attention_heads", "num_kv_heads", "num_experts", "moe_ffn_hidden_size"):
        value = getattr(arch, field)
        assert type(value) is int and value >= 1
    assert type(arch.linear_key_heads) is int and arch.linear_key_heads >= 0


# --- issue 26: near misses in other programs' families, the .env file, ALLOW_DRIFT's fields ------


@pytest.mark.parametrize(
    ("typo", "meant"),
    [("RAY_WAIT_TIMOUT", "RAY_WAIT_TIMEOUT"), ("WANDB_APIKEY", "WANDB_API_KEY"), ("HF_TOKN", "HF_TOKEN"),
     ("RAY_ADRESS", "RAY_ADDRESS"), ("RAY_AUTH_TOKN", "RAY_AUTH_TOKEN")],
)  # fmt: skip
def test_a_typo_of_our_setting_inside_another_programs_family_is_named(typo: str, meant: str) -> None:
    from recipe.env_warnings import near_miss_warnings

    assert near_miss_warnings({typo: "1"}) == [f"{typo} is not a setting (ignored); did you mean {meant}?"]


@pytest.mark.parametrize(
    ("typo", "meant", "reader"),
    [("WANDB_PROJET", "WANDB_PROJECT", "wandb"), ("NCCL_DEBG", "NCCL_DEBUG", "nvidia_nccl_cu13"),
     ("NCCL_SOCKET_IFNAM", "NCCL_SOCKET_IFNAME", "nvidia_nccl_cu13"),
     ("HCCL_CONECT_TIMEOUT", "HCCL_CONNECT_TIMEOUT", "torch_npu"), ("RAY_DEDUP_LOGZ", "RAY_DEDUP_LOGS", "ray"),
     ("HF_HUB_OFLINE", "HF_HUB_OFFLINE", "huggingface_hub"), ("VLLM_ASCEND_ENABLE_NZZ", "VLLM_ASCEND_ENABLE_NZ", "vllm_ascend"),
     # A slip in the prefix leaves the family; the name is still found.
     ("HCL_EXEC_TIMEOUT", "HCCL_EXEC_TIMEOUT", "torch_npu"), ("WANDBB_PROJECT", "WANDB_PROJECT", "wandb")],
)  # fmt: skip
def test_a_typo_of_a_variable_a_library_reads_is_named_with_the_library(typo: str, meant: str, reader: str) -> None:
    from recipe.env_warnings import near_miss_warnings

    assert near_miss_warnings({typo: "1"}) == [
        f"{typo} is read by no library of the images (ignored); did you mean {meant}, which {reader} reads?"
    ]


def test_no_variable_a_library_reads_is_called_a_typo() -> None:
    """Every name of recipe/env_names.json, and every one the libraries installed here read (wandb may be newer)."""
    from recipe.env_names import known_names, scan_installed
    from recipe.env_warnings import near_miss_warnings

    table = {name for names in known_names().values() for name in names}
    installed = {name for entry in scan_installed().values() for names in entry.values() for name in names}
    assert len(table) > 1000 and len(installed) > 500
    assert near_miss_warnings(dict.fromkeys(table | installed, "1")) == []


def _slips(name: str, random: Random) -> str:
    at = random.randrange(1, len(name) - 1)
    return random.choice([
        name[:at] + name[at + 1 :], name[:at] + name[at] + name[at:], name[:at] + random.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") + name[at + 1 :],
        name[:at] + name[at + 1] + name[at] + name[at + 2 :],
    ])  # fmt: skip


def test_the_family_cutoff_is_the_measured_tradeoff() -> None:
    """settings.FAMILY_TYPO_CUTOFF's comment: one-letter slips named, and real names left out of the list spared."""
    import difflib

    from recipe.env_names import known_names
    from recipe.env_warnings import FAMILY_TYPO_CUTOFF

    random = Random(0)
    named = slipped = alarms = names_seen = 0
    for names in known_names().values():
        listed = sorted(names)
        for name in listed:
            typo = _slips(name, random)
            if typo not in names:
                slipped += 1
                named += difflib.get_close_matches(typo, listed, n=1, cutoff=FAMILY_TYPO_CUTOFF) == [name]
            names_seen += 1
            alarms += bool(difflib.get_close_matches(name, [other for other in listed if other != name], n=1, cutoff=FAMILY_TYPO_CUTOFF))
    assert named / slipped >= 0.97 and alarms / names_seen <= 0.07, (named / slipped, alarms / names_seen)


@hsettings(max_examples=100, deadline=None)
@given(data=st.data())
def test_any_one_letter_slip_in_a_long_library_name_is_caught(data: st.DataObject) -> None:
    # From 13 letters on, any one slip keeps difflib's ratio above the family cutoff: a warning is certain.
    from recipe.env_names import known_names
    from recipe.env_warnings import near_miss_warnings

    known = {name for names in known_names().values() for name in names}
    name = data.draw(st.sampled_from(sorted(name for name in known if len(name) >= 13)))
    typo = _slips(name, Random(data.draw(st.integers(0, 2**32))))
    assume(typo not in known and typo.upper() not in {n.upper() for n in Settings.model_fields})
    warnings = near_miss_warnings({typo: "1"})
    assert len(warnings) == 1 and "(ignored); did you mean " in warnings[0], (typo, warnings)


@pytest.mark.parametrize(
    ("line", "bad"),
    [("TP = 4", True), ("TP =4", True), ("TP= 4", True), ("export PP = 2", True), ("TP=4", False), ("# TP = 4", False),
     ("NAME=a = b", True), ("NAME='a = b'", False), ("", False)],
)  # fmt: skip
def test_an_env_file_line_with_blanks_around_the_equals_sign_is_named(tmp_path: Path, line: str, bad: bool) -> None:
    # `NAME=a = b`: Compose reads NAME='a = b', bash runs `=` as a command and leaves NAME unset.
    from recipe.env_file import env_file_problems

    env_file = tmp_path / ".env"
    env_file.write_text(f"EP=8\n{line}\n")
    problems = env_file_problems(env_file)
    assert bool(problems) is bad
    if bad:
        assert problems[0].startswith(f"{env_file}:2: ") and ("write " in problems[0] or "quote the value" in problems[0])


def test_plan_warns_about_the_env_file_it_can_see(tmp_path: Path) -> None:
    import subprocess

    from .envtools import ENTRYPOINT, HANG_GUARD_S, entrypoint_env

    (tmp_path / ".env").write_text("TP = 4\n")
    done = subprocess.run([*ENTRYPOINT, "plan"], cwd=tmp_path, env=entrypoint_env(DEVICE="gpu"), capture_output=True,
                          text=True, timeout=HANG_GUARD_S, check=False)  # fmt: skip
    assert done.returncode == 0 and "warning: .env:1: TP: Compose reads TP=4, bash runs `TP` as a command" in done.stderr


@pytest.mark.parametrize(("field", "meant"), [("TRAIN_FILE", "TRAIN_FILES"), ("FRAMEWORK", "FRAMEWORKS"), ("MODEL_PAT", "MODEL_PATH")])
def test_an_allow_drift_field_close_to_a_real_one_is_named(field: str, meant: str) -> None:
    from recipe.provenance import DRIFT_FIELDS
    from recipe.env_warnings import allow_drift_warnings
    from recipe.settings import Settings

    known = [*(name.upper() for name in Settings.model_fields), *DRIFT_FIELDS]
    assert allow_drift_warnings([field, "MY_LR", "TP"], known) == [
        f"ALLOW_DRIFT names {field}, which is no field a record compares; did you mean {meant}?"
    ]
