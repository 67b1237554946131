"""Hostile overrides after `--` (issue 11, items 1-4 and 6), judged against the real parsers.

The oracle is always Hydra's own override parser and the composition of the installed verl's
own trainer config (as `python -m verl.trainer.main_ppo` builds it), then OmegaConf's own
resolution, done the way verl's TaskRunner does it (print resolved, resolve in place, read).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from recipe.errors import RecipeConfigError
from recipe.launch import checkpoint_root
from recipe.plan import build_plan
from recipe.settings import load_settings
from recipe.user_overrides import is_secret_name
from tests.support.needs import TRAINER_EXTRA, needs

from .envtools import clear_settings

verl = needs("verl", install=TRAINER_EXTRA)
pytestmark = pytest.mark.verl

from hydra import compose, initialize_config_dir  # noqa: E402
from hydra.core.override_parser.overrides_parser import OverridesParser  # noqa: E402
from hydra.errors import HydraException  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

CONFIG_DIR = str(Path(verl.__file__).parent / "trainer" / "config")
CANARY = "hf_leak_canary_0123456789"


def hydra_composes(overrides: list[str]) -> Any:
    """verl's trainer config from these overrides, as main_ppo would build it; raises what Hydra raises."""
    OverridesParser.create().parse_overrides(overrides)
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def as_verl_reads(config: Any) -> dict:
    """What verl's TaskRunner ends up reading: pprint(resolve=True), OmegaConf.resolve in place, read again."""
    OmegaConf.to_container(config, resolve=True)
    OmegaConf.resolve(config)
    return OmegaConf.to_container(config, resolve=True)  # type: ignore[return-value]


def _plan(extra: tuple[str, ...] | list[str] = (), **values: str):  # type: ignore[no-untyped-def]
    with pytest.MonkeyPatch.context() as mp:
        clear_settings(mp)
        mp.setenv("DEVICE", values.pop("DEVICE", "gpu"))
        mp.setenv("HF_TOKEN", CANARY)
        mp.setenv("WANDB_API_KEY", CANARY)
        mp.setenv("RAY_AUTH_TOKEN", CANARY)
        for name, value in values.items():
            mp.setenv(name, value)
        return build_plan(load_settings(), os.environ, list(extra))


def _refused(*extra: str, **values: str) -> list[str]:
    with pytest.raises(RecipeConfigError) as caught:
        _plan(extra, **values)
    problems = caught.value.problems
    assert problems and all(CANARY not in p for p in problems)
    return problems


# --- item 1: no override resolves a secret ------------------------------------------------------


def test_verls_task_runner_resolves_its_config_in_place_and_reads_it_again() -> None:
    """The fact behind refusing `${` in settings (an escape would not survive) and behind resolving
    several times here: verl 0.9.1 prints the config resolved, then resolves it in place."""
    source = (Path(verl.__file__).parent / "trainer" / "main_ppo.py").read_text()
    assert "pprint(OmegaConf.to_container(config, resolve=True))\n        OmegaConf.resolve(config)" in source


@pytest.mark.parametrize(
    "override",
    [
        "+foo=${oc.env:HF_TOKEN}",
        "trainer.total_training_steps=${oc.env:WANDB_API_KEY}",
        "+ray_kwargs.ray_init.runtime_env.env_vars.X=${oc.env:RAY_AUTH_TOKEN}",
        "+foo='${oc.env:HF_TOKEN}'",
        "+foo=\"prefix-${oc.env:HF_TOKEN}\"",
        "+foo=${oc.env:MY_SERVICE_PASSWORD,none}",
        "+foo=${oc.env:'HF_TOKEN'}",
        "+foo={a:[${oc.env:HF_TOKEN}]}",
        "+foo='${oc.decode:${oc.env:HF_TOKEN}}'",  # nested interpolations parse only inside quotes
    ],
)
def test_an_override_reading_a_secret_is_refused(override: str) -> None:
    problems = _refused(override)
    assert any(override in p and "secret" in p for p in problems), problems


