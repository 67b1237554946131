"""What the export check reads from shard files and the index, and the one line it writes when it cannot.

test_hostile_headers.py proves the check refuses exactly what the `safetensors` loader refuses.
This file pins what a user sees: the exact line naming the shard, the tensor, the value and
the rule broken (users grep logs for these), and how a checkpoint directory is assembled:
which shard files are read, what the index says, and which files are never opened (names
that are not plain file names, symlinks out of the directory, non-regular files). Valid
files are written by the real `safetensors` package; hostile ones as raw bytes.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from recipe.export.safetensors_header import ShardError, TensorInfo, parse_safetensors_header
from recipe.export.shards import (
    INDEX_NAME,
    MAX_INDEX_BYTES,
    CheckpointContents,
    allowed_roots,
    read_checkpoint,
    read_safetensors_header,
    resolve_member,
)

numpy = pytest.importorskip("numpy")
from safetensors.numpy import save_file  # noqa: E402

SHARD = "model.safetensors"
A2 = {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}


def raw_file(header: str | bytes, data: bytes = b"", length: int | None = None) -> bytes:
    """A safetensors file: 8-byte little-endian header length, the header, the data section."""
    head = header.encode("utf-8") if isinstance(header, str) else header
    return struct.pack("<Q", len(head) if length is None else length) + head + data


def refusal(header: str | bytes, data_size: int) -> str:
    """The one line the check writes for a header it refuses."""
    raw = header.encode("utf-8") if isinstance(header, str) else header
    with pytest.raises(ShardError) as refused:
        parse_safetensors_header(raw, data_size, SHARD)
    return str(refused.value)


def entry(**change: object) -> str:
    return json.dumps({"a": {**A2, **change}})


# --- headers: what is read ----------------------------------------------------------------


def test_a_header_gives_each_tensors_dtype_and_shape_in_its_shard() -> None:
    header = {
        "__metadata__": {"format": "pt"},
        "b": {"dtype": "F32", "shape": [2, 3], "data_offsets": [2, 26]},
        "a": A2,
        "c": {"dtype": "F4", "shape": [2, 0], "data_offsets": [26, 26]},
    }
    assert parse_safetensors_header(json.dumps(header).encode(), 26, "x.safetensors") == {
        "a": TensorInfo("x.safetensors", "U8", (2,)),
        "b": TensorInfo("x.safetensors", "F32", (2, 3)),
        "c": TensorInfo("x.safetensors", "F4", (2, 0)),
    }


ACCEPTED: dict[str, tuple[str, dict[str, tuple[str, tuple[int, ...]]]]] = {
    # serde reads a unit enum variant written as a one-key map with null.
    "dtype as a map": (entry(dtype={"BF16": None}, shape=[1]), {"a": ("BF16", (1,))}),
    # The loader parses an unknown field but ignores it, up to its nesting limit.
    "unknown field": (entry(extra={"k": [1, 2, None]}), {"a": ("U8", (2,))}),
    "unknown field 125 lists deep": (entry(x="D").replace('"D"', "[" * 125 + "]" * 125), {"a": ("U8", (2,))}),
    "unknown field 125 objects deep": (
        entry(x="D").replace('"D"', '{"y":' * 125 + "1" + "}" * 125),
        {"a": ("U8", (2,))},
    ),
    # A repeated tensor name: the last one counts.
    "repeated name": (
        '{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"a":' + json.dumps(A2) + "}",
        {"a": ("U8", (2,))},
    ),
    "null metadata": ('{"__metadata__":null,"a":' + json.dumps(A2) + "}", {"a": ("U8", (2,))}),
    # "-0" in a name is no number: only the literal -0 is refused.
    "minus zero in a name": ('{"layer-0":' + json.dumps(A2) + "}", {"layer-0": ("U8", (2,))}),
    "surrogate pair escape": ('{"\\ud83d\\ude00":' + json.dumps(A2) + "}", {"\U0001f600": ("U8", (2,))}),
    # Tensors lie in the data section in offset order, whatever their names.
    "names out of offset order": (
        json.dumps({"b": A2, "a": {**A2, "shape": [1, 2], "data_offsets": [2, 4]}}),
        {"b": ("U8", (2,)), "a": ("U8", (1, 2))},
    ),
}


@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_headers_the_loader_accepts_are_read(case: str) -> None:
    header, found = ACCEPTED[case]
    size = 4 if case == "names out of offset order" else 2
    assert parse_safetensors_header(header.encode(), size, SHARD) == {
        name: TensorInfo(SHARD, dtype, shape) for name, (dtype, shape) in found.items()
    }


def test_sizes_beyond_float_precision_are_compared_exactly() -> None:
    """2**60 + 1 bytes: a float would round it to 2**60 and refuse a valid (sparse) shard."""
    size = 2**60 + 1
    header = json.dumps({"a": {"dtype": "U8", "shape": [size], "data_offsets": [0, size]}})
    assert parse_safetensors_header(header.encode(), size, SHARD) == {"a": TensorInfo(SHARD, "U8", (size,))}


def test_a_gc_pause_does_not_outlive_the_parse() -> None:
    """Parsing turns the collector off for speed; it is on again afterwards, refused or not."""
    import gc

    assert gc.isenabled()
    parse_safetensors_header(entry().encode(), 2, SHARD)
    assert gc.isenabled()
    with pytest.raises(ShardError):
        parse_safetensors_header(b"[]", 0, SHARD)
    assert gc.isenabled()
    gc.disable()
    try:
        parse_safetensors_header(entry().encode(), 2, SHARD)
        assert not gc.isenabled()  # a caller's choice is kept
    finally:
        gc.enable()


# --- headers: the line for each refusal ------------------------------------------------------

KNOWN = (
    "BOOL, F4, F6_E2M3, F6_E3M2, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ, "
    "I16, U16, F16, BF16, I32, U32, F32, C64, F64, I64, U64"
)
DEEP = "[" * 126 + "]" * 126
UNREAD = "header is not JSON the loader reads"
NOT_U64 = "is not a non-negative integer below 2**64"
GAP = "overlapping, out of order or leaving a gap"

REFUSALS: dict[str, tuple[str | bytes, int, str]] = {
    "not UTF-8": (b'{"a\xff":1}', 0, "header is not UTF-8 (byte 0xff at offset 3)"),
    "cut JSON": ('{"a":', 0, "header is not JSON (Expecting value at offset 5)"),
    "trailing garbage": ("{} x", 0, "header is not JSON (Extra data at offset 3)"),
    "NaN": ('{"a":{"dtype":"U8","shape":[NaN],"data_offsets":[0,2]}}', 2, f"{UNREAD} (NaN is not JSON)"),
    "Infinity": ("[-Infinity]", 0, "header is not JSON the loader reads (-Infinity is not JSON)"),
    "1e400": ('{"x":1e400}', 0, "header is not JSON the loader reads (number 1e400 out of range)"),
    # A long number is cut to its first 24 characters.
    "1e430 in 34 characters": (
        '{"x":1' + "0" * 30 + "e400}",
        0,
        "header is not JSON the loader reads (number 1" + "0" * 23 + " out of range)",
    ),
    "nested 100k": ("[" * 100_000 + "]" * 100_000, 0, f"{UNREAD} (nested more than 127 levels deep)"),
    "lone surrogate": ('{"\\ud800":1}', 0, "header is not JSON the loader reads (a lone surrogate escape in a string)"),
    "lone surrogate in metadata": (
        '{"__metadata__":{"k":"\\uDFFF"}}',
        0,
        "header is not JSON the loader reads (a lone surrogate escape in a string)",
    ),
    "an array": ("[]", 0, "header is not a JSON object"),
    "metadata twice": ('{"__metadata__":{},"__metadata__":{}}', 0, "__metadata__ given twice"),
    "metadata a list": ('{"__metadata__":[]}', 0, "__metadata__ is not an object of strings"),
    "metadata with a number": ('{"__metadata__":{"format":"pt","n":1}}', 0, "__metadata__ is not an object of strings"),
    "metadata a repeated key with a number": (
        '{"__metadata__":{"k":1,"k":"a"}}',
        0,
        "__metadata__ is not an object of strings",
    ),
    "tensor null": ('{"a":null}', 0, "tensor 'a': not an object with dtype, shape and data_offsets"),
    "shape twice": (
        '{"a":{"dtype":"U8","shape":[2],"shape":[2],"data_offsets":[0,2]}}',
        2,
        "tensor 'a': shape given twice",
    ),
    "dtype and offsets twice": (
        '{"a":{"dtype":"U8","dtype":"U8","shape":[2],"data_offsets":[0,2],"data_offsets":[0,2]}}',
        2,
        "tensor 'a': data_offsets given twice",
    ),
    "no dtype": (json.dumps({"a": {"shape": [2]}}), 2, "tensor 'a': no dtype"),
    "no shape": (json.dumps({"a": {"dtype": "U8", "data_offsets": [0, 2]}}), 2, "tensor 'a': no shape"),
    "no offsets": (json.dumps({"a": {"dtype": "U8", "shape": [2]}}), 2, "tensor 'a': no data_offsets"),
    "unknown field 126 deep": (
        entry(x="D").replace('"D"', DEEP), 2, "tensor 'a': field 'x' nested more than 127 levels deep"
    ),
    "unknown field 126 objects deep": (
        entry(x="D").replace('"D"', '{"y":' * 126 + "1" + "}" * 126),
        2,
        "tensor 'a': field 'x' nested more than 127 levels deep",
    ),
    "unknown field huge number": (
        '{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"x":[-1' + "0" * 400 + "]}}",
        2,
        "tensor 'a': field 'x' holds a number out of range",
    ),
    "dtype a map with a value": (entry(dtype={"U8": []}), 2, "tensor 'a': dtype {'U8': []} is not a dtype"),
    "dtype a map with a repeated key": (
        '{"a":{"dtype":{"U8":null,"U8":null},"shape":[2],"data_offsets":[0,2]}}',
        2,
        f"tensor 'a': unknown dtype {{'U8': None}} (safetensors knows {KNOWN})",
    ),
    "dtype lower case": (entry(dtype="u8"), 2, f"tensor 'a': unknown dtype 'u8' (safetensors knows {KNOWN})"),
    "dtype a two-key map": (
        entry(dtype={"U8": None, "I8": None}),
        2,
        f"tensor 'a': unknown dtype {{'U8': None, 'I8': None}} (safetensors knows {KNOWN})",
    ),
    "shape a number": (entry(shape=2), 2, "tensor 'a': shape 2 is not a list"),
    "shape entry a string": (entry(shape=["abc"]), 2, f"tensor 'a': shape entry 'abc' {NOT_U64}"),
    "shape entry negative": (entry(shape=[-1]), 2, f"tensor 'a': shape entry -1 {NOT_U64}"),
    "shape entry 2**64": (entry(shape=[2**64]), 2, f"tensor 'a': shape entry {2**64} {NOT_U64}"),
    "shape entry true": (entry(shape=[True]), 2, f"tensor 'a': shape entry True {NOT_U64}"),
    "shape entry minus zero": (
        '{"a":{"dtype":"U8","shape":[-0],"data_offsets":[0,0]}}',
        0,
        "tensor 'a': shape entry -0 is not a non-negative integer below 2**64",
    ),
    "shape entry a long number": (
        entry(shape=[10**50]),
        2,
        f"tensor 'a': shape entry 10000000000000000000000000000000...(51 chars) {NOT_U64}",
    ),
    # A value is shown whole up to 40 characters, then cut.
    "shape entry of 40 characters": (
        entry(shape=["x" * 38]),
        2,
        f"tensor 'a': shape entry '{'x' * 38}' is not a non-negative integer below 2**64",
    ),
    "shape entry of 41 characters": (
        entry(shape=["x" * 39]),
        2,
        f"tensor 'a': shape entry '{'x' * 31}...(41 chars) is not a non-negative integer below 2**64",
    ),
    "offsets of three": (entry(data_offsets=[0, 2, 2]), 2, "tensor 'a': data_offsets [0, 2, 2] is not [start, end]"),
    "offsets an object": (entry(data_offsets={"0": 0}), 2, "tensor 'a': data_offsets {'0': 0} is not [start, end]"),
    "offset a float": (
        entry(data_offsets=[0, 2.0]),
        2,
        "tensor 'a': data_offsets entry 2.0 is not a non-negative integer below 2**64",
    ),
    "offset negative": (
        entry(data_offsets=[-2, 0]),
        0,
        "tensor 'a': data_offsets entry -2 is not a non-negative integer below 2**64",
    ),
    "overlap": (
        json.dumps({"a": A2, "b": {**A2, "data_offsets": [1, 3]}}),
        3,
        f"tensor 'b': data_offsets [1, 3] do not start where the previous tensor ends (2): {GAP}",
    ),
    "gap": (
        json.dumps({"a": A2, "b": {**A2, "data_offsets": [3, 5]}}),
        5,
        f"tensor 'b': data_offsets [3, 5] do not start where the previous tensor ends (2): {GAP}",
    ),
    "start after end": (
        json.dumps({"a": {**A2, "data_offsets": [0, 2]}, "b": {**A2, "shape": [0], "data_offsets": [2, 1]}}),
        2,
        f"tensor 'b': data_offsets [2, 1] do not start where the previous tensor ends (2): {GAP}",
    ),
    "shape overflows": (
        entry(shape=[2**32, 2**32, 0], data_offsets=[0, 0]),
        0,
        f"tensor 'a': shape [{2**32}, {2**32}, 0] overflows 64 bits",
    ),
    "bits overflow": (
        entry(shape=[2**62], dtype="F64", data_offsets=[0, 2**62]),
        0,
        f"tensor 'a': shape [{2**62}] of F64 overflows 64 bits",
    ),
    # 2**64 - 1 is a valid shape entry; the size it makes is not.
    "largest shape entry": (
        entry(shape=[2**64 - 1], data_offsets=[0, 0]),
        0,
        f"tensor 'a': shape [{2**64 - 1}] of U8 overflows 64 bits",
    ),
    "largest shape entry and an unknown field": (
        entry(shape=[2**64 - 1], data_offsets=[0, 2**64 - 1], x=1),
        0,
        f"tensor 'a': shape [{2**64 - 1}] of U8 overflows 64 bits",
    ),
    "half a byte": (entry(shape=[3], dtype="F4"), 2, "tensor 'a': 3 F4 elements do not fill whole bytes"),
    "size disagrees": (entry(shape=[3]), 2, "tensor 'a': data_offsets [0, 2] hold 2 bytes, shape [3] of U8 needs 3"),
    "size disagrees, second tensor": (
        json.dumps({"a": A2, "b": {**A2, "shape": [3], "data_offsets": [2, 4]}}),
        4,
        "tensor 'b': data_offsets [2, 4] hold 2 bytes, shape [3] of U8 needs 3",
    ),
    "size disagrees, wider dtype": (
        entry(shape=[2], dtype="BF16"),
        2,
        "tensor 'a': data_offsets [0, 2] hold 2 bytes, shape [2] of BF16 needs 4",
    ),
    "data cut": (entry(), 1, "the data section is 1 bytes, the header's offsets need exactly 2 (truncated file)"),
    "trailing bytes": (entry(), 3, "the data section is 3 bytes, the header's offsets need exactly 2 (trailing bytes)"),
    "nothing but data": ("{}", 1, "the data section is 1 bytes, the header's offsets need exactly 0 (trailing bytes)"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_a_refused_header_is_one_line_naming_shard_tensor_and_rule(case: str) -> None:
    header, data_size, reason = REFUSALS[case]
    assert refusal(header, data_size) == f"{SHARD}: {reason}"


def test_a_huge_integer_is_refused_with_the_first_line_of_pythons_reason() -> None:
    message = refusal('{"a":{"dtype":"U8","shape":[' + "9" * 5000 + '],"data_offsets":[0,2]}}', 2)
    assert message.startswith(f"{SHARD}: header is not JSON the loader reads (Exceeds the limit (4300 digits)")
    assert "\n" not in message and message.endswith(")")


# --- files --------------------------------------------------------------------------------


def test_a_file_written_by_safetensors_is_read_with_its_label(tmp_path: Path) -> None:
    path = tmp_path / "model-00001-of-00002.safetensors"
    save_file({"w": numpy.zeros((3, 2), dtype=numpy.float16), "b": numpy.zeros(5, dtype=numpy.int64)}, path)
    assert read_safetensors_header(path) == {
        "w": TensorInfo(path.name, "F16", (3, 2)),
        "b": TensorInfo(path.name, "I64", (5,)),
    }
    assert read_safetensors_header(path, label="shown")["w"] == TensorInfo("shown", "F16", (3, 2))


@pytest.mark.parametrize(
    "content, reason",
    [
        (b"", "0 bytes, shorter than a safetensors header length"),
        (b"\x02\x00\x00\x00\x00\x00\x00", "7 bytes, shorter than a safetensors header length"),
        (raw_file("{}", length=100_000_001), "header length 100000001 is over safetensors' limit of 100000000"),
        (raw_file("{}", length=2**64 - 1), f"header length {2**64 - 1} is over safetensors' limit of 100000000"),
        (raw_file("{}", length=3), "header length 3 runs past the end of the file (10 bytes)"),
        (raw_file("{}  ", length=12), "header length 12 runs past the end of the file (12 bytes)"),
        (raw_file(entry(), b"x"), "the data section is 1 bytes, the header's offsets need exactly 2 (truncated file)"),
    ],
    ids=["empty", "7 bytes", "over the limit", "2^64-1", "past the end", "one past the end", "data cut"],
)
def test_a_file_the_loader_refuses_is_one_line_naming_it(tmp_path: Path, content: bytes, reason: str) -> None:
    path = tmp_path / "model-00002-of-00002.safetensors"
    path.write_bytes(content)
    with pytest.raises(ShardError) as refused:
        read_safetensors_header(path)
    assert str(refused.value) == f"{path.name}: {reason}"


def test_a_one_byte_header_is_read_and_refused_as_json(tmp_path: Path) -> None:
    path = tmp_path / SHARD
    path.write_bytes(raw_file("{"))
    with pytest.raises(ShardError) as refused:
        read_safetensors_header(path)
    reason = "header is not JSON (Expecting property name enclosed in double quotes at offset 1)"
    assert str(refused.value) == f"{SHARD}: {reason}"


def test_a_header_longer_than_one_read_is_read_whole(tmp_path: Path) -> None:
    """Headers are read in 16 MiB pieces; a 17 MiB one (JSON whitespace first) comes back intact."""
    path = tmp_path / SHARD
    path.write_bytes(raw_file(" " * (17 << 20) + entry(), b"xx"))
    assert read_safetensors_header(path) == {"a": TensorInfo(SHARD, "U8", (2,))}


def test_a_header_of_exactly_the_limit_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The limit is inclusive; shown with a limit of 16 bytes rather than writing 100 MB."""
    from recipe.export import shards

    monkeypatch.setattr(shards, "MAX_HEADER_BYTES", 16)
    path = tmp_path / SHARD
    path.write_bytes(raw_file("{}" + " " * 14))
    assert read_safetensors_header(path) == {}
    path.write_bytes(raw_file("{}" + " " * 15))
    with pytest.raises(ShardError) as refused:
        read_safetensors_header(path)
    assert str(refused.value) == f"{SHARD}: header length 17 is over safetensors' limit of 16"


