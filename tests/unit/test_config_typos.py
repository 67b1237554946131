"""A key one slip from a key of verl's config is refused naming it, with or without `+` (recipe.config_typos).

The keys are read from the installed verl's config, composed with the recipe's own overrides as
`plan` composes it, and the overrides are parsed by Hydra's own parser.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from recipe.config_typos import key_typo, typo_problems
from recipe.errors import RecipeConfigError
from recipe.near_miss import MIN_SLIP_LENGTH, one_slip_from
from recipe.plan import build_plan
from recipe.user_overrides import hydra_override_parser
from recipe.verl_config import compose_verl_config, verl_config_dir

from .envtools import settings_of

pytest.importorskip("omegaconf", reason="verl's config is composed with Hydra (pip install '.[trainer]')")


@cache
def _base() -> dict[str, Any]:
    """verl's config composed with the default gpu plan's overrides, as a plain dict."""
    from omegaconf import OmegaConf

    config_dir = verl_config_dir()
    assert config_dir is not None, "verl's config (pip install '.[trainer]')"
    plan = build_plan(settings_of(DEVICE="gpu"), environ={})
    return OmegaConf.to_container(compose_verl_config(plan.overrides, config_dir))  # type: ignore[return-value]


def _paths(node: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every key path of the config, at every depth."""
    if not isinstance(node, dict):
        return []
    out = []
    for key, value in node.items():
        if isinstance(key, str) and key.isidentifier():
            out.append((*prefix, key))
            out += _paths(value, (*prefix, key))
    return out


@st.composite
def _typos(draw: st.DrawFn) -> tuple[str, str]:
    """(a real key path, the same path with one slip in one of its components)."""
    path = draw(st.sampled_from(_paths(_base())))
    depth = draw(st.integers(0, len(path) - 1))
    part = path[depth]
    at = draw(st.integers(0, len(part) - 1))
    kind = draw(st.sampled_from(["drop", "insert", "swap", "case"]))
    slipped = {
        "drop": part[:at] + part[at + 1 :],
        "insert": part[:at] + draw(st.sampled_from("abcdefghijklmnopqrstuvwxyz_")) + part[at:],
        "swap": part[:at] + part[at + 1 : at + 2] + part[at : at + 1] + part[at + 2 :],
        "case": part.capitalize() if part != part.capitalize() else part.upper(),
    }[kind]
    node: Any = _base()
    for name in path[:depth]:
        node = node[name]
    siblings = [name for name in node if isinstance(name, str)]
    assume(slipped not in siblings and (kind == "case" or len(slipped) >= MIN_SLIP_LENGTH))
    # Where two siblings are one slip away, the first (sorted) is named: the meant key is that one.
    meant = one_slip_from(slipped, siblings)
    assume(meant is not None)
    typo = ".".join((*path[:depth], slipped, *path[depth + 1 :]))
    return ".".join((*path[:depth], meant, *path[depth + 1 :])), typo


@settings(max_examples=200, deadline=None)
@given(_typos(), st.sampled_from(["", "+", "++"]))
def test_a_slip_at_any_depth_is_refused_naming_the_key(pair: tuple[str, str], prefix: str) -> None:
    meant, typo = pair
    text = f"{prefix}{typo}=1"
    problems = typo_problems([text], _base(), hydra_override_parser())
    assert problems == {text: problems[text]} and f"verl's config has no {typo}; did you mean {meant}?" in problems[text]
    assert ("never reads" in problems[text]) is bool(prefix)


def test_a_real_key_and_a_new_key_under_a_free_form_node_pass() -> None:
    keys = ["actor_rollout_ref.actor.optim.lr", "ray_kwargs.ray_init.runtime_env.env_vars.MY_OWN_VARIABLE",
            "actor_rollout_ref.rollout.engine_kwargs.vllm.some_new_option"]  # fmt: skip
    assert [key_typo(key, _base()) for key in keys] == [None, None, None]
    assert typo_problems([f"+{keys[1]}=1", f"{keys[0]}=2e-6", "~trainer.logger"], _base(), hydra_override_parser()) == {}


