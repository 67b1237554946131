"""The JSON-safe config writer: each rule, and a fuzz run over odd objects that must never raise."""

from __future__ import annotations

import dataclasses
import enum
import functools
import io
import json
import math
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from tests.support.needs import TRAINER_EXTRA, needs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recipe.export.jsonsafe import dump_json_safe, dumps_json_safe, to_json_safe


class Color(enum.Enum):
    RED = 1


class Level(enum.IntEnum):
    HIGH = 3


@dataclasses.dataclass
class Inner:
    act: Any = None
    size: int = 2


@dataclasses.dataclass
class Outer:
    name: str = "outer"
    inner: Inner = dataclasses.field(default_factory=Inner)


class WithToDict:
    def __init__(self, payload: Any) -> None:
        self.payload = payload

    def to_dict(self) -> Any:
        return self.payload


class BrokenToDict:
    def to_dict(self) -> Any:
        raise RuntimeError("no")


class SelfToDict:
    def to_dict(self) -> Any:
        return self


class HostileRepr:
    def __repr__(self) -> str:
        raise ValueError("repr refuses")


class BadProperty:
    @property
    def to_dict(self) -> Any:
        raise RuntimeError("property refuses")


@dataclasses.dataclass
class RaisingField:
    x: int = 1

    def __getattribute__(self, name: str) -> Any:
        if name == "x":
            raise RuntimeError("field refuses")
        return object.__getattribute__(self, name)


def strict_loads(text: str) -> Any:
    """json.loads that rejects NaN/Infinity, as strict JSON parsers do."""

    def reject(constant: str) -> Any:
        raise ValueError(f"non-standard JSON constant {constant}")

    return json.loads(text, parse_constant=reject)


def test_plain_values_pass_through() -> None:
    value = {"a": 1, "b": [True, None, 2.5, "x"], "c": {"d": -3}}
    converted, notes = to_json_safe(value)
    assert converted == value and notes == []


def test_rules() -> None:
    torch = needs("torch", install=TRAINER_EXTRA)
    np = needs("numpy", install=TRAINER_EXTRA)
    value = {
        "enum": Color.RED,
        "intenum": Level.HIGH,
        "dtype": torch.bfloat16,
        "device": torch.device("cpu"),
        "path": Path("/models/x"),
        "pure": PurePosixPath("a/b"),
        "set": {3, 1, 2},
        "tuple": (1, (2, 3)),
        "nan": float("nan"),
        "inf": -math.inf,
        "np_int": np.int64(7),
        "np_complex": np.complex128(1 + 2j),
        "np_array": np.arange(3),
        "np_dtype": np.dtype("float32"),
        "bytes": b"\xff\x00",
        "text_bytes": b"abc",
        "dataclass": Outer(inner=Inner(act=functools.partial(max, 1))),
        "to_dict": WithToDict({"k": torch.float32}),
        "func": strict_loads,
        "lambda": lambda x: x,
        "class": Inner,
        "tensor": torch.ones(2, 3),
        "scalar_tensor": torch.tensor(4.0),
        1: "int key",
        ("t", 1): "tuple key",
    }
    converted, notes = to_json_safe(value)
    assert converted["enum"] == "Color.RED"
    assert converted["intenum"] == "Level.HIGH"
    assert converted["dtype"] == "torch.bfloat16"
    assert converted["device"] == "cpu"
    assert converted["path"] == "/models/x" and converted["pure"] == "a/b"
    assert converted["set"] == [1, 2, 3]
    assert converted["tuple"] == [1, [2, 3]]
    assert converted["nan"] == "nan" and converted["inf"] == "-inf"
    assert converted["np_int"] == 7 and converted["np_complex"] == "(1+2j)"
    assert converted["np_array"] == [0, 1, 2] and converted["np_dtype"] == "float32"
    assert converted["bytes"] == "base64:/wA=" and converted["text_bytes"] == "abc"
    assert converted["dataclass"] == {"name": "outer", "inner": {"act": "<callable builtins.max>", "size": 2}}
    assert converted["to_dict"] == {"k": "torch.float32"}
    assert converted["func"] == f"<callable {__name__}.strict_loads>"
    assert converted["lambda"] == f"<callable {__name__}.test_rules.<locals>.<lambda>>"
    assert converted["class"] == f"<callable {__name__}.Inner>"
    assert converted["tensor"] == "<tensor shape=[2, 3] dtype=torch.float32>"
    assert converted["scalar_tensor"] == 4.0
    assert converted["1"] == "int key" and converted['["t", 1]'] == "tuple key"
    assert notes == []  # every rule above is lossless enough to need no warning
    strict_loads(json.dumps(converted, allow_nan=False))