def test_a_header_of_exactly_the_file_is_read(tmp_path: Path) -> None:
    """Header length + 8 == file size: no data section, no tensors, nothing wrong."""
    path = tmp_path / SHARD
    path.write_bytes(raw_file("{}  "))
    assert read_safetensors_header(path) == {}


def test_what_is_not_a_regular_file_is_never_opened(tmp_path: Path) -> None:
    (tmp_path / "dir.safetensors").mkdir()
    os.mkfifo(tmp_path / "fifo.safetensors")
    for name in ("dir.safetensors", "fifo.safetensors"):
        with pytest.raises(ShardError) as refused:
            read_safetensors_header(tmp_path / name)
        assert str(refused.value) == f"{name}: not a regular file (not read)"
    with pytest.raises(ShardError) as refused:
        read_safetensors_header(tmp_path / "gone.safetensors", label="gone")
    assert str(refused.value) == "gone: cannot open (No such file or directory)"


@pytest.fixture
def no_hang() -> Iterator[None]:
    """Fail (instead of hanging the suite) if something blocks on a FIFO."""

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError("blocked for 20 s: a FIFO was opened without O_NONBLOCK")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def test_a_fifo_swapped_in_after_the_check_is_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_hang: None
) -> None:
    """Between the type check and the open a file may become a FIFO: the open must not block on it."""
    from recipe.export import shards

    regular = tmp_path / "regular"
    regular.write_bytes(b"")
    fifo = tmp_path / "swapped.safetensors"
    os.mkfifo(fifo)
    real_stat = os.stat

    def stat_before_the_swap(path: object, *args: object, **kwargs: object) -> os.stat_result:
        return real_stat(regular if Path(str(path)) == fifo else path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(shards.os, "stat", stat_before_the_swap)
    with pytest.raises(ShardError) as refused:
        read_safetensors_header(fifo)
    assert str(refused.value) == "swapped.safetensors: not a regular file (not read)"


def test_a_read_error_is_one_line_naming_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A disk that fails mid-read (EIO) gives the shard's or the index's line, not a traceback."""
    from recipe.export import shards

    save(tmp_path, SHARD, a=(2,))
    write_index(tmp_path, {"a": SHARD})

    def failing_pread(fd: int, size: int, offset: int) -> bytes:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(shards.os, "pread", failing_pread)
    assert read_checkpoint(tmp_path).errors == [
        f"{INDEX_NAME}: cannot read (Input/output error)",
        f"{SHARD}: cannot read (Input/output error)",
    ]


def test_a_shard_that_shrinks_while_read_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from recipe.export import shards

    path = tmp_path / SHARD
    path.write_bytes(raw_file(entry(), b"xx"))
    real_pread = os.pread

    def cut_after_the_length(fd: int, size: int, offset: int) -> bytes:
        return real_pread(fd, size, offset) if offset < 8 else b""

    monkeypatch.setattr(shards.os, "pread", cut_after_the_length)
    with pytest.raises(ShardError) as refused:
        read_safetensors_header(path)
    assert str(refused.value) == f"{SHARD}: header cut short (the file shrank while it was read)"


# --- which files of a directory may be opened ---------------------------------------------


@pytest.mark.parametrize("name", ["", ".", "..", "a/b.safetensors", "a\\b", "/etc/passwd", "a\0b", "x\n.safetensors"])
def test_only_plain_file_names_are_resolved(tmp_path: Path, name: str) -> None:
    with pytest.raises(ShardError) as refused:
        resolve_member(tmp_path, name, allowed_roots(tmp_path), "absent")
    assert str(refused.value) == f"{name!r}: not a plain file name inside the checkpoint directory (not opened)"


def test_resolving_files_and_symlinks_of_a_directory(tmp_path: Path) -> None:
    export = tmp_path / "export"
    (export / "store").mkdir(parents=True)
    (export / "plain").write_text("x")
    (export / "store" / "real").write_text("x")
    (export / "inside").symlink_to(Path("store") / "real")
    (tmp_path / "secret").write_text("x")
    (export / "outside").symlink_to(tmp_path / "secret")
    (export / "dangling").symlink_to(export / "nothing")
    roots = allowed_roots(export)
    assert roots == (export.resolve(),)
    assert resolve_member(export, "plain", roots, "absent") == export / "plain"
    assert resolve_member(export, "inside", roots, "absent") == (export / "store" / "real").resolve()
    refusals = {}
    for name in ("outside", "dangling", "missing"):
        with pytest.raises(ShardError) as refused:
            resolve_member(export, name, roots, "named by the index but not on disk")
        refusals[name] = str(refused.value)
    assert refusals == {
        "outside": (
            f"outside: a symlink to {str((tmp_path / 'secret').resolve())!r}, outside the checkpoint directory "
            "and not a Hugging Face cache blob (not opened)"
        ),
        "dangling": "dangling: a symlink whose target does not exist",
        "missing": "missing: named by the index but not on disk",
    }


def test_a_name_the_filesystem_refuses_is_one_line(tmp_path: Path) -> None:
    name = "a" * 300 + ".safetensors"
    with pytest.raises(ShardError) as refused:
        resolve_member(tmp_path, name, allowed_roots(tmp_path), "absent")
    assert str(refused.value) == f"{name}: cannot read (File name too long)"


def hub_repo(tmp_path: Path, name: str = "models--Org--Tiny", blobs: bool = True) -> Path:
    """`<cache>/models--Org--Tiny/snapshots/<revision>`: the Hugging Face cache layout."""
    snapshot = tmp_path / "hub" / name / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    if blobs:
        (tmp_path / "hub" / name / "blobs").mkdir()
    return snapshot


def test_a_hugging_face_cache_snapshot_may_point_into_its_own_blobs(tmp_path: Path) -> None:
    snapshot = hub_repo(tmp_path)
    blobs = snapshot.parent.parent / "blobs"
    assert allowed_roots(snapshot) == (snapshot.resolve(), blobs.resolve())
    # A subfolder of a snapshot belongs to the same repository.
    (snapshot / "sub").mkdir()
    assert allowed_roots(snapshot / "sub") == ((snapshot / "sub").resolve(), blobs.resolve())
    (blobs / "abc").write_text("x")
    (snapshot / "config.json").symlink_to(Path("..") / ".." / "blobs" / "abc")
    assert resolve_member(snapshot, "config.json", allowed_roots(snapshot), "absent") == (blobs / "abc").resolve()


@pytest.mark.parametrize("layout", ["not a models-- repository", "no blobs folder"])
def test_only_a_real_cache_repository_adds_its_blobs(tmp_path: Path, layout: str) -> None:
    if layout == "no blobs folder":
        snapshot = hub_repo(tmp_path, blobs=False)
    else:
        snapshot = hub_repo(tmp_path, name="datasets--Org--Tiny")
    assert allowed_roots(snapshot) == (snapshot.resolve(),)


# --- a whole checkpoint directory -------------------------------------------------------------


def save(directory: Path, name: str, **tensors: tuple[int, ...]) -> None:
    save_file({tensor: numpy.zeros(shape, dtype=numpy.float32) for tensor, shape in tensors.items()}, directory / name)


def write_index(directory: Path, weight_map: object) -> None:
    (directory / INDEX_NAME).write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))


def test_a_checkpoint_is_its_shards_and_its_index(tmp_path: Path) -> None:
    save(tmp_path, "model-00001-of-00002.safetensors", a=(2,), b=(1, 3))
    save(tmp_path, "model-00002-of-00002.safetensors", c=(4,))
    (tmp_path / "notes.txt").write_text("not a shard")
    weight_map = {"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors"}
    weight_map["c"] = "model-00002-of-00002.safetensors"
    write_index(tmp_path, weight_map)
    assert read_checkpoint(tmp_path) == CheckpointContents(
        tensors={
            "a": TensorInfo("model-00001-of-00002.safetensors", "F32", (2,)),
            "b": TensorInfo("model-00001-of-00002.safetensors", "F32", (1, 3)),
            "c": TensorInfo("model-00002-of-00002.safetensors", "F32", (4,)),
        },
        index=weight_map,
        shard_names=["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"],
        errors=[],
    )


def test_a_shard_the_index_does_not_name_is_read_too(tmp_path: Path) -> None:
    """A stale shard beside the indexed ones: its tensors are read (the report calls them unindexed)."""
    save(tmp_path, "model-00001-of-00001.safetensors", a=(2,))
    save(tmp_path, "stale.safetensors", old=(2,))
    write_index(tmp_path, {"a": "model-00001-of-00001.safetensors"})
    contents = read_checkpoint(tmp_path)
    assert contents.shard_names == ["model-00001-of-00001.safetensors", "stale.safetensors"]
    assert contents.tensors["old"] == TensorInfo("stale.safetensors", "F32", (2,))


def test_a_shard_symlinked_inside_the_directory_keeps_its_own_name(tmp_path: Path) -> None:
    """The index names the link, so the tensors are found in the link's name, not the target's."""
    (tmp_path / "store").mkdir()
    save(tmp_path / "store", "blob", a=(2,))
    (tmp_path / SHARD).symlink_to(Path("store") / "blob")
    write_index(tmp_path, {"a": SHARD})
    contents = read_checkpoint(tmp_path)
    assert (contents.tensors, contents.errors) == ({"a": TensorInfo(SHARD, "F32", (2,))}, [])


def test_without_index_every_safetensors_file_is_read(tmp_path: Path) -> None:
    save(tmp_path, "model.safetensors", a=(2,))
    save(tmp_path, "extra.safetensors", b=(2,))
    contents = read_checkpoint(tmp_path)
    assert (contents.index, contents.errors) == (None, [])
    assert contents.shard_names == ["extra.safetensors", "model.safetensors"]
    assert sorted(contents.tensors) == ["a", "b"]


def test_a_tensor_in_two_shards_is_kept_from_the_first_and_reported(tmp_path: Path) -> None:
    save(tmp_path, "a.safetensors", w=(2,))
    # The repeated tensor first: the shard's other tensors are still read.
    header = {"w": {**A2, "shape": [3], "data_offsets": [0, 3]}, "z": {**A2, "data_offsets": [3, 5]}}
    (tmp_path / "b.safetensors").write_bytes(raw_file(json.dumps(header), b"xxxxx"))
    contents = read_checkpoint(tmp_path)
    assert contents.tensors == {
        "w": TensorInfo("a.safetensors", "F32", (2,)),
        "z": TensorInfo("b.safetensors", "U8", (2,)),
    }
    assert contents.errors == ["w: in two shards (a.safetensors, b.safetensors)"]


def test_shards_named_by_the_index_are_read_and_missing_ones_reported(tmp_path: Path) -> None:
    """The index may name a shard without the .safetensors suffix: it is read too."""
    save(tmp_path, "weights.bin", a=(2,))
    write_index(tmp_path, {"a": "weights.bin", "b": "gone.safetensors", "c": "gone.safetensors"})
    contents = read_checkpoint(tmp_path)
    assert contents.shard_names == ["gone.safetensors", "weights.bin"]
    assert contents.tensors == {"a": TensorInfo("weights.bin", "F32", (2,))}
    assert contents.errors == ["gone.safetensors: named by the index but not on disk"]


def test_index_names_that_are_not_plain_file_names_are_never_opened(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    save(outside, "secret.safetensors", secret=(2,))
    export = tmp_path / "export"
    export.mkdir()
    save(export, "model.safetensors", a=(2,))
    secret = "../outside/secret.safetensors"
    write_index(export, {"a": "model.safetensors", "x": secret, "y": secret})
    contents = read_checkpoint(export)
    assert contents.shard_names == ["model.safetensors"]
    assert "secret" not in contents.tensors
    assert contents.errors == [
        (
            f"{INDEX_NAME}: weight_map names '../outside/secret.safetensors' for 2 tensor(s): not a plain file name "
            "inside the checkpoint directory (not opened)"
        )
    ]


def test_an_empty_weight_map_names_no_shard(tmp_path: Path) -> None:
    save(tmp_path, "model.safetensors", a=(2,))
    write_index(tmp_path, {})
    contents = read_checkpoint(tmp_path)
    assert (contents.index, contents.shard_names, contents.errors) == ({}, ["model.safetensors"], [])


@pytest.mark.parametrize(
    "content, reason",
    [
        (b"\xff{}", "not UTF-8 (byte at offset 0)"),
        (b"[" * 100_000 + b"]" * 100_000, "JSON nested too deeply to read"),
        (b"", "not JSON (Expecting value: line 1 column 1 (char 0))"),
        (b'{"weight_map": {"a": 1}}', "no weight_map of tensor name -> shard file"),
        (b'{"weight_map": ["a"]}', "no weight_map of tensor name -> shard file"),
        (b'["weight_map"]', "no weight_map of tensor name -> shard file"),
        (b"{}", "no weight_map of tensor name -> shard file"),
    ],
    ids=["not UTF-8", "nested", "empty", "a number for a shard", "a list", "an array", "no weight_map"],
)
def test_an_unusable_index_is_one_error_and_the_shards_are_still_read(
    tmp_path: Path, content: bytes, reason: str
) -> None:
    save(tmp_path, "model-00001-of-00001.safetensors", a=(2,))
    (tmp_path / INDEX_NAME).write_bytes(content)
    contents = read_checkpoint(tmp_path)
    assert contents.errors == [f"{INDEX_NAME}: {reason}"]
    assert contents.index is None
    assert contents.tensors == {"a": TensorInfo("model-00001-of-00001.safetensors", "F32", (2,))}


def test_an_index_too_large_to_be_one_is_not_read(tmp_path: Path) -> None:
    with (tmp_path / INDEX_NAME).open("wb") as handle:
        handle.truncate(MAX_INDEX_BYTES + 1)  # sparse: nothing is written, nothing is read
    assert read_checkpoint(tmp_path).errors == [
        f"{INDEX_NAME}: {MAX_INDEX_BYTES + 1} bytes, too large for an index (limit {MAX_INDEX_BYTES})"
    ]


def test_an_index_of_exactly_the_limit_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The limit is inclusive; shown with a limit of 16 bytes rather than reading 256 MiB."""
    from recipe.export import shards

    monkeypatch.setattr(shards, "MAX_INDEX_BYTES", 16)
    (tmp_path / INDEX_NAME).write_text('{"weight_map":{}}')  # 17 bytes
    assert read_checkpoint(tmp_path).errors == [f"{INDEX_NAME}: 17 bytes, too large for an index (limit 16)"]
    (tmp_path / INDEX_NAME).write_text('{"weight_map":{}')  # 16 bytes: read, and cut
    assert read_checkpoint(tmp_path).errors == [
        f"{INDEX_NAME}: not JSON (Expecting ',' delimiter: line 1 column 17 (char 16))"
    ]


def test_an_index_symlinked_out_or_not_a_file_is_an_error(tmp_path: Path) -> None:
    export = tmp_path / "export"
    export.mkdir()
    write_index(tmp_path, {})
    (export / INDEX_NAME).symlink_to(tmp_path / INDEX_NAME)
    assert read_checkpoint(export).errors == [
        (
            f"{INDEX_NAME}: a symlink to {str((tmp_path / INDEX_NAME).resolve())!r}, outside the checkpoint directory "
            "and not a Hugging Face cache blob (not opened)"
        )
    ]
    (export / INDEX_NAME).unlink()
    (export / INDEX_NAME).mkdir()
    assert read_checkpoint(export).errors == [f"{INDEX_NAME}: not a regular file (not read)"]


def test_a_directory_that_cannot_be_listed_is_one_error(tmp_path: Path) -> None:
    file = tmp_path / "hf"
    file.write_text("not a directory")
    assert read_checkpoint(file).errors == ["hf: cannot list (Not a directory)"]


def test_an_unreadable_shard_is_one_error_and_the_others_are_read(tmp_path: Path) -> None:
    save(tmp_path, "a.safetensors", a=(2,))
    (tmp_path / "b.safetensors").write_bytes(raw_file("[]"))
    contents = read_checkpoint(tmp_path)
    assert contents.errors == ["b.safetensors: header is not a JSON object"]
    assert contents.tensors == {"a": TensorInfo("a.safetensors", "F32", (2,))}
    assert contents.shard_names == ["a.safetensors", "b.safetensors"]
