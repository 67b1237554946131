"""The stored run record by direct calls: what reading one accepts, what it refuses and with which line, how it is written.

A record travels between clusters and tickets, so reading it treats every byte as hostile
(recipe/record_file.py): anything but a regular JSON file of the schema is UnreadableRecord,
one line that names the path and why; a NUL or a lone surrogate anywhere, NaN or Infinity, are
refused as a whole. Writing is atomic and never through a link; copies go only into the steps
a run made. test_record_hostile.py drives the same code through plan, run and replay; this file
pins each outcome and message here without composing verl's config, so it runs in about a second.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recipe import record_file
from recipe.digests import FileRefused
from recipe.record_file import (
    RECORD_MAX_BYTES,
    RECORD_NAME,
    REWARD_FUNCTION_KEY,
    UnreadableRecord,
    copy_into_new_steps,
    read_record,
    record_bytes,
    write_record,
)

#: What a record of only {"schema_version": 1} reads as: each part empty (the drift guard reports them as changed).
EMPTY = {
    "schema_version": 1,
    "recipe_version": "",
    "frameworks": {},
    "image": {"labels": None, "locks": {}},
    "model": {"path": "", "files": {}},
    "data": {},
    "layout": {},
    "training": {},
    "environment_reads": {},
    "referenced_files": {},
    "extra_overrides": [],
    "setting_keys": {},
    "settings": {},
}


def _stored(tmp_path: Path, provenance: Any, **beside: Any) -> Path:
    path = tmp_path / RECORD_NAME
    path.write_text(json.dumps({"provenance": provenance, **beside}))
    return path


def _refusal(path: Path) -> str:
    with pytest.raises(UnreadableRecord) as caught:
        read_record(path)
    assert "\n" not in str(caught.value)
    return str(caught.value)


def test_the_file_name_schema_and_reward_key_are_the_documented_ones() -> None:
    # Records written by earlier runs are found and read by these: a rename orphans every one of them.
    assert (RECORD_NAME, record_file.SCHEMA_VERSION, RECORD_MAX_BYTES) == ("run-record.json", 1, 16 * 1024 * 1024)
    assert REWARD_FUNCTION_KEY == "reward.custom_reward_function.path"  # verl 0.9.1's key


# --- reading: what is accepted -----------------------------------------------------------------


def test_nothing_at_the_path_is_no_record(tmp_path: Path) -> None:
    assert read_record(tmp_path / RECORD_NAME) is None


def test_a_record_missing_its_parts_reads_them_as_empty(tmp_path: Path) -> None:
    assert read_record(_stored(tmp_path, {"schema_version": 1})) == EMPTY


def test_a_full_record_reads_back_as_written(tmp_path: Path) -> None:
    provenance = {
        "schema_version": 1,
        "recipe_version": "0.4.0",
        "frameworks": {"verl": "0.9.1", "megatron": None},
        "image": {"labels": {"org.opencontainers.image.version": "1"}, "locks": {"uv.lock": "a" * 64}},
        "model": {"path": "/m", "files": {"config.json": "b" * 64}},
        "data": {"TRAIN_FILES": {"path": "/d/train.parquet", "size": 12, "rows": 3, "sha256": "c" * 64}, "VAL_FILES": None},
        "layout": {"tp": 2, "name": "one", "fraction": 0.5, "offload": True, "ep": None},
        "training": {"lr": "1e-6"},
        "environment_reads": {"MY_LR": "1e-6", "UNSET": None},
        "referenced_files": {"data.custom_cls.path": {"path": "/c.py", "sha256": None}, "gone": None},
        "extra_overrides": ["trainer.total_epochs=1"],
        "setting_keys": {"TP": "actor.tp"},
        "settings": {"TP": 2, "NAME": "x", "ON": False, "F": 1.5, "NONE": None},
    }
    assert read_record(_stored(tmp_path, provenance, started_at="2024-01-02T03:04:05+00:00")) == provenance


def test_scalars_keep_their_json_type(tmp_path: Path) -> None:
    """"2", 2, 2.5 and true are four different settings: none is coerced into another."""
    layout = {"s": "2", "i": 2, "f": 2.5, "b": True, "n": None}
    stored = read_record(_stored(tmp_path, {"schema_version": 1, "layout": layout}))
    assert stored is not None
    assert [(key, type(value)) for key, value in stored["layout"].items()] == [(k, type(v)) for k, v in layout.items()]


def test_a_record_of_the_earlier_schema_reads_its_reward_function_as_a_referenced_file(tmp_path: Path) -> None:
    earlier = {"path": "/r.py", "sha256": "a" * 64}
    stored = read_record(_stored(tmp_path, {"schema_version": 1, "reward_function": earlier}))
    assert stored == EMPTY | {"referenced_files": {REWARD_FUNCTION_KEY: earlier}}


def test_a_referenced_reward_function_wins_over_the_earlier_field(tmp_path: Path) -> None:
    newer = {"path": "/new.py", "sha256": "b" * 64}
    provenance = {"schema_version": 1, "reward_function": {"path": "/old.py", "sha256": "a" * 64},
                  "referenced_files": {REWARD_FUNCTION_KEY: newer}}  # fmt: skip
    assert read_record(_stored(tmp_path, provenance)) == EMPTY | {"referenced_files": {REWARD_FUNCTION_KEY: newer}}


def test_a_null_earlier_reward_function_adds_nothing(tmp_path: Path) -> None:
    assert read_record(_stored(tmp_path, {"schema_version": 1, "reward_function": None})) == EMPTY


def test_a_record_of_exactly_the_bound_is_read(tmp_path: Path) -> None:
    path = tmp_path / RECORD_NAME
    text = json.dumps({"provenance": {"schema_version": 1}})
    path.write_text(text + " " * (RECORD_MAX_BYTES - len(text)))
    assert path.stat().st_size == RECORD_MAX_BYTES and read_record(path) == EMPTY


def test_a_link_to_a_record_is_read(tmp_path: Path) -> None:
    real = _stored(tmp_path, {"schema_version": 1}).rename(tmp_path / "elsewhere.json")
    (tmp_path / RECORD_NAME).symlink_to(real)
    assert read_record(tmp_path / RECORD_NAME) == EMPTY


# --- reading: what is refused, and the line that says so ----------------------------------------


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"\xff{", "UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff in position 0: invalid start byte"),
        (b"{", "JSONDecodeError: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
        (b"", "JSONDecodeError: Expecting value: line 1 column 1 (char 0)"),
        (b'{"provenance": {"schema_version": 1, "layout": {"tp": NaN}}}', "ValueError: NaN is not JSON"),
        (b'{"provenance": {"schema_version": 1, "layout": {"tp": Infinity}}}', "ValueError: Infinity is not JSON"),
        (b'{"provenance": {"schema_version": 1, "layout": {"tp": -Infinity}}}', "ValueError: -Infinity is not JSON"),
        # Python refuses an integer of more than 4300 digits; its message is cut to 120 characters.
        (b'{"provenance": {"schema_version": 1}, "n": ' + b"7" * 5000 + b"}",
         ("ValueError: Exceeds the limit (4300 digits) for integer string conversion: value has 5000 digits; "
          "use sys.set_int_max_str_digits() t")),
        (b'{"provenance": {"schema_version": 1, "training": {"lr": "1\\u0000"}}}', "ValueError: a NUL or a lone surrogate in a string"),
    ],
)  # fmt: skip
def test_content_that_is_not_a_json_record_is_refused_saying_what_it_is(tmp_path: Path, content: bytes, why: str) -> None:
    path = tmp_path / RECORD_NAME
    path.write_bytes(content)
    assert _refusal(path) == f"{path}: not a run record ({why})"


def test_json_nested_deeper_than_the_parser_allows_is_refused(tmp_path: Path) -> None:
    path = tmp_path / RECORD_NAME
    path.write_text('{"provenance": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert _refusal(path).startswith(f"{path}: not a run record (RecursionError: maximum recursion depth exceeded")


@pytest.mark.parametrize(
    "document",
    [[], "text", 1, None, {}, {"provenance": None}, {"provenance": [1]}, {"provenance": "record"}, {"record": {}}],
)
def test_json_without_a_provenance_object_is_refused(tmp_path: Path, document: Any) -> None:
    path = tmp_path / RECORD_NAME
    path.write_text(json.dumps(document))
    assert _refusal(path) == f'{path}: not a run record (no "provenance" object)'


@pytest.mark.parametrize("version", [None, 0, 2, 1.0, True, "1", [1]], ids=repr)
def test_a_record_of_another_schema_is_refused(tmp_path: Path, version: Any) -> None:
    # 1.0 and true compare equal to 1 in Python: only the integer 1 is this schema.
    path = _stored(tmp_path, {"schema_version": version})
    assert _refusal(path) == f"{path}: not a run record of schema 1"


def test_a_record_without_a_schema_version_is_refused(tmp_path: Path) -> None:
    path = _stored(tmp_path, {"recipe_version": "0.4.0"})
    assert _refusal(path) == f"{path}: not a run record of schema 1"


@pytest.mark.parametrize(
    ("part", "problem"),
    [
        ({"recipe_version": 5}, "recipe_version: Input should be a valid string"),
        ({"surprise": 1}, "surprise: Extra inputs are not permitted"),
        ({"model": {"path": "/m", "weights": {}}}, "model.weights: Extra inputs are not permitted"),
        # Strict: a size of "12" is not the integer 12, a rows count of 3.0 is not 3.
        ({"data": {"TRAIN_FILES": {"path": "/d", "size": "12", "rows": 3, "sha256": "c"}}}, "data.TRAIN_FILES.size: Input should be a valid integer"),
        ({"data": {"TRAIN_FILES": {"path": "/d", "size": 12, "rows": 3.0, "sha256": "c"}}}, "data.TRAIN_FILES.rows: Input should be a valid integer"),
        ({"training": {"lr": 1}}, "training.lr: Input should be a valid string"),
        ({"extra_overrides": "a=1"}, "extra_overrides: Input should be a valid list"),
        ({"referenced_files": {"k": {"path": "/c.py"}}}, "referenced_files.k.sha256: Field required"),
        # A hostile key in the location is escaped: the message stays one line (hypothesis found "image.\n").
        ({"image": {"\n": 1}}, "image.\\n: Extra inputs are not permitted"),
        ({"training": {"a\u2028b\"": 1}}, 'training.a\\u2028b\\": Input should be a valid string'),
    ],
)  # fmt: skip
def test_a_record_not_of_the_schema_is_refused_naming_the_first_wrong_field(
    tmp_path: Path, part: dict[str, Any], problem: str
) -> None:
    path = _stored(tmp_path, {"schema_version": 1, **part})
    assert _refusal(path) == f"{path}: not a run record of schema 1 ({problem})"


def test_a_dangling_link_is_an_unreadable_record_not_no_record(tmp_path: Path) -> None:
    path = tmp_path / RECORD_NAME
    path.symlink_to(tmp_path / "gone.json")
    assert _refusal(path) == f"{path}: a symlink to nothing"


def test_a_symlink_loop_is_refused_with_the_os_reason(tmp_path: Path) -> None:
    path = tmp_path / RECORD_NAME
    path.symlink_to(RECORD_NAME)
    assert _refusal(path) == f"{path}: cannot be read (Too many levels of symbolic links)"


@pytest.mark.parametrize(
    "plant",
    [pytest.param(lambda path: os.mkfifo(path), id="fifo"), pytest.param(lambda path: path.mkdir(), id="directory"),
     pytest.param(lambda path: path.symlink_to("/dev/zero"), id="link-to-dev-zero")],
)  # fmt: skip
def test_a_special_file_is_refused_at_once(tmp_path: Path, plant: Callable[[Path], None]) -> None:
    path = tmp_path / RECORD_NAME
    plant(path)
    assert _refusal(path) == f"{path}: not a regular file (a run record is a regular file of at most 16 MiB)"


def test_a_record_past_the_bound_is_refused_without_reading_it(tmp_path: Path) -> None:
    path = tmp_path / RECORD_NAME
    with open(path, "wb") as handle:
        handle.truncate(RECORD_MAX_BYTES + 1)  # sparse: nothing is read to refuse it
    assert _refusal(path) == f"{path}: 16.0 MiB, above the 16.0 MiB bound (a run record is a regular file of at most 16 MiB)"


@pytest.mark.parametrize(
    ("where", "error", "shown"),
    [("open_regular", PermissionError(13, "Permission denied"), "cannot be read (Permission denied)"),
     ("open_regular", OSError(), "cannot be read (OSError)"),
     ("read_bounded", OSError(5, "Input/output error"), "cannot be read (Input/output error)"),
     ("read_bounded", IsADirectoryError(), "cannot be read (IsADirectoryError)"),
     # The file grew past the bound between the check and the read.
     ("read_bounded", FileRefused("more than 16.0 MiB"), "more than 16.0 MiB")],
)  # fmt: skip
def test_a_record_the_os_will_not_give_is_one_line_naming_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, error: Exception, shown: str
) -> None:
    """Root reads any file here, so the OS's refusals are made by replacing the call that would get them."""
    path = _stored(tmp_path, {"schema_version": 1})

    def refuse(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(record_file, where, refuse)
    assert _refusal(path) == f"{path}: {shown}"


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counting open files needs /proc")
@pytest.mark.parametrize("content", [b'{"provenance": {"schema_version": 1}}', b"\xff", b"[" * 100_000])
def test_reading_a_record_leaves_no_file_open(tmp_path: Path, content: bytes) -> None:
    """plan and replay read records in long-lived processes (and watch, every step)."""
    path = tmp_path / RECORD_NAME
    path.write_bytes(content)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(5):
        try:
            read_record(path)
        except UnreadableRecord:
            pass
    assert len(os.listdir("/proc/self/fd")) == before


# --- a NUL or a lone surrogate anywhere refuses the whole record ---------------------------------

#: Text of any character a path or a value of ours may hold: no NUL, no surrogate.
CLEAN_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=6)
CLEAN_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | CLEAN_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(CLEAN_TEXT, inner, max_size=3),
    max_leaves=8,
)
#: A surrogate is any of U+D800..U+DFFF; its neighbours U+D7FF and U+E000 are ordinary characters.
BAD = st.sampled_from(["\x00", "\ud800", "\udbff", "\udc00", "\udfff"])