def test_lossy_conversions_warn_with_their_path(caplog: pytest.LogCaptureFixture) -> None:
    cyclic: list[Any] = [1]
    cyclic.append(cyclic)
    value = {
        "obj": object(),
        "hostile": HostileRepr(),
        "broken": BrokenToDict(),
        "self": SelfToDict(),
        "prop": BadProperty(),
        "field": RaisingField(),
        "cycle": cyclic,
    }
    with caplog.at_level("WARNING", logger="recipe.export.jsonsafe"):
        text = dumps_json_safe(value)
    data = strict_loads(text)
    assert data["obj"] == "<object object>"
    assert data["hostile"] == f"<{__name__}.HostileRepr>"
    assert data["broken"].startswith(f"<{__name__}.BrokenToDict object")
    assert data["cycle"] == [1, "<cycle: builtins.list>"]
    assert data["field"] == {"x": "<unreadable: RuntimeError>"}
    assert "0x" not in text  # stable: no memory addresses
    messages = "\n".join(r.getMessage() for r in caplog.records)
    for path in (".obj", ".hostile", ".broken", ".self", ".prop", ".field.x", ".cycle[1]"):
        assert f"JSON-safe config: {path}:" in messages, path


def test_depth_limit() -> None:
    deep: Any = 0
    for _ in range(100):
        deep = [deep]
    converted, notes = to_json_safe(deep, max_depth=10)
    text = json.dumps(converted)
    assert "<too deep: builtins.list>" in text
    assert len(notes) == 1


def test_dump_to_path_is_atomic_and_to_stream(tmp_path: Path) -> None:
    target = tmp_path / "transformer_config.json"
    notes = dump_json_safe({"a": object()}, target)
    assert json.loads(target.read_text()) == {"a": "<object object>"}
    assert notes == [".a: builtins.object is not JSON; wrote its repr"]
    assert not (tmp_path / "transformer_config.json.partial").exists()
    stream = io.StringIO()
    dump_json_safe({"b": 1}, stream)
    assert json.loads(stream.getvalue()) == {"b": 1}


# --- fuzz ---------------------------------------------------------------------------


def _odd_leaves() -> st.SearchStrategy[Any]:
    np = needs("numpy", install=TRAINER_EXTRA)
    torch = needs("torch", install=TRAINER_EXTRA)
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.integers(min_value=-(10**40), max_value=10**40),
        st.floats(allow_nan=True, allow_infinity=True),
        st.complex_numbers(allow_nan=True),
        st.text(),
        st.binary(max_size=16),
        st.sampled_from([Color.RED, Level.HIGH, torch.bfloat16, torch.int8, torch.device("cpu"), np.dtype("int16")]),
        st.builds(np.float16, st.floats(width=16, allow_nan=True)),
        st.builds(np.complex64, st.complex_numbers(max_magnitude=1e6)),
        st.builds(lambda s: np.datetime64(s, "D"), st.integers(-10000, 10000)),
        st.builds(Path, st.text(alphabet="ab/._", max_size=8)),
        st.sampled_from([len, print, strict_loads, Inner, functools.partial(max, 1), lambda: None, object]),
        st.builds(object),
        st.builds(HostileRepr),
        st.builds(BrokenToDict),
        st.builds(SelfToDict),
        st.builds(BadProperty),
        st.builds(RaisingField),
        st.builds(lambda n: torch.zeros(n), st.integers(0, 3)),
        st.builds(lambda: iter([1, 2])),
        st.builds(lambda: (x for x in range(2))),
        st.builds(lambda: json),  # a module
    )


def _hashable() -> st.SearchStrategy[Any]:
    return st.one_of(st.integers(), st.text(max_size=5), st.sampled_from([Color.RED, None, 1.5, (1, "a")]))


def _odd_values() -> st.SearchStrategy[Any]:
    return st.recursive(
        _odd_leaves(),
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.lists(children, max_size=4).map(tuple),
            st.frozensets(_hashable(), max_size=4),
            st.sets(_hashable(), max_size=4),
            st.dictionaries(_hashable(), children, max_size=4),
            st.builds(Inner, act=children, size=st.integers()),
            st.builds(Outer, name=st.text(max_size=4), inner=st.builds(Inner, act=children)),
            st.builds(WithToDict, children),
        ),
        max_leaves=20,
    )


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_odd_values())
def test_fuzz_never_raises_and_is_strict_stable_json(value: Any) -> None:
    first = dumps_json_safe(value, warn=False)
    second = dumps_json_safe(value, warn=False)
    strict_loads(first)
    assert first == second
    assert " at 0x" not in first


@settings(max_examples=100, deadline=None)
@given(_odd_values())
def test_fuzz_self_referencing_containers(value: Any) -> None:
    holder: dict[str, Any] = {"value": value}
    holder["self"] = holder
    outer = [holder, holder]  # shared but not cyclic: both copies are written
    data = strict_loads(dumps_json_safe(outer, warn=False))
    assert data[0]["self"] == "<cycle: builtins.dict>"
    assert data[0] == data[1]


@pytest.mark.parametrize("planted", ["config.json", "config.json.partial"])
def test_dump_to_path_never_writes_through_a_planted_link(tmp_path: Path, planted: str) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched")
    (tmp_path / planted).symlink_to(victim)
    dump_json_safe({"b": 1}, tmp_path / "config.json")
    assert victim.read_text() == "untouched"
    assert not (tmp_path / "config.json").is_symlink() and json.loads((tmp_path / "config.json").read_text()) == {"b": 1}