@pytest.mark.parametrize(
    "overrides",
    [
        # The name is computed: only the resolution can tell which variable it is.
        ("+n=HF_TOKEN", "+foo='${oc.env:${n}}'"),
        # An escaped interpolation survives one resolution and is resolved by the next one,
        # after verl's in-place OmegaConf.resolve.
        ("+foo='\\${oc.env:HF_TOKEN}'",),
        # Two halves concatenated into an interpolation string, resolved on the next read.
        ("+a='$'", "+b='{oc.env:HF_TOKEN}'", "+foo=${a}${b}"),
    ],
)
def test_a_secret_reached_indirectly_is_refused(overrides: tuple[str, ...]) -> None:
    problems = _refused(*overrides)
    assert any("secret" in p for p in problems), problems


def test_an_override_reading_an_ordinary_variable_passes() -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RECIPE_TEST_STEPS", "7")
        plan = _plan(("trainer.total_training_steps=${oc.env:RECIPE_TEST_STEPS,3}",))
    assert "trainer.total_training_steps=${oc.env:RECIPE_TEST_STEPS,3}" in plan.overrides


# --- item 2: settings round-trip through verl's real composition ------------------------------------

_text = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), min_size=1, max_size=20)


@hsettings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(experiment=_text, checkpoint_dir=_text, alloc=_text)
def test_settings_reach_verls_composed_config_exactly(experiment: str, checkpoint_dir: str, alloc: str) -> None:
    try:
        plan = _plan(EXPERIMENT_NAME=experiment, CHECKPOINT_DIR="/" + checkpoint_dir, PYTORCH_CUDA_ALLOC_CONF="max_split_size_mb:" + alloc)
    except RecipeConfigError as error:
        assert all(p.split("=", 1)[0] in {"EXPERIMENT_NAME", "CHECKPOINT_DIR", "PYTORCH_CUDA_ALLOC_CONF"} for p in error.problems)
        return
    config = hydra_composes(plan.overrides)
    ray_env = OmegaConf.to_container(config.ray_kwargs.ray_init.runtime_env.env_vars, resolve=False)  # as run_ppo passes it to ray.init
    read = as_verl_reads(config)
    assert read["trainer"]["experiment_name"] == plan.settings.experiment_name == experiment
    assert read["trainer"]["default_local_dir"] == str(checkpoint_root(plan.settings))
    assert ray_env["PYTORCH_CUDA_ALLOC_CONF"] == plan.env["PYTORCH_CUDA_ALLOC_CONF"]
    assert read["ray_kwargs"]["ray_init"]["runtime_env"]["env_vars"]["PYTORCH_CUDA_ALLOC_CONF"] == plan.env["PYTORCH_CUDA_ALLOC_CONF"]


# --- item 3: parents of decided keys ---------------------------------------------------------------


@pytest.mark.parametrize(
    "override",
    [
        "trainer={nnodes:4}",
        "actor_rollout_ref.actor.megatron={tensor_model_parallel_size:4}",
        "actor_rollout_ref.ref.megatron={tensor_model_parallel_size:4}",
        "~trainer",
        "~trainer.nnodes",
        "~actor_rollout_ref.actor.megatron",
        "++trainer={nnodes:4}",
        "+trainer.nnodes=4",
        "++actor_rollout_ref={actor:{megatron:{tensor_model_parallel_size:4}}}",
        "actor@actor_rollout_ref.actor=megatron_actor",
        "ref@actor_rollout_ref.ref=megatron_ref",
        "model_engine=dp",
        "data={train_files:/etc/passwd}",
    ],
)
def test_an_override_of_a_decided_key_or_its_parent_is_refused(override: str) -> None:
    (problem,) = _refused(override)
    assert problem.startswith(f"override {override!r}: ") and "decide" in problem


