"""Settings' user-facing words: the exact error line of each rule, the redacted view, and every warning.

A user greps logs for these lines, and `plan --json` prints `redacted()`: a changed word, a lost
key or a value shown as `null` is a regression. Expectations are hand-written from the rules as
the README and .env.example state them, never copied from the implementation's tables.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from recipe.env_file import env_file_problems
from recipe.env_warnings import allow_drift_warnings, near_miss_warnings
from recipe.errors import RecipeConfigError
from recipe.settings import REDACTED, Settings, load_settings, path_component_problem
from recipe.settings_messages import describe_error, is_whole

from .envtools import HANG_GUARD_S

ONE_COMPONENT = (
    "must be a single path component (no '/', not '.' or '..', no NUL or control characters), "
    "so that checkpoints stay inside CHECKPOINT_DIR"
)


def _problems(clean_env: pytest.MonkeyPatch, **values: str) -> list[str]:
    """The error lines load_settings reports for these environment variables (they must be refused)."""
    for name, value in values.items():
        clean_env.setenv(name, value)
    with pytest.raises(RecipeConfigError) as caught:
        load_settings()
    return caught.value.problems


# --- names are one path component -------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "refused"),
    [
        (".", True), ("..", True), ("a/b", True), ("/", True), ("a\x00b", True),
        # Control characters other than NUL: a tab, an escape, DEL and a C1 control.
        ("a\tb", True), ("esc\x1b[2J", True), ("a\x7fb", True), ("a\x9fb", True),
        # Dots inside a name, or three of them, are a plain file name.
        ("...", False), ("run.1", False), (".hidden", False), ("run-1_é", False), ("a\\b", False),
    ],
)  # fmt: skip
def test_a_name_is_one_plain_path_component(value: str, refused: bool) -> None:
    assert path_component_problem(value) == (ONE_COMPONENT if refused else None)


@pytest.mark.parametrize("name", ["PROJECT_NAME", "EXPERIMENT_NAME"])
@pytest.mark.parametrize("value", [".", "..", "a/b", "tab\there"])
def test_a_name_that_leaves_checkpoint_dir_is_one_exact_line(clean_env: pytest.MonkeyPatch, name: str, value: str) -> None:
    assert _problems(clean_env, **{name: value}) == [f"{name}={value!r}: {ONE_COMPONENT}"]


# --- the wording of each rule --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value", "rule"),
    [
        ("NODE_RANK", "-1", "must be at least 0"),
        ("RAY_PORT", "0", "must be at least 1"),
        ("RAY_PORT", "65536", "must be at most 65535"),
        ("SEED", "-1", "must be at least 0"),
        ("SEED", "2147483648", "must be at most 2147483647"),  # a seed is a signed 32-bit number
        ("NNODES", "1.5", "must be a whole number"),
        ("RAY_WAIT_TIMEOUT", "0", "must be a positive whole number"),
        ("RAY_AUTH_MODE", "password", "must be one of 'token' or 'disabled'"),
        ("PROFILE", "tiny", "must be one of 'full', 'smoke' or 'bench'"),
        ("EXPORT_STRICT", "strict", "must be true or false"),
        ("TEST_FREQ", "-2", "must be a positive number of steps, or -1 to disable"),
        ("DEVICE_MEMORY_GIB", "abc", "must be a number"),
        ("DEVICE_MEMORY_GIB", "inf", "must be a finite number"),
        ("PEAK_TFLOPS", "0", "must be a positive number"),
        ("PEAK_TFLOPS", "1e6", "must be at most 100000"),
    ],
)
def test_each_rule_is_one_line_naming_the_variable_its_value_and_the_rule(
    clean_env: pytest.MonkeyPatch, name: str, value: str, rule: str
) -> None:
    assert _problems(clean_env, **{name: value}) == [f"{name}={value!r}: {rule}"]


@pytest.mark.parametrize(("name", "value"), [("SAVE_FREQ", "-1"), ("SAVE_FREQ", "1"), ("TEST_FREQ", "-1"), ("TEST_FREQ", "1")])
def test_minus_one_disables_and_any_positive_frequency_is_taken(clean_env: pytest.MonkeyPatch, name: str, value: str) -> None:
    clean_env.setenv(name, value)
    assert getattr(load_settings(), name.lower()) == int(value)


def test_a_lower_case_variable_is_named_in_upper_case_with_its_value(clean_env: pytest.MonkeyPatch) -> None:
    """pydantic-settings reads names case-insensitively; the error line still finds and quotes the value set."""
    assert _problems(clean_env, ray_port="0") == ["RAY_PORT='0': must be at least 1"]


# --- the redacted view (`plan --json`'s settings) -------------------------------------------------


def test_the_redacted_view_names_every_setting_once_with_json_values(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("DATA_DIR", "/srv/data")
    clean_env.setenv("MODEL_PATH", "/srv/model")
    clean_env.setenv("HF_TOKEN", "hf_secret_value")
    shown = load_settings().redacted()
    assert set(shown) == {name.upper() for name in Settings.model_fields}
    assert shown == json.loads(json.dumps(shown))  # only JSON's own types: paths are strings
    assert shown["MODEL_PATH"] == "/srv/model" and shown["DATA_DIR"] == "/srv/data"
    assert shown["CHECKPOINT_DIR"] == "/checkpoints"
    # Unset data files show where they resolve to, not null.
    assert shown["TRAIN_FILES"] == "/srv/data/geo3k/train.parquet"
    assert shown["VAL_FILES"] == "/srv/data/geo3k/test.parquet"
    # A set secret is masked; an unset one stays null, so that `plan --json` tells them apart.
    assert (shown["HF_TOKEN"], shown["WANDB_API_KEY"], shown["RAY_AUTH_TOKEN"]) == (REDACTED, None, None)


def test_data_files_the_user_set_are_shown_as_set(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("TRAIN_FILES", "/x/train.parquet")
    clean_env.setenv("VAL_FILES", "/x/val.parquet")
    shown = load_settings().redacted()
    assert (shown["TRAIN_FILES"], shown["VAL_FILES"]) == ("/x/train.parquet", "/x/val.parquet")


# --- near misses -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "others",
    [
        {"DEVICE": "gpu"},  # a setting
        {"HF_HOME": "/cache"},  # a name a library reads
        {"CUDA_HOME": "/usr/local/cuda"},  # another program's prefix
        {"DEVICE_ID": "0"},  # another program's name
        {"Path": "/bin"},  # not upper case
    ],
    ids=["setting", "library-name", "foreign-prefix", "foreign-name", "lower-case"],
)
def test_a_typo_is_named_whatever_else_the_environment_holds(others: dict[str, str]) -> None:
    # Each of these sorts before the typo, and is passed over without ending the scan.
    assert near_miss_warnings({**others, "TPP": "2", "WANDB_PROJET": "p"}) == [
        "TPP is not a setting (ignored); did you mean TP?",
        "WANDB_PROJET is read by no library of the images (ignored); did you mean WANDB_PROJECT, which wandb reads?",
    ]


@pytest.mark.parametrize(
    ("typo", "warning"),
    [
        # A name read by several libraries lists them all, in one sentence with a plural verb.
        ("HF_ENDPONT", "did you mean HF_ENDPOINT, which datasets, huggingface_hub read?"),
        ("HCCL_DETERMINISTC", "did you mean HCCL_DETERMINISTIC, which torch_npu, vllm_ascend read?"),
        ("NCCL_DEBG", "did you mean NCCL_DEBUG, which nvidia_nccl_cu13 reads?"),
        # A slip in the prefix leaves the family; the name's unchanged end still finds it.
        ("HCL_EXEC_TIMEOUT", "did you mean HCCL_EXEC_TIMEOUT, which torch_npu reads?"),
        ("WANDBB_PROJECT", "did you mean WANDB_PROJECT, which wandb reads?"),
        # One slip in a short name (a swap, a letter changed), under difflib's ratio (recipe.near_miss).
        ("HF_ENDPIONT", "did you mean HF_ENDPOINT, which datasets, huggingface_hub read?"),
        ("HF_HOEM", "did you mean HF_HOME, which accelerate, datasets, huggingface_hub read?"),
        # A name cut short of the only one it begins.
        ("VLLM_USE_V2", "did you mean VLLM_USE_V2_MODEL_RUNNER, which vllm reads?"),
        ("NCCL_DEBUGG", "did you mean NCCL_DEBUG, which nvidia_nccl_cu13 reads?"),
        ("HCCL_CONECT_TIMEOUT", "did you mean HCCL_CONNECT_TIMEOUT, which torch_npu reads?"),
    ],
)
def test_a_typo_of_a_library_variable_names_the_libraries_that_read_it(typo: str, warning: str) -> None:
    assert near_miss_warnings({typo: "1"}) == [f"{typo} is read by no library of the images (ignored); {warning}"]


@pytest.mark.parametrize("typo", ["HF_TOKNE", "HF_TOEKN", "HF_TOKN"])
def test_a_slip_of_a_secret_setting_names_the_setting(typo: str) -> None:
    """HF_TOKEN is a setting of ours (and read by the libraries): a slip names it as the setting."""
    assert near_miss_warnings({typo: "hf_x"}) == [f"{typo} is not a setting (ignored); did you mean HF_TOKEN?"]


def test_a_name_far_from_every_known_one_never_warns() -> None:
    # Same last four letters as HCCL_EXEC_TIMEOUT, but nothing else alike.
    assert near_miss_warnings({"ZZZZ_EXEC_TIMEOUT": "1", "MY_OWN_VARIABLE": "1"}) == []


# --- ALLOW_DRIFT's fields ----------------------------------------------------------------------------


def test_an_allow_drift_field_close_to_a_known_one_is_named_once() -> None:
    known = ["TRAIN_FILES", "VAL_FILES", "MODEL_PATH", "TP"]
    assert allow_drift_warnings(["TRAIN_FILE", "TP", "MY_LR", "VAL_FILE"], known) == [
        "ALLOW_DRIFT names TRAIN_FILE, which is no field a record compares; did you mean TRAIN_FILES?",
        "ALLOW_DRIFT names VAL_FILE, which is no field a record compares; did you mean VAL_FILES?",
    ]


@pytest.mark.parametrize("field", ["TRAIN_FILES", "TP"])
def test_a_known_allow_drift_field_never_warns(field: str) -> None:
    assert allow_drift_warnings([field], ["TRAIN_FILES", "TRAIN_FILESS", "TP", "TPP"]) == []


def test_a_field_only_loosely_like_a_known_one_never_warns() -> None:
    # difflib's ratio of TRAIN and TRAIN_FILES is 0.625, under the 0.8 a typo needs.
    assert allow_drift_warnings(["TRAIN"], ["TRAIN_FILES"]) == []


# --- the .env file ----------------------------------------------------------------------------------


RUNS_TP = "bash runs `TP` as a command and leaves TP unset"


def _blanks(path: Path, number: int, name: str, value: str, bash: str) -> str:
    """The warning for a line `NAME = value`: Compose reads NAME=value, and BASH says what bash does (issue 50)."""
    return f"{path}:{number}: {name}: Compose reads {name}={value}, {bash} (blanks around `=`): write {name}={value}"


def test_each_env_line_the_two_readers_read_apart_is_named_with_its_line_number(tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text(
        "TP = 4\n"
        "EP=8\n"
        "# PP = 2 is only a comment\n"
        "   # CP = 2 an indented comment\n"
        "export GEN_TP =8\n"
        "  NNODES= 2\n"
        "lower_case = 1\n"
        "NAME=a = b\n"
        "\n"
    )
    assert env_file_problems(env_file) == [
        _blanks(env_file, 1, "TP", "4", RUNS_TP),
        _blanks(env_file, 5, "GEN_TP", "8", "bash's `export` takes `=8` for names and leaves GEN_TP unset"),
        _blanks(env_file, 6, "NNODES", "2", "bash runs `2` as a command and leaves NNODES unset"),
        _blanks(env_file, 7, "lower_case", "1", "bash runs `lower_case` as a command and leaves lower_case unset"),
        # Compose takes the rest of the line for the value; bash assigns NAME=a for the command `=` only.
        f"{env_file}:8: NAME: Compose reads NAME='a = b', bash runs `=` as a command and leaves NAME unset (an "
        f"unquoted value with a blank or a character the shell reads): quote the value: NAME='a = b'",
    ]


def test_an_env_file_that_is_not_utf_8_is_still_checked(tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    env_file.write_bytes(b"# caf\xe9 in latin-1\nTP = 4\n")
    assert env_file_problems(env_file) == [_blanks(env_file, 2, "TP", "4", RUNS_TP)]


def test_an_env_file_of_up_to_one_mib_is_read_and_a_larger_one_is_not(tmp_path: Path) -> None:
    bad = b"TP = 4\n"
    at_limit, over = tmp_path / "at-limit.env", tmp_path / "over.env"
    at_limit.write_bytes(bad + b"#" * ((1 << 20) - len(bad)))
    over.write_bytes(bad + b"#" * ((1 << 20) - len(bad) + 1))
    assert env_file_problems(at_limit) == [_blanks(at_limit, 1, "TP", "4", RUNS_TP)]
    assert env_file_problems(over) == []


def test_no_env_file_or_a_directory_is_no_problem(tmp_path: Path) -> None:
    (tmp_path / "dir.env").mkdir()
    assert env_file_problems(tmp_path / "missing.env") == [] and env_file_problems(tmp_path / "dir.env") == []


def test_an_env_file_that_is_a_fifo_is_never_opened(tmp_path: Path) -> None:
    """Opening a FIFO would block plan until someone writes to it; plan reads only regular files."""
    fifo = tmp_path / ".env"
    os.mkfifo(fifo)

    def write() -> None:
        with open(fifo, "w", encoding="utf-8") as writer:  # waits for a reader: the check, if it opened the FIFO
            writer.write("TP = 4\n")

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        problems = env_file_problems(fifo)
    finally:
        # Let the writer finish if the check left it waiting (a non-blocking reader opens at once).
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        writer.join(timeout=HANG_GUARD_S)
        os.close(reader)
    assert problems == []


def _bounds() -> list[tuple[str, str, float]]:
    """(setting, kind, bound) for every numeric bound the settings model declares (gt, ge, le, lt)."""
    from annotated_types import Ge, Gt, Le, Lt

    from recipe.settings import Settings

    found = []
    for name, field in Settings.model_fields.items():
        for item in field.metadata:
            for kind, cls in (("gt", Gt), ("ge", Ge), ("le", Le), ("lt", Lt)):
                if isinstance(item, cls):
                    found.append((name.upper(), kind, float(getattr(item, kind))))
        if "PositiveInt" in str(field.annotation) or "gt=0" in str(field.annotation):
            found.append((name.upper(), "gt", 0.0))
    return found


BOUNDS = _bounds()


def test_every_numeric_setting_has_its_bounds_here() -> None:
    names = {name for name, _, _ in BOUNDS}
    assert {"TP", "DEVICE_MEMORY_GIB", "SEED", "RAY_PORT", "NODE_RANK", "RAY_WAIT_TIMEOUT"} <= names, names


@pytest.mark.parametrize(("name", "kind", "bound"), BOUNDS, ids=[f"{n}-{k}" for n, k, _ in BOUNDS])
@given(offset=st.integers(1, 10**6), fraction=st.sampled_from([0.5, 0.25, 0.001]))
def test_a_value_on_each_side_of_a_bound_and_the_rule_the_message_states(
    name: str, kind: str, bound: float, offset: int, fraction: float
) -> None:
    """Inside the bound: accepted. Outside: refused with a rule that is the bound, in the setting's own kind of number."""
    whole = is_whole(name, Settings.model_fields)
    step = offset if whole else offset * fraction
    outside = bound - step if kind in ("gt", "ge") else bound + step
    # Inside this bound, and never past the field's other one.
    others = [b for n, k, b in BOUNDS if n == name and (k in ("le", "lt")) != (kind in ("le", "lt"))]
    room = min((abs(b - bound) / 2 for b in others), default=step)
    step = min(step, room if not whole else max(1, int(room)))
    inside = bound + step if kind in ("gt", "ge") else bound - step
    if kind == "ge":
        inside = bound  # ge takes the bound itself
    shown = (lambda v: str(int(v))) if whole else (lambda v: repr(float(v)))
    companions = {"MASTER_ADDR": "head", "NNODES": "2", "RAY_AUTH_MODE": "disabled"} if name == "NODE_RANK" else {}
    ok = _lines_for({name: shown(inside), **companions})
    assert not [p for p in ok if p.startswith(f"{name}=")], ok
    refused = [p for p in _lines_for({name: shown(outside), **companions}) if p.startswith(f"{name}=")]
    assert len(refused) == 1, refused
    rule = refused[0].split(": ", 1)[1]
    expected = {
        "gt": f"must be a positive {'whole number' if whole else 'number'}" if bound == 0 else f"must be greater than {bound:g}",
        "ge": f"must be at least {int(bound) if bound.is_integer() else bound}",
        "le": f"must be at most {int(bound) if bound.is_integer() else bound}",
    }[kind]
    assert rule == expected


