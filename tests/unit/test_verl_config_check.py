"""recipe.verl_config, function by function: what `plan` finds when it composes verl's config with the overrides.

Most tests compose a small verl-shaped tree written here (a `ppo_trainer.yaml` and two dataclass files), so that
each outcome is decided by a config whose every key the test chose, and a composition takes milliseconds instead
of seconds; Hydra and OmegaConf are the real ones. A few tests compose the installed verl's own config, which is
what `plan` composes in the image. The expected lines are written by hand from the rules in the module's
docstrings (the oracle is the rule, not the implementation's own tables).
"""

from __future__ import annotations

import ast
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, strategies as st

from recipe import verl_config as vc, verl_types as vt
from recipe.launch import Override
from tests.support.needs import TRAINER_EXTRA, needs

needs("hydra", install=TRAINER_EXTRA)

from omegaconf import OmegaConf  # noqa: E402
from omegaconf.basecontainer import BaseContainer  # noqa: E402

#: A verl-shaped trainer config: typed defaults (bool, int, float), null defaults a dataclass types, and keys nothing types.
PPO_TRAINER = """\
free_top: null
trainer:
  resume_mode: auto
  total_training_steps: null
  total_epochs: 1
  project_name: demo
  n_gpus_per_node: 8
  use_legacy: false
  ratio: 0.5
  model_path: null
  label: null
actor:
  _target_: verl.workers.config.ActorConfig
  clip: null
  micro: null
  name: null
  steps: null
  deep: null
  undeclared: null
foreign:
  _target_: elsewhere.Config
  clip: null
other:
  free: null
ray_kwargs:
  ray_init:
    runtime_env:
      env_vars: {}
"""
ACTOR_PY = """\
from dataclasses import dataclass
from typing import Optional
from abc import ABC
from .base import BaseConfig

@dataclass
class Mixin:
    deep: Optional[int] = None

@dataclass
class ActorConfig(BaseConfig, Mixin, ABC):
    clip: Optional[float] = None
    micro: "int | None" = None
    name: Optional[str] = None
"""
BASE_PY = """\
from dataclasses import dataclass
from typing import Optional
from ..shared import Root

@dataclass
class BaseConfig(Root):
    steps: Optional[int] = None
"""
SHARED_PY = """\
from dataclasses import dataclass

@dataclass
class Root:
    seed: int = 0
"""

ALLOC = "PYTORCH_CUDA_ALLOC_CONF"
ENV = "ray_kwargs.ray_init.runtime_env.env_vars."
#: The recipe's own overrides in these tests: two keys settings decide, one the recipe sets freely, one allocator value.
RECIPE = [
    Override("trainer.n_gpus_per_node", "8", setting="NDEVICES_PER_NODE"),
    Override("trainer.project_name", "demo", setting="PROJECT_NAME"),
    Override("trainer.resume_mode", "auto"),
    Override("trainer.label", "'8'", setting="LABEL"),
    Override(f"{ENV}{ALLOC}", "'expandable_segments:False'", prefix="+"),
]
ALLOCATOR_RULE = "EXPANDABLE_SEGMENTS and PYTORCH_CUDA_ALLOC_CONF / PYTORCH_NPU_ALLOC_CONF (the allocator policy)"


@pytest.fixture
def verl_tree(tmp_path: Path) -> Path:
    """A fake installed verl: its trainer config directory (verl/trainer/config), dataclasses under verl/workers."""
    root = tmp_path / "verl"
    config = root / "trainer" / "config"
    config.mkdir(parents=True)
    (config / "ppo_trainer.yaml").write_text(PPO_TRAINER)
    (root / "workers" / "config").mkdir(parents=True)
    (root / "workers" / "config" / "actor.py").write_text(ACTOR_PY)
    (root / "workers" / "config" / "base.py").write_text(BASE_PY)
    (root / "workers" / "shared.py").write_text(SHARED_PY)
    return config