def test_a_sibling_of_a_decided_key_passes() -> None:
    plan = _plan(("trainer.total_training_steps=3", "actor_rollout_ref.actor.megatron.use_distributed_optimizer=False"))
    assert "actor_rollout_ref.actor.megatron.use_distributed_optimizer=False" in plan.overrides


# --- item 4: what Hydra rejects, plan rejects ------------------------------------------------------


@pytest.mark.parametrize(
    "override",
    [" trainer.total_training_steps=3", "foo.bar=1", "TRAINER.TOTAL_EPOCHS=4", "trainer.total_training_steps=3 trainer.val_before_train=True",
     "trainer.totаl_training_steps=3", "trainer.total_training_steps=3,4", "=3", "trainer.total_training_steps"],
)
def test_plan_rejects_what_hydra_rejects(override: str) -> None:
    with pytest.raises((HydraException, ValueError)):  # ValueError: Hydra's own for `=3`
        hydra_composes([*_plan().overrides, override])
    (problem,) = _refused(override)
    assert problem.startswith(f"override {override!r}: ")


_key_char = st.sampled_from(list("abtr_.~+=@/ ,'\"${}:[]1-") + ["а", "é", "\t", "\\"])
_override = st.one_of(
    st.text(_key_char, min_size=1, max_size=16),
    st.builds(lambda k, v: f"{k}={v}", st.sampled_from(["trainer.total_training_steps", "Trainer.total_training_steps", "+trainer.foo",
                                                         "++trainer.total_epochs", "trainer.total_training_steps ", "~trainer.val_before_train",
                                                         "actor_rollout_ref.actor.optim.lr", "trainer.nope", "+trainer.x.y"]),
              st.text(_key_char, max_size=10)),
)


@hsettings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(override=_override)
def test_any_override_plan_accepts_composes_in_verl(override: str) -> None:
    """plan accepts => Hydra parses it and verl's config composes with it (and nothing resolves a secret)."""
    try:
        plan = _plan((override,))
    except RecipeConfigError as error:
        assert error.problems and all(CANARY not in p for p in error.problems)
        return
    config = hydra_composes(plan.overrides)
    assert CANARY not in repr(as_verl_reads(config))


# --- item 6: the allocator promise --------------------------------------------------------------------


@pytest.mark.parametrize(
    "override",
    [
        "+ray_kwargs.ray_init.runtime_env.env_vars.PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
        "++ray_kwargs.ray_init.runtime_env.env_vars.PYTORCH_CUDA_ALLOC_CONF='expandable_segments:True'",
        "+ray_kwargs.ray_init.runtime_env.env_vars.PYTORCH_CUDA_ALLOC_CONF=\"max_split_size_mb:1, expandable_segments : True\"",
        "+ray_kwargs.ray_init.runtime_env.env_vars.PYTORCH_NPU_ALLOC_CONF=expandable_segments:True",
        "+ray_kwargs.ray_init.runtime_env.env_vars.PYTORCH_ALLOC_CONF=expandable_segments:True",
        "+ray_kwargs.ray_init.runtime_env.env_vars={PYTORCH_CUDA_ALLOC_CONF:'expandable_segments:True'}",
        "ray_kwargs.ray_init.runtime_env={env_vars:{PYTORCH_CUDA_ALLOC_CONF:'expandable_segments:True'}}",
        "~ray_kwargs.ray_init.runtime_env.env_vars.PYTORCH_CUDA_ALLOC_CONF",
    ],
)
@pytest.mark.parametrize("device", ["gpu", "npu"])
def test_an_override_cannot_put_expandable_segments_into_the_workers(override: str, device: str) -> None:
    problems = _refused(override, DEVICE=device, PYTORCH_CUDA_ALLOC_CONF="max_split_size_mb:64", PYTORCH_NPU_ALLOC_CONF="max_split_size_mb:64")
    assert any(p.startswith(f"override {override!r}: ") for p in problems), problems


