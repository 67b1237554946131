"""verl's routing replay turned on by an override: refused by `plan` with why (recipe.routing_replay), let through
with a warning when ALLOW_UPSTREAM_ISSUE names the known failure (issue 53, item 3)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from recipe import cli
from recipe.errors import RecipeConfigError
from recipe.plan import build_plan
from recipe.plan_warnings import routing_replay_warning
from recipe.routing_replay import ROUTING_REPLAY_OFF, UNPROVEN, ZERO_ROUTES_ISSUE, routing_replay_problems

from .envtools import settings_of

REPLAY = "actor_rollout_ref.rollout.enable_rollout_routing_replay"
REPLAY_MODE = "actor_rollout_ref.actor.megatron.router_replay.mode"
WHY = ("routing replay is not proven by the recipe's tests (vLLM on CPU, which its e2e runs, cannot return the experts "
       "it routed to); on gpu, vLLM 0.24.0 returns all-zero routes without an error where it picks FlashInfer's MoE "
       "kernel (Blackwell, vllm#44214)")  # fmt: skip


@pytest.mark.parametrize(("overrides", "named"), [
    ([], None),  # the recipe leaves both off
    ([f"{REPLAY}=False", f"{REPLAY_MODE}=disabled"], None),  # verl's own defaults, written out
    ([f"{REPLAY_MODE}=null"], None),
    ([f"{REPLAY}=True"], f"{REPLAY}=True"),
    ([f"{REPLAY}=true", f"{REPLAY_MODE}=R3"], f"{REPLAY}=true, {REPLAY_MODE}=R3"),
    ([f"{REPLAY_MODE}='R2'"], f"{REPLAY_MODE}=R2"),  # R2 records in the trainer: still unproven here
    ([f"{REPLAY}=True", f"{REPLAY}=False"], None),  # the last override wins, as in Hydra
])  # fmt: skip
def test_routing_replay_turned_on_is_refused_with_why_unless_its_issue_is_allowed(
    overrides: list[str], named: str | None
) -> None:
    refused = routing_replay_problems(overrides, [])
    warned = routing_replay_warning(overrides)
    assert UNPROVEN == WHY
    if named is None:
        assert refused == [] and warned is None
        return
    assert refused == [f"{named}: {WHY}; set ALLOW_UPSTREAM_ISSUE=vllm#44214 to try it on your own evidence "
                       "(docs/health.md, Routing replay)"]  # fmt: skip
    assert routing_replay_problems(overrides, ["vllm-ascend#10014", ZERO_ROUTES_ISSUE]) == []
    assert routing_replay_problems(overrides, ["vllm#44215", "vllm-ascend#10014"]) == refused
    assert warned == f"{named}: {WHY}; docs/health.md, Routing replay"


@given(value=st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 _", max_size=12),
       key=st.sampled_from([REPLAY, REPLAY_MODE]))  # fmt: skip
def test_any_value_but_off_is_refused(value: str, key: str) -> None:
    """Off is verl's defaults and their spellings (False, 'disabled', null), in any case and with blanks."""
    off = value.strip().lower() in ROUTING_REPLAY_OFF
    assert (routing_replay_problems([f"{key}={value}"], []) == []) == off


def test_through_the_plan_refused_and_allowed(tmp_path: Path) -> None:
    """Through build_plan, the keys checked against verl's own config first (both are verl 0.9.1's)."""
    overrides = [f"{REPLAY}=True", f"{REPLAY_MODE}=R3"]
    with pytest.raises(RecipeConfigError) as refused:
        build_plan(settings_of(PROFILE="smoke", DEVICE="gpu", CHECKPOINT_DIR=str(tmp_path)), {}, overrides)
    assert any(line.startswith(f"{REPLAY}=True, {REPLAY_MODE}=R3: routing replay is not proven")
               for line in refused.value.problems)  # fmt: skip
    plan = build_plan(settings_of(PROFILE="smoke", DEVICE="gpu", CHECKPOINT_DIR=str(tmp_path),
                                  ALLOW_UPSTREAM_ISSUE=ZERO_ROUTES_ISSUE), {}, overrides)  # fmt: skip
    [line] = [line for line in plan.warnings if "routing replay" in line]
    assert line == f"{REPLAY}=True, {REPLAY_MODE}=R3: {WHY}; docs/health.md, Routing replay"
    assert f"+{REPLAY}=True" in plan.overrides or f"{REPLAY}=True" in plan.overrides


def test_plan_refuses_it_with_exit_2(gpu_env: pytest.MonkeyPatch, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    gpu_env.setenv("PROFILE", "smoke")
    assert cli.main(["plan", "--", f"{REPLAY}=True"]) == 2
    assert f"{REPLAY}=True: routing replay is not proven" in capsys.readouterr().err
    assert not (tmp_path / "checkpoints").exists()
