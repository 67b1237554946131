"""The drift guard by direct calls (recipe.provenance.drift and drift_problems): which fields drift, how each is
named, and the exact line `plan` and `run` print for it.

docs/reproducibility.md: drift in the data files, the model's files, the recipe or framework versions, the
image's locks, the layout or a training setting is refused, exit 2, one line per field, e.g.

    error: TRAIN_FILES: 3f1c0a9e2b7d when the checkpoint's run started (.../run-record.json), 9a0e44c1d2f3 now;
    resuming would mix two runs: restore it, start afresh with `trainer.resume_mode=disable` (in OVERRIDES, or
    after `--` of plan and run) or another CHECKPOINT_DIR, or accept it with ALLOW_DRIFT=TRAIN_FILES

and ALLOW_DRIFT accepts the fields it names (RECIPE, FRAMEWORKS, IMAGE, a setting such as TP, a Hydra key), which
the plan lists. Records here are hand-written dicts (a stored one may be hostile: every value is cut to one
printable line); test_provenance.py checks the same guard through `plan` on real files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from recipe.provenance import DRIFT_FIELDS, drift, drift_problems, shown_name

A, B = "a" * 64, "b" * 64  # two sha256 digests: a line shows their first 12 characters
SOURCE = Path("/ck/run-record.json")


def _refusal(field: str, then: str, now: str, path: Path | None = SOURCE) -> str:
    """docs/reproducibility.md's line, written out."""
    return (
        f"{field}: {then} when the checkpoint's run started ({path}), {now} now; resuming would mix two runs: "
        f"restore it, start afresh with `trainer.resume_mode=disable` (in OVERRIDES, or after `--` of plan and run) "
        "or another CHECKPOINT_DIR, "
        f"or accept it with ALLOW_DRIFT={field}"
    )


def test_the_readmes_example_line_is_printed_as_written() -> None:
    stored = {"data": {"TRAIN_FILES": {"sha256": "3f1c0a9e2b7d" + "0" * 52}}}
    now = {"data": {"TRAIN_FILES": {"sha256": "9a0e44c1d2f3" + "1" * 52}}}
    refused, accepted = drift_problems(stored, now, [], Path(".../run-record.json"))
    assert refused == [
        (
            "TRAIN_FILES: 3f1c0a9e2b7d when the checkpoint's run started (.../run-record.json), 9a0e44c1d2f3 now; "
            "resuming would mix two runs: restore it, start afresh with `trainer.resume_mode=disable` (in OVERRIDES, "
            "or after `--` of plan and run) or another CHECKPOINT_DIR, or accept it with ALLOW_DRIFT=TRAIN_FILES"
        )
    ]
    assert accepted == []


def test_the_extra_fields_allow_drift_names_are_recipe_frameworks_and_image() -> None:
    assert DRIFT_FIELDS == ("RECIPE", "FRAMEWORKS", "IMAGE")


# --- each kind of field: (stored, now) -> the exact (then, now) pair ------------------------------