@pytest.mark.parametrize("value", ["Expandable_Segments:True", " expandable_segments : True ", "expandable_segments:true,max_split_size_mb:64"])
def test_any_spelling_in_the_users_variable_is_kept_out_of_the_workers(value: str) -> None:
    plan = _plan(PYTORCH_CUDA_ALLOC_CONF=value)
    read = as_verl_reads(hydra_composes(plan.overrides))
    env = read["ray_kwargs"]["ray_init"]["runtime_env"]["env_vars"]
    assert "expandable_segments" not in env.get("PYTORCH_CUDA_ALLOC_CONF", "").lower().replace(" ", "")
    assert plan.allocator.runtime_switch


def test_a_generic_pytorch_alloc_conf_with_expandable_segments_is_refused() -> None:
    problems = _refused(PYTORCH_ALLOC_CONF="expandable_segments:True")
    assert problems[0].startswith("PYTORCH_ALLOC_CONF='expandable_segments:True': ")


# --- issue 22, class 4: a secret given literally after `--` ---------------------------------------

_secret_names = st.sampled_from(
    ["HF_TOKEN", "WANDB_API_KEY", "RAY_AUTH_TOKEN", "MY_SERVICE_PASSWORD", "S3_ACCESS_KEY", "MYSQL_PWD", "SSHPASS", "SENTRY_DSN"]
)
#: How an environment variable's name may be written under env_vars: the variable is the same secret.
_CASES = {"as is": lambda n: n, "lower": str.lower, "camel": lambda n: n[:1].lower() + n.title().replace("_", "")[1:]}
_literal = st.from_regex(r"[A-Za-z0-9_]{8,30}", fullmatch=True)


@given(
    name=_secret_names, value=_literal, shape=st.sampled_from(["key", "dict", "nested", "inside the key"]),
    case=st.sampled_from(sorted(_CASES)),
)  # fmt: skip
def test_a_literal_secret_is_refused_and_never_echoed(name: str, value: str, shape: str, case: str) -> None:
    """It would land twice in run-record.json and once in `Executing:`: refused, naming the variable to set,
    the value nowhere in the message (Hydra's own parser reads each override). Under env_vars a name is an
    environment variable's, in any case (github_token, hfToken); a secret word inside the key counts too."""
    env_vars = "+ray_kwargs.ray_init.runtime_env.env_vars"
    variable = _CASES[case](name)
    override = {
        "key": f"{env_vars}.{variable}={value}",
        "dict": f"{env_vars}={{{variable}: {value}}}",
        "nested": f"+my_section={{inner: {{{name}: {value}}}}}",
        "inside the key": f"{env_vars}.{variable}.part={value}",
    }[shape]
    problems = _refused(override)
    shown = name if shape == "nested" else variable
    assert any(f"set the environment variable {shown} instead" in p for p in problems), problems
    assert all(value not in p for p in problems), problems


@given(
    key=st.sampled_from(["+ray_kwargs.ray_init.runtime_env.env_vars.DATABASE_URL", "+my_section.url", "+my_section.endpoint"]),
    scheme=st.sampled_from(["postgres", "https", "redis", "mongodb+srv"]),
    user=st.from_regex(r"[a-z]{0,6}", fullmatch=True),
    password=_literal,
)
def test_a_url_with_its_password_is_a_secret_whatever_key_holds_it(key: str, scheme: str, user: str, password: str) -> None:
    problems = _refused(f"{key}='{scheme}://{user}:{password}@db.example:5432/x'")
    assert any("a URL with its password" in p for p in problems), problems
    assert all(password not in p for p in problems), problems


def test_a_secret_set_to_null_or_an_ordinary_key_passes() -> None:
    plan = _plan(("+ray_kwargs.ray_init.runtime_env.env_vars.HF_TOKEN=null", "+my_section={keyboard_layout: us}"))
    assert "+my_section={keyboard_layout: us}" in plan.overrides


