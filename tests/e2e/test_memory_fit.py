"""`plan`'s memory estimate against the bytes a real run holds: verl's Megatron worker after its first step."""

from __future__ import annotations

import json
import re

from tests.e2e.conftest import ReferenceRun
from tests.e2e.cpu.megatron_patches import HELD_LINE

_HELD = re.compile(re.escape(HELD_LINE).replace(r"\{weights\}", r"(\d+)").replace(r"\{gradients\}", r"(\d+)")
                   .replace(r"\{optimizer\}", r"(\d+)"))  # fmt: skip


def test_weights_gradients_and_optimizer_are_what_the_estimate_says(e2e_reference: ReferenceRun) -> None:
    """The worker's parameters (bf16), main gradients (fp32) and optimizer state (fp32 master weights and Adam's
    two moments) after step 1 equal the estimate's terms for the smoke model and the plan's layout, byte for byte:
    both count every parameter of the model Megatron-Bridge built (the CPU run keeps the optimizer on the device:
    tests/e2e/harness/plan.py, optimizer_cpu_offload)."""
    from recipe.layout import ParallelLayout
    from recipe.memory_fit import actor_shard, model_state_bytes
    from recipe.model_sizes import sizes_from_config

    (held,) = {match.groups() for match in _HELD.finditer(e2e_reference.run.text())}
    weights, gradients, optimizer = map(int, held)
    fields = ("tp", "pp", "cp", "ep", "etp", "gen_tp", "nnodes", "ndevices_per_node")
    layout = ParallelLayout(**{name: e2e_reference.plan["layout"][name] for name in fields})
    config = json.loads((e2e_reference.assets.model / "config.json").read_text())
    estimate = model_state_bytes(actor_shard(sizes_from_config(config), layout))
    assert {"weights": weights, "gradients": gradients, "optimizer": optimizer} == estimate
    assert e2e_reference.plan["memory"]["phases"][0]["name"] == "actor phase (training)"