CASES: list[tuple[str, dict[str, Any], dict[str, Any], dict[str, tuple[str, str]]]] = [
    ("recipe", {"recipe_version": "0.1.0"}, {"recipe_version": "0.2.0"}, {"RECIPE": ("0.1.0", "0.2.0")}),
    ("recipe from nothing", {}, {"recipe_version": "0.2.0"}, {"RECIPE": ("(absent)", "0.2.0")}),
    ("one framework", {"frameworks": {"verl": "0.9.1", "ray": "2.60.0"}},
     {"frameworks": {"verl": "0.9.2", "ray": "2.60.0"}}, {"FRAMEWORKS": ("verl 0.9.1", "verl 0.9.2")}),
    ("frameworks installed and removed, sorted by name",
     {"frameworks": {"vllm": "0.11.0", "torch": None}}, {"frameworks": {"vllm": None, "torch": "2.9.0"}},
     {"FRAMEWORKS": ("torch None, vllm 0.11.0", "torch 2.9.0, vllm None")}),
    ("frameworks from nothing", {}, {"frameworks": {"verl": "0.9.1"}}, {"FRAMEWORKS": ("verl None", "verl 0.9.1")}),
    ("one image lock", {"image": {"locks": {"gpu.lock": A}}}, {"image": {"locks": {"gpu.lock": B}}},
     {"IMAGE": (f'["{A}"]', f'["{B}"]')}),
    ("image locks, sorted and cut to 80 characters", {"image": {"locks": {"gpu.lock": A, "npu.lock": A}}},
     {"image": {"locks": {"gpu.lock": B, "npu.lock": A}}},
     {"IMAGE": (f'["{A}", "{A[:7]}...', f'["{A}", "{B[:7]}...')}),
    ("image locks from none", {"image": {"labels": None, "locks": {}}}, {"image": {"locks": {"x.lock": "12"}}},
     {"IMAGE": ("[]", '["12"]')}),
    ("image without locks", {"image": {"labels": None}}, {"image": {"locks": {"x.lock": "12"}}},
     {"IMAGE": ("[]", '["12"]')}),
    ("a model file", {"model": {"files": {"config.json": A, "tokenizer.json": A}}},
     {"model": {"files": {"config.json": B, "tokenizer.json": A}}},
     {"MODEL_PATH": (f"config.json {A[:12]}", f"config.json {B[:12]}")}),
    ("model files added and removed, sorted by name", {"model": {"files": {"vocab.json": A}}},
     {"model": {"files": {"chat_template.jinja": B}}},
     {"MODEL_PATH": (f"chat_template.jinja (absent), vocab.json {A[:12]}", f"chat_template.jinja {B[:12]}, vocab.json (absent)")}),
    ("model files from nothing", {"model": {"path": "/m"}}, {"model": {"files": {"config.json": A}}},
     {"MODEL_PATH": ("config.json (absent)", f"config.json {A[:12]}")}),
    ("train data", {"data": {"TRAIN_FILES": {"sha256": A}}}, {"data": {"TRAIN_FILES": {"sha256": B}}},
     {"TRAIN_FILES": (A[:12], B[:12])}),
    ("val data", {"data": {"VAL_FILES": {"sha256": A}}}, {"data": {"VAL_FILES": {"sha256": B}}},
     {"VAL_FILES": (A[:12], B[:12])}),
    ("val data gone", {"data": {"VAL_FILES": {"sha256": A}}}, {"data": {"VAL_FILES": None}},
     {"VAL_FILES": (A[:12], "(absent)")}),
    ("data from nothing", {}, {"data": {"TRAIN_FILES": {"sha256": A}}}, {"TRAIN_FILES": ("(absent)", A[:12])}),
    ("layout, named as the setting", {"layout": {"tp": 2, "pp": 1}}, {"layout": {"tp": 4, "pp": 1}}, {"TP": ("2", "4")}),
    ("layout from nothing", {}, {"layout": {"gen_tp": 2}}, {"GEN_TP": ("(absent)", "2")}),
    ("layout lost", {"layout": {"ep": 8}}, {}, {"EP": ("8", "(absent)")}),
    # WORLD_SIZE and DP follow from the settings: said beside the setting that moved them, never a field of their own
    # (ALLOW_DRIFT=DP was the advice, and DP is no variable a user sets).
    ("more nodes: the derived sizes ride on NNODES",
     {"layout": {"nnodes": 1, "world_size": 8, "dp": 2, "tp": 4}}, {"layout": {"nnodes": 2, "world_size": 16, "dp": 4, "tp": 4}},
     {"NNODES": ("1", "2 (so DP 2 then, 4 now, WORLD_SIZE 8 then, 16 now)")}),
    ("derived sizes moved alone (a record whose arithmetic is off): said as they are",
     {"layout": {"world_size": 8, "dp": 2}}, {"layout": {"world_size": 8, "dp": 4}}, {"DP": ("2", "4")}),
    ("an oc.env read", {"environment_reads": {"MY_LR": "1e-6"}}, {"environment_reads": {"MY_LR": "2e-6"}},
     {"MY_LR": ("1e-6", "2e-6")}),
    ("an oc.env read newly set", {"environment_reads": {}}, {"environment_reads": {"MY_LR": "2e-6"}},
     {"MY_LR": ("(unset)", "2e-6")}),
    ("an oc.env read from nothing", {}, {"environment_reads": {"MY_LR": "2e-6"}}, {"MY_LR": ("(unset)", "2e-6")}),
    ("an oc.env read now unset", {"environment_reads": {"MY_LR": "1"}}, {}, {"MY_LR": ("1", "(unset)")}),
    # A variable the config reads, unset at plan time (null), against a record whose config did not read it.
    ("an oc.env read newly made, of an unset variable", {"environment_reads": {}},
     {"environment_reads": {"MY_LR": None}}, {"MY_LR": ("(unset)", "(absent)")}),
    ("an oc.env read of an unset variable dropped", {"environment_reads": {"MY_LR": None}}, {},
     {"MY_LR": ("(absent)", "(unset)")}),
    ("a referenced file", {"referenced_files": {"r.path": {"path": "r.py", "sha256": A}}},
     {"referenced_files": {"r.path": {"path": "r.py", "sha256": B}}}, {"r.path": (A[:12], B[:12])}),
    ("a referenced file now named", {}, {"referenced_files": {"r.path": {"path": "r.py", "sha256": B}}},
     {"r.path": ("(absent)", B[:12])}),
    ("a referenced file gone", {"referenced_files": {"r.path": {"path": "r.py", "sha256": A}}},
     {"referenced_files": {"r.path": None}}, {"r.path": (A[:12], "(absent)")}),
    ("a training key, named by its setting", {"training": {"data.seed": "1"}, "setting_keys": {"data.seed": "SEED"}},
     {"training": {"data.seed": "2"}, "setting_keys": {"data.seed": "SEED"}}, {"SEED": ("1", "2")}),
    ("a setting only now decides the key", {"training": {"data.seed": "1"}},
     {"training": {"data.seed": "2"}, "setting_keys": {"data.seed": "SEED"}}, {"SEED": ("1", "2")}),
    ("a setting then decided the key", {"training": {"data.seed": "1"}, "setting_keys": {"data.seed": "SEED"}},
     {"training": {"data.seed": "2"}}, {"SEED": ("1", "2")}),
    ("the setting naming the key now wins", {"training": {"k": "1"}, "setting_keys": {"k": "OLD"}},
     {"training": {"k": "2"}, "setting_keys": {"k": "NEW"}}, {"NEW": ("1", "2")}),
    ("a Hydra key given after --", {"training": {"actor_rollout_ref.actor.clip_ratio": "0.2"}},
     {"training": {"actor_rollout_ref.actor.clip_ratio": "0.3"}}, {"actor_rollout_ref.actor.clip_ratio": ("0.2", "0.3")}),
    ("a Hydra key added", {}, {"training": {"k": "1"}}, {"k": ("(unset)", "1")}),
    ("a Hydra key dropped", {"training": {"k": "1"}}, {"training": {}}, {"k": ("1", "(unset)")}),
]  # fmt: skip


