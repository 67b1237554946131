"""`plan`'s memory estimate against the bytes a real run holds: verl's Megatron worker after its first step."""

from __future__ import annotations

import json
import re

from tests.e2e.conftest import ReferenceRun
from tests.e2e.cpu.megatron_patches import HELD_LINE
from tests.e2e.cpu.vllm_patches import KV_SPEC_LINE

_HELD = re.compile(re.escape(HELD_LINE).replace(r"\{weights\}", r"(\d+)").replace(r"\{gradients\}", r"(\d+)")
                   .replace(r"\{optimizer\}", r"(\d+)"))  # fmt: skip
_KV_SPEC = re.compile(re.escape(KV_SPEC_LINE).replace(r"\{per_token\}", r"(\d+)").replace(r"\{per_sequence\}", r"(\d+)"))


def _model_sizes(run: ReferenceRun):  # type: ignore[no-untyped-def]
    from recipe.model_sizes import sizes_from_config

    return sizes_from_config(json.loads((run.assets.model / "config.json").read_text()))


def test_weights_gradients_and_optimizer_are_what_the_estimate_says(e2e_reference: ReferenceRun) -> None:
    """The worker's parameters (bf16), main gradients (fp32) and optimizer state (fp32 master weights and Adam's
    two moments) after step 1 equal the estimate's terms for the smoke model and the plan's layout, byte for byte:
    both count every parameter of the model Megatron-Bridge built (the CPU run keeps the optimizer on the device:
    tests/e2e/harness/plan.py, optimizer_cpu_offload)."""
    from recipe.layout import ParallelLayout
    from recipe.memory_fit import actor_shard, model_state_bytes

    (held,) = {match.groups() for match in _HELD.finditer(e2e_reference.run.text())}
    weights, gradients, optimizer = map(int, held)
    fields = ("tp", "pp", "cp", "ep", "etp", "gen_tp", "nnodes", "ndevices_per_node")
    layout = ParallelLayout(**{name: e2e_reference.plan["layout"][name] for name in fields})
    estimate = model_state_bytes(actor_shard(_model_sizes(e2e_reference), layout))
    assert {"weights": weights, "gradients": gradients, "optimizer": optimizer} == estimate
    assert e2e_reference.plan["memory"]["phases"][0]["name"] == "actor phase (training)"


def test_the_kv_and_deltanet_state_terms_are_vllm_s_own_cache_spec(e2e_reference: ReferenceRun) -> None:
    """vLLM's cache spec for the smoke model on one rank (GEN_TP of the smoke layout): the keys and values of the
    full-attention layers per token, and the Gated DeltaNet conv and recurrent state per sequence, before vLLM pads
    pages to a common size, equal the estimate's terms."""
    from recipe.memory_fit import vllm_cache_bytes

    (spec,) = {match.groups() for match in _KV_SPEC.finditer(e2e_reference.run.text())}
    per_token, per_sequence = map(int, spec)
    gen_tp = e2e_reference.plan["layout"]["gen_tp"]
    assert (per_token, per_sequence) == vllm_cache_bytes(_model_sizes(e2e_reference), gen_tp, "gpu")
