"""The smoke verdict's rules, by direct calls on hand-written metrics and a tiny Llama written here: no trainer.

test_verdict.py judges a recorded run and the real smoke model's export (a build of about 10 s); this file
pins each rule on its own, fast enough to run once per mutant: which metric values pass, what each check
says it measured and against which limit, that every hostile file is a failed check (never a traceback),
which export counts as trained, and the block and JSON the user reads. The oracles are hand-written cases
and docs/smoke.md (its example block and its table of what a FAIL means), never the module's own tables.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from recipe.smoke.verdict import (
    ADVANTAGE_MAX,
    ADVANTAGE_MIN,
    GRAD_NORM,
    MISMATCH_ABS,
    MISMATCH_KL,
    PROBS_DIFF_MAX,
    PROMPT_MAX,
    PROMPT_MIN,
    Check,
    MetricsError,
    Verdict,
    judge_export,
    judge_images,
    judge_metrics,
    read_metrics,
    smoke_verdict,
)
from tests.support.needs import TRAINER_EXTRA, needs

DOCS = Path(__file__).resolve().parents[3] / "docs" / "smoke.md"
METRIC_CHECKS = ["rewards vary within a prompt's group", "gradients", "rollout matches actor", "mismatch as KL",
                 "mismatch per token"]  # fmt: skip
EXPORT_CHECKS = ["HF export", "export was trained", "vision tower was trained", "export watcher"]
NOT_LOGGED = "not logged (or not a finite number) at step"
#: Each metric check's limit as docs/smoke.md's example block prints it.
LIMITS = {
    "rewards vary within a prompt's group": "critic/advantages/max - critic/advantages/min > 0 at every step",
    "gradients": "actor/grad_norm > 0 at every step",
    "rollout matches actor": "training/rollout_probs_diff_max < 0.01 at every step",
    "mismatch as KL": "-0.01 < rollout_corr/kl < 0.01 at every step",
    "mismatch per token": "rollout_corr/abs_log_prob_diff < 0.05 at every step",
}

#: Two steps of a healthy run: the docs' example values at step 1 (its worst), better ones at step 2.
GOOD: dict[int, dict[str, float]] = {
    1: {ADVANTAGE_MAX: 1.5, ADVANTAGE_MIN: -0.99, GRAD_NORM: 1.49, PROBS_DIFF_MAX: 0.00092, PROMPT_MIN: 76, PROMPT_MAX: 76,
        MISMATCH_KL: -0.0045, MISMATCH_ABS: 0.0121},
    2: {ADVANTAGE_MAX: 2.0, ADVANTAGE_MIN: -1.0, GRAD_NORM: 2.0, PROBS_DIFF_MAX: 0.0005, PROMPT_MIN: 76, PROMPT_MAX: 76,
        MISMATCH_KL: 0.0043, MISMATCH_ABS: 0.0116},
}


def smoke_prompts() -> Any:
    """The smoke data's prompt lengths as recipe.data.prompt_lengths counts them: 64 prompts of 76 tokens, 4 of
    them image tokens (tests/e2e/test_image_data.py checks that count against verl's filter)."""
    from recipe.data.prompt_lengths import PromptLengths, RowLength

    return PromptLengths.of([RowLength(76, 4)] * 64)


def metrics_with(change: Callable[[dict[int, dict[str, float]]], Any]) -> dict[int, dict[str, float]]:
    """GOOD, copied, then changed by `change({step: values})`."""
    metrics = {step: dict(values) for step, values in GOOD.items()}
    change(metrics)
    return metrics


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {check.name: check for check in checks}


# --- the metrics checks -------------------------------------------------------------------------------------------


def test_a_healthy_run_passes_each_metric_check_naming_its_worst_step() -> None:
    assert judge_metrics(GOOD, 2) == [
        Check("steps", True, "2 of 2 logged", "every step 1..2"),
        *[Check(name, True, f"{worst} at its worst step", LIMITS[name])
          for name, worst in zip(METRIC_CHECKS, ["2.49", "1.49", "0.00092", "-0.0045", "0.0121"])],
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("change", "check", "measured"),
    [
        # GRPO has no signal when every reward of a group is equal: the spread is exactly 0.
        (lambda m: m[2].update({ADVANTAGE_MAX: 0.5, ADVANTAGE_MIN: 0.5}), METRIC_CHECKS[0], "0 at its worst step"),
        (lambda m: m[1].pop(ADVANTAGE_MIN), METRIC_CHECKS[0], f"{NOT_LOGGED} 1"),
        (lambda m: [values.pop(ADVANTAGE_MAX) for values in m.values()], METRIC_CHECKS[0], f"{NOT_LOGGED} 1, 2"),
        (lambda m: m[1].update({GRAD_NORM: 0.0}), "gradients", "0 at its worst step"),
        (lambda m: m[2].update({GRAD_NORM: math.inf}), "gradients", f"{NOT_LOGGED} 2"),
        (lambda m: m[2].update({GRAD_NORM: math.nan}), "gradients", f"{NOT_LOGGED} 2"),
        (lambda m: m[2].pop(GRAD_NORM), "gradients", f"{NOT_LOGGED} 2"),
        # The limit itself fails: "< 0.01", and a lost tensor moves the difference far past it.
        (lambda m: m[2].update({PROBS_DIFF_MAX: 0.01}), "rollout matches actor", "0.01 at its worst step"),
        (lambda m: m[1].update({PROBS_DIFF_MAX: 0.5}), "rollout matches actor", "0.5 at its worst step"),
        (lambda m: m[1].update({PROBS_DIFF_MAX: -math.inf}), "rollout matches actor", f"{NOT_LOGGED} 1"),
        # The mismatch in each unit: the limit itself fails, a negative KL counts by its size, a missing one fails.
        (lambda m: m[2].update({MISMATCH_KL: 0.01}), "mismatch as KL", "0.01 at its worst step"),
        (lambda m: m[2].update({MISMATCH_KL: -0.02}), "mismatch as KL", "-0.02 at its worst step"),
        (lambda m: m[1].pop(MISMATCH_KL), "mismatch as KL", f"{NOT_LOGGED} 1"),
        (lambda m: m[1].update({MISMATCH_ABS: 0.05}), "mismatch per token", "0.05 at its worst step"),
        (lambda m: m[2].update({MISMATCH_ABS: 0.3}), "mismatch per token", "0.3 at its worst step"),
        (lambda m: m[2].update({MISMATCH_ABS: math.nan}), "mismatch per token", f"{NOT_LOGGED} 2"),
    ],
)  # fmt: skip
def test_a_bad_metric_fails_its_own_check_only_saying_what_it_measured(
    change: Callable[[dict[int, dict[str, float]]], Any], check: str, measured: str
) -> None:
    checks = judge_metrics(metrics_with(change), 2)
    assert [c.name for c in checks if not c.passed] == [check]
    # Exactly False (CI reads `"passed": false` in the JSON), with the limit it missed.
    assert by_name(checks)[check] == Check(check, False, measured, LIMITS[check])


def test_small_but_positive_signals_pass() -> None:
    """Advantages 0.25 apart and a gradient norm of 0.001 are signal; only 0 is none."""
    tiny = metrics_with(lambda m: m[2].update({ADVANTAGE_MAX: 0.125, ADVANTAGE_MIN: -0.125, GRAD_NORM: 0.001}))
    checks = by_name(judge_metrics(tiny, 2))
    assert [checks[name].measured for name in METRIC_CHECKS[:2]] == [
        "0.25 at its worst step",
        "0.001 at its worst step",
    ]
    assert all(check.passed for check in checks.values())


def test_a_step_not_logged_fails_only_the_steps_check() -> None:
    """The other checks judge the steps that were logged: one cause, one failed check."""
    checks = judge_metrics(metrics_with(lambda m: m.pop(1)), 2)
    assert checks[0] == Check("steps", False, "1 of 2 logged", "every step 1..2")
    assert [c.passed for c in checks[1:]] == [True] * len(METRIC_CHECKS)
    # Step 2's own values, now the only ones.
    assert [c.measured for c in checks[1:]] == [f"{v:.3g} at its worst step" for v in (3.0, 2.0, 0.0005, 0.0043, 0.0116)]


def test_nothing_logged_fails_every_metric_check() -> None:
    assert judge_metrics({}, 3) == [
        Check("steps", False, "0 of 3 logged", "every step 1..3"),
        *[Check(name, False, "no step logged", LIMITS[name]) for name in METRIC_CHECKS],
    ]  # fmt: skip


def test_steps_outside_1_to_steps_are_not_judged() -> None:
    """A step 0 (verl's validation before training) or a step past the plan's last does not count or fail."""
    bad = {ADVANTAGE_MAX: 0.0, ADVANTAGE_MIN: 0.0, GRAD_NORM: 0.0, PROBS_DIFF_MAX: 1.0}
    checks = judge_metrics({0: bad, **GOOD, 3: bad}, 2)
    assert checks == judge_metrics(GOOD, 2)


def test_a_resumed_run_is_judged_on_the_steps_it_trained() -> None:
    """A restart resumed after step 1: verl's file logger started its file anew, so it holds step 2 alone; that is
    the whole of what this run trained, and a bad step 1 left from before is not judged."""
    bad = {ADVANTAGE_MAX: 0.0, ADVANTAGE_MIN: 0.0, GRAD_NORM: 0.0, PROBS_DIFF_MAX: 1.0}
    resumed = judge_metrics({2: GOOD[2]}, 2, first=2)
    assert resumed[0] == Check("steps", True, "1 of 1 logged (resumed after step 1)", "every step 2..2")
    assert all(check.passed for check in resumed)
    assert judge_metrics({1: bad, 2: GOOD[2]}, 2, first=2) == resumed
    # Judged from step 1, the same file misses step 1.
    assert judge_metrics({2: GOOD[2]}, 2)[0] == Check("steps", False, "1 of 2 logged", "every step 1..2")
    # A resumed run that logged nothing fails.
    assert not judge_metrics({1: GOOD[1]}, 2, first=2)[0].passed


finite_positive = st.floats(min_value=1e-6, max_value=1e6)


@given(
    st.lists(
        st.tuples(finite_positive, finite_positive, st.floats(min_value=0, max_value=0.0099)), min_size=1, max_size=6
    )
)
def test_any_run_with_signal_and_matching_probabilities_passes(steps: list[tuple[float, float, float]]) -> None:
    """Whatever the values, a spread > 0, a grad norm > 0 and a difference < 0.01 at every step pass,
    and the worst step is the one reported: the smallest spread and norm, the largest difference."""
    metrics = {
        step: {ADVANTAGE_MAX: spread, ADVANTAGE_MIN: 0.0, GRAD_NORM: norm, PROBS_DIFF_MAX: diff,
               MISMATCH_KL: diff - 0.005, MISMATCH_ABS: 5 * diff}  # fmt: skip
        for step, (spread, norm, diff) in enumerate(steps, start=1)
    }
    checks = judge_metrics(metrics, len(steps))
    assert all(check.passed for check in checks), checks
    spreads, norms, diffs = zip(*steps)
    kls = [diff - 0.005 for diff in diffs]
    assert [c.measured for c in checks[1:]] == [
        f"{v:.3g} at its worst step" for v in (min(spreads), min(norms), max(diffs), max(kls, key=abs), 5 * max(diffs))
    ]


# --- reading verl's metrics file ----------------------------------------------------------------------------------


def lines(*records: object) -> str:
    return "".join(json.dumps(record) + "\n" for record in records)


def test_a_later_line_of_a_step_wins_and_only_numbers_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text(
        lines(
            {"step": 1, "data": {"a": 1, "b": 2.5, "flag": True, "text": "x", "none": None, "list": [1]}},
            {"step": 2, "data": {"a": 7}},
            {"step": 1, "data": {"b": -3}},
        )
    )
    metrics = read_metrics(path)
    assert metrics == {1: {"a": 1.0, "b": -3.0}, 2: {"a": 7.0}}
    assert {type(value) for data in metrics.values() for value in data.values()} == {float}


def test_blank_lines_are_skipped_and_bad_bytes_do_not_stop_the_reader(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'\n   \n{"step": 1, "data": {"x\xff": 1}}\n\t\n')
    assert read_metrics(path) == {1: {"x\ufffd": 1.0}}


@pytest.mark.parametrize(
    ("content", "line", "problem"),
    [
        ("\n\nnot json\n", 3, "not a JSON line"),
        ('{"step": 1, "data": {}}\n{"step": 2, "data": {\n', 2, "not a JSON line"),
        ('{"step": "1", "data": {}}\n', 1, 'not a metrics line ({"step": <int>, "data": {...}})'),
        ('{"step": 1.0, "data": {}}\n', 1, 'not a metrics line ({"step": <int>, "data": {...}})'),
        ('{"step": true, "data": {}}\n', 1, 'not a metrics line ({"step": <int>, "data": {...}})'),
        ('{"data": {}}\n', 1, 'not a metrics line ({"step": <int>, "data": {...}})'),
        ('{"step": 1}\n', 1, 'not a metrics line ({"step": <int>, "data": {...}})'),
        ('{"step": 1, "data": [1]}\n', 1, 'not a metrics line ({"step": <int>, "data": {...}})'),
        ("[1, 2]\n", 1, 'not a metrics line ({"step": <int>, "data": {...}})'),
        ("7\n", 1, 'not a metrics line ({"step": <int>, "data": {...}})'),
    ],
)
def test_a_malformed_line_is_named_by_file_and_line(content: str, line: int, problem: str, tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text(content)
    with pytest.raises(MetricsError) as raised:
        read_metrics(path)
    assert str(raised.value) == f"{path}:{line}: {problem}"


def test_nan_and_infinity_as_pythons_json_writes_them_are_kept(tmp_path: Path) -> None:
    """verl's file logger writes a NaN loss as `NaN`: it is the run's own verdict (a failed check), not a bad line."""
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1, "data": {"loss": NaN, "up": Infinity, "down": -Infinity}}\n')
    metrics = read_metrics(path)
    assert math.isnan(metrics[1]["loss"]) and metrics[1]["up"] == math.inf and metrics[1]["down"] == -math.inf


def test_a_line_nested_too_deep_is_named_by_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1, "data": {}}\n' + "[" * 100_000 + "\n")
    with pytest.raises(MetricsError) as raised:
        read_metrics(path)
    assert str(raised.value) == f"{path}:2: nested too deep to be read"


