"""Hostile safetensors headers: the check must be exactly as strict as the `safetensors` loader.

The `safetensors` library is the oracle: for any bytes, `safe_open` refusing the file
means the check reports the shard as unreadable (ShardError, hence BROKEN), and
`safe_open` accepting it means the check reads the same tensors, dtypes and shapes.
Neither side may raise anything else (a traceback is a bug). The check still reads
the header only: a file whose data section is 65 GB of holes is checked at once.
"""

from __future__ import annotations

import json
import math
import struct
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open

from recipe.export.safetensors_header import DTYPE_BITS, ShardError, TensorInfo
from recipe.export.shards import read_safetensors_header

U64_MAX = 2**64 - 1
#: The dtypes safetensors 0.8 accepts (its error message for an unknown one lists them).
ORACLE_DTYPES = [
    *("BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ"),
    *("F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64", "F64", "I64", "U64"),
]


def raw_file(header: str | bytes, data: bytes = b"", length: int | None = None) -> bytes:
    """A safetensors file: 8-byte little-endian header length, the header, the data section."""
    head = header.encode("utf-8") if isinstance(header, str) else header
    return struct.pack("<Q", len(head) if length is None else length) + head + data


def loader_view(path: Path) -> dict[str, tuple[str, tuple[int, ...]]] | None:
    """What safetensors itself reads from `path`: {name: (dtype, shape)}, or None when it refuses."""
    try:
        with safe_open(str(path), framework="numpy") as handle:
            return {
                name: (handle.get_slice(name).get_dtype(), tuple(handle.get_slice(name).get_shape()))
                for name in handle.keys()  # noqa: SIM118 - a safe_open handle is not a dict
            }
    except Exception:  # noqa: BLE001 - any refusal of the loader is a refusal
        return None


def checker_view(path: Path) -> dict[str, tuple[str, tuple[int, ...]]] | None:
    """What the export check reads from `path`; None when it reports the shard unreadable."""
    try:
        found = read_safetensors_header(path)
    except ShardError as error:
        text = str(error)
        assert text and "\n" not in text and text.isprintable(), f"not one clear line: {text!r}"
        return None
    return {name: (info.dtype, info.shape) for name, info in found.items()}


def assert_agrees(path: Path, content: bytes) -> dict[str, tuple[str, tuple[int, ...]]] | None:
    path.write_bytes(content)
    expected = loader_view(path)
    assert checker_view(path) == expected, f"loader {'refuses' if expected is None else 'accepts'} {content[:300]!r}"
    return expected


@pytest.fixture
def shard(tmp_path: Path) -> Path:
    return tmp_path / "model.safetensors"


