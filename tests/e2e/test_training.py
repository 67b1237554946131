"""The GRPO loop itself: the recipe's plan, two steps, a reward with signal, gradients, log-prob agreement."""

from __future__ import annotations

from tests.e2e.conftest import TRACKER, E2ERun
from tests.e2e.harness.metrics import step_metrics
from tests.e2e.harness.plan import _split, cpu_additions, cpu_swaps, host_swaps
from tests.e2e.harness.versions import version_problems

#: Rollout (vLLM, bf16) and actor (Megatron, bf16) probabilities of the same tokens: measured 2e-5 to 7e-5.
LOG_PROB_TOLERANCE = 1e-3


def _metrics(run: E2ERun) -> dict[int, dict[str, float]]:
    """Step metrics of both trainer runs (step 1 from the first, step 2 from the resumed one)."""
    return {**step_metrics(run.first.text()), **step_metrics(run.second.text())}


def test_pinned_versions() -> None:
    """The patches cite lines of exactly these releases."""
    assert version_problems() == []


def test_argv_is_the_recipe_plan_with_only_the_cpu_mapping(e2e: E2ERun) -> None:
    """Every planned override runs as planned, except the listed swaps; the additions are appended."""
    swaps = {**cpu_swaps(e2e.assets.model, e2e.checkpoint_dir), **host_swaps()}
    additions = cpu_additions()
    planned = e2e.plan["overrides"]
    ran = e2e.argv[len(e2e.plan["argv"]) - len(planned) :]
    assert e2e.argv[: len(e2e.plan["argv"]) - len(planned)] == e2e.plan["argv"][: -len(planned)]
    for before, after in zip(planned, ran):
        key = _split(before)[1]
        assert after == (before if key not in swaps else f"{_split(before)[0]}{key}={swaps[key].cpu}")
    assert ran[len(planned) :] == [addition.override for addition in additions.values()]
    assert "model_engine='megatron'" in ran
    assert "actor_rollout_ref.actor.megatron.vanilla_mbridge=False" in ran


def test_two_steps_complete(e2e: E2ERun) -> None:
    """Step 1 in the first run, step 2 in the resumed one; the resumed run exits 0 with step 2 saved."""
    assert e2e.second.returncode == 0, e2e.second.tail()
    metrics = _metrics(e2e)
    assert sorted(metrics) == [1, 2], f"step lines found: {sorted(metrics)}"
    assert (e2e.root / TRACKER).read_text().strip() == "2"
    assert (e2e.step_dir(2) / "actor" / "ckpt_contents.json").is_file()


def test_rewards_vary(e2e: E2ERun) -> None:
    """GRPO needs different rewards within a step, or every advantage is 0."""
    for step, values in _metrics(e2e).items():
        assert values["critic/score/max"] > values["critic/score/min"], f"step {step}: constant reward {values}"


def test_gradients_flow(e2e: E2ERun) -> None:
    """A reward with signal gives a non-zero gradient at every step."""
    for step, values in _metrics(e2e).items():
        assert values["actor/grad_norm"] > 0, f"step {step}: grad_norm {values['actor/grad_norm']}"


def test_rollout_and_actor_log_probs_agree(e2e: E2ERun) -> None:
    """vLLM's token probabilities of its own samples match Megatron's recomputation: vLLM generates with
    the weights Megatron holds (a sync that lost or mangled a tensor would show). With lr 1e-6 one update
    moves the weights too little for this check to tell a stale copy from a fresh one."""
    for step, values in _metrics(e2e).items():
        assert values["training/rollout_probs_diff_valid"] == 1, f"step {step}: {values}"
        assert values["training/rollout_probs_diff_max"] < LOG_PROB_TOLERANCE, f"step {step}: {values}"


def test_megatron_engine_and_bridge_ran(e2e: E2ERun) -> None:
    """The actor is Megatron's, loaded and exported by Megatron-Bridge (not vanilla mbridge)."""
    log = e2e.first.text()
    assert "Loading from" in log and "Qwen3Bridge" in log
    assert "Converting to HuggingFace" in log