@given(value=CLEAN_JSON)
def test_any_clean_json_beside_the_record_is_accepted(tmp_path_factory: pytest.TempPathFactory, value: Any) -> None:
    path = _stored(tmp_path_factory.mktemp("r"), {"schema_version": 1}, note=value)
    assert read_record(path) == EMPTY


@pytest.mark.parametrize("neighbour", ["\ud7ff", "\ue000", "\x01"])
def test_the_neighbours_of_the_refused_characters_are_accepted(tmp_path: Path, neighbour: str) -> None:
    provenance = {"schema_version": 1, "training": {f"k{neighbour}": f"v{neighbour}"}}
    assert read_record(_stored(tmp_path, provenance)) == EMPTY | {"training": {f"k{neighbour}": f"v{neighbour}"}}


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    value=CLEAN_JSON,
    bad=BAD,
    nesting=st.lists(st.one_of(st.just("list"), CLEAN_TEXT), max_size=3),
    as_key=st.booleans(),
    first=st.booleans(),
)
def test_a_nul_or_a_lone_surrogate_anywhere_refuses_the_record(
    tmp_path_factory: pytest.TempPathFactory, value: Any, bad: str, nesting: list[str], as_key: bool, first: bool
) -> None:
    # Either breaks the next reader (open() of a path, an encoder): refused as a whole, wherever it hides.
    poisoned: Any = {f"k{bad}": value} if as_key else f"/p{bad}q"
    for level in reversed(nesting):  # inside lists and objects, beside clean neighbours
        if level == "list":
            poisoned = [poisoned, value] if first else [value, poisoned]
        else:
            poisoned = {level: poisoned, **({} if level == "z" else {"z": value})}
    path = _stored(tmp_path_factory.mktemp("r"), {"schema_version": 1}, note=poisoned)
    assert _refusal(path) == f"{path}: not a run record (ValueError: a NUL or a lone surrogate in a string)"