@pytest.fixture
def fake_verl(verl_tree: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """check_verl_config composes the fake tree instead of the installed verl."""
    monkeypatch.setattr(vc, "verl_config_dir", lambda: verl_tree)
    return verl_tree


def check(*extra: str, recipe: list[Override] = RECIPE) -> vc.VerlConfigCheck:
    """What `plan` would find with these overrides after `--` (the final list: the recipe's, then these)."""
    return vc.check_verl_config(recipe, [*map(str, recipe), *extra], list(extra))


# --- where verl's config is ---------------------------------------------------------------------------------------


def test_the_installed_verls_config_directory_is_found_without_importing_verl() -> None:
    needs("verl", install=TRAINER_EXTRA)
    found = vc.verl_config_dir()
    assert found is not None and found.parts[-3:] == ("verl", "trainer", "config")
    assert (found / "ppo_trainer.yaml").is_file()


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param(ImportError("broken"), id="find_spec raises ImportError"),
        pytest.param(ValueError("no spec"), id="find_spec raises ValueError"),
        pytest.param(None, id="verl not installed"),
        pytest.param(SimpleNamespace(submodule_search_locations=None), id="a module, not a package"),
        pytest.param(SimpleNamespace(submodule_search_locations=["/nonexistent"]), id="a package without the config"),
    ],
)
def test_no_verl_config_directory_is_none(spec: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def find_spec(name: str) -> Any:
        assert name == "verl"
        if isinstance(spec, Exception):
            raise spec
        return spec

    monkeypatch.setattr(vc, "find_spec", find_spec)
    assert vc.verl_config_dir() is None


def test_the_first_location_holding_the_trainer_config_wins(verl_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty"
    (empty / "trainer" / "config").mkdir(parents=True)  # the directory without ppo_trainer.yaml does not count
    spec = SimpleNamespace(submodule_search_locations=[str(empty), str(verl_tree.parents[1])])
    monkeypatch.setattr(vc, "find_spec", lambda name: spec)
    assert vc.verl_config_dir() == verl_tree


@pytest.mark.parametrize("missing", ["verl's config", "Hydra"])
def test_without_verl_or_hydra_the_overrides_are_refused_with_the_way_to_check_them(missing: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if missing == "Hydra":
        monkeypatch.setattr(vc, "hydra_override_parser", lambda: None)
    else:
        monkeypatch.setattr(vc, "verl_config_dir", lambda: None)
    assert check("trainer.total_epochs=2", "+x=1").problems == [
        "your overrides (2): need verl's trainer config (pip install '.[trainer]', or the image) to be checked "
        "the way the trainer reads them; run `plan` in the image (docker compose run --rm gpu plan -- ...)"
    ]


# --- composing ----------------------------------------------------------------------------------------------------


def test_composition_applies_the_overrides_to_the_config_unresolved(verl_tree: Path) -> None:
    config = vc.compose_verl_config(["trainer.total_epochs=3", "+trainer.copy=${trainer.ratio}"], verl_tree)
    assert config.trainer.total_epochs == 3
    assert OmegaConf.to_container(config.trainer)["copy"] == "${trainer.ratio}"  # not resolved


def test_the_installed_verls_config_composes_with_an_override() -> None:
    verl = needs("verl", install=TRAINER_EXTRA)
    config = vc.compose_verl_config(["trainer.total_epochs=3"], Path(verl.__file__).parent / "trainer" / "config")
    assert config.trainer.total_epochs == 3 and config.trainer.resume_mode == "auto"


@pytest.mark.parametrize(
    ("raised", "problem"),
    [
        (ValueError("first line\n   second line  \n\n third"), "first line; second line; third"),
        (ValueError(""), "ValueError"),
        (KeyError("x" * 500), "'" + "x" * 399),  # cut at 400 characters
    ],
)
def test_a_composition_failure_is_one_line(raised: Exception, problem: str, verl_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def compose(overrides: Any, config_dir: Path) -> Any:
        raise raised

    monkeypatch.setattr(vc, "compose_verl_config", compose)
    assert vc._compose_problem(["a=1"], verl_tree) == problem


def test_a_composition_that_succeeds_is_no_problem(verl_tree: Path) -> None:
    assert vc._compose_problem(["trainer.total_epochs=2"], verl_tree) is None


# --- the checks, on the fake tree -----------------------------------------------------------------------------------


def test_overrides_verl_accepts_are_no_problem_and_read_nothing(fake_verl: Path) -> None:
    assert check("trainer.total_epochs=2", "+trainer.note=hello") == vc.VerlConfigCheck([], {}, {})


def test_each_override_verls_config_rejects_is_named_and_the_rest_still_checked(fake_verl: Path) -> None:
    assert check("trainer.nope=1", "trainer.total_epochs=x", "actor.missing=2", "trainer.ratio=0.25").problems == [
        "override 'trainer.nope=1': verl's config rejects it (Could not override 'trainer.nope'.; "
        "To append to your config use +trainer.nope=1)",
        "override 'actor.missing=2': verl's config rejects it (Could not override 'actor.missing'.; "
        "To append to your config use +actor.missing=2)",
        "override 'trainer.total_epochs=x': trainer.total_epochs is an int in verl's config (default 1), not 'x'; "
        "verl would fail on it only when its trainer starts",
    ]


def test_a_rejected_override_alone_among_good_ones_is_the_only_problem(fake_verl: Path) -> None:
    # trainer.resume_mode=auto merges into exactly the recipe's overrides: nothing to compose for it alone.
    assert check("trainer.resume_mode=auto", "trainer.nope=1").problems == [
        "override 'trainer.nope=1': verl's config rejects it (Could not override 'trainer.nope'.; "
        "To append to your config use +trainer.nope=1)"
    ]


def test_overrides_rejected_only_together_are_refused_together(fake_verl: Path) -> None:
    assert check("+trainer.new=1", "+trainer.new=2").problems == [
        "your overrides: verl's config rejects them together (Could not append to config. An item is already "
        "at 'trainer.new'.; Either remove + prefix: 'trainer.new=2'; Or add a second + to add or override "
        "'trainer.new': '++trainer.new=2')"
    ]


@pytest.mark.parametrize(
    ("override", "shown"),
    [
        ("trainer.resume_mode=bogus", "'bogus'"),
        ("trainer.resume_mode=${trainer.project_name}", "'${trainer.project_name}'"),  # an interpolation, even to a mode
    ],
)
def test_a_resume_mode_the_guard_cannot_vouch_for_is_refused(override: str, shown: str, fake_verl: Path) -> None:
    assert check(override).problems == [
        f"trainer.resume_mode={shown}: must be one of auto, disable, resume_path, written literally (verl 0.9.1 "
        "knows no other mode, and the resume guard checks what it reads before the run: an interpolation is "
        "resolved only later); use trainer.resume_mode=auto, trainer.resume_mode=disable, or "
        "trainer.resume_mode=resume_path trainer.resume_from_path=<global_step_N dir>"
    ]


def test_an_interpolated_resume_mode_is_refused_even_when_it_names_a_mode(fake_verl: Path) -> None:
    problems = check("+trainer.mode_source=auto", "trainer.resume_mode=${trainer.mode_source}").problems
    assert [p.split(":", 1)[0] for p in problems] == ["trainer.resume_mode='${trainer.mode_source}'"]


@pytest.mark.parametrize(
    ("override", "now", "planned", "setting"),
    [
        ("trainer.n_gpus_per_node=4", "4", "8", "NDEVICES_PER_NODE"),
        ("trainer.label=8", "8", "'8'", "LABEL"),  # the same digits, but a number: verl reads an int
        ("trainer.project_name=${trainer.resume_mode}", "'auto'", "'demo'", "PROJECT_NAME"),  # through an interpolation
        ("~trainer.project_name", "None", "'demo'", "PROJECT_NAME"),  # deleted
    ],
)
def test_a_key_a_setting_decides_that_ends_up_changed_is_refused_naming_the_setting(
    override: str, now: str, planned: str, setting: str, fake_verl: Path
) -> None:
    key = override.lstrip("~").split("=")[0]
    assert check(override).problems == [
        f"your overrides: change {key} (now {now}, planned {planned}), which {setting} decides; set that instead"
    ]


@pytest.mark.parametrize(
    ("override", "have", "want"),
    [
        (f"+{ENV}PYTORCH_ALLOC_CONF=expandable_segments:True", "PYTORCH_ALLOC_CONF='expandable_segments:True'", "None"),
        (f"{ENV}{ALLOC}=expandable_segments:True", f"{ALLOC}='expandable_segments:True'", "'expandable_segments:False'"),
        (f"~{ENV}{ALLOC}", f"{ALLOC}=None", "'expandable_segments:False'"),
    ],
)
def test_no_allocator_variable_but_the_planned_one_reaches_the_workers(override: str, have: str, want: str, fake_verl: Path) -> None:
    assert check(override).problems == [
        f"your overrides: put {have} into the Ray workers' environment (planned {want}), which {ALLOCATOR_RULE} decides"
    ]


# --- what resolving the config reads --------------------------------------------------------------------------------


def test_every_ordinary_variable_oc_env_reads_is_recorded_with_its_value_now(fake_verl: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H13_SET", "value")
    monkeypatch.delenv("H13_UNSET", raising=False)
    monkeypatch.setenv("H13_NAME", "H13_SET")
    found = check(
        "+trainer.b=${oc.env:H13_UNSET,fallback}",
        "+trainer.a=${oc.env:H13_SET}",
        "+trainer.name=${oc.env:H13_NAME}",
    )
    assert found.problems == []
    assert found.environment_reads == {"H13_NAME": "H13_SET", "H13_SET": "value", "H13_UNSET": None}
    assert list(found.environment_reads) == sorted(found.environment_reads)  # the record is sorted by name


def test_a_secret_read_through_oc_env_is_refused_without_its_value(fake_verl: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H13_API_TOKEN", "hunter2")
    found = check("+trainer.tok=${oc.env:H13_API_TOKEN}", "+trainer.list=[x, '${oc.env:H13_API_TOKEN}']")
    assert found.problems == [
        f"your overrides: {path} would hold the secret H13_API_TOKEN (read through oc.env); a secret reaches "
        "verl only through the environment, never its config (which verl prints and logs)"
        for path in ("trainer.tok", "trainer.list[1]")
    ]
    assert found.environment_reads == {}
    assert "hunter2" not in repr(found)


def test_oc_env_reads_the_real_environment_again_after_the_check(fake_verl: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H13_API_TOKEN", "hunter2")
    check("+trainer.tok=${oc.env:H13_API_TOKEN}")
    assert OmegaConf.create({"t": "${oc.env:H13_API_TOKEN}"}).t == "hunter2"


def test_without_an_oc_env_resolver_before_none_is_left_after(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(BaseContainer._resolvers, "oc.env")
    seen: set[str] = set()
    reads: dict[str, str | None] = {}
    with vc._secret_reads_marked(seen, reads):
        assert OmegaConf.create({"t": "${oc.env:H13_MY_PASSWORD}"}).t == "<<recipe:secret-read:H13_MY_PASSWORD>>"
    assert "oc.env" not in BaseContainer._resolvers
    assert seen == {"H13_MY_PASSWORD"} and reads == {}


def test_inside_the_marker_an_ordinary_variable_reads_its_real_value_and_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H13_SET", "value")
    monkeypatch.delenv("H13_UNSET", raising=False)
    reads: dict[str, str | None] = {}
    with vc._secret_reads_marked(set(), reads):
        config = OmegaConf.create({"a": "${oc.env:H13_SET}", "b": "${oc.env:H13_UNSET,dflt}"})
        assert (config.a, config.b) == ("value", "dflt")
        # Not cached: a read after the variable changed sees the new value.
        monkeypatch.setenv("H13_SET", "other")
        assert config.a == "other"
    assert reads == {"H13_SET": "other", "H13_UNSET": None}


def _escaped(levels: int) -> str:
    """`${trainer.total_epochs}` escaped `levels` - 1 times: each escape keeps it text through one more resolution."""
    text = "${trainer.total_epochs}"
    for _ in range(levels - 1):
        text = text.replace("\\", "\\\\").replace("${", "\\${")
    return text


def test_an_interpolation_left_after_the_resolutions_verl_does_is_refused(fake_verl: Path) -> None:
    # verl resolves the config in place after printing it resolved: four rounds (and Hydra's own unquoting, which
    # takes one escape) reach what verl reads; one escape more is still an interpolation then.
    assert check(f"+trainer.deep='{_escaped(5)}'").problems == []
    assert check(f"+trainer.deep='{_escaped(6)}'").problems == [
        "your overrides: trainer.deep still holds an interpolation after 4 resolutions ('${trainer.total_epochs}'); "
        "verl would resolve it again when it reads it"
    ]


def test_a_config_that_cannot_be_resolved_is_refused_with_the_earlier_problems(fake_verl: Path) -> None:
    assert check("trainer.resume_mode=bogus", "+trainer.loop=${trainer.loop}").problems[1:] == [
        "your overrides: verl's config cannot be resolved with them (Recursive interpolation detected)"
    ]


def test_files_named_by_path_keys_no_setting_decides_are_recorded(fake_verl: Path, tmp_path: Path) -> None:
    code = tmp_path / "reward.py"
    code.write_text("def compute_score(): ...\n")
    recipe = [*RECIPE, Override("trainer.model_path", str(code), setting="MODEL_PATH")]
    found = check(
        f"+trainer.reward_fn_path={code}",
        f"+trainer.filepath={code}",
        f"+trainer.dir_path={tmp_path}",  # a directory: not a file
        f"+trainer.missing_path={tmp_path / 'absent.py'}",
        f"+trainer.path_list=[{code}]",  # the last word is `path_list[0]`
        f"+trainer.code={code}",  # not a `path` key
        recipe=recipe,
    )
    assert found.problems == []
    assert found.referenced_files == {"trainer.reward_fn_path": str(code), "trainer.filepath": str(code)}


@pytest.mark.parametrize(
    ("value", "regular"),
    [("file", True), ("dir", False), ("", False), ("missing", False), ("nul\0byte", False), (7, False), (None, False)],
)
def test_only_an_existing_regular_file_counts_as_a_referenced_file(value: Any, regular: bool, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    (tmp_path / "dir").mkdir()
    argument = str(tmp_path / value) if value in ("file", "dir", "missing") else value
    assert vc._regular_file(argument) is regular


# --- types: a value verl's dataclasses would refuse when its trainer starts ---------------------------------------------


def _type_problems(verl_tree: Path, *extra: str, recipe: list[Override] = RECIPE) -> list[str]:
    """vt.type_problems as check_verl_config calls it: verl's config composed without, then with, the extra overrides."""
    base, now = ([*map(str, recipe), *more] for more in ((), extra))
    composed = (OmegaConf.to_container(vc.compose_verl_config(overrides, verl_tree)) for overrides in (base, now))
    return vt.type_problems(*composed, list(extra), verl_tree)


@pytest.mark.parametrize(
    ("override", "problem"),
    [
        ("trainer.total_epochs=abc", "trainer.total_epochs is an int in verl's config (default 1), not 'abc'"),
        ("trainer.total_epochs=true", "trainer.total_epochs is an int in verl's config (default 1), not True"),
        ("trainer.total_epochs=1.5", "trainer.total_epochs is an int in verl's config (default 1), not 1.5"),
        ("trainer.use_legacy=1", "trainer.use_legacy is a bool in verl's config (default False), not 1"),
        ("trainer.ratio=x", "trainer.ratio is a float in verl's config (default 0.5), not 'x'"),
        ("trainer.ratio=false", "trainer.ratio is a float in verl's config (default 0.5), not False"),
        ("trainer.total_training_steps=x", "trainer.total_training_steps is an int or null in verl's config (default None), not 'x'"),
        ("actor.clip=wide", "actor.clip is a float or null in verl's config (default None), not 'wide'"),
        ("actor.micro=2.5", "actor.micro is an int or null in verl's config (default None), not 2.5"),
        ("actor.steps=x", "actor.steps is an int or null in verl's config (default None), not 'x'"),
        ("actor.deep=x", "actor.deep is an int or null in verl's config (default None), not 'x'"),
        ("++trainer.total_epochs=x", "trainer.total_epochs is an int in verl's config (default 1), not 'x'"),
    ],
)
def test_a_value_of_another_type_than_verls_is_refused_naming_key_default_and_value(override: str, problem: str, verl_tree: Path) -> None:
    assert _type_problems(verl_tree, override) == [
        f"override {override!r}: {problem}; verl would fail on it only when its trainer starts"
    ]


@pytest.mark.parametrize(
    "override",
    [
        "trainer.total_epochs=2",
        "trainer.use_legacy=true",
        "trainer.ratio=1",  # an int is a float's value too
        "trainer.ratio=0.1",
        "trainer.total_training_steps=5",
        "trainer.total_training_steps=null",
        "actor.clip=null",
        "actor.clip=0.2",
        "actor.name=5",  # a str field: any text
        "actor.undeclared=x",  # no field declares it
        "foreign.clip=x",  # a section of no verl dataclass
        "other.free=x",  # a section of no dataclass
        "free_top=x",  # no section
        "trainer.project_name=123",  # a text default
        "trainer.total_epochs=${trainer.n_gpus_per_node}",  # an interpolation is not checked
        "+trainer.brand_new=x",  # not in verl's config
    ],
)
def test_a_value_verls_types_allow_is_no_problem(override: str, verl_tree: Path) -> None:
    assert _type_problems(verl_tree, override) == []


def test_the_trainers_step_count_is_an_int_whatever_its_section(verl_tree: Path) -> None:
    base = {"trainer": {"total_training_steps": None, "_target_": "verl.workers.config.ActorConfig"}}
    assert vt._declared_kind(base, "trainer.total_training_steps", verl_tree) == "int"
    assert vt._declared_kind(base, "trainer.clip", verl_tree) == "float"
    assert vt._declared_kind({"trainer": {"_target_": 5}}, "trainer.clip", verl_tree) is None


@pytest.mark.parametrize(
    ("annotation", "kind"),
    [
        ("int", "int"),
        ("bool", "bool"),
        ("float", "float"),
        ("Optional[int]", "int"),
        ("int | None", "int"),
        ("Optional[float]", "float"),
        ("float | int", "float"),
        ("'int'", "int"),
        ("'Optional[bool]'", "bool"),
        ("Optional['float']", "float"),
        ("str", None),
        ("Optional[str]", None),
        ("int | str", None),
        ("list[int]", None),
        ("'str'", None),
        ("'not ( valid'", None),
        ("Optional['str']", None),
        ("Any", None),
    ],
)
def test_an_annotation_types_a_key_only_when_it_allows_one_number_or_bool(annotation: str, kind: str | None) -> None:
    assert vt._annotation_kind(ast.parse(annotation, mode="eval").body) == kind


@pytest.mark.parametrize(
    ("value", "kind"),
    [(True, "bool"), (False, "bool"), (0, "int"), (7, "int"), (0.5, "float"), ("1", None), (None, None), ([1], None)],
)
def test_a_default_types_its_key_as_bool_int_or_float(value: Any, kind: str | None) -> None:
    assert vt._scalar_type(value) == kind


@pytest.mark.parametrize(
    ("kind", "value", "fits"),
    [
        ("bool", True, True), ("bool", 1, False), ("bool", "true", False),
        ("int", 3, True), ("int", True, False), ("int", 3.0, False), ("int", "3", False),
        ("float", 3, True), ("float", 3.5, True), ("float", False, False), ("float", "3.5", False),
    ],
)  # fmt: skip
def test_a_value_fits_a_kind_as_verls_dataclasses_would_accept_it(kind: str, value: Any, fits: bool) -> None:
    assert vt._fits(kind, value) is fits


# --- reading verl's dataclasses from their source ----------------------------------------------------------------------


def test_a_dataclass_has_its_own_fields_and_every_base_classes_wherever_defined(verl_tree: Path) -> None:
    fields = vt._dataclass_fields(verl_tree.parents[1], "verl.workers.config.ActorConfig")
    # Root (two packages up), BaseConfig (a sibling file), Mixin (the same file); ABC is not verl's.
    assert fields == {"seed": "int", "steps": "int", "deep": "int", "clip": "float", "micro": "int", "name": None}


def test_a_class_in_a_module_file_is_read_and_an_absent_one_has_no_fields(verl_tree: Path) -> None:
    root = verl_tree.parents[1]
    assert vt._dataclass_fields(root, "verl.workers.shared.Root") == {"seed": "int"}
    assert vt._dataclass_fields(root, "verl.workers.shared.Absent") == {}
    assert vt._dataclass_fields(root, "verl.workers.nowhere.Root") == {}


def test_a_base_imported_absolutely_from_verl_counts(verl_tree: Path) -> None:
    root = verl_tree.parents[1]
    (root / "workers" / "absolute.py").write_text(
        "from verl.workers.shared import Root\nclass Child(Root):\n    flag: bool = False\n"
    )
    assert vt._dataclass_fields(root, "verl.workers.absolute.Child") == {"seed": "int", "flag": "bool"}


def test_a_package_import_without_a_module_name_resolves_to_the_package(verl_tree: Path) -> None:
    root = verl_tree.parents[1]
    (root / "workers" / "config" / "pkg_import.py").write_text("from . import base\nfrom .. import shared as s\n")
    _, imports = vt._parsed(root, root / "workers" / "config" / "pkg_import.py")
    assert imports == {"base": "verl.workers.config", "s": "verl.workers"}


def test_base_classes_that_loop_end(verl_tree: Path) -> None:
    root = verl_tree.parents[1]
    (root / "workers" / "loop.py").write_text("class A(B):\n    a: int = 0\nclass B(A):\n    b: float = 0.0\n")
    assert vt._dataclass_fields(root, "verl.workers.loop.A") == {"a": "int", "b": "float"}


def test_a_file_that_cannot_be_parsed_has_no_classes(verl_tree: Path) -> None:
    broken = verl_tree.parents[1] / "workers" / "broken.py"
    broken.write_text("class (:\n")
    assert vt._parsed(verl_tree.parents[1], broken) == ({}, {})


# --- small helpers -----------------------------------------------------------------------------------------------------


def test_the_leaves_of_a_config_are_named_by_their_dotted_path() -> None:
    value = {"a": {"b": 1, "c": [2, {"d": 3}]}, "e": None}
    assert list(vc._leaves(value)) == [("a.b", 1), ("a.c[0]", 2), ("a.c[1].d", 3), ("e", None)]
    assert list(vc._leaves(5)) == [("", 5)]


@pytest.mark.parametrize(
    ("key", "selected"),
    [("a.b", (True, 1)), ("a", (True, {"b": 1, "n": None})), ("a.n", (True, None)), ("a.x", (False, None)),
     ("a.b.c", (False, None)), ("z", (False, None))],
)  # fmt: skip
def test_a_dotted_key_selects_its_value_or_says_it_is_absent(key: str, selected: tuple[bool, Any]) -> None:
    assert vt.select_key({"a": {"b": 1, "n": None}}, key) == selected


@pytest.mark.parametrize(("a", "b", "same"), [(1, 1, True), (1, True, False), (1, 1.0, False), ("1", 1, False), ("x", "x", True)])
def test_a_planned_value_is_kept_only_with_its_type(a: Any, b: Any, same: bool) -> None:
    assert vc._same(a, b) is same


def test_the_installed_verls_null_keys_take_their_dataclass_types() -> None:
    """Against verl's own config and dataclasses: a null key typed by its section's `_target_` (the real case)."""
    verl = needs("verl", install=TRAINER_EXTRA)
    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    text = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=many"
    assert _type_problems(config_dir, text, recipe=[]) == [
        f"override {text!r}: actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu is an int or null in verl's config "
        "(default None), not 'many'; verl would fail on it only when its trainer starts"
    ]
    assert os.path.isdir(config_dir)


#: Every way to write "this type, or None" (issue 39, item 5): each must give the type's kind.
_OR_NONE = ("{0} | None", "None | {0}", "Optional[{0}]", "typing.Optional[{0}]", "t.Optional[{0}]", "Union[{0}, None]",
            "Union[None, {0}]", "typing.Union[{0}, None]", "'{0}'", "Optional['{0}']", "'Optional[{0}]'")  # fmt: skip


@given(st.sampled_from(["int", "float", "bool", "str", "list[int]", "Any"]),
       st.lists(st.sampled_from(_OR_NONE), max_size=3))  # fmt: skip
def test_every_spelling_of_or_none_gives_the_same_kind(base: str, wrappers: list[str]) -> None:
    """Wrapped in any mix of the spellings, nested or quoted, the kind is the bare type's (None for a non-number)."""
    annotation = base
    for wrapper in wrappers:
        if "'" in wrapper and "'" in annotation:
            continue  # one level of quoting: a string inside a string annotation is another spelling test's
        annotation = wrapper.format(annotation)
    expected = {"int": "int", "float": "float", "bool": "bool"}.get(base)
    assert vt._annotation_kind(ast.parse(annotation, mode="eval").body) == expected, annotation
