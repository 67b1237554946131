"""Every file the recipe reads back, under every class of hostile content (issue 40), through its real reader.

The readers: config.json (plan's model and memory fit), the smoke verdict's metrics log and the watcher's
report, run's finish check, verl's checkpoint tracker, the run record, the prepare-data manifest behind run's
prompt-budget warning, vllm-ascend's _build_info.py (the chip), the shared-storage nonce, the TensorBoard event files
behind the progress line and the image's labels and locks (plan's chip, doctor). The classes: a special file where a regular one belongs (FIFO, folder,
link loop, a huge sparse file), numbers past range (a 5000-digit integer, inf and NaN), depth (JSON nested past
the parser's recursion) and bytes that are no UTF-8, each placed and also generated (hypothesis). A reader must
answer within seconds with its own documented refusal, never hang, recurse, overflow or raise anything else.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from recipe.checkpoint_tracker import TRACKER_NAME, ResumeCheckError, tracked_step_dir
from recipe.chip import built_device_type
from recipe.cluster import shared_storage
from recipe.doctor.facts import lock_digests, read_labels
from recipe.errors import RecipeConfigError
from recipe.models import load_architecture
from recipe.numbers import MAX_DIGITS, NumberRefused, finite_or_none, real_number, whole_number
from recipe.read_back import FileRefused, parse_json, read_json
from recipe.record_file import RECORD_NAME, UnreadableRecord, read_record
from recipe.export.evidence import trusted_status
from recipe.smoke.prepare import MANIFEST as SMOKE_MANIFEST, _read_manifest as smoke_manifest
from recipe.run.progress import event_file_problem
from recipe.run.prompt_budget import recorded_lengths
from recipe.smoke.verdict import MetricsError, read_metrics

#: A reader that has not answered in this long is hanging (each answers in milliseconds).
HANG_S = 20.0


@dataclass(frozen=True)
class Reader:
    """One reader of a file read back: the file's name in its folder, and how it is read (returns, or raises `refusals`)."""

    file_name: str
    read: Callable[[Path], Any]
    refusals: tuple[type[BaseException], ...] = ()
    #: Whether an answer says that nothing usable was read (None, a reason, an error answer, an empty table).
    said_no: Callable[[Any], bool] = lambda value: value is None or isinstance(value, str)


def _nonce(folder: Path) -> Any:
    os.environ.pop(shared_storage.ROOT_VARIABLE, None)
    return shared_storage.read_nonce(str(folder))


READERS: dict[str, Reader] = {
    "config.json": Reader("config.json", load_architecture, (RecipeConfigError,)),
    "metrics log": Reader("metrics.jsonl", lambda folder: read_metrics(folder / "metrics.jsonl"), (MetricsError,)),
    # The watcher's report, as the finished-run check and the smoke verdict read it (here the folder is the step's
    # folder and the export's at once).
    "export report": Reader("hf_export_report.json",
                            lambda folder: trusted_status(folder / "hf_export_report.json", 1, folder, folder)),
    "smoke assets manifest": Reader(SMOKE_MANIFEST, smoke_manifest),
    "checkpoint tracker": Reader(TRACKER_NAME, tracked_step_dir, (ResumeCheckError,)),
    "run record": Reader(RECORD_NAME, lambda folder: read_record(folder / RECORD_NAME), (UnreadableRecord,)),
    "prepare-data manifest": Reader("manifest.json", lambda folder: recorded_lengths(folder / "train.parquet")),
    "vllm-ascend build info": Reader("_build_info.py", built_device_type),
    "shared-storage nonce": Reader(shared_storage.NONCE_FILE, _nonce, said_no=lambda answer: answer[1].startswith("error: ")),
    "event files": Reader("events.out.tfevents.1.host", event_file_problem, said_no=lambda problem: isinstance(problem, str)),
    "image labels": Reader("labels.d/image.labels", read_labels, said_no=lambda found: found is not None and found[0] == {}),
    "image locks": Reader("requirements.lock", lock_digests, said_no=lambda digests: digests == {}),
}


