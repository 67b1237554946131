"""Signs of a failing run, named while it runs: one line when each sign starts, from verl's own step metrics.

A GRPO run of a mixture-of-experts model more often stops learning than crashes, and each way it does shows in
the metrics verl 0.9.1 logs every step (the event files the progress line reads, recipe.run.progress): responses
cut at the length limit, groups whose samples all got the same reward (no advantage, so no gradient), the
policy's entropy collapsing, a gradient norm that is no longer finite, a reward that stopped moving, and the
rollout's log-probabilities drifting from the trainer's. HealthWatch judges each step as it comes and says a
sign once, when it starts (again only after it had ended); `signs_of` replays a whole run for its report.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from recipe.mismatch import METRIC as MISMATCH_ABS
from recipe.near_miss import one_slip_from
from recipe.run.verl_metrics import REWARD

#: verl 0.9.1's metrics the signs are read from (verl/trainer/ppo/metric_utils.py compute_data_metrics; the
#: actor's entropy and grad norm from its update; rollout_corr/* from verl/trainer/ppo/rollout_corr_helper.py).
CLIPPED = "response_length/clip_ratio"
ADVANTAGE_MAX, ADVANTAGE_MIN = "critic/advantages/max", "critic/advantages/min"
ENTROPY = "actor/entropy"
GRAD_NORM = "actor/grad_norm"
MISMATCH_KL = "rollout_corr/kl"
#: Every metric the signs read (added to what `run` reads back: recipe.run.verl_metrics.READ_BACK); MISMATCH_ABS is
#: the recipe's own, logged beside verl's rollout_corr/* (recipe.mismatch).
HEALTH_METRICS = frozenset({CLIPPED, ADVANTAGE_MAX, ADVANTAGE_MIN, ENTROPY, GRAD_NORM, MISMATCH_KL, MISMATCH_ABS,
                            REWARD})  # fmt: skip
#: Every sign, by the name its line and the run report give it.
SIGN_NAMES = ("responses cut at the length limit", "no reward spread", "entropy collapse", "gradient norm not finite",
              "reward flat", "rollout/training mismatch", "mismatch growing")  # fmt: skip
#: The signs as curves beside verl's: one 0/1 metric a sign and step, logged with verl's own (recipe.health_log).
CURVE_PREFIX = "recipe_health"


def curve_name(sign: str) -> str:
    """The metric a sign is logged as: CURVE_PREFIX/<its name, spaces and slashes as underscores>."""
    return f"{CURVE_PREFIX}/{sign.replace(' ', '_').replace('/', '_')}"


def sign_curves(active: Iterable[str]) -> dict[str, float]:
    """Every sign's metric at one step: 1.0 while it is on (in `active`), 0.0 otherwise."""
    on = set(active)
    return {curve_name(name): 1.0 if name in on else 0.0 for name in SIGN_NAMES}