@pytest.mark.parametrize(
    ("override", "meant"),
    [
        ("+actor_rollout_ref.actor.optim.lrr=2e-6", "actor_rollout_ref.actor.optim.lr"),
        ("actor_rollout_ref.actor.optim.lrr=2e-6", "actor_rollout_ref.actor.optim.lr"),
        ("+trainer.total_traning_steps=100", "trainer.total_training_steps"),
        ("+Trainer.total_training_steps=100", "trainer.total_training_steps"),
    ],
)
def test_plan_refuses_the_issues_examples_in_one_line(override: str, meant: str) -> None:
    """Hydra's "use +" advice never reaches the user for a near miss; the key meant does."""
    with pytest.raises(RecipeConfigError) as refused:
        build_plan(settings_of(DEVICE="gpu"), environ={}, extra_overrides=[override])
    (line,) = refused.value.problems
    assert f"did you mean {meant}?" in line and "To append to your config use" not in line, line


def test_plan_takes_new_keys_under_free_form_nodes() -> None:
    plan = build_plan(settings_of(DEVICE="gpu"), environ={}, extra_overrides=[
        "+ray_kwargs.ray_init.runtime_env.env_vars.MY_OWN_VARIABLE=1",
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.some_new_option=1"])  # fmt: skip
    assert "+ray_kwargs.ray_init.runtime_env.env_vars.MY_OWN_VARIABLE=1" in plan.overrides


# --- a hand-made config: each edge of the walk, named (issue 52) -------------------------------------------------

CONFIG: dict[Any, Any] = {
    "trainer": {"total_training_steps": 1, "logger": ["console"], "n_gpus_per_node": 8},
    "actor": {"optim": {"lr": 1e-6, "lr_warmup_steps": 0}, 0: "a key that is no name"},
    "data": None,
}


@pytest.mark.parametrize(
    ("key", "meant"),
    [
        ("trainer.total_training_steps", None),  # every component exists
        ("trainer", None),
        ("trainer.total_traning_steps", "trainer.total_training_steps"),  # the last component
        ("trainr.total_training_steps", "trainer.total_training_steps"),  # the first, the rest kept as written
        ("Trainer.anything.below", "trainer.anything.below"),
        ("actor.optim.lrr", "actor.optim.lr"),  # a sibling that is not a string (0) is no candidate, and no crash
        ("actor.optimm.lr", "actor.optim.lr"),
        ("actor.optim.lr.deeper", None),  # past a leaf: verl's own error says why
        ("trainer.logger.x", None),  # a list is no node of keys
        ("data.path", None),  # a null node
        ("trainer.my_own_option", None),  # a new key like none of its siblings
        ("actor.optim.lo", None),  # too short to be a slip of lr
    ],
)
def test_key_typo_walks_the_config_to_the_first_missing_component(key: str, meant: str | None) -> None:
    assert key_typo(key, CONFIG) == meant


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("actor.optim.lrr=2e-6", "override 'actor.optim.lrr=2e-6': verl's config has no actor.optim.lrr; did you mean actor.optim.lr?"),
        ("+actor.optim.lrr=2e-6", "override '+actor.optim.lrr=2e-6': verl's config has no actor.optim.lrr; did you mean "
                                  "actor.optim.lr? (`+` adds a key that verl never reads)"),
        ("++trainr.logger=[a]", "override '++trainr.logger=[a]': verl's config has no trainr.logger; did you mean "
                                "trainer.logger? (`+` adds a key that verl never reads)"),
    ],
)  # fmt: skip
def test_a_typo_is_refused_with_its_exact_line(text: str, line: str) -> None:
    assert typo_problems([text], CONFIG, hydra_override_parser()) == {text: line}


def test_what_is_not_checked_for_a_typo_passes() -> None:
    """A deletion, a group or package override, a key with `/`, text Hydra cannot parse (refused elsewhere, saying
    why), and real keys: no line here. Each of the others is still judged."""
    texts = ["~trainer.total_traning_steps", "trainr@pkg=x", "train/er=y", "actor.optim.lrr='unclosed", "trainer.logger=[a]",
             "+trainer.new_option=1", "actor.optim.lrr=1", "trainer.n_gpus_per_nodes=2"]  # fmt: skip
    assert typo_problems(texts, CONFIG, hydra_override_parser()) == {
        "actor.optim.lrr=1": "override 'actor.optim.lrr=1': verl's config has no actor.optim.lrr; did you mean actor.optim.lr?",
        "trainer.n_gpus_per_nodes=2": "override 'trainer.n_gpus_per_nodes=2': verl's config has no trainer.n_gpus_per_nodes; "
                                      "did you mean trainer.n_gpus_per_node?",
    }  # fmt: skip