def _answer(reader: Reader, folder: Path) -> tuple[str, Any]:
    """('returned', value) or ('refused', error), in a thread: a reader still reading after HANG_S fails the test."""
    outcome: list[tuple[str, Any]] = []

    def target() -> None:
        try:
            outcome.append(("returned", reader.read(folder)))
        except reader.refusals as error:
            outcome.append(("refused", error))
        except BaseException as error:  # noqa: BLE001 - what the test is about: nothing else may escape
            outcome.append(("escaped", error))

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(HANG_S)
    if thread.is_alive():
        with_writer = folder / reader.file_name
        if with_writer.exists() and not with_writer.is_file():  # unblock a reader stuck on a FIFO
            try:
                os.close(os.open(with_writer, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        pytest.fail(f"{reader.file_name}: the reader hung")
    (kind, value), = outcome
    assert kind != "escaped", f"{reader.file_name}: {type(value).__name__}: {value}"
    return kind, value


def _sparse(path: Path) -> None:
    with open(path, "wb") as handle:
        handle.truncate(1 << 40)  # 1 TiB, no block written


#: How each class of hostile file is made at a path.
SPECIAL: dict[str, Callable[[Path], None]] = {
    "FIFO": lambda path: os.mkfifo(path),
    "folder": lambda path: path.mkdir(),
    "link loop": lambda path: path.symlink_to(path.name),
    "1 TiB sparse": _sparse,
}
CONTENT: dict[str, bytes] = {
    "5000-digit number": b'{"step": 1, "status": ' + b"9" * 5000 + b', "data": {"x": ' + b"9" * 5000 + b"}}",
    "400-digit number": b'{"step": 1, "data": {"x": ' + b"9" * 400 + b"}, \"num_attention_heads\": " + b"9" * 400 + b"}",
    "inf and NaN": b'{"step": 1, "data": {"x": Infinity, "y": NaN}, "status": NaN}',
    "deep nesting": b"[" * 200_000 + b"]" * 200_000,
    "deep object": b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
    "not UTF-8": b"\xff\xfe\x00{\x80",
    "python nested past the parser": b"x = " + b"(" * 200_000 + b")" * 200_000,
}


def _prepared(tmp_path: Path, reader: Reader) -> Path:
    folder = tmp_path / "folder"
    (folder / "labels.d").mkdir(parents=True)
    (folder / "train.parquet").write_bytes(b"PAR1")  # what the manifest describes
    return folder


@pytest.mark.parametrize("kind", sorted(SPECIAL))
@pytest.mark.parametrize("name", sorted(READERS))
def test_a_special_file_is_refused_and_never_hangs(tmp_path: Path, name: str, kind: str) -> None:
    reader = READERS[name]
    folder = _prepared(tmp_path, reader)
    SPECIAL[kind](folder / reader.file_name)
    kind_of_answer, value = _answer(reader, folder)
    # A file that cannot be what it should is never read as one: a refusal, or an answer that says no.
    assert kind_of_answer == "refused" or reader.said_no(value), value


@pytest.mark.parametrize("content", sorted(CONTENT))
@pytest.mark.parametrize("name", sorted(READERS))
def test_hostile_content_is_one_refusal_or_a_sound_answer(tmp_path: Path, name: str, content: str) -> None:
    reader = READERS[name]
    folder = _prepared(tmp_path, reader)
    (folder / reader.file_name).write_bytes(CONTENT[content])
    _answer(reader, folder)


_JSONISH = st.recursive(
    st.one_of(st.integers(-10**500, 10**500), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=5),
              st.booleans(), st.none()),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["step", "data", "status",
                            "x", "files", "prompt_tokens"]), inner, max_size=3)),
    max_leaves=12,
)  # fmt: skip


