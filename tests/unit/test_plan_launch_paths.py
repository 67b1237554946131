"""What `plan` takes from the launch paths and says before anything starts (issue 38).

OVERRIDES: the user's overrides as one setting, read exactly as those after `--` (Hydra's parser, the same
refusals, the same record). CANN_CHIP: the npu chip planned for where no image label says it, and the
hint when the other chip's defaults would fit. The resume line: where the trainer starts, by verl's rule.
Settings are built in-process; the CLI runs where its exit code and stderr are the behaviour.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings as hypothesis_settings, strategies as st

from recipe.checkpoint_tracker import TRACKER_NAME
from recipe.errors import RecipeConfigError
from recipe.plan import build_plan
from recipe.record_file import record_bytes, write_record
from recipe.settings import Settings
from recipe.user_overrides import hydra_override_parser, user_overrides

from .envtools import ENTRYPOINT, HANG_GUARD_S, entrypoint_env, settings_of
from .test_plan_orchestration import model, smoke  # noqa: F401  (fixture)

LR = "actor_rollout_ref.actor.optim.lr"


# --- OVERRIDES ----------------------------------------------------------------------------


@given(st.lists(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30), max_size=6))
def test_overrides_split_back_into_the_words_a_shell_would_pass(words: list[str]) -> None:
    """Whatever the words, written as a shell quotes them they come back one for one (nothing split or joined)."""
    assert Settings.model_validate({"overrides": shlex.join(words) or None}).override_list == words


#: Override texts Hydra's own grammar accepts: keys, values of several kinds, with spaces and quotes inside.
_KEYS = st.sampled_from(["trainer.val_before_train", LR, "+trainer.note", "data.max_prompt_length", "~trainer.xyz"])
_VALUES = st.one_of(
    st.integers(-10**6, 10**6).map(str), st.sampled_from(["true", "null", "2e-6", "'a b'", '"x=y"', "[1,2]", "{a: 1}"])
)


@given(st.lists(st.tuples(_KEYS, _VALUES), max_size=4))
@hypothesis_settings(max_examples=60)
def test_overrides_reach_hydra_as_the_same_texts_as_after_the_separator(pairs: list[tuple[str, str]]) -> None:
    """Hydra parses each OVERRIDES word exactly as it parses the same text given after `--`."""
    parser = hydra_override_parser()
    assert parser is not None, "Hydra comes with the trainer extra"
    texts = [key if key.startswith("~") else f"{key}={value}" for key, value in pairs]
    from_setting = Settings.model_validate({"overrides": shlex.join(texts) or None}).override_list
    assert [str(parser.parse_override(t)) for t in from_setting] == [str(parser.parse_override(t)) for t in texts]


def test_the_separator_wins_for_a_key_in_both_and_hydra_never_sees_it_twice() -> None:
    setting = ["+trainer.note=a", f"{LR}=1e-6", "~trainer.other", "trainer.total_training_steps=5"]
    after = [f"{LR}=3e-6", "trainer.note=b", "trainer.other=1"]
    assert user_overrides(setting, after) == ["trainer.total_training_steps=5", *after]
    assert user_overrides(setting, []) == setting and user_overrides([], after) == after


def test_a_plan_with_overrides_equals_the_plan_with_them_after_the_separator(tmp_path: Path) -> None:
    words = [f"{LR}=3e-6", "+trainer.note='a b'"]
    by_setting = build_plan(smoke(tmp_path, OVERRIDES=shlex.join(words)), {})
    by_separator = build_plan(smoke(tmp_path), {}, words)
    assert by_setting.argv == by_separator.argv and f"{LR}=3e-6" in by_setting.argv
    # Recorded as overrides after `--` are, and OVERRIDES itself is no setting of the record (no drift when moved).
    assert by_setting.provenance == by_separator.provenance
    assert "OVERRIDES" not in by_setting.provenance["settings"]
    assert by_setting.provenance["extra_overrides"] == words


def test_overrides_are_refused_exactly_as_after_the_separator(tmp_path: Path) -> None:
    """A key a setting decides, a literal secret: the same lines, whichever place held them."""
    for bad in (["trainer.total_epochs=3"], ["+trainer.wandb_api_key=abc123"]):
        with pytest.raises(RecipeConfigError) as by_setting:
            build_plan(smoke(tmp_path, OVERRIDES=shlex.join(bad)), {})
        with pytest.raises(RecipeConfigError) as by_separator:
            build_plan(smoke(tmp_path), {}, bad)
        assert by_setting.value.problems == by_separator.value.problems != []
        assert "abc123" not in " ".join(by_setting.value.problems)


@pytest.mark.parametrize("value", ["a='1", 'a="1', "a=1 \\"])
def test_overrides_a_shell_cannot_split_exit_2_naming_the_setting(value: str, tmp_path: Path) -> None:
    done = subprocess.run([*ENTRYPOINT, "plan"], env=entrypoint_env(OVERRIDES=value), cwd=tmp_path,
                          capture_output=True, text=True, timeout=HANG_GUARD_S, check=False)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"error: OVERRIDES={value!r}: must be overrides separated by spaces, quoted as in a shell (")


# --- CANN_CHIP ----------------------------------------------------------------------------


def _labels(tmp_path: Path, chip: str) -> dict[str, str]:
    (tmp_path / "labels.d").mkdir(exist_ok=True)
    (tmp_path / "labels.d" / "image.labels").write_text(f"io.grpo-recipe.cann.chip={chip}\n")
    return {"RECIPE_IMAGE_INFO_DIR": str(tmp_path)}


def test_an_a2_layout_is_planned_on_a_laptop_with_cann_chip(tmp_path: Path, model: Path) -> None:  # noqa: F811
    settings = settings_of(DEVICE="npu", CANN_CHIP="910b", MODEL_PATH=str(model), CHECKPOINT_DIR=str(tmp_path / "ck"),
                           TP=1, GEN_TP=1, EP=1)  # fmt: skip
    plan = build_plan(settings, {"RECIPE_IMAGE_INFO_DIR": str(tmp_path / "no-image")})
    assert plan.chip == {"name": "910b", "reason": "CANN_CHIP=910b, not in an image"}
    assert (plan.layout.ndevices_per_node, plan.layout.pp) == (8, 1)
    assert plan.layout.sources["PP"] == "default for npu (910b)"


def test_in_an_image_its_label_wins_and_the_other_chip_is_refused(tmp_path: Path, model: Path) -> None:  # noqa: F811
    environ = _labels(tmp_path, "a3")
    base = dict(DEVICE="npu", MODEL_PATH=str(model), CHECKPOINT_DIR=str(tmp_path / "ck"), TP=1, GEN_TP=1, EP=1)
    assert build_plan(settings_of(**base, CANN_CHIP="a3"), environ).chip["name"] == "a3"  # type: ignore[index]
    with pytest.raises(RecipeConfigError) as caught:
        build_plan(settings_of(**base, CANN_CHIP="910b"), environ)
    assert caught.value.problems == [
        "CANN_CHIP=910b: this image is built for a3 (Atlas A3, 910C; its label io.grpo-recipe.cann.chip), and its "
        "vllm-ascend would refuse 910b NPUs; unset CANN_CHIP, or rebuild the image with CANN_CHIP=910b "
        "(docker compose build npu)"
    ]


def test_a_layout_the_other_chips_defaults_fit_says_so(tmp_path: Path) -> None:
    """`DEVICE=npu NDEVICES_PER_NODE=8 plan`: a3's PP=2 breaks it, and the refusal names 910b and PP=1."""
    done = subprocess.run([*ENTRYPOINT, "plan"], env=entrypoint_env(DEVICE="npu", NDEVICES_PER_NODE="8"), cwd=tmp_path,
                          capture_output=True, text=True, timeout=HANG_GUARD_S, check=False)
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == (
        "error: CANN_CHIP: planned for a3 (Atlas A3, 910C); on 910b (Atlas A2, 910B) the defaults (PP=1) fit this "
        "layout: set CANN_CHIP=910b if the node is one, else set PP=1"
    )
    # Set PP by hand and the other chip's defaults change nothing: no hint (and here, no error).
    fixed = subprocess.run([*ENTRYPOINT, "plan"], env=entrypoint_env(DEVICE="npu", NDEVICES_PER_NODE="8", PP="1"),
                           cwd=tmp_path, capture_output=True, text=True, timeout=HANG_GUARD_S, check=False)
    assert fixed.returncode == 0, fixed.stderr