# --- writing --------------------------------------------------------------------------------------

STARTED = datetime(2024, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


def test_the_record_file_is_the_record_and_its_start_as_sorted_indented_json() -> None:
    expected = b'{\n  "provenance": {\n    "a": 1,\n    "b": [\n      "x"\n    ]\n  },\n  "started_at": "2024-01-02T03:04:05+00:00"\n}\n'
    assert record_bytes({"b": ["x"], "a": 1}, STARTED) == expected


def test_a_record_without_a_start_is_stamped_now_in_utc() -> None:
    before = datetime.now(timezone.utc)
    started = datetime.fromisoformat(json.loads(record_bytes({}))["started_at"])
    assert started.utcoffset() == timedelta(0) and before <= started <= datetime.now(timezone.utc)


def test_a_written_record_reads_back(tmp_path: Path) -> None:
    root = tmp_path / "ck" / "p" / "e"  # made with its parents
    path = write_record(root, record_bytes({"schema_version": 1, "recipe_version": "0.4.0"}, STARTED))
    assert path == root / RECORD_NAME
    assert read_record(path) == EMPTY | {"recipe_version": "0.4.0"}


def test_writing_again_replaces_the_record(tmp_path: Path) -> None:
    write_record(tmp_path, b"old")
    assert write_record(tmp_path, b"new").read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == [RECORD_NAME]  # no temporary file left


def test_a_link_planted_where_the_record_goes_is_replaced_not_written_through(tmp_path: Path) -> None:
    outside = tmp_path / "outside.json"
    outside.write_bytes(b"theirs")
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / RECORD_NAME).symlink_to(outside)
    path = write_record(tmp_path / "root", b"ours")
    assert not path.is_symlink() and path.read_bytes() == b"ours" and outside.read_bytes() == b"theirs"