@settings(max_examples=40)
@given(st.sampled_from(sorted(READERS)), _JSONISH, st.integers(0, 3000), st.binary(max_size=20))
def test_generated_documents_never_escape_a_reader(name: str, document: Any, depth: int, noise: bytes) -> None:
    """Any JSON-like value (huge numbers, NaN), wrapped `depth` lists deep, with stray bytes after: a sound answer or a refusal."""
    import tempfile

    reader = READERS[name]
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        (folder / "labels.d").mkdir()
        (folder / "train.parquet").write_bytes(b"PAR1")
        text = "[" * depth + json.dumps(document) + "]" * depth
        (folder / reader.file_name).write_bytes(text.encode() + noise)
        _answer(reader, folder)


# --- the two primitives ---------------------------------------------------------------------------------------


@given(st.one_of(st.integers(), st.text(max_size=60), st.floats(), st.booleans(), st.none()))
def test_whole_number_returns_an_int_in_range_or_refuses(value: Any) -> None:
    try:
        number = whole_number(value, -1000, 10**12, "x")
    except NumberRefused as refused:
        assert str(refused).startswith("x=") and len(str(refused)) < 200
        return
    assert type(number) is int and -1000 <= number <= 10**12


def test_whole_number_refuses_long_text_before_int_sees_it() -> None:
    with pytest.raises(NumberRefused, match=f"at most {MAX_DIGITS} digits"):
        whole_number("9" * 100_000, 0, 10, "x")  # int() would raise ValueError past 4,300 digits
    # An int already made past repr's 4,300 digits is refused by its size, never a ValueError from the message.
    with pytest.raises(NumberRefused, match="bit integer>: must be between 0 and 10"):
        whole_number(10**5000, 0, 10, "x")


@given(st.one_of(st.integers(-10**400, 10**400), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=5)))
def test_real_number_is_finite_and_in_range_or_refused(value: Any) -> None:
    try:
        number = real_number(value, -1e6, 1e6, "x")
    except NumberRefused:
        assert finite_or_none(value) is None or not -1e6 <= finite_or_none(value) <= 1e6  # type: ignore[operator]
        return
    assert -1e6 <= number <= 1e6


@given(st.binary(max_size=200), st.integers(0, 5000))
def test_parse_json_raises_only_file_refused(data: bytes, depth: int) -> None:
    try:
        parse_json(b"[" * depth + data + b"]" * depth, "x")
    except FileRefused as refused:
        assert str(refused).startswith("x: ")


def test_read_json_of_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(FileRefused, match="not a regular file"):
        read_json(tmp_path / "fifo", 1024)


# --- read_back's own lines and options, named (issue 52) --------------------------------------------------------


def _linked(tmp_path: Path, content: bytes) -> Path:
    """A symlink to a regular file holding `content` (how a config or record is often placed)."""
    (tmp_path / "real").write_bytes(content)
    (tmp_path / "link").symlink_to("real")
    return tmp_path / "link"


def test_every_reader_follows_a_link_by_default_and_refuses_it_when_told(tmp_path: Path) -> None:
    from recipe.read_back import read_file, read_prefix

    link = _linked(tmp_path, b'{"a": 1}')
    assert read_file(link, 100) == b'{"a": 1}'
    assert read_json(link, 100) == {"a": 1}
    assert read_prefix(link, 4) == b'{"a"'
    loop = f"{link}: cannot be opened (Too many levels of symbolic links)"
    for read in (lambda: read_file(link, 100, follow=False), lambda: read_json(link, 100, follow=False),
                 lambda: read_prefix(link, 4, follow=False)):  # fmt: skip
        with pytest.raises(FileRefused) as refused:
            read()
        assert str(refused.value) == loop


def test_a_missing_file_is_named_with_the_os_reason(tmp_path: Path) -> None:
    from recipe.read_back import read_file, read_prefix

    missing = tmp_path / "gone.json"
    for read in (lambda: read_file(missing, 10), lambda: read_json(missing, 10), lambda: read_prefix(missing, 10)):
        with pytest.raises(FileRefused) as refused:
            read()
        assert str(refused.value) == f"{missing}: cannot be opened (No such file or directory)"