# --- the resume `plan` states -------------------------------------------------------------


def _full(tmp_path: Path, model_dir: Path, **values: object) -> Settings:
    return settings_of(MODEL_PATH=str(model_dir), CHECKPOINT_DIR=str(tmp_path / "ck"), DEVICE="gpu", TP=1, GEN_TP=1,
                       EP=1, NDEVICES_PER_NODE=1, **values)  # fmt: skip


def _root(tmp_path: Path) -> Path:
    return tmp_path / "ck" / "grpo_qwen3_5_35b_geo3k" / "qwen3_5_35b_megatron"


def _save(tmp_path: Path, step: int) -> Path:
    """A save verl finished: its HF export folder, its manifest (written last), the tracker naming it."""
    step_dir = _root(tmp_path) / f"global_step_{step}"
    (step_dir / "actor" / "model" / "huggingface").mkdir(parents=True)
    (step_dir / "actor" / "ckpt_contents.json").write_text("{}")
    (_root(tmp_path) / TRACKER_NAME).write_text(str(step))
    return step_dir


def test_plan_says_it_starts_fresh_without_a_save(tmp_path: Path, model: Path) -> None:  # noqa: F811
    plan = build_plan(_full(tmp_path, model), {})
    assert plan.resume["action"] == "fresh" and plan.resume["step"] is None
    assert f"resume   starts fresh: nothing saved under {_root(tmp_path)} yet" in plan.to_text().splitlines()
    assert json.loads(plan.to_json())["resume"] == plan.resume


