"""Step 1's training batch, made once and trained on twice: on one node and on two.

verl 0.9.1's rollout skip for its v1 trainer (verl/utils/skip/rollout_skip.py, RolloutTqSkip) writes a step's
batch as the replay buffer hands it to the trainer (TransferQueue's fields of every trajectory: prompt and response
tokens, the rollout's log-probs, the rewards; `tq_batch.pt`) when it finds none, and when it finds one, puts it into
TransferQueue in place of the rollout's. The one-node e2e's first run writes step 1's batch (tests/e2e/conftest.py);
the two-node run loads it (tests/e2e/test_two_nodes.py). Both start from the same weights, so their step-1 saves
hold the same update made on one rank and on two, one a node: what GRPO across nodes must not change.

What may differ is the order of the sums. On two ranks each sums the gradient of its half of the batch, and the
all-reduce (gloo here) adds the halves; on one rank the same per-token terms are added in another order. Each fp32
addition rounds at 2^-24 (6e-8) of its result, so the two gradients differ by that order of magnitude, relative:
1.2e-7 measured. UPDATE_TOLERANCE is 80 times that; a different batch gives a relative gap near 1 (1.0 measured
between the first moments of step 1 and step 2). Weights are compared in steps: Adam's first update moves every
weight by about the learning rate, so the weights' root-mean-square gap over lr says how much of a step the two
updates disagree on (6e-6 measured).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # its module imports tests.e2e.cpu, whose patches must not load where the deploy tests import this
    from tests.e2e.harness.checkpoint import OptimizerState

#: What the comparison allows: relative gap of Adam's moments, weights' RMS gap in learning-rate steps (see above).
UPDATE_TOLERANCE = 1e-5
#: verl's lines (rollout_skip.py) when it wrote step 1's batch and when it loaded it; colour codes around them.
WROTE = "Dump TQ batch at step 1 "
LOADED = "cached trajectories from step 1 "


def batch_overrides(folder: Path) -> list[str]:
    """verl's overrides that write step 1's batch into `folder` when none is there, and load it when one is."""
    skip = "skip.rollout_tq"
    return [f"{skip}.enable=True", f"{skip}.steps=[1]", f"{skip}.dump_dir={folder}"]


def written_batch(folder: Path) -> list[Path]:
    """The batch files verl wrote under `folder` (one per step and sync round)."""
    return sorted(folder.rglob("tq_batch.pt"))


@dataclass(frozen=True)
class UpdateGap:
    """How far two saves of one update are apart."""

    #: ||m_a - m_b|| / ||m_a|| over Adam's first moment: after one step (1 - beta1) times the gradient.
    gradient: float
    #: The same for the second moment, (1 - beta2) times the squared gradient.
    squared_gradient: float
    #: RMS of the fp32 main weights' gap, in learning-rate steps.
    weights_in_steps: float

    def within(self, tolerance: float = UPDATE_TOLERANCE) -> bool:
        """Whether every gap is within `tolerance` (and is a number)."""
        return all(math.isfinite(gap) and gap <= tolerance
                   for gap in (self.gradient, self.squared_gradient, self.weights_in_steps))  # fmt: skip


def update_gap(one: OptimizerState, other: OptimizerState) -> UpdateGap:
    """The gap between two saves after the same number of steps; ValueError where they are not comparable."""
    if one.adam_steps != other.adam_steps or one.learning_rates != other.learning_rates:
        raise ValueError(f"not the same step: Adam's steps {one.adam_steps} and {other.adam_steps}, "
                         f"lr {one.learning_rates} and {other.learning_rates}")  # fmt: skip
    shapes = {name: (tuple(one.flat[name].shape), tuple(other.flat[name].shape)) for name in one.flat}
    if any(a != b for a, b in shapes.values()):
        raise ValueError(f"the flat buffers' shapes differ: {shapes}")
    [lr] = set(one.learning_rates)

    def relative(name: str) -> float:
        reference = one.flat[name].double()
        return float((reference - other.flat[name].double()).norm() / reference.norm())

    weights = one.flat["param"].double() - other.flat["param"].double()
    rms = float(weights.norm()) / math.sqrt(weights.numel())
    return UpdateGap(relative("exp_avg"), relative("exp_avg_sq"), rms / lr)