def test_a_root_that_is_a_file_is_an_os_error(tmp_path: Path) -> None:
    (tmp_path / "root").write_text("not a directory")
    with pytest.raises(OSError):
        write_record(tmp_path / "root", b"ours")
    assert (tmp_path / "root").read_text() == "not a directory"


# --- copies into the steps a run made -------------------------------------------------------------


def _steps(root: Path, *names: str) -> Path:
    for name in names:
        (root / name).mkdir(parents=True)
    return root


def test_the_record_goes_into_each_new_step_in_name_order(tmp_path: Path) -> None:
    root = _steps(tmp_path / "root", "global_step_2", "global_step_10", "global_step_1", "other", "global_step")
    assert copy_into_new_steps(root, set(), b"rec") == [root / f"global_step_{n}" / RECORD_NAME for n in ("1", "10", "2")]
    assert not (root / "other" / RECORD_NAME).exists() and not (root / "global_step" / RECORD_NAME).exists()
    assert all((root / f"global_step_{n}" / RECORD_NAME).read_bytes() == b"rec" for n in (1, 2, 10))


def test_steps_there_when_the_run_started_are_left_alone(tmp_path: Path) -> None:
    root = _steps(tmp_path / "root", "global_step_1", "global_step_2", "global_step_3")
    assert copy_into_new_steps(root, {"global_step_1", "global_step_3"}, b"rec") == [root / "global_step_2" / RECORD_NAME]
    assert not (root / "global_step_1" / RECORD_NAME).exists() and not (root / "global_step_3" / RECORD_NAME).exists()