@given(
    name=_secret_names,
    value=_literal,
    broken=st.sampled_from(["'{value}", "{value},other", "[{value}", "{{{value}", "${{oc.env:{value}",
                            # the secret's name inside the value: an open dict, a sweep, a choice, quoted or not
                            "{{{name}:{value}", "{{{name}:{value}}},{{a:b}}", "choice({{{name}:{value}}},{{a:b}})",
                            "[{{{name}:{value}}}", "{{\"{name}\":{value}", "{{{name}:'{value}}}"]),
    where=st.sampled_from(["+ray_kwargs.ray_init.runtime_env.env_vars.{name}", "+ray_kwargs.ray_init.runtime_env.env_vars"]),
)  # fmt: skip
def test_a_secret_in_an_override_hydra_cannot_parse_is_never_echoed(name: str, value: str, broken: str, where: str) -> None:
    """Unbalanced quotes, a sweep, an open list: Hydra's own message quotes the text, so the refusal may not."""
    override = f"{where.format(name=name)}={broken.format(value=value, name=name)}"
    assume(name in override)  # else nothing in it names a secret, and Hydra's message may quote it
    problems = _refused(override)
    assert problems and all(value not in p for p in problems), problems


_word = st.from_regex(r"[A-Z][A-Z0-9]{0,6}", fullmatch=True).filter(lambda w: not is_secret_name(w))


@given(
    word=st.sampled_from(["KEY", "KEYS", "AUTH", "COOKIE", "SESSION", "PASS"]),
    before=st.lists(_word, max_size=2),
    after=st.lists(_word, max_size=2),
    case=st.sampled_from([str.upper, str.lower]),
)
def test_a_secret_word_anywhere_in_a_variable_name_marks_it_secret(
    word: str, before: list[str], after: list[str], case: Any
) -> None:
    """`${oc.env:S3_KEY}`, `${oc.env:key_id}`: each secret word, first, last or inside, in either case."""
    name = case("_".join([*before, word, *after]))
    assert is_secret_name(name), name
    problems = _refused(f"+my_section.value=${{oc.env:{name}}}")
    assert any(f"reads the secret {name} through oc.env" in p for p in problems), problems


@pytest.mark.parametrize("name", ["KEYBOARD_LAYOUT", "MONKEY", "PASSAGE_COUNT", "AUTHOR", "HOST_KEYWORD"])
def test_a_word_that_only_contains_a_secret_word_is_not_a_secret(name: str) -> None:
    assert not is_secret_name(name)


# --- issue 26, item 3: a value of the wrong type for verl's config is refused in plan -------------


def _typed_leaves() -> list[tuple[str, str]]:
    """(key, bool|int|float) of every leaf of verl's config, as the recipe composes it, with a typed default."""
    from recipe.launch import build_overrides
    from recipe.layout import resolve_layout
    from recipe.models import QWEN3_5_35B_A3B
    from recipe.user_overrides import decided_keys
    from recipe.verl_config import _leaves, compose_verl_config, verl_config_dir
    from recipe.verl_types import _scalar_type
    from tests.unit.envtools import settings_of

    settings = settings_of(DEVICE="gpu")
    recipe = build_overrides(settings, "gpu", resolve_layout(settings, "gpu", QWEN3_5_35B_A3B), {})
    config = OmegaConf.to_container(compose_verl_config([str(o) for o in recipe], verl_config_dir()), resolve=False)
    decided = decided_keys(recipe)
    return sorted(
        (path, kind) for path, value in _leaves(config)
        if (kind := _scalar_type(value)) and path not in decided and "[" not in path and not path.startswith("hydra")
    )  # fmt: skip


TYPED_LEAVES = _typed_leaves()
_WRONG = {"bool": st.sampled_from(["maybe", "1.5", "[1]"]), "int": st.sampled_from(["abc", "1.5", "true"]),
          "float": st.sampled_from(["abc", "true", "[1.0]"])}  # fmt: skip