@pytest.mark.parametrize(
    ("step", "problem"),
    [(-1, "step=-1: must be between 0 and 1000000000"), (10**9 + 1, "step=1000000001: must be between 0 and 1000000000")],
)
def test_a_step_out_of_any_runs_range_is_named_by_file_and_line(step: int, problem: str, tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text(lines({"step": 0, "data": {"a": 1}}, {"step": 10**9, "data": {}}, {"step": step, "data": {}}))
    with pytest.raises(MetricsError) as raised:
        read_metrics(path)
    assert str(raised.value) == f"{path}:3: {problem}"


def test_step_0_and_the_last_possible_step_are_read(tmp_path: Path) -> None:
    """verl logs its validation before training as step 0: a step, judged by no check."""
    path = tmp_path / "m.jsonl"
    path.write_text(lines({"step": 0, "data": {"a": 1}}, {"step": 10**9, "data": {"b": 2}}))
    assert read_metrics(path) == {0: {"a": 1.0}, 10**9: {"b": 2.0}}


@pytest.mark.parametrize(
    ("make", "reason"), [(lambda p: None, "No such file or directory"), (Path.mkdir, "not a regular file")]
)
def test_an_unreadable_metrics_file_says_why(make: Callable[[Path], object], reason: str, tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    make(path)
    with pytest.raises(MetricsError) as raised:
        read_metrics(path)
    assert str(raised.value) == f"{path}: cannot read the metrics verl logs ({reason})"


# --- the block and the JSON -------------------------------------------------------------------------------------


def docs_hints() -> dict[str, str]:
    """docs/smoke.md's table "what a FAIL usually means": check name -> its cell."""
    rows = re.findall(r"^\| ([^|]+?) \| ([^|]+?) \|$", DOCS.read_text(encoding="utf-8"), re.MULTILINE)
    return {name: meaning for name, meaning in rows if name != "check" and not name.startswith("---")}


@pytest.mark.parametrize("name", ["steps", *METRIC_CHECKS, "images reached the rollout", *EXPORT_CHECKS])
def test_each_failed_check_prints_the_hint_the_docs_give(name: str) -> None:
    """The hint after the table starts as the docs' row for that check does (up to its first `:`, `;` or `,`)."""
    meaning = re.split(r"[:;,]", docs_hints()[name])[0]
    text = Verdict((Check(name, False, "m", "l"),)).to_text()
    assert text.splitlines()[2].startswith(f"  {name}: {meaning}")


def test_a_dead_run_fails_every_check_with_what_to_look_at(tmp_path: Path) -> None:
    """Nothing logged, nothing saved: every check fails, and each one's hint follows the table, in check order."""
    verdict = smoke_verdict(tmp_path / "metrics.jsonl", 2, tmp_path / "checkpoints", tmp_path / "model", smoke_prompts())
    assert [check["passed"] for check in json.loads(verdict.to_json())["checks"]] == [False, False]
    assert verdict.to_text() == "\n".join([
        "smoke verdict:",
        (f"  FAIL  steps      {tmp_path}/metrics.jsonl: cannot read the metrics verl logs "
         "(No such file or directory)  (limit: every step 1..2)"),
        f"  FAIL  HF export  no finished save with an HF export under {tmp_path}/checkpoints  (limit: one)",
        ("  steps: the trainer stopped early or logged nothing: look for the last `step:` line and the Ray worker "
         "errors after it (a failure before step 1 is usually the device stack: driver, container runtime, NCCL/HCCL)"),
        "  HF export: Megatron-Bridge's export: see the report beside the export (verify-export)",
        "smoke: FAIL",
    ])  # fmt: skip


def test_failed_metric_checks_print_their_hints_only_for_the_failures() -> None:
    checks = judge_metrics(metrics_with(lambda m: m[1].update({ADVANTAGE_MAX: 0.0, ADVANTAGE_MIN: 0.0, GRAD_NORM: 0.0,
                                                              PROBS_DIFF_MAX: 1.0})), 2)  # fmt: skip
    hints = Verdict(tuple(checks)).to_text().splitlines()[2 + len(METRIC_CHECKS) :]
    assert hints == [
        (
            "  rewards vary within a prompt's group: every sample of a prompt got the same reward, so GRPO has no "
            "signal: the reward function (reward.custom_reward_function) or identical samples from vLLM "
            "(a seed per prompt)"
        ),
        "  gradients: no gradient reached the actor: the optimizer, the loss or the Megatron engine",
        (
            "  rollout matches actor: vLLM samples with other weights than Megatron trains: the weight sync "
            "(update_weights), sleep/wake or a dtype mismatch"
        ),
        "smoke: FAIL",
    ]


def test_a_failed_mismatch_check_says_what_drifts_and_why_it_may_be_missing() -> None:
    checks = judge_metrics(metrics_with(lambda m: (m[1].update({MISMATCH_KL: 0.2}), m[2].pop(MISMATCH_ABS))), 2)
    assert Verdict(tuple(checks)).to_text().splitlines()[-3:] == [
        ("  mismatch as KL: vLLM's and Megatron's log-probabilities of the samples drift apart: the weight sync, a dtype "
         "mismatch, or an MoE routing tokens to other experts (docs/health.md); not logged: the rollout returned no "
         "log-probabilities (actor_rollout_ref.rollout.calculate_log_probs)"),
        ("  mismatch per token: the same drift, token by token, where gaps of opposite signs do not cancel; not logged: "
         "the recipe's worker hook (recipe.mismatch) did not run in verl's workers"),
        "smoke: FAIL",
    ]  # fmt: skip


def test_a_check_without_a_hint_adds_no_hint_line() -> None:
    verdict = Verdict((Check("steps", True, "1 of 1 logged", "every step 1..1"), Check("custom", False, "x", "y")))
    assert verdict.to_text().splitlines() == [
        "smoke verdict:",
        "  PASS  steps   1 of 1 logged  (limit: every step 1..1)",
        "  FAIL  custom  x  (limit: y)",
        "smoke: FAIL",
    ]


def test_a_passing_verdict_ends_with_smoke_pass() -> None:
    verdict = Verdict((Check("steps", True, "2 of 2 logged", "every step 1..2"), Check("gradients", True, "1.49", "> 0")))
    assert verdict.to_text().splitlines() == [
        "smoke verdict:",
        "  PASS  steps      2 of 2 logged  (limit: every step 1..2)",
        "  PASS  gradients  1.49  (limit: > 0)",
        "smoke: PASS",
    ]


def test_the_json_has_passed_and_every_check_as_written() -> None:
    verdict = Verdict((Check("steps", True, "2 of 2 logged", "every step 1..2"), Check("gradients", False, "0", "> 0")))
    assert (
        verdict.to_json()
        == """{
  "passed": false,
  "checks": [
    {
      "name": "steps",
      "passed": true,
      "measured": "2 of 2 logged",
      "limit": "every step 1..2"
    },
    {
      "name": "gradients",
      "passed": false,
      "measured": "0",
      "limit": "> 0"
    }
  ]
}"""
    )
    assert json.loads(Verdict(verdict.checks[:1]).to_json())["passed"] is True


# --- the export checks, on a tiny Llama written here --------------------------------------------------------------

#: A one-layer Llama with untied embeddings: 12 tensors, the names and shapes Llama's checkpoints carry.
CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 8, "hidden_size": 4,
    "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1, "num_key_value_heads": 1,
    "head_dim": 4, "tie_word_embeddings": False,
}  # fmt: skip
LAYER = "model.layers.0."
SHAPES: dict[str, tuple[int, ...]] = {
    "lm_head.weight": (8, 4), "model.embed_tokens.weight": (8, 4), "model.norm.weight": (4,),
    f"{LAYER}input_layernorm.weight": (4,), f"{LAYER}post_attention_layernorm.weight": (4,),
    **{f"{LAYER}self_attn.{p}_proj.weight": (4, 4) for p in "qkvo"},
    f"{LAYER}mlp.gate_proj.weight": (8, 4), f"{LAYER}mlp.up_proj.weight": (8, 4),
    f"{LAYER}mlp.down_proj.weight": (4, 8),
}  # fmt: skip
Tensors = dict[str, Any]


def weights() -> Tensors:
    """The initial weights: each tensor filled with its own value, exact in bf16 too."""
    torch = needs("torch", install=f"{TRAINER_EXTRA}: the export checks read tensors")
    return {name: torch.full(shape, 0.5 + i) for i, (name, shape) in enumerate(sorted(SHAPES.items()))}


def write_model(directory: Path, tensors: Tensors, config: bool = True) -> Path:
    """An HF checkpoint: config.json and one model.safetensors."""
    needs("transformers", install=f"{TRAINER_EXTRA}: the export check builds the model class on the meta device")
    from safetensors.torch import save_file

    directory.mkdir(parents=True)
    if config:
        (directory / "config.json").write_text(json.dumps(CONFIG))
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    return directory


class Run:
    """A finished save as verl leaves it: root/global_step_2/actor/{model/huggingface, ckpt_contents.json},
    the watcher's report beside the export, and the initial model it started from."""

    def __init__(self, tmp_path: Path, change: Callable[[Tensors], Any] = lambda t: None, report: str | None = None,
                 config: bool = True, initial: Tensors | None = None) -> None:  # fmt: skip
        self.root = tmp_path / "checkpoints"
        self.initial = write_model(tmp_path / "initial", weights() | (initial or {}))
        exported = weights()
        change(exported)
        actor = self.root / "global_step_2" / "actor"
        self.export = write_model(actor / "model" / "huggingface", exported, config)
        (actor / "ckpt_contents.json").write_text("{}")
        self.report = actor / "model" / "hf_export_report.json"
        if report is not None:
            self.report.write_bytes(with_evidence(report, actor.parent, self.export).encode("utf-8", "surrogateescape"))

    def checks(self) -> dict[str, Check]:
        checks = judge_export(self.root, self.initial)
        assert [check.name for check in checks] == EXPORT_CHECKS
        return by_name(checks)


def with_evidence(report: str, step_dir: Path, export: Path) -> str:
    """A report the watcher would write: a JSON object gets the evidence of the export it sits beside
    (recipe.export.evidence); anything else is written as it is."""
    from recipe.export.evidence import collect_evidence

    try:
        document = json.loads(report)
    except ValueError:
        return report
    if not isinstance(document, dict):
        return report
    evidence = collect_evidence(int(step_dir.name.removeprefix("global_step_")), step_dir, export)
    return json.dumps({**document, "evidence": evidence.model_dump()})


def trained(name: str) -> Callable[[Tensors], None]:
    def change(tensors: Tensors) -> None:
        tensors[name] = tensors[name] + 1

    return change


COMPLETE = '{"status": "complete"}'
NOT_THE_WATCHERS = "no report of the watcher's for this export at {path}"
WATCHER_LIMIT = "its report, with evidence that matches the export, says COMPLETE or LENIENT"


def test_no_finished_save_is_one_failed_check(tmp_path: Path) -> None:
    """A save verl has not finished (no ckpt_contents.json) is not judged: it may be half written."""
    run = Run(tmp_path, trained("lm_head.weight"), COMPLETE)
    (run.root / "global_step_2" / "actor" / "ckpt_contents.json").unlink()
    assert judge_export(run.root, run.initial) == [
        Check("HF export", False, f"no finished save with an HF export under {run.root}", "one")
    ]


@pytest.mark.parametrize(
    ("change", "config", "passed", "measured"),
    [
        (trained(f"{LAYER}mlp.up_proj.weight"), True, True, "COMPLETE"),
        # Multi-token-prediction layers are allowed by default: LENIENT, each with its reason.
        (lambda t: t.update({"mtp.norm.weight": t["model.norm.weight"].clone(),
                             "mtp.fc.weight": t["lm_head.weight"].clone()}),
         True, True, r"LENIENT (mtp.fc.weight (allowed: ^mtp\.); mtp.norm.weight (allowed: ^mtp\.))"),
        (lambda t: t.pop(f"{LAYER}mlp.up_proj.weight"), True, False,
         "BROKEN (11 of 12 tensors; verify-export {export})"),
        (lambda t: None, False, False,
         "cannot be checked: {export}: no config.json (the export must carry the HF config)"),
    ],
)  # fmt: skip
def test_the_hf_export_check_reports_the_export_checks_verdict(
    change: Callable[[Tensors], Any], config: bool, passed: bool, measured: str, tmp_path: Path
) -> None:
    run = Run(tmp_path, change, COMPLETE, config)
    check = run.checks()["HF export"]
    assert check == Check(
        "HF export", passed, measured.format(export=run.export), "COMPLETE, or LENIENT with its reason"
    )


def test_what_the_export_dropped_of_the_initial_model_is_judged_too(tmp_path: Path) -> None:
    """The initial model carries an MTP layer (Qwen3.5 does) that the export, trained without MTP, leaves out:
    the export check compares against the initial model, so LENIENT names it; alone the export looks COMPLETE."""
    torch = needs("torch", install=f"{TRAINER_EXTRA}: the export checks read tensors")
    run = Run(tmp_path, trained("lm_head.weight"), COMPLETE, initial={"mtp.norm.weight": torch.ones(4)})
    assert run.checks()["HF export"] == Check(
        "HF export", True, r"LENIENT (mtp.norm.weight (allowed: ^mtp\.))", "COMPLETE, or LENIENT with its reason"
    )


@pytest.mark.parametrize(
    ("change", "passed", "measured"),
    [
        (lambda t: None, False, "all 12 shared tensors equal the initial model's"),
        # The first differing tensor by name is named (several changed).
        (lambda t: [trained(name)(t) for name in ("model.norm.weight", f"{LAYER}mlp.down_proj.weight")], True,
         f"{LAYER}mlp.down_proj.weight differs"),
        # Megatron exports bf16: the same weights in another dtype are not training.
        (lambda t: t.update({name: value.bfloat16() for name, value in t.items()}), False,
         "all 12 shared tensors equal the initial model's"),
        # A tensor the initial model lacks (an extra MTP layer) is not compared, and not a difference.
        (lambda t: t.update({"mtp.norm.weight": t["model.norm.weight"] + 1}), False,
         "all 12 shared tensors equal the initial model's"),
        (lambda t: t.pop("lm_head.weight"), False, "all 11 shared tensors equal the initial model's"),
    ],
)  # fmt: skip
def test_the_export_was_trained_when_some_shared_tensor_differs(
    change: Callable[[Tensors], Any], passed: bool, measured: str, tmp_path: Path
) -> None:
    check = Run(tmp_path, change, COMPLETE).checks()["export was trained"]
    assert check == Check("export was trained", passed, measured, "some tensor differs from the initial model's")


VISUAL = "model.visual.blocks.0.attn.proj.bias"
VISUAL_LIMIT = "some visual tensor differs from the initial model's"


@pytest.mark.parametrize(
    ("in_export", "passed", "measured"),
    [
        (lambda t: t + 1, True, f"{VISUAL} differs"),
        (lambda t: t, False, "all 1 shared visual tensors equal the initial model's"),
        (None, False, "no visual tensor in both the export and the initial model"),
    ],
)  # fmt: skip
def test_the_vision_tower_was_trained_when_some_visual_tensor_differs(
    in_export: Callable[[Any], Any] | None, passed: bool, measured: str, tmp_path: Path
) -> None:
    """The initial model has a vision tower (Qwen3.5's model.visual.*): the export's must differ from it, and an export
    that lost its tower fails (only the vision tower is looked at: the language tensors were trained here)."""
    torch = needs("torch", install=f"{TRAINER_EXTRA}: the export checks read tensors")
    tower = torch.full((4,), 0.25)

    def change(tensors: Tensors) -> None:
        trained("lm_head.weight")(tensors)
        if in_export is not None:
            tensors[VISUAL] = in_export(tower.clone())

    check = Run(tmp_path, change, COMPLETE, initial={VISUAL: tower}).checks()["vision tower was trained"]
    assert check == Check("vision tower was trained", passed, measured, VISUAL_LIMIT)


def test_a_model_without_a_vision_tower_has_nothing_to_check_there(tmp_path: Path) -> None:
    check = Run(tmp_path, trained("lm_head.weight"), COMPLETE).checks()["vision tower was trained"]
    assert check == Check("vision tower was trained", True, "the initial model has no visual tensor: nothing to check",
                          VISUAL_LIMIT)  # fmt: skip


@pytest.mark.parametrize("broken", ["export", "initial"])
def test_an_unreadable_checkpoint_fails_the_trained_check_naming_the_file(broken: str, tmp_path: Path) -> None:
    run = Run(tmp_path, trained("lm_head.weight"), COMPLETE)
    (run.export if broken == "export" else run.initial).joinpath("model.safetensors").write_bytes(b"garbage")
    check = run.checks()["export was trained"]
    assert check == Check(
        "export was trained", False, "unreadable: model.safetensors: 7 bytes, shorter than a safetensors header length",
        "some tensor differs from the initial model's",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("report", "passed", "measured"),
    [
        (COMPLETE, True, "COMPLETE"),
        ('{"status": "lenient", "allowed": ["mtp.norm.weight"]}', True, "LENIENT"),
        ('{"status": "broken"}', False, "BROKEN"),
        # No status of the watcher's, not its JSON object, not JSON, not UTF-8, or absent: not the watcher's word on
        # this export, never a traceback.
        ("{}", False, NOT_THE_WATCHERS),
        ('{"status": "COMPLETE"}', False, NOT_THE_WATCHERS),
        ("[]", False, NOT_THE_WATCHERS),
        ('{"status": ', False, NOT_THE_WATCHERS),
        ('{"status": "\udcff"}', False, NOT_THE_WATCHERS),
        (None, False, NOT_THE_WATCHERS),
    ],
)
def test_the_watchers_report_beside_the_export_must_say_it_is_usable(
    report: str | None, passed: bool, measured: str, tmp_path: Path
) -> None:
    run = Run(tmp_path, trained("lm_head.weight"), report)  # a JSON object with the evidence the watcher writes
    check = run.checks()["export watcher"]
    assert check == Check("export watcher", passed, measured.format(path=run.report), WATCHER_LIMIT)


def test_a_report_without_its_evidence_or_for_another_export_is_not_the_watchers(tmp_path: Path) -> None:
    """Issue 50: a status alone (written by hand, or before the export changed) never passes the check."""
    run = Run(tmp_path, trained("lm_head.weight"), COMPLETE)
    assert run.checks()["export watcher"].passed  # the control: the watcher's report, with its evidence
    run.report.write_text(COMPLETE)  # the status alone
    assert run.checks()["export watcher"] == Check("export watcher", False, NOT_THE_WATCHERS.format(path=run.report),
                                                   WATCHER_LIMIT)  # fmt: skip
    run.report.write_text(with_evidence(COMPLETE, run.export.parents[2], run.export))
    (run.export / "extra.bin").write_bytes(b"0")  # the export changed after its check
    assert not run.checks()["export watcher"].passed


def test_an_export_of_the_initial_weights_fails_with_its_hint(tmp_path: Path) -> None:
    metrics = tmp_path / "m.jsonl"
    metrics.write_text(lines(*({"step": step, "data": data} for step, data in GOOD.items())))
    run = Run(tmp_path, report='{"status": "broken"}')
    text = smoke_verdict(metrics, 2, run.root, run.initial, smoke_prompts()).to_text().splitlines()
    assert text[-3:] == [
        (
            "  export was trained: the export holds the initial weights: the export read stale weights, or training "
            "never changed them"
        ),
        (
            "  export watcher: `run`'s watcher found the save broken or could not check it: its report is beside "
            "the export"
        ),
        "smoke: FAIL",
    ]


# --- the image check ------------------------------------------------------------------------------------------------

IMAGES = "images reached the rollout"


def prompt_lengths(tokens: list[int], image_tokens: list[int]) -> Any:
    """The data's prompts as recipe.data.prompt_lengths counts them: each prompt's length with its image tokens."""
    from recipe.data.prompt_lengths import PromptLengths, RowLength

    return PromptLengths.of(RowLength(t, i) for t, i in zip(tokens, image_tokens))


def images_limit(shown: str) -> str:
    return f"prompt_length/min and prompt_length/max are the data's prompt lengths with images ({shown}) at every step"


def prompt_steps(*ends: tuple[float, float]) -> dict[int, dict[str, float]]:
    """Step 1, 2, ...: the shortest and the longest prompt of that step's batch."""
    return {step: {PROMPT_MIN: low, PROMPT_MAX: high} for step, (low, high) in enumerate(ends, start=1)}


def test_the_smoke_datas_images_reaching_every_step_pass_saying_what_was_seen() -> None:
    assert judge_images(GOOD, 2, smoke_prompts()) == Check(
        IMAGES, True, "4 image tokens in every prompt (prompts of 76 tokens)", images_limit("76")
    )


@pytest.mark.parametrize(
    ("image_tokens", "said"),
    [
        ([4, 4, 4], "4 image tokens in every prompt"),
        ([4, 0, 4], "4 image tokens in 2 of 3 prompts"),
        ([0, 6, 4], "4 to 6 image tokens in 2 of 3 prompts"),
        ([0, 0, 9], "9 image tokens in 1 of 3 prompts"),
        ([9, 4, 6], "4 to 9 image tokens in every prompt"),
    ],
)
def test_data_where_only_some_prompts_carry_images_says_how_many(image_tokens: list[int], said: str) -> None:
    """Issue 52: a prompt without an image is not one with 0 image tokens, nor hidden by "every"."""
    check = judge_images(prompt_steps((100, 130), (100, 120)), 2, prompt_lengths([100, 120, 130], image_tokens))
    assert check == Check(IMAGES, True, f"{said} (prompts of 100, 120, 130 tokens)", images_limit("100, 120, 130"))


@pytest.mark.parametrize(
    ("tokens", "shown"),
    [([5], "5"), ([7, 5, 5], "5, 7"), ([9, 7, 5], "5, 7, 9"), ([11, 9, 7, 5], "5, 7, 9 ..."), ([5, 6, 7, 8, 9], "5, 6, 7 ...")],
)
def test_the_limit_names_the_three_shortest_lengths_and_dots_for_more(tokens: list[int], shown: str) -> None:
    check = judge_images(prompt_steps((5, 5)), 1, prompt_lengths(tokens, [4] * len(tokens)))
    assert check == Check(IMAGES, True, f"4 image tokens in every prompt (prompts of {shown} tokens)", images_limit(shown))


def test_steps_outside_the_run_are_not_judged_for_images() -> None:
    """Issue 52: verl's validation at step 0, a step past the plan's last, and (resumed after step 1) the step
    before this run's first carry no prompts of this run: wrong lengths there neither fail nor count."""
    wrong = {PROMPT_MIN: 1.0, PROMPT_MAX: 1.0}
    data = prompt_lengths([100, 120], [4, 0])
    passed = Check(IMAGES, True, "4 image tokens in 1 of 2 prompts (prompts of 100, 120 tokens)", images_limit("100, 120"))
    assert judge_images({0: wrong, **prompt_steps((100, 120), (120, 120)), 3: wrong}, 2, data) == passed
    assert judge_images({1: wrong, 2: {PROMPT_MIN: 100.0, PROMPT_MAX: 120.0}}, 2, data, first=2) == passed
    # The same steps inside the run fail.
    assert judge_images({1: wrong, 2: {PROMPT_MIN: 100.0, PROMPT_MAX: 120.0}}, 2, data) == Check(
        IMAGES, False, "step 1: 1 to 1 tokens", images_limit("100, 120")
    )
    assert judge_images({**prompt_steps((100, 120), (120, 120)), 3: wrong}, 3, data).measured == "step 3: 1 to 1 tokens"


@pytest.mark.parametrize(
    ("ends", "measured"),
    [
        # Either end alone off the data's lengths fails: a batch with one prompt whose image was dropped.
        ({PROMPT_MIN: 96.0, PROMPT_MAX: 120.0}, "step 2: 96 to 120 tokens"),
        ({PROMPT_MIN: 100.0, PROMPT_MAX: 124.0}, "step 2: 100 to 124 tokens"),
        ({PROMPT_MIN: 100.5, PROMPT_MAX: 120.0}, "step 2: 100.5 to 120 tokens"),
        # Either end not logged.
        ({PROMPT_MIN: 100.0}, "step 2: not logged"),
        ({PROMPT_MAX: 120.0}, "step 2: not logged"),
        ({}, "step 2: not logged"),
    ],
)
def test_a_step_whose_prompt_ends_are_not_the_datas_fails_naming_it(ends: dict[str, float], measured: str) -> None:
    metrics = {1: {PROMPT_MIN: 100.0, PROMPT_MAX: 120.0}, 2: ends}
    check = judge_images(metrics, 2, prompt_lengths([100, 120], [4, 4]))
    assert check == Check(IMAGES, False, measured, images_limit("100, 120"))


def test_every_failing_step_is_named_in_order() -> None:
    metrics = {1: {PROMPT_MIN: 96.0, PROMPT_MAX: 96.0}, 2: {PROMPT_MIN: 100.0, PROMPT_MAX: 100.0}, 3: {}}
    check = judge_images(metrics, 3, prompt_lengths([100], [4]))
    assert check == Check(IMAGES, False, "step 1: 96 to 96 tokens; step 3: not logged", images_limit("100"))


def test_text_only_data_passes_with_nothing_to_check_and_uncountable_data_fails_saying_why() -> None:
    wrong = prompt_steps((1, 1))
    assert judge_images(wrong, 1, prompt_lengths([120, 130], [0, 0])) == Check(
        IMAGES, True, "the training data have no images: nothing to check", "none"
    )
    assert judge_images(wrong, 1, "OSError: no processor") == Check(
        IMAGES, False, "the data's prompts cannot be counted: OSError: no processor", "every step's prompts have images"
    )


def test_the_verdict_judges_the_images_after_the_metrics(tmp_path: Path) -> None:
    metrics = tmp_path / "m.jsonl"
    metrics.write_text(lines(*({"step": step, "data": data} for step, data in GOOD.items())))
    checks = smoke_verdict(metrics, 2, tmp_path / "none", tmp_path / "model", "OSError: no processor").checks
    assert [check.name for check in checks] == ["steps", *METRIC_CHECKS, IMAGES, "HF export"]
    assert checks[1 + len(METRIC_CHECKS)] == judge_images(GOOD, 2, "OSError: no processor")


def test_a_resumed_verdict_judges_only_the_steps_it_trained(tmp_path: Path) -> None:
    """Resumed after step 1: a bad step 1 left in the file (metrics and images) is judged by no check."""
    bad = {ADVANTAGE_MAX: 0.0, ADVANTAGE_MIN: 0.0, GRAD_NORM: 0.0, PROBS_DIFF_MAX: 1.0, PROMPT_MIN: 1, PROMPT_MAX: 1,
           MISMATCH_KL: 1.0, MISMATCH_ABS: 1.0}
    metrics = tmp_path / "m.jsonl"
    metrics.write_text(lines({"step": 1, "data": bad}, {"step": 2, "data": GOOD[2]}))
    checks = smoke_verdict(metrics, 2, tmp_path / "none", tmp_path / "model", smoke_prompts(), first=2).checks
    assert checks[0] == Check("steps", True, "1 of 1 logged (resumed after step 1)", "every step 2..2")
    assert [check.passed for check in checks] == [True, *[True] * len(METRIC_CHECKS), True, False]  # no save: HF export


def test_a_verdict_without_metrics_names_the_steps_it_expected(tmp_path: Path) -> None:
    verdict = smoke_verdict(tmp_path / "m.jsonl", 3, tmp_path / "none", tmp_path / "model", smoke_prompts(), first=2)
    assert verdict.checks[0].limit == "every step 2..3"


def test_the_verdict_judges_every_planned_step(tmp_path: Path) -> None:
    metrics = tmp_path / "m.jsonl"
    metrics.write_text(lines(*({"step": step, "data": data} for step, data in GOOD.items())))
    checks = smoke_verdict(metrics, 3, tmp_path / "none", tmp_path / "model", smoke_prompts()).checks
    assert list(checks[: 1 + len(METRIC_CHECKS)]) == judge_metrics(GOOD, 3)
    assert checks[0] == Check("steps", False, "2 of 3 logged", "every step 1..3")


# --- counting the training data's prompts ----------------------------------------------------------------------------


class _Counter:
    """A stand-in for the processor's count (tests/e2e count with the real one): a row's prompt length is its text's
    length, and a row with images has 4 image tokens. It records the model it was made for."""

    models: list[Path] = []

    def __init__(self, model: Path) -> None:
        _Counter.models.append(model)

    def count(self, row: dict[str, Any]) -> Any:
        from recipe.data.prompt_lengths import RowLength

        if row["prompt"] == "boom":
            raise ValueError("the processor refused a row\nsecond line")
        return RowLength(len(row["prompt"]), 4 if row.get("images") else 0)


@pytest.fixture
def counter(monkeypatch: pytest.MonkeyPatch) -> type[_Counter]:
    from recipe.data import prompt_lengths

    monkeypatch.setattr(prompt_lengths, "PromptCounter", _Counter)
    monkeypatch.setattr(_Counter, "models", [])
    return _Counter


def write_prompts(path: Path, prompts: list[str], images: list[list[str]]) -> Path:
    pyarrow = needs("pyarrow", install=f"{TRAINER_EXTRA}: the training data are parquet")
    import pyarrow.parquet as pq

    pq.write_table(pyarrow.table({"prompt": prompts, "images": images}), path)
    return path


def test_the_training_prompts_are_counted_with_the_models_processor(counter: type[_Counter], tmp_path: Path) -> None:
    from recipe.smoke.verdict import count_training_prompts

    train = write_prompts(tmp_path / "train.parquet", ["abc", "abcdef"], [["img"], []])
    lengths = count_training_prompts(train, tmp_path / "model")
    assert (lengths.tokens, lengths.image_tokens) == ((3, 6), (4, 0))
    assert counter.models == [tmp_path / "model"]


def test_data_that_cannot_be_counted_is_one_line_saying_why(counter: type[_Counter], tmp_path: Path) -> None:
    from recipe.smoke.verdict import count_training_prompts

    train = write_prompts(tmp_path / "train.parquet", ["abc", "boom"], [[], []])
    assert count_training_prompts(train, tmp_path / "model") == "ValueError: the processor refused a row"
    assert count_training_prompts(tmp_path / "none.parquet", tmp_path / "model").startswith("FileNotFoundError: ")