def test_a_step_that_already_holds_a_record_keeps_it(tmp_path: Path) -> None:
    root = _steps(tmp_path / "root", "global_step_1", "global_step_2")
    (root / "global_step_1" / RECORD_NAME).write_bytes(b"its own")
    assert copy_into_new_steps(root, set(), b"rec") == [root / "global_step_2" / RECORD_NAME]
    assert (root / "global_step_1" / RECORD_NAME).read_bytes() == b"its own"


def test_a_step_that_is_not_a_directory_is_skipped(tmp_path: Path) -> None:
    root = _steps(tmp_path / "root", "global_step_2")
    (root / "global_step_1").write_text("a file")
    outside = _steps(tmp_path, "outside") / "outside"
    (root / "global_step_0").symlink_to(outside)  # a link to a directory is not written into
    assert copy_into_new_steps(root, set(), b"rec") == [root / "global_step_2" / RECORD_NAME]
    assert list(outside.iterdir()) == [] and (root / "global_step_1").read_text() == "a file"


def test_a_link_planted_where_a_steps_record_goes_is_replaced(tmp_path: Path) -> None:
    root = _steps(tmp_path / "root", "global_step_1")
    outside = tmp_path / "outside.json"
    outside.write_bytes(b"theirs")
    (root / "global_step_1" / RECORD_NAME).symlink_to(outside)
    assert copy_into_new_steps(root, set(), b"rec") == [root / "global_step_1" / RECORD_NAME]
    assert outside.read_bytes() == b"theirs" and not (root / "global_step_1" / RECORD_NAME).is_symlink()


def test_a_step_that_cannot_take_the_record_does_not_stop_the_others(tmp_path: Path) -> None:
    # A directory where the record goes: the rename fails (as in a step verl is deleting); the sweep goes on.
    root = _steps(tmp_path / "root", f"global_step_1/{RECORD_NAME}", "global_step_2")
    assert copy_into_new_steps(root, set(), b"rec") == [root / "global_step_2" / RECORD_NAME]
    assert (root / "global_step_1" / RECORD_NAME).is_dir()


def test_a_step_deleted_during_the_sweep_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """verl's max_ckpt_to_keep removes old steps while the run writes: the lstat of a listed step fails."""
    root = _steps(tmp_path / "root", "global_step_1", "global_step_2")
    real_lstat = os.lstat

    def vanished(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        if Path(path) == root / "global_step_1":
            raise FileNotFoundError(2, "No such file or directory")
        return real_lstat(path, *args, **kwargs)

    monkeypatch.setattr(record_file.os, "lstat", vanished)
    assert copy_into_new_steps(root, set(), b"rec") == [root / "global_step_2" / RECORD_NAME]