_RIGHT = {"bool": st.sampled_from(["true", "False"]), "int": st.integers(0, 1000).map(str),
          "float": st.sampled_from(["0.5", "3", "1e-7"])}  # fmt: skip


def test_the_typed_keys_are_many() -> None:
    assert len(TYPED_LEAVES) > 100 and ("actor_rollout_ref.actor.optim.lr", "float") in TYPED_LEAVES


@hsettings(max_examples=8)
@given(data=st.data())
def test_a_value_of_the_wrong_type_for_verls_config_is_refused_naming_key_value_and_type(data: Any) -> None:
    key, kind = data.draw(st.sampled_from(TYPED_LEAVES))
    value = data.draw(_WRONG[kind])
    [line] = _refused(f"++{key}={value}")  # ++: set or add (the recipe adds some keys verl's YAML lacks)
    assert line.startswith(f"override '++{key}={value}': {key} is ") and f" {kind} in verl's config" in line


@hsettings(max_examples=8)
@given(data=st.data())
def test_a_value_of_the_right_type_passes(data: Any) -> None:
    """Any value of the right type, except for the keys the memory estimate reads, whose values it also judges
    (`gpu_memory_utilization=3` does not fit: tests/unit/test_memory_fit.py)."""
    from recipe.memory_workload import WORKLOAD_DEFAULTS

    key, kind = data.draw(st.sampled_from([leaf for leaf in TYPED_LEAVES if leaf[0] not in WORKLOAD_DEFAULTS]))
    value = data.draw(_RIGHT[kind])
    assert f"++{key}={value}" in _plan((f"++{key}={value}",)).overrides


@pytest.mark.parametrize(
    "override",
    ["actor_rollout_ref.rollout.max_num_batched_tokens=8192", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8192",
     "reward.reward_model.rollout.skip_tokenizer_init=true", "+my_section={session_length: 3, keyboard: us}"],
)  # fmt: skip
def test_verls_token_count_keys_are_not_secrets(override: str) -> None:
    """TOKEN names a secret in HF_TOKEN, not in max_num_batched_tokens: lower-case config keys are verl's own."""
    assert override in _plan((override,)).overrides


@pytest.mark.parametrize("name", ["hf_token", "api_key", "db_password", "client_secret", "aws_access_key_id"])
def test_a_lower_case_key_that_is_plainly_a_secret_is_still_refused(name: str) -> None:
    problems = _refused(f"+ray_kwargs.ray_init.runtime_env.env_vars.{name}=s3cr3t_value_123")
    assert all("s3cr3t_value_123" not in p for p in problems) and any("gives the secret" in p for p in problems)


# --- keys verl leaves null: their type is their dataclass's (read with ast) or the recipe's reading ---------


def _real_kind(hint: Any) -> str | None:
    """bool/int/float when a real annotation allows only that (and None), the way typing itself reads it."""
    import types
    import typing

    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    names = frozenset(getattr(a, "__name__", repr(a)) for a in args if a is not type(None))
    return {frozenset({"int"}): "int", frozenset({"float"}): "float", frozenset({"int", "float"}): "float",
            frozenset({"bool"}): "bool"}.get(names)  # fmt: skip


def _targets() -> list[str]:
    from recipe.verl_config import _leaves, compose_verl_config, verl_config_dir

    config = OmegaConf.to_container(compose_verl_config(_plan().overrides, verl_config_dir()), resolve=False)
    return sorted({value for key, value in _leaves(config) if key.endswith("._target_") and str(value).startswith("verl.")})