@pytest.mark.parametrize(("stored", "now", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_drifted_field_is_named_with_then_and_now(
    stored: dict[str, Any], now: dict[str, Any], expected: dict[str, tuple[str, str]]
) -> None:
    assert drift(stored, now) == expected


@pytest.mark.parametrize(("stored", "now"), [c[1:3] for c in CASES], ids=[c[0] for c in CASES])
def test_a_record_never_drifts_from_itself(stored: dict[str, Any], now: dict[str, Any]) -> None:
    assert drift(stored, stored) == {} and drift(now, now) == {}


def test_nothing_stored_and_nothing_now_is_no_drift() -> None:
    assert drift({}, {}) == {}


def test_an_unchanged_record_with_every_field_is_no_drift() -> None:
    record = {
        "recipe_version": "0.1", "frameworks": {"verl": "0.9.1"}, "image": {"locks": {"gpu.lock": A}},
        "model": {"path": "/m", "files": {"config.json": A}},
        "data": {"TRAIN_FILES": {"path": "/a", "sha256": A}, "VAL_FILES": {"path": "/b", "sha256": B}},
        "layout": {"tp": 2}, "environment_reads": {"X": "1"}, "referenced_files": {"r.path": {"path": "r", "sha256": A}},
        "training": {"data.seed": "42"}, "setting_keys": {"data.seed": "SEED"},
    }  # fmt: skip
    # Moved files with the same content: the paths differ, the digests do not.
    moved = json.loads(json.dumps(record))
    moved["model"]["path"], moved["data"]["TRAIN_FILES"]["path"] = "/elsewhere/m", "/elsewhere/a"
    moved["referenced_files"]["r.path"]["path"] = "/elsewhere/r"
    assert drift(record, moved) == {}


def test_a_setting_that_drifted_in_the_layout_is_said_once() -> None:
    """TP drifts in the layout and in the key it decides: one line, the layout's numbers."""
    stored = {"layout": {"tp": 2}, "training": {"tp.key": "2"}, "setting_keys": {"tp.key": "TP"}}
    now = {"layout": {"tp": 4}, "training": {"tp.key": "4"}, "setting_keys": {"tp.key": "TP"}}
    assert drift(stored, now) == {"TP": ("2", "4")}


def test_only_the_differing_model_files_are_listed() -> None:
    stored = {"model": {"files": {"a.json": A, "b.json": A, "c.json": A}}}
    now = {"model": {"files": {"a.json": A, "b.json": B, "c.json": A}}}
    assert drift(stored, now) == {"MODEL_PATH": (f"b.json {A[:12]}", f"b.json {B[:12]}")}


def test_only_the_differing_layout_and_env_reads_are_listed() -> None:
    stored = {"layout": {"tp": 2, "pp": 1, "ep": 8}, "environment_reads": {"X": "1", "Y": "1"}}
    now = {"layout": {"tp": 2, "pp": 2, "ep": 8}, "environment_reads": {"X": "1", "Y": "2"}}
    assert drift(stored, now) == {"PP": ("1", "2"), "Y": ("1", "2")}


def test_only_the_differing_referenced_files_and_training_keys_are_listed() -> None:
    stored = {"referenced_files": {"a.path": {"sha256": A}, "b.path": {"sha256": A}}, "training": {"x": "1", "y": "1"}}
    now = {"referenced_files": {"a.path": {"sha256": A}, "b.path": {"sha256": B}}, "training": {"x": "1", "y": "2"}}
    assert drift(stored, now) == {"b.path": (A[:12], B[:12]), "y": ("1", "2")}


def test_the_fields_come_in_a_fixed_order() -> None:
    """Recipe, frameworks, image, model, data, layout, env reads, files, training: the lines read the same each time."""
    stored = {"recipe_version": "1", "frameworks": {"verl": "1"}, "image": {"locks": {"l": "1"}},
              "model": {"files": {"config.json": "1"}}, "data": {"TRAIN_FILES": {"sha256": "1"}, "VAL_FILES": {"sha256": "1"}},
              "layout": {"tp": 1}, "environment_reads": {"E": "1"}, "referenced_files": {"r.path": {"sha256": "1"}},
              "training": {"t": "1"}}  # fmt: skip
    now = json.loads(json.dumps(stored).replace('"1"', '"2"').replace(": 1}", ": 2}"))
    assert list(drift(stored, now)) == [
        "RECIPE", "FRAMEWORKS", "IMAGE", "MODEL_PATH", "TRAIN_FILES", "VAL_FILES", "TP", "E", "r.path", "t",
    ]  # fmt: skip


# --- a value or a name of a stored record, shown on one line ---------------------------------


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (None, "(absent)"),
        ("", '""'),
        ("  ", '"  "'),
        ("\t", '"\\t"'),
        (2, "2"),
        (True, "true"),
        ({"b": 1, "a": 2}, '{"a": 2, "b": 1}'),  # sorted keys: the same value, the same line
        (A, "aaaaaaaaaaaa"),
        ("0123456789abcdef" * 4, "0123456789ab"),
        ("0123456789ABCDEF" * 4, "0123456789ABCDEF" * 4),  # not how a sha256 is written: shown whole
        ("0123456789abcdeX" * 4, "0123456789abcdeX" * 4),  # 64 characters, not all hex digits: shown whole
        ("a" * 63, "a" * 63),
        ("a" * 65, "a" * 65),
        ("x" * 80, "x" * 80),
        ("x" * 81, "x" * 77 + "..."),
        ("a\nb\x1b[31m", "a\\nb\\x1b[31m"),  # a forged line or a colour never reaches the terminal
        ("é" * 80, "é" * 80),
    ],
)
def test_a_value_is_shown_on_one_printable_line(value: Any, shown: str) -> None:
    assert drift({"recipe_version": value}, {"recipe_version": "now"})["RECIPE"][0] == shown