@pytest.mark.parametrize(("error", "reason"), [(OSError(5, "Input/output error"), "Input/output error"), (OSError(), "OSError")])
def test_an_os_error_without_its_text_is_named_by_its_type(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: OSError, reason: str
) -> None:
    """A failure to open or read (a disk error; an OSError whose strerror is None) is one line naming the cause."""
    from recipe import read_back

    (tmp_path / "f").write_bytes(b"abc")

    def failing(*args: Any, **kwargs: Any) -> Any:
        raise error

    for call, said in (("read", "cannot be read"), ("open", "cannot be opened")):
        with monkeypatch.context() as patch:
            patch.setattr(read_back.os, call, failing)
            for read in (read_back.read_file, read_back.read_prefix):
                with pytest.raises(FileRefused) as refused:
                    read(tmp_path / "f", 10)
                assert str(refused.value) == f"{tmp_path / 'f'}: {said} ({reason})"


def test_a_file_that_grows_after_its_check_is_refused_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Checked at 10 bytes, written past its 16-byte bound before the read: never read past the bound."""
    from recipe import read_back

    path = tmp_path / "growing.json"
    path.write_bytes(b"0123456789")
    checked = os.fstat

    def check_then_grow(fd: int) -> os.stat_result:
        info = checked(fd)
        with open(path, "ab") as handle:
            handle.write(b"x" * 100)
        return info

    monkeypatch.setattr(read_back.os, "fstat", check_then_grow)
    with pytest.raises(FileRefused) as refused:
        read_back.read_file(path, 16)
    assert str(refused.value) == f"{path}: more than 16 B"


def test_read_prefix_reads_exactly_its_size_across_chunks(tmp_path: Path) -> None:
    from recipe.read_back import CHUNK, read_prefix

    content = bytes(range(256)) * (3 * CHUNK // 256)  # three chunks
    path = tmp_path / "big"
    path.write_bytes(content)
    for size in (0, 1, 4, CHUNK - 1, CHUNK, CHUNK + 10, 2 * CHUNK + 1, len(content), len(content) + 5):
        assert read_prefix(path, size) == content[:size], size


@pytest.mark.parametrize(
    ("text", "constants", "line"),
    [
        ('{"x": NaN}', False, "w: not JSON: NaN is not JSON"),
        ("[Infinity]", False, "w: not JSON: Infinity is not JSON"),
        ("-Infinity", False, "w: not JSON: -Infinity is not JSON"),
        ("9" * 5000, False, "w: not JSON: a number of more than 4,300 digits"),
        ("9" * 5000, True, "w: not JSON: a number of more than 4,300 digits"),
        ("{", False, "w: not JSON (Expecting property name enclosed in double quotes, line 1 column 2)"),
        (b"[1, \xff]", False, "w: not UTF-8 text (byte 4)"),
        ("[" * 200_000 + "]" * 200_000, False, "w: nested too deep to be read"),
    ],
)
def test_parse_json_refuses_with_its_exact_line(text: str | bytes, constants: bool, line: str) -> None:
    with pytest.raises(FileRefused) as refused:
        parse_json(text, "w", constants=constants)
    assert str(refused.value) == line


def test_nan_and_infinity_are_taken_only_when_asked(tmp_path: Path) -> None:
    """verl's metrics log holds NaN (constants=True); every other file is strict JSON."""
    import math

    with pytest.raises(FileRefused, match="^w: not JSON: NaN is not JSON$"):
        parse_json("[NaN]", "w")  # strict unless told
    value = parse_json('{"x": NaN, "y": Infinity}', "w", constants=True)
    assert math.isnan(value["x"]) and value["y"] == math.inf
    path = tmp_path / "metrics.json"
    path.write_text("[NaN]")
    assert math.isnan(read_json(path, 100, constants=True)[0])
    with pytest.raises(FileRefused) as refused:
        read_json(path, 100)
    assert str(refused.value) == f"{path}: not JSON: NaN is not JSON"