def test_the_source_reading_of_verls_dataclasses_agrees_with_their_real_annotations() -> None:
    """For every dataclass verl's composed config names (`_target_`), each field's kind read from the source with
    `ast` (what plan does, without importing verl) is what typing.get_type_hints gives for the imported class."""
    import importlib
    import typing

    from recipe.verl_config import verl_config_dir
    from recipe.verl_types import _dataclass_fields

    root = verl_config_dir().parents[1]
    checked = 0
    for target in _targets():
        module, _, name = target.rpartition(".")
        real = typing.get_type_hints(getattr(importlib.import_module(module), name))
        read = _dataclass_fields(root, target)
        for field, hint in real.items():
            kind = _real_kind(hint)
            assert read.get(field) == kind, f"{target}.{field}: read {read.get(field)}, typing says {hint}"
            checked += kind is not None
    assert checked > 50


def _null_typed_leaves() -> list[tuple[str, str]]:
    from recipe.verl_config import _leaves, compose_verl_config, verl_config_dir
    from recipe.verl_types import _declared_kind

    config = OmegaConf.to_container(compose_verl_config(_plan().overrides, verl_config_dir()), resolve=False)
    found = [(key, _declared_kind(config, key, verl_config_dir())) for key, value in _leaves(config) if value is None]
    return sorted((key, kind) for key, kind in found if kind and "[" not in key)


NULL_TYPED_LEAVES = _null_typed_leaves()


@hsettings(max_examples=4)  # each example plans twice, composing verl's config (about 1 s each)
@given(data=st.data())
def test_a_null_default_key_takes_its_declared_type_and_null(data: Any) -> None:
    """`trainer.total_training_steps=abc` passed plan and died in verl's trainer (issue 26); so did every key verl's
    YAML leaves null. Now a wrong type is refused naming the key, the type and null; a right value and null pass."""
    key, kind = data.draw(st.sampled_from(NULL_TYPED_LEAVES))
    wrong, right = data.draw(_WRONG[kind]), data.draw(_RIGHT[kind])
    [line] = _refused(f"{key}={wrong}")
    assert line.startswith(f"override '{key}={wrong}': {key} is ") and f" {kind} or null in verl's config" in line
    assert f"{key}={right}" in _plan((f"{key}={right}",)).overrides


def test_total_training_steps_is_typed_though_verl_leaves_it_null_and_untyped() -> None:
    assert ("trainer.total_training_steps", "int") in NULL_TYPED_LEAVES
    [line] = _refused("trainer.total_training_steps=abc")
    assert "trainer.total_training_steps is an int or null" in line
    assert "trainer.total_training_steps=null" in _plan(("trainer.total_training_steps=null",)).overrides


@hsettings(max_examples=8, deadline=None)
@given(
    key=st.sampled_from(["+trainer.tracking_uri", "+trainer.db_url", "+reward.reward_kwargs.endpoint"]),
    # Marked, so that no digest or size in the record can hold it by chance.
    password=st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=6, max_size=12).map("pw-{}-pw".format),
)
def test_the_way_out_of_a_url_with_its_password_works_when_followed(key: str, password: str) -> None:
    """The refusal's own override, copied from the message, with the URL in the variable it names: the plan takes it,
    and neither the record nor the command line holds the password."""
    import json
    import re

    from recipe.plan import build_plan

    from .envtools import settings_of

    url = f"postgres://me:{password}@db.example.com:5432/runs"
    with pytest.raises(RecipeConfigError) as refused:
        build_plan(settings_of(DEVICE="gpu"), environ={}, extra_overrides=[f"{key}={url}"])
    (line,) = refused.value.problems
    assert password not in line
    suggested = re.search(r"write '([^']+)'", line)
    assert suggested is not None, line
    from unittest import mock

    with mock.patch.dict(os.environ, {"DB_URL": url}):  # `plan` resolves oc.env from its own environment
        plan = build_plan(settings_of(DEVICE="gpu"), environ=dict(os.environ), extra_overrides=[suggested.group(1)])
    assert suggested.group(1) in plan.argv
    assert password not in json.dumps(plan.provenance) and password not in " ".join(plan.argv)
