"""recipe.verl_config: what `plan` says about each override after `--`, line by line, on a small verl-shaped config.

test_verl_config_check.py pins each check; these pin how the checks treat a list of overrides (every one is
judged, each by its own key), the lengths the lines cut a value at, and how composing goes as verl's does. The
config is written here (a `ppo_trainer.yaml` and one dataclass file), so that every key and type is the test's.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from recipe import verl_config as vc, verl_types as vt
from recipe.launch import Override
from tests.support.needs import TRAINER_EXTRA, needs

needs("hydra", install=TRAINER_EXTRA)
from omegaconf import OmegaConf  # noqa: E402 - after the check that names what to install

#: A verl-shaped trainer config: typed defaults, a null default a dataclass types, and a default that is an interpolation.
PPO_TRAINER = """\
trainer:
  resume_mode: auto
  project_name: demo
  total_epochs: 1
  ratio: 0.5
actor:
  _target_: verl.workers.actor.ActorConfig
  clip: null
  scale: ${trainer.total_epochs}
"""
ACTOR_PY = """\
from dataclasses import dataclass
from typing import Optional

@dataclass
class ActorConfig:
    clip: Optional[float] = None
    scale: float = 1.0
"""
#: The recipe's own overrides here: one key a setting decides, one it sets freely.
RECIPE = [Override("trainer.project_name", "demo", setting="PROJECT_NAME"), Override("trainer.resume_mode", "auto")]
TAIL = "; verl would fail on it only when its trainer starts"


@pytest.fixture
def verl_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake installed verl (its trainer config directory), which check_verl_config composes instead of the real one."""
    config = tmp_path / "verl" / "trainer" / "config"
    config.mkdir(parents=True)
    (config / "ppo_trainer.yaml").write_text(PPO_TRAINER)
    (tmp_path / "verl" / "workers").mkdir()
    (tmp_path / "verl" / "workers" / "actor.py").write_text(ACTOR_PY)
    monkeypatch.setattr(vc, "verl_config_dir", lambda: config)
    return config


def check(*extra: str) -> vc.VerlConfigCheck:
    """What `plan` would find with these overrides after `--` (the final list: the recipe's, then these)."""
    return vc.check_verl_config(RECIPE, [*map(str, RECIPE), *extra], list(extra))


def test_composing_is_as_quiet_as_verls_own_composition(verl_tree: Path) -> None:
    """verl composes with Hydra's current defaults (version_base=None): no warning about an unset version reaches `plan`."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config = vc.compose_verl_config(["trainer.total_epochs=2"], verl_tree)
    assert config.trainer.total_epochs == 2


def test_every_override_is_type_checked_whatever_comes_before_it(verl_tree: Path) -> None:
    # A text key (not checked) and a null given to a nullable key come first: the bad value after them is still found.
    extra = ("trainer.project_name=x", "actor.clip=null", "trainer.total_epochs=abc")
    base, now = (OmegaConf.to_container(vc.compose_verl_config([*map(str, RECIPE), *more], verl_tree)) for more in ((), extra))
    assert vt.type_problems(base, now, extra, verl_tree) == [
        f"override 'trainer.total_epochs=abc': trainer.total_epochs is an int in verl's config (default 1), not 'abc'{TAIL}"
    ]


def test_a_value_holding_an_equals_sign_is_checked_against_the_key_before_it(verl_tree: Path) -> None:
    assert check("trainer.total_epochs='x=y'").problems == [
        f"override \"trainer.total_epochs='x=y'\": trainer.total_epochs is an int in verl's config (default 1), not 'x=y'{TAIL}"
    ]


def test_a_new_key_is_never_checked_as_the_key_its_name_ends_with(verl_tree: Path) -> None:
    # `my_trainer.ratio` is a new key of its own (no slip of `trainer`: recipe.config_typos would name that one):
    # only the override of trainer.ratio itself is wrong.
    assert check("trainer.ratio=x", "+my_trainer.ratio=0.1").problems == [
        f"override 'trainer.ratio=x': trainer.ratio is a float in verl's config (default 0.5), not 'x'{TAIL}"
    ]


def test_a_key_whose_default_is_an_interpolation_takes_no_type_from_where_it_points(verl_tree: Path) -> None:
    # actor.scale follows trainer.total_epochs (an int) in verl's config, but its dataclass field is a float.
    assert check("actor.scale=0.5").problems == []
    assert check("actor.scale=abc").problems == []  # its type is the dataclass's, known only when the trainer starts


def test_a_config_that_cannot_be_resolved_is_named_in_at_most_300_characters(verl_tree: Path) -> None:
    missing = "k" * 400
    why = f"Interpolation key 'trainer.{missing}' not found"[:300]
    assert check(f"+trainer.copy=${{trainer.{missing}}}").problems == [
        f"your overrides: verl's config cannot be resolved with them ({why})"
    ]


def test_an_interpolation_left_after_the_resolutions_is_shown_in_at_most_80_characters(verl_tree: Path) -> None:
    # Escaped five times: still an interpolation after Hydra's unquoting and verl's four resolutions.
    text = "${trainer." + "k" * 100 + "}"
    escaped = text
    for _ in range(5):
        escaped = escaped.replace("\\", "\\\\").replace("${", "\\${")
    assert check(f"+trainer.deep='{escaped}'").problems == [
        f"your overrides: trainer.deep still holds an interpolation after 4 resolutions ({text[:80]!r}); "
        "verl would resolve it again when it reads it"
    ]


def test_a_value_built_from_two_secrets_names_both(verl_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H13_API_TOKEN", "hunter2")
    monkeypatch.setenv("H13_DB_PASSWORD", "swordfish")
    assert check("+trainer.login=${oc.env:H13_DB_PASSWORD}:${oc.env:H13_API_TOKEN}").problems == [
        "your overrides: trainer.login would hold the secret H13_API_TOKEN, H13_DB_PASSWORD (read through oc.env); "
        "a secret reaches verl only through the environment, never its config (which verl prints and logs)"
    ]


def test_a_key_is_a_path_key_only_when_its_last_word_ends_in_path(verl_tree: Path, tmp_path: Path) -> None:
    code = tmp_path / "reward.py"
    code.write_text("def compute_score(): ...\n")
    # A mapping key `a path ` (ending in a space, kept by oc.create) does not end in `path`: not a path key.
    found = check(f"""+trainer.named='${{oc.create:"{{\\'a path \\': {code}, \\'b_path\\': {code}}}"}}'""")
    assert found.problems == []
    assert found.referenced_files == {"trainer.named.b_path": str(code)}
