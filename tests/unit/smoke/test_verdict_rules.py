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
    PROBS_DIFF_MAX,
    PROMPT_MAX,
    PROMPT_MIN,
    Check,
    MetricsError,
    Verdict,
    judge_export,
    judge_metrics,
    read_metrics,
    smoke_verdict,
)
from tests.support.needs import TRAINER_EXTRA, needs

DOCS = Path(__file__).resolve().parents[3] / "docs" / "smoke.md"
METRIC_CHECKS = ["rewards vary within a prompt's group", "gradients", "rollout matches actor"]
EXPORT_CHECKS = ["HF export", "export was trained", "vision tower was trained", "export watcher"]
NOT_LOGGED = "not logged (or not a finite number) at step"
#: Each metric check's limit as docs/smoke.md's example block prints it.
LIMITS = {
    "rewards vary within a prompt's group": "critic/advantages/max - critic/advantages/min > 0 at every step",
    "gradients": "actor/grad_norm > 0 at every step",
    "rollout matches actor": "training/rollout_probs_diff_max < 0.01 at every step",
}

#: Two steps of a healthy run: the docs' example values at step 1 (its worst), better ones at step 2.
GOOD: dict[int, dict[str, float]] = {
    1: {ADVANTAGE_MAX: 1.5, ADVANTAGE_MIN: -0.99, GRAD_NORM: 1.49, PROBS_DIFF_MAX: 0.00092, PROMPT_MIN: 76, PROMPT_MAX: 76},
    2: {ADVANTAGE_MAX: 2.0, ADVANTAGE_MIN: -1.0, GRAD_NORM: 2.0, PROBS_DIFF_MAX: 0.0005, PROMPT_MIN: 76, PROMPT_MAX: 76},
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
          for name, worst in zip(METRIC_CHECKS, ["2.49", "1.49", "0.00092"])],
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
    assert [c.passed for c in checks[1:]] == [True, True, True]
    # Step 2's own values, now the only ones.
    assert [c.measured for c in checks[1:]] == [f"{v:.3g} at its worst step" for v in (3.0, 2.0, 0.0005)]


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
        step: {ADVANTAGE_MAX: spread, ADVANTAGE_MIN: 0.0, GRAD_NORM: norm, PROBS_DIFF_MAX: diff}
        for step, (spread, norm, diff) in enumerate(steps, start=1)
    }
    checks = judge_metrics(metrics, len(steps))
    assert all(check.passed for check in checks), checks
    spreads, norms, diffs = zip(*steps)
    assert [c.measured for c in checks[1:]] == [
        f"{v:.3g} at its worst step" for v in (min(spreads), min(norms), max(diffs))
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
    hints = Verdict(tuple(checks)).to_text().splitlines()[5:]
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


def test_a_check_without_a_hint_adds_no_hint_line() -> None:
    verdict = Verdict((Check("steps", True, "1 of 1 logged", "every step 1..1"), Check("custom", False, "x", "y")))
    assert verdict.to_text().splitlines() == [
        "smoke verdict:",
        "  PASS  steps   1 of 1 logged  (limit: every step 1..1)",
        "  FAIL  custom  x  (limit: y)",
        "smoke: FAIL",
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