def _lines_for(values: dict[str, str]) -> list[str]:
    """The lines `plan` would print for exactly these variables (the process environment replaced meanwhile)."""
    from unittest import mock

    from recipe.settings import load_settings

    with mock.patch.dict(os.environ, values, clear=True):
        try:
            load_settings()
        except RecipeConfigError as error:
            return list(error.problems)
    return []


# --- the describer's every rule, as pydantic reports it ------------------------------------------------------------
# Settings' own bounds today are `gt=0` and whole `ge`/`le`; the describer words any bound pydantic gives (a fractional
# one, a non-zero `gt`), so that a setting added with one still gets the line this file pins. Pydantic's error dicts
# are given here as pydantic makes them (type, ctx), for a setting of each kind.


@pytest.mark.parametrize(
    ("error", "line"),
    [
        ({"loc": ("tp",), "type": "greater_than", "ctx": {"gt": 5}, "msg": ""}, "TP='7': must be greater than 5"),
        ({"loc": ("tp",), "type": "greater_than", "ctx": {"gt": 0.25}, "msg": ""}, "TP='7': must be greater than 0.25"),
        ({"loc": ("tp",), "type": "greater_than", "ctx": {"gt": 0}, "msg": ""}, "TP='7': must be a positive whole number"),
        ({"loc": ("device_memory_gib",), "type": "greater_than", "ctx": {"gt": 0}, "msg": ""},
         "DEVICE_MEMORY_GIB='7': must be a positive number"),
        ({"loc": ("tp",), "type": "greater_than_equal", "ctx": {"ge": 1.5}, "msg": ""}, "TP='7': must be at least 1.5"),
        ({"loc": ("tp",), "type": "greater_than_equal", "ctx": {"ge": 4096.0}, "msg": ""}, "TP='7': must be at least 4096"),
        ({"loc": ("tp",), "type": "less_than_equal", "ctx": {"le": 2**31 - 1}, "msg": ""},
         "TP='7': must be at most 2147483647"),
        ({"loc": ("tp",), "type": "less_than_equal", "ctx": {"le": 1e-3}, "msg": ""}, "TP='7': must be at most 0.001"),
        ({"loc": ("tp",), "type": "less_than_equal", "ctx": {"le": 1e-5}, "msg": ""}, "TP='7': must be at most 1e-05"),
        # As people write it: 0.3, not the float's 0.30000000000000004.
        ({"loc": ("tp",), "type": "greater_than_equal", "ctx": {"ge": 0.1 + 0.2}, "msg": ""}, "TP='7': must be at least 0.3"),
        ({"loc": ("device_memory_gib",), "type": "float_type", "msg": ""}, "DEVICE_MEMORY_GIB='7': must be a number"),
        ({"loc": ("tp",), "type": "int_type", "msg": ""}, "TP='7': must be a whole number"),
        ({"loc": ("tp",), "type": "value_error", "msg": "Value error, must divide 16"}, "TP='7': must divide 16"),
    ],
)  # fmt: skip
def test_the_describer_words_every_bound_pydantic_gives(error: dict[str, object], line: str) -> None:
    assert describe_error(error, {"TP": "7", "device_memory_gib": "7"}, Settings.model_fields) == line