class Thresholds(BaseModel):
    """Where each sign starts, with why there: HEALTH_THRESHOLDS changes any of them (`parse_thresholds`)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    clipped_share: float = Field(0.5, gt=0, lt=1, description=(
        "More than half the responses cut at data.max_response_length: most answers are judged unfinished, and "
        "DAPO's overlong filtering exists because such samples teach the policy to be cut off."))
    entropy_fall: float = Field(0.1, gt=0, lt=1, description=(
        "The policy's entropy below a tenth of the run's first step: the collapse DAPO and Clip-Cov/KL-Cov report "
        "is a fall by an order of magnitude within a few hundred steps, after which exploration is gone."))
    flat_steps: int = Field(10, ge=2, le=100_000, description="The reward's spread over this many steps below "
                            "flat_span: nothing learnt for a while.")
    flat_span: float = Field(1e-3, gt=0, description="See flat_steps.")
    mismatch_kl: float = Field(0.002, gt=0, description=(
        "NeMo-RL's Qwen3.5-35B-A3B geo3k recipe checks a mean generation KL below 0.002 (the issue's anchor)."))
    mismatch_abs: float = Field(0.1, gt=0, description=(
        "slime keeps the mean |log p_rollout - log p_train| per token within 0.1 (0.2 to 0.4 is a broken run)."))
    mismatch_rising_steps: int = Field(5, ge=2, le=100_000, description="The mismatch rising at each of this many "
                                       "steps in a row.")


#: The longest HEALTH_THRESHOLDS read: every bound with a long number fits many times over.
MAX_THRESHOLDS_TEXT = 1000


def parse_thresholds(text: str) -> Thresholds:
    """`name=value` pairs separated by commas (HEALTH_THRESHOLDS) over the defaults; ValueError saying what is wrong
    (an unknown name with the one it is a slip of, a name twice, a value out of its bound)."""
    if len(text) > MAX_THRESHOLDS_TEXT:
        raise ValueError(f"must be at most {MAX_THRESHOLDS_TEXT} characters")
    names = list(Thresholds.model_fields)
    given: dict[str, str] = {}
    for pair in (part.strip() for part in text.split(",")):
        name, equals, value = (part.strip() for part in pair.partition("="))
        if not equals or not name or not value:
            raise ValueError(f"must be name=value pairs separated by commas (e.g. mismatch_kl=0.005); not {pair!r}")
        if name not in names:
            slip = one_slip_from(name, names)
            hint = f"did you mean {slip}? " if slip else ""
            raise ValueError(f"{name!r} is no health bound; {hint}the bounds are {', '.join(names)}")
        if name in given:
            raise ValueError(f"{name} is given twice")
        given[name] = value
    try:
        return Thresholds.model_validate(given)
    except ValidationError as error:
        first = error.errors()[0]
        # Pydantic's own wording of the bound (Thresholds has no validator of its own to word it otherwise).
        raise ValueError(f"{first['loc'][0]}={given[str(first['loc'][0])]!r}: {str(first['msg']).lower()}") from None


def thresholds_text(thresholds: Thresholds) -> str:
    """Every bound as `name=value` pairs, what parse_thresholds reads back to the same Thresholds."""
    return ",".join(f"{name}={value!r}" for name, value in thresholds.model_dump().items())


@dataclass(frozen=True)
class Sign:
    """One sign of one run: which, the step it started at, what was seen, and what to look at or change."""

    name: str
    since: int
    seen: str
    advice: str

    def line(self) -> str:
        """The one line said when it starts."""
        return f"health: {self.name} from step {self.since}: {self.seen}; {self.advice}"


@dataclass
class HealthWatch:
    """The signs of the steps fed so far (each step once, in order)."""

    thresholds: Thresholds = field(default_factory=Thresholds)
    active: set[str] = field(default_factory=set)
    started: list[Sign] = field(default_factory=list)
    first_entropy: float | None = None
    rewards: list[float] = field(default_factory=list)
    mismatches: list[float] = field(default_factory=list)

    def feed(self, step: int, metrics: Mapping[str, float | None]) -> list[str]:
        """The lines of the signs that start at `step` (a sign still on says nothing more)."""
        now = {sign.name: sign for sign in self._judge(step, metrics)}
        self.active &= now.keys()  # the ones that ended are said again if they come back
        lines = []
        for name, sign in now.items():
            if name not in self.active:
                self.active.add(name)
                self.started.append(sign)
                lines.append(sign.line())
        return lines

    def _judge(self, step: int, metrics: Mapping[str, float | None]) -> Iterable[Sign]:
        limits = self.thresholds
        clipped = metrics.get(CLIPPED)
        if clipped is not None and clipped > limits.clipped_share:
            yield Sign("responses cut at the length limit", step,
                       f"{clipped:.0%} of responses end at data.max_response_length ({CLIPPED} above {limits.clipped_share:.0%})",
                       "the reward judges unfinished answers: raise data.max_response_length, or look at response_length/mean")  # fmt: skip
        high, low = metrics.get(ADVANTAGE_MAX), metrics.get(ADVANTAGE_MIN)
        if high is not None and low is not None and high == 0.0 and low == 0.0:
            yield Sign("no reward spread", step,
                       "every group's samples got the same reward (every advantage 0: this step's update had no gradient)",
                       "make the task harder or easier for the model (critic/score/mean), or raise ROLLOUT_N")  # fmt: skip
        entropy = metrics.get(ENTROPY)
        if entropy is not None:
            if self.first_entropy is None:
                self.first_entropy = entropy
            elif self.first_entropy > 0 and entropy < limits.entropy_fall * self.first_entropy:
                yield Sign("entropy collapse", step,
                           f"{ENTROPY} {entropy:.4g}, below {limits.entropy_fall:g} of the first step's {self.first_entropy:.4g}",
                           "the policy stopped exploring: lower the learning rate, or look at actor/pg_clipfrac")  # fmt: skip
        if GRAD_NORM in metrics and metrics[GRAD_NORM] is None:
            yield Sign("gradient norm not finite", step,
                       f"{GRAD_NORM} is inf or NaN; in bf16 Megatron's optimizer checks gradients only with a loss "
                       "scaler, so verl applied this update",
                       "the weights may hold NaN from here: resume from the save before this step "
                       "(trainer.resume_mode=resume_path) with a lower learning rate")  # fmt: skip
        reward = metrics.get(REWARD)
        if reward is not None:
            self.rewards.append(reward)
            window = self.rewards[-limits.flat_steps :]
            if len(window) == limits.flat_steps and max(window) - min(window) < limits.flat_span:
                yield Sign("reward flat", step - limits.flat_steps + 1,
                           f"{REWARD} within {limits.flat_span:g} over {limits.flat_steps} steps (last {reward:.4g})",
                           "nothing is being learnt: look at the reward function's scores (critic/score/mean) and the data")  # fmt: skip
        mismatch, gap = metrics.get(MISMATCH_KL), metrics.get(MISMATCH_ABS)
        above = []  # in either anchor's unit
        if mismatch is not None and mismatch > limits.mismatch_kl:
            above.append(f"{MISMATCH_KL} {mismatch:.4g}, above {limits.mismatch_kl:g} (NeMo-RL's bound for this model)")
        if gap is not None and gap > limits.mismatch_abs:
            above.append(f"{MISMATCH_ABS} {gap:.4g}, above {limits.mismatch_abs:g} (slime's bound)")
        if above:
            yield Sign("rollout/training mismatch", step, "; ".join(above),
                       "vLLM and Megatron disagree on the samples' log-probabilities: the update is off-policy")
        if mismatch is not None:
            self.mismatches.append(mismatch)
            rising = self.mismatches[-(limits.mismatch_rising_steps + 1) :]
            if len(rising) > limits.mismatch_rising_steps and all(a < b for a, b in zip(rising, rising[1:])):
                yield Sign("mismatch growing", step - limits.mismatch_rising_steps + 1,
                           f"{MISMATCH_KL} rose at each of {limits.mismatch_rising_steps} steps, to {mismatch:.4g}",
                           "the rollout drifts from the trainer: look at rollout_corr/* and the weight sync")  # fmt: skip


def signs_of(steps: Mapping[int, Mapping[str, float | None]], thresholds: Thresholds = Thresholds()) -> list[Sign]:
    """Every sign a run showed, in the order they started: its steps (recipe.run.progress.read_steps) replayed."""
    watch = HealthWatch(thresholds)
    for step in sorted(steps):
        watch.feed(step, steps[step])
    return watch.started