@pytest.mark.parametrize(
    ("name", "shown"),
    [("MY_LR", "MY_LR"), ("", '""'), (" ", '" "'), ("k\n", "k\\n"), ("k" * 81, "k" * 77 + "...")],
)
def test_a_name_is_shown_printable_and_never_blank(name: str, shown: str) -> None:
    assert shown_name(name) == shown
    assert list(drift({"environment_reads": {name: "1"}}, {"environment_reads": {name: "2"}})) == [shown]


@given(value=st.text())
def test_any_stored_text_is_shown_as_one_visible_printable_line(value: str) -> None:
    shown = drift({"recipe_version": value}, {"recipe_version": None if value else "x"})["RECIPE"][0]
    assert shown.isprintable() and shown.strip() != ""
    if value.isprintable() and value.strip():
        assert len(shown) <= 80


# --- the lines: refused unless ALLOW_DRIFT names the field -------------------------------------


def test_a_drifted_field_is_refused_with_the_way_out() -> None:
    refused, accepted = drift_problems({"layout": {"tp": 2}}, {"layout": {"tp": 4}}, ["PP"], SOURCE)
    assert (refused, accepted) == ([_refusal("TP", "2", "4")], [])


def test_a_field_allow_drift_names_is_accepted_and_said() -> None:
    refused, accepted = drift_problems({"layout": {"tp": 2}}, {"layout": {"tp": 4}}, ["TP"], SOURCE)
    assert refused == []
    assert accepted == ["TP: 2 when the checkpoint's run started (/ck/run-record.json), 4 now (accepted: ALLOW_DRIFT)"]