def test_plan_says_which_step_it_resumes_from_of_how_many(tmp_path: Path, model: Path) -> None:  # noqa: F811
    step_dir = _save(tmp_path, 20)
    plan = build_plan(_full(tmp_path, model), {}, ["trainer.total_training_steps=300"])
    assert {k: plan.resume[k] for k in ("action", "step", "path", "planned_steps", "finished")} == {
        "action": "resume", "step": 20, "path": str(step_dir), "planned_steps": 300, "finished": False}  # fmt: skip
    line = next(line for line in plan.to_text().splitlines() if line.startswith("resume   "))
    assert line.startswith("resume   resumes from global_step_20 (of 300 planned): the newest save under ")
    assert line.endswith("drift not checked: the checkpoint has no run record (written before run records)")


def test_plan_with_a_matching_record_says_no_drift_and_a_finished_run_says_so(tmp_path: Path, model: Path) -> None:  # noqa: F811
    first = build_plan(_full(tmp_path, model, OVERRIDES="trainer.total_training_steps=20"), {})
    _save(tmp_path, 20)
    write_record(_root(tmp_path), record_bytes(first.provenance))
    plan = build_plan(_full(tmp_path, model, OVERRIDES="trainer.total_training_steps=20"), {})
    assert plan.resume["drift"] == "none: the settings and inputs match the run's record"
    assert plan.resume["finished"] is True and "the run already finished" in plan.resume["text"]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["trainer.resume_mode=disable"], "starts fresh: trainer.resume_mode=disable"),
        (["trainer.resume_mode=resume_path", "trainer.resume_from_path=/elsewhere/global_step_7"],
         "resumes from global_step_7: trainer.resume_from_path=/elsewhere/global_step_7"),
    ],
)
def test_plan_follows_the_resume_mode_the_user_chose(tmp_path: Path, model: Path, overrides: list[str],  # noqa: F811
                                                     expected: str) -> None:
    _save(tmp_path, 20)
    assert build_plan(_full(tmp_path, model), {}, overrides).resume["text"] == expected


def test_a_tracker_naming_a_missing_step_is_said_and_an_unreadable_one_refused(tmp_path: Path, model: Path) -> None:  # noqa: F811
    _root(tmp_path).mkdir(parents=True)
    (_root(tmp_path) / TRACKER_NAME).write_text("9")
    plan = build_plan(_full(tmp_path, model), {})
    assert plan.resume["action"] == "fresh" and "names a step that is not saved, and nothing is" in plan.resume["text"]
    (_root(tmp_path) / TRACKER_NAME).write_text("nine")
    with pytest.raises(RecipeConfigError, match="cannot tell which checkpoint verl would resume from: .* holds 'nine'"):
        build_plan(_full(tmp_path, model), {})


def test_without_a_configured_total_plan_counts_the_training_files_rows(tmp_path: Path, model: Path) -> None:  # noqa: F811
    """rows // TRAIN_BATCH_SIZE * TOTAL_EPOCHS of the file the trainer reads, said to be an estimate ("about")."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    _save(tmp_path, 2)
    train_file = tmp_path / "train.parquet"
    pq.write_table(pa.table({"prompt": [str(i) for i in range(9)]}), train_file)
    for epochs, planned in ((1, 2), (3, 6)):
        plan = build_plan(_full(tmp_path, model, TRAIN_FILES=str(train_file), TRAIN_BATCH_SIZE=4, TOTAL_EPOCHS=epochs), {})
        assert plan.resume["planned_steps"] == planned
        assert f"(of about {planned} planned)" in plan.to_text()