# --- numbers' bounds and lines, named (issue 52) ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "low", "high", "number"),
    [("42", 0, 100, 42), (b" 42\n", 0, 100, 42), ("-7", -7, 0, -7), ("+1_000", 0, 1000, 1000), (0, 0, 5, 0), (5, 0, 5, 5),
     ("9" * MAX_DIGITS, 0, 10**MAX_DIGITS, 10**MAX_DIGITS - 1), (2**300, 0, 2**300, 2**300)],
)  # fmt: skip
def test_whole_number_takes_its_bounds_and_at_most_max_digits(value: Any, low: int, high: int, number: int) -> None:
    assert whole_number(value, low, high, "x") == number


@pytest.mark.parametrize(
    ("value", "line"),
    [
        (True, "x=True: must be a whole number, not true/false"),
        (1.0, "x=1.0: must be a whole number"),
        (None, "x=None: must be a whole number"),
        ("9" * (MAX_DIGITS + 1), f"x='{'9' * (MAX_DIGITS + 1)}': must be a whole number of at most {MAX_DIGITS} digits"),
        ("1.5", f"x='1.5': must be a whole number of at most {MAX_DIGITS} digits"),
        (b"\xff1", f"x=b'\\xff1': must be a whole number of at most {MAX_DIGITS} digits"),  # not ASCII: never a crash
        ("   ", f"x='   ': must be a whole number of at most {MAX_DIGITS} digits"),  # whitespace only
        # A repr of exactly 40 characters is shown whole; one more is cut to 37 and "...".
        ("a" * 38, f"x='{'a' * 38}': must be a whole number of at most {MAX_DIGITS} digits"),
        ("a" * 39, f"x='{'a' * 36}...: must be a whole number of at most {MAX_DIGITS} digits"),
        (-1, "x=-1: must be between 0 and 10"),
        (11, "x=11: must be between 0 and 10"),
        ("11", "x=11: must be between 0 and 10"),
        # A 256-bit integer is still shown by its digits (cut); past 256 bits, by its size.
        (2**255, "x=5789604461865809771178549250434395392...: must be between 0 and 10"),
        (2**256, "x=<a 257-bit integer>: must be between 0 and 10"),
    ],
)
def test_whole_number_refuses_with_its_exact_line(value: Any, line: str) -> None:
    with pytest.raises(NumberRefused) as refused:
        whole_number(value, 0, 10, "x")
    assert str(refused.value) == line


@pytest.mark.parametrize(("value", "number"), [(0, 0.0), (1.5, 1.5), (-1.5, -1.5), (1, 1.0), (-1, -1.0)])
def test_real_number_takes_its_bounds(value: Any, number: float) -> None:
    assert real_number(value, -1.5, 1.5, "x") == number
    assert finite_or_none(value) == number


@pytest.mark.parametrize(
    ("value", "line"),
    [
        ("1", "x='1': must be a number"),
        (False, "x=False: must be a number"),
        (None, "x=None: must be a number"),
        (10**400, "x=<a 1329-bit integer>: beyond any float"),
        (float("nan"), "x=nan: must be finite"),
        (float("-inf"), "x=-inf: must be finite"),
        (1.5000001, "x=1.5000001: must be between -1.5 and 1.5"),
        (-2, "x=-2.0: must be between -1.5 and 1.5"),
    ],
)
def test_real_number_refuses_with_its_exact_line(value: Any, line: str) -> None:
    with pytest.raises(NumberRefused) as refused:
        real_number(value, -1.5, 1.5, "x")
    assert str(refused.value) == line


def test_finite_or_none_takes_any_finite_number_and_nothing_else() -> None:
    assert finite_or_none(-1e300) == -1e300 and finite_or_none(1e300) == 1e300 and finite_or_none(-3) == -3.0
    assert [finite_or_none(v) for v in (float("inf"), float("-inf"), float("nan"), True, "1", None, 10**400)] == [None] * 7