def test_each_drifted_field_is_its_own_line() -> None:
    stored = {"recipe_version": "1", "layout": {"tp": 2}}
    now = {"recipe_version": "2", "layout": {"tp": 4}}
    refused, accepted = drift_problems(stored, now, ["RECIPE"], SOURCE)
    assert refused == [_refusal("TP", "2", "4")]
    assert accepted == ["RECIPE: 1 when the checkpoint's run started (/ck/run-record.json), 2 now (accepted: ALLOW_DRIFT)"]


def test_no_drift_no_lines() -> None:
    assert drift_problems({"layout": {"tp": 2}}, {"layout": {"tp": 2}}, [], SOURCE) == ([], [])


def test_with_two_records_a_field_is_said_once_from_the_first_that_has_it() -> None:
    """The run's record first, then the resumed step's: either one alone still guards the resume."""
    run, step = Path("/ck/run-record.json"), Path("/ck/global_step_4/run-record.json")
    now = {"layout": {"tp": 4}, "recipe_version": "3"}
    stored = [({"layout": {"tp": 2}, "recipe_version": "3"}, run), ({"layout": {"tp": 1}, "recipe_version": "2"}, step)]
    refused, accepted = drift_problems(stored, now, [])
    assert refused == [_refusal("TP", "2", "4", run), _refusal("RECIPE", "2", "3", step)]
    assert accepted == []


def test_no_stored_record_no_lines() -> None:
    assert drift_problems([], {"layout": {"tp": 4}}, []) == ([], [])