def test_dtype_table_is_the_loaders(shard: Path) -> None:
    """Every dtype the installed safetensors knows is known to the check, with the same bit size."""
    assert sorted(DTYPE_BITS) == sorted(ORACLE_DTYPES)
    for dtype, bits in DTYPE_BITS.items():
        count = 8 // math.gcd(8, bits)  # the fewest elements that fill whole bytes
        header = {"t": {"dtype": dtype, "shape": [count], "data_offsets": [0, count * bits // 8]}}
        assert assert_agrees(shard, raw_file(json.dumps(header), b"\0" * (count * bits // 8))) is not None


T2 = {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}


def entry(**change: Any) -> str:
    return json.dumps({"a": {**T2, **change}})


# Each: (header text or bytes, data). The loader decides; the check must agree.
CASES: dict[str, tuple[str | bytes, bytes]] = {
    # issue 11, item 9
    "valid": (entry(), b"xx"),
    "data cut to header + 1 byte": (entry(), b"x"),
    "offsets beyond the end of the file": (entry(data_offsets=[0, 4], shape=[4]), b"xx"),
    "overlapping offsets": (
        json.dumps({"a": T2, "b": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}}),
        b"xxx",
    ),
    "gap between tensors": (
        json.dumps({"a": T2, "b": {"dtype": "U8", "shape": [2], "data_offsets": [3, 5]}}),
        b"xxxxx",
    ),
    "negative offsets": (entry(data_offsets=[-2, 0]), b""),
    "unknown dtype": (entry(dtype="Q8"), b"xx"),
    "lower-case dtype": (entry(dtype="u8"), b"xx"),
    "float shape": (entry(shape=[2.0]), b"xx"),
    "size disagrees with shape": (entry(shape=[3]), b"xx"),
    "trailing bytes after the data": (entry(), b"xxx"),
    # issue 11, item 10
    "string shape": (entry(shape=["abc"]), b"xx"),
    "null shape entry": (entry(shape=[None]), b"xx"),
    "nested shape": (entry(shape=[[2]]), b"xx"),
    "Infinity shape": ('{"a":{"dtype":"U8","shape":[Infinity],"data_offsets":[0,2]}}', b"xx"),
    "NaN shape": ('{"a":{"dtype":"U8","shape":[NaN],"data_offsets":[0,2]}}', b"xx"),
    "bool shape": (entry(shape=[True, True]), b"xx"),
    "shape not a list": (entry(shape=2), b"xx"),
    "minus zero in shape": ('{"a":{"dtype":"U8","shape":[-0,2],"data_offsets":[0,0]}}', b""),
    "exponent in shape": ('{"a":{"dtype":"U8","shape":[2e0],"data_offsets":[0,2]}}', b"xx"),
    "shape beyond u64": (entry(shape=[2**64], data_offsets=[0, 0]), b""),
    "shape product overflows before a 0": (entry(shape=[2**32, 2**32, 0], data_offsets=[0, 0]), b""),
    "bits overflow": (entry(shape=[2**62], dtype="F64", data_offsets=[0, 2**62]), b""),
    "odd number of 4-bit elements": (entry(shape=[3], dtype="F4"), b"xx"),
    "three data offsets": (entry(data_offsets=[0, 2, 2]), b"xx"),
    "offsets as an object": (entry(data_offsets={"0": 0, "1": 2}), b"xx"),
    "missing shape": (json.dumps({"a": {"dtype": "U8", "data_offsets": [0, 2]}}), b"xx"),
    "missing dtype": (json.dumps({"a": {"shape": [2], "data_offsets": [0, 2]}}), b"xx"),
    "null tensor": ('{"a":null}', b""),
    "header is an array": ("[]", b""),
    "header is true": ("true", b""),
    "empty header text": ("", b""),
    "empty object": ("{}", b""),
    "empty object then data": ("{}", b"x"),
    "scalar tensor": (entry(shape=[], data_offsets=[0, 1]), b"x"),
    "zero-size tensors share offsets": (
        json.dumps({"a": {**T2, "shape": [0], "data_offsets": [0, 0]}, "b": {**T2, "shape": [0], "data_offsets": [0, 0]}}),
        b"",
    ),
    "unknown field": (entry(extra=[[1]]), b"xx"),
    "duplicate known field": ('{"a":{"dtype":"U8","shape":[2],"shape":[2],"data_offsets":[0,2]}}', b"xx"),
    "duplicate unknown field": ('{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"x":1,"x":2}}', b"xx"),
    "duplicate tensor, last fits": (
        '{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}',
        b"xx",
    ),
    "duplicate tensor, last does not fit": (
        '{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}',
        b"xx",
    ),
    "duplicate tensor, first is null": ('{"a":null,"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}', b"xx"),
    "metadata null": ('{"__metadata__":null,"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}', b"xx"),
    "metadata only": ('{"__metadata__":{"format":"pt"}}', b""),
    "metadata twice": ('{"__metadata__":{},"__metadata__":{}}', b""),
    "metadata with a number": ('{"__metadata__":{"x":1}}', b""),
    "metadata a list": ('{"__metadata__":[]}', b""),
    "metadata duplicate keys": ('{"__metadata__":{"k":"a","k":"b"}}', b""),
    "dtype as a one-key map": (entry(dtype={"U8": None}), b"xx"),
    "dtype as a map with a list": (entry(dtype={"U8": []}), b"xx"),
    "dtype as a two-key map": (entry(dtype={"U8": None, "I8": None}), b"xx"),
    "dtype null": (entry(dtype=None), b"xx"),
    "leading and trailing JSON whitespace": (" \n\t\r" + entry() + "  \r\n\t", b"xx"),
    "trailing NUL": (entry() + "\0", b"xx"),
    "trailing form feed": (entry() + "\f", b"xx"),
    "trailing no-break space": (entry() + "\u00a0", b"xx"),
    "byte-order mark": (b"\xef\xbb\xbf" + entry().encode(), b"xx"),
    "invalid UTF-8": (b'{"a\xff":' + json.dumps(T2).encode() + b"}", b"xx"),
    "overlong UTF-8": (b'{"a\xc0\x80":' + json.dumps(T2).encode() + b"}", b"xx"),
    "UTF-8 encoded surrogate": (b'{"a\xed\xa0\x80":' + json.dumps(T2).encode() + b"}", b"xx"),
    "lone surrogate escape in a name": ('{"\\ud800":' + json.dumps(T2) + "}", b"xx"),
    "lone low surrogate escape": ('{"\\udc00":' + json.dumps(T2) + "}", b"xx"),
    "surrogate pair escape": ('{"\\ud83d\\ude00":' + json.dumps(T2) + "}", b"xx"),
    "lone surrogate in an unknown field": (entry(x="\ud800"), b"xx"),
    "lone surrogate in metadata": ('{"__metadata__":{"k":"\\ud800"}}', b""),
    "raw control character in a name": ('{"a\x01":' + json.dumps(T2) + "}", b"xx"),
    "escaped control character in a name": ('{"a\\u0001\\n\\u001b[2K":' + json.dumps(T2) + "}", b"xx"),
    "DEL in a name": ('{"a\x7f":' + json.dumps(T2) + "}", b"xx"),
    "1e400 in an unknown field": ('{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"x":1e400}}', b"xx"),
    "1e-400 in an unknown field": ('{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"x":1e-400}}', b"xx"),
    "huge integer in an unknown field": ('{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"x":' + "9" * 30 + "}}", b"xx"),
    "400-digit integer in an unknown field": (
        '{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"x":-' + "9" * 400 + "}}",
        b"xx",
    ),
    "5000-digit shape": ('{"a":{"dtype":"U8","shape":[' + "9" * 5000 + '],"data_offsets":[0,2]}}', b"xx"),
    "leading zero": ('{"a":{"dtype":"U8","shape":[02],"data_offsets":[0,2]}}', b"xx"),
    "plus sign": ('{"a":{"dtype":"U8","shape":[+2],"data_offsets":[0,2]}}', b"xx"),
    "invalid escape": ('{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"x":"\\q"}}', b"xx"),
    "unknown field 125 levels deep": (entry(x="DEEP").replace('"DEEP"', "[" * 125 + "]" * 125), b"xx"),
    "unknown field 126 levels deep": (entry(x="DEEP").replace('"DEEP"', "[" * 126 + "]" * 126), b"xx"),
    "unknown field 300 levels deep": (entry(x="DEEP").replace('"DEEP"', '{"y":' * 300 + "1" + "}" * 300), b"xx"),
    "header nested 100k levels": ("[" * 100_000 + "]" * 100_000, b""),
    "object nested 100k levels": ('{"a":' * 100_000 + "1" + "}" * 100_000, b""),
    "tensor nested 100k levels": ('{"a":' + "[" * 100_000 + "]" * 100_000 + "}", b""),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_quirk_agrees_with_the_loader(shard: Path, case: str) -> None:
    header, data = CASES[case]
    assert_agrees(shard, raw_file(header, data))


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"\x01\x00\x00",
        raw_file("{}", length=2**64 - 1),
        raw_file("{}", length=2**63),
        raw_file("{}", length=100_000_001),
        raw_file("{}", length=3),  # longer than the file
        raw_file("{}" + " " * 6, length=1),  # "{" alone
    ],
    ids=["empty file", "shorter than the length", "length 2^64-1", "length 2^63", "over 100 MB", "past the end", "cut header"],
)
def test_header_length_agrees_with_the_loader(shard: Path, content: bytes) -> None:
    assert assert_agrees(shard, content) is None


def test_header_of_exactly_the_loaders_limit_is_read(shard: Path) -> None:
    """safetensors allows headers up to 100,000,000 bytes (not 100 MiB); so does the check."""
    header = entry()
    limit = 100_000_000
    assert_agrees(shard, raw_file(header + " " * (limit - len(header)), b"xx"))
    assert_agrees(shard, raw_file(header + " " * (limit + 1 - len(header)), b"xx"))


def test_issue_examples_name_the_problem(shard: Path) -> None:
    """One clear line per problem, naming the shard and what is wrong."""
    examples = {
        "data cut": (entry(), b"", "data section"),
        "beyond end": (entry(data_offsets=[0, 4], shape=[4]), b"xx", "data section"),
        "overlap": (json.dumps({"a": T2, "b": {**T2, "data_offsets": [1, 3]}}), b"xxx", "data_offsets"),
        "negative": (entry(data_offsets=[-2, 0]), b"", "data_offsets"),
        "dtype": (entry(dtype="Q8"), b"xx", "unknown dtype 'Q8'"),
        "float shape": (entry(shape=[2.0]), b"xx", "shape"),
        "abc": (entry(shape=["abc"]), b"xx", "shape"),
        "deep": ("[" * 100_000, b"", "nested"),
    }
    for header, data, words in examples.values():
        shard.write_bytes(raw_file(header, data))
        with pytest.raises(ShardError) as caught:
            read_safetensors_header(shard)
        message = str(caught.value)
        assert message.startswith("model.safetensors: ") and words in message, message
        assert "\n" not in message


def _bytes_read_by_this_process() -> int:
    """What the kernel counted as read by this process so far (`rchar`: read, pread, ...)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("/proc/self/io has no rchar line")


def test_header_only_on_a_65_gb_sparse_shard(tmp_path: Path) -> None:
    """The data section is never read: the process reads the header's bytes, not 65 GB.

    Counted by the kernel, not timed: a timing bound measured the machine, and a loaded one
    failed it (issue 13).
    """
    size = 65 * 10**9
    count = size // 4
    header = json.dumps({"w": {"dtype": "F32", "shape": [count], "data_offsets": [0, count * 4]}}).encode()
    path = tmp_path / "model.safetensors"
    with path.open("wb") as handle:
        handle.write(raw_file(header))
        try:
            handle.truncate(8 + len(header) + count * 4)
        except OSError as error:  # pragma: no cover - a filesystem without sparse files
            pytest.skip(f"cannot make a sparse 65 GB file here: {error}")
    before = _bytes_read_by_this_process()
    found = read_safetensors_header(path)
    read = _bytes_read_by_this_process() - before
    # The header is 8 + len(header) bytes; one chunk of the data section would be 16 MiB.
    assert read < 8 + len(header) + (1 << 16), f"{read} bytes read"
    assert found == {"w": TensorInfo("model.safetensors", "F32", (count,))}


# --- the generated battery ------------------------------------------------------------

BAD_DTYPES = ["u8", "Q8", "", "C128", "F8_E4M3FN", "FLOAT32"]
HOSTILE_NUMBERS: list[Any] = [-1, -(2**63), 2**64, U64_MAX, 2**40, 1.0, 2.5, True, False, None, "3", [1], {}]
names = st.text(max_size=8) | st.sampled_from(["__metadata__", "a", "a.b", "x\x1b[2K\n", "\ud800"])


@st.composite
def headers(draw: st.DrawFn) -> bytes:
    """A safetensors file built from a generated header: well formed, or (half the time) damaged in some ways."""
    hostile = draw(st.booleans())

    def damage(one_in: int) -> bool:
        return hostile and draw(st.integers(0, one_in - 1)) == 0

    count = draw(st.integers(0, 4))
    tensor_names = draw(st.lists(names if hostile else st.text(max_size=8), min_size=count, max_size=count, unique=True))
    ordered: list[tuple[str, Any]] = []
    offset = 0
    for name in tensor_names:
        dtype: Any = draw(st.sampled_from(ORACLE_DTYPES))
        shape: list[Any] = draw(st.lists(st.integers(0, 5), max_size=3))
        bits = DTYPE_BITS[dtype]
        if not hostile and math.prod(shape) * bits % 8:
            shape.append(8)  # whole bytes
        size = math.prod(shape) * bits // 8
        if damage(4):
            dtype = draw(st.sampled_from(BAD_DTYPES) | st.just({"U8": None}) | st.just(None))
        if shape and damage(4):
            shape[draw(st.integers(0, len(shape) - 1))] = draw(st.sampled_from(HOSTILE_NUMBERS))
        start, end = offset, offset + size
        offset = end
        if damage(4):
            start += draw(st.integers(-3, 3))
        if damage(4):
            end += draw(st.integers(-3, 3))
        offsets: Any = [start, end]
        if damage(8):
            offsets = draw(st.sampled_from([[start], [start, end, end], [float(start), end], None, {"0": start}]))
        value: dict[str, Any] = {"dtype": dtype, "shape": shape, "data_offsets": offsets}
        if draw(st.integers(0, 4)) == 0:
            value["extra"] = draw(st.sampled_from([1, "x", [1, [2]], {"k": None}, -(10**30)]))
        if damage(8):
            del value[draw(st.sampled_from(sorted(value)))]
        items = list(value.items())
        draw(st.randoms()).shuffle(items)
        ordered.append((name, dict(items)))
    metadata = draw(st.sampled_from([None, "absent", {}, {"format": "pt"}]))
    if damage(4):
        metadata = draw(st.sampled_from([{"x": 1}, [], "text", 0]))
    if metadata != "absent":
        ordered.append(("__metadata__", metadata))
    draw(st.randoms()).shuffle(ordered)
    if ordered and damage(4):
        ordered.append(draw(st.sampled_from(ordered)))  # a repeated key
    ascii_only = draw(st.booleans())
    separators = draw(st.sampled_from([(",", ":"), (", ", ": ")]))
    text = (
        "{"
        + separators[0].join(
            f"{json.dumps(k, ensure_ascii=ascii_only)}{separators[1]}"
            f"{json.dumps(v, ensure_ascii=ascii_only, separators=separators)}"
            for k, v in ordered
        )
        + "}"
    )
    encoded = text.encode("utf-8", "surrogatepass")  # a raw surrogate becomes invalid UTF-8
    encoded += b" " * draw(st.sampled_from([0, (8 - len(encoded) % 8) % 8, 3]))  # the writer pads to 8
    data = b"\0" * offset
    if damage(4):
        data = data[: max(0, offset - 1)] if draw(st.booleans()) else data + b"\0" * draw(st.integers(1, 7))
    length = len(encoded)
    if damage(8):
        length = max(0, length + draw(st.sampled_from([-1, 1, len(data) + 1, 2**63, 100_000_001])))
    return raw_file(encoded, data, length=length)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A valid file with some bytes overwritten, inserted, cut or appended."""
    tensors = {
        "embed.weight": {"dtype": "BF16", "shape": [4, 2], "data_offsets": [0, 16]},
        "norm.weight": {"dtype": "F32", "shape": [2], "data_offsets": [16, 24]},
        "mask": {"dtype": "F4", "shape": [2, 1], "data_offsets": [24, 25]},
    }
    content = bytearray(raw_file(json.dumps({"__metadata__": {"format": "pt"}, **tensors}), b"\1" * 25))
    for _ in range(draw(st.integers(1, 3))):
        action = draw(st.sampled_from(["set", "insert", "cut", "append", "truncate"]))
        where = draw(st.integers(0, len(content)))
        if action == "set" and where < len(content):
            content[where] = draw(st.integers(0, 255))
        elif action == "set":
            content.append(draw(st.integers(0, 255)))
        elif action == "insert":
            content[where:where] = draw(st.binary(min_size=1, max_size=4) | st.sampled_from([b"[", b"-", b"\\u", b"\xff"]))
        elif action == "cut":
            del content[where : where + draw(st.integers(1, 4))]
        elif action == "append":
            content += draw(st.binary(min_size=1, max_size=4))
        else:
            del content[where:]
    return bytes(content)


BATTERY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@BATTERY
@given(content=headers())
def test_generated_headers_agree_with_the_loader(content: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        assert_agrees(Path(folder) / "model.safetensors", content)


@BATTERY
@given(content=mutated())
def test_mutated_files_agree_with_the_loader(content: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        assert_agrees(Path(folder) / "model.safetensors", content)


@settings(max_examples=60, deadline=None)
@given(
    dtype=st.sampled_from(ORACLE_DTYPES),
    shape=st.lists(st.sampled_from([0, 1, 2, 3, 7]) | st.integers(0, 2**33), max_size=4),
    slack=st.integers(-1, 1),
)
def test_generated_sizes_agree_with_the_loader(dtype: str, shape: list[int], slack: int) -> None:
    """Large shapes and sub-byte dtypes: overflow and byte-boundary rules, with a sparse data section."""
    elements = math.prod(shape)
    bits = DTYPE_BITS[dtype]
    size = min(max(0, elements * bits // 8 + slack), 2**36)  # beyond 64 GiB both must refuse anyway
    header = json.dumps({"t": {"dtype": dtype, "shape": shape, "data_offsets": [0, size]}}).encode()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.safetensors"
        with path.open("wb") as handle:
            handle.write(raw_file(header))
            handle.truncate(8 + len(header) + size)
        assert checker_view(path) == loader_view(path)
