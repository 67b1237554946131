"""The JSON-safe converter's rules, value by value: the exact JSON each odd value becomes, and the warning
(with its path) each lossy conversion gives."""

from __future__ import annotations

import collections.abc
import dataclasses
import enum
import functools
import json
import math
import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from recipe.export.jsonsafe import to_json_safe
from tests.support.needs import TRAINER_EXTRA, needs


class Color(enum.Enum):
    RED = 1


@dataclasses.dataclass(frozen=True)
class Pair:
    """Fields declared out of alphabetical order, so sorted and declared key orders differ."""

    b: int
    a: int


@dataclasses.dataclass
class Holder:
    act: Any = None
    extra: Any = None


@dataclasses.dataclass
class HolderWithBrokenToDict:
    act: Any = None
    extra: Any = None

    def to_dict(self) -> Any:
        raise RuntimeError("no")


class BrokenToDict:
    def to_dict(self) -> Any:
        raise RuntimeError("no")


class SelfToDict:
    def to_dict(self) -> Any:
        return self


@dataclasses.dataclass
class FirstFieldRaises:
    x: int = 1
    y: int = 2

    def __getattribute__(self, name: str) -> Any:
        if name == "x":
            raise RuntimeError("field refuses")
        return object.__getattribute__(self, name)


class BrokenMapping(collections.abc.Mapping):  # type: ignore[type-arg]
    """A Mapping whose items cannot be listed."""

    def __getitem__(self, key: Any) -> Any:
        raise KeyError(key)

    def __iter__(self) -> Iterator[Any]:
        raise RuntimeError("iteration refuses")

    def __len__(self) -> int:
        return 3

    def items(self) -> Any:
        raise RuntimeError("iteration refuses")

    def __repr__(self) -> str:
        return "BrokenMapping(3 keys)"


class BytesPath(os.PathLike):  # type: ignore[type-arg]
    """A path-like object whose path is bytes, which JSON cannot hold."""

    def __fspath__(self) -> bytes:
        return b"/models/x"

    def __repr__(self) -> str:
        return "BytesPath(b'/models/x')"


class Hook:
    """A callable object: no __name__ or __qualname__ of its own."""

    def __call__(self) -> None:
        return None


class NamedHook(Hook):
    def __init__(self) -> None:
        self.__name__ = "named_hook"


class NoModuleHook(Hook):
    """A callable whose __module__ cannot be read."""

    def __getattribute__(self, name: str) -> Any:
        if name == "__module__":
            raise AttributeError(name)
        return object.__getattribute__(self, name)


class Job:
    """A class with a `func` attribute that is not a function (unlike functools.partial's)."""

    func = "train"


def test_infinities_and_nan_become_their_names() -> None:
    """+inf, -inf and NaN (strict JSON has none) become "inf", "-inf" and "nan"."""
    converted, notes = to_json_safe([math.inf, -math.inf, math.nan, 1e308 * 10, 0.0, -0.0])
    assert converted == ["inf", "-inf", "nan", "inf", 0.0, -0.0] and notes == []


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_every_float_is_itself_or_its_name(number: float) -> None:
    """Finite floats pass through unchanged; the non-finite ones become their names, with no warning."""
    converted, notes = to_json_safe(number)
    if math.isnan(number):
        assert converted == "nan"
    elif math.isinf(number):
        assert converted == ("inf" if number > 0 else "-inf")
    else:
        assert converted == number and type(converted) is float
    assert notes == []


def test_a_value_at_the_root_is_reported_as_root() -> None:
    """A lossy conversion of the value itself names `<root>` as its path."""
    converted, notes = to_json_safe(object())
    assert converted == "<object object>"
    assert notes == ["<root>: builtins.object is not JSON; wrote its repr"]


def test_python_complex_is_its_text() -> None:
    """Complex numbers (no JSON type) become their Python text."""
    assert to_json_safe({"z": 1 + 2j}) == ({"z": "(1+2j)"}, [])


def test_torch_size_and_parameters() -> None:
    """torch.Size is a list of ints; a one-element Parameter its number, a larger one a shape summary."""
    torch = needs("torch", install=TRAINER_EXTRA)
    value = {
        "size": torch.Size([2, 3]),
        "scalar_param": torch.nn.Parameter(torch.tensor(4.0)),
        "param": torch.nn.Parameter(torch.ones(2, 3)),
    }
    converted, notes = to_json_safe(value)
    assert converted == {"size": [2, 3], "scalar_param": 4.0, "param": "<tensor shape=[2, 3] dtype=torch.float32>"}
    assert notes == []


def test_numpy_object_array_items_warn_with_their_path() -> None:
    """The items of a numpy object array are converted by the rules, and a lossy one names its index."""
    np = needs("numpy", install=TRAINER_EXTRA)
    array = np.empty(2, dtype=object)
    array[0], array[1] = 5, object()
    converted, notes = to_json_safe({"arr": array})
    assert converted == {"arr": [5, "<object object>"]}
    assert notes == [".arr[1]: builtins.object is not JSON; wrote its repr"]


def test_path_like_with_bytes_path_is_the_path_decoded_as_the_os_does() -> None:
    """A path-like object whose path is bytes is its path, decoded by os.fsdecode (never raw bytes, nothing lost)."""
    converted, notes = to_json_safe({"p": BytesPath()})
    assert (converted, notes) == ({"p": "/models/x"}, [])
    json.dumps(converted)


@pytest.mark.parametrize("kind", ["longdouble", "clongdouble"])
def test_numpys_long_doubles_are_their_text_not_a_lost_value(kind: str) -> None:
    """Their item() is the numpy value itself: converting it again recursed to the depth marker, the value lost."""
    np = needs("numpy", install=TRAINER_EXTRA)
    value = getattr(np, kind)("1.5") if kind == "longdouble" else np.clongdouble(1.5 + 2j)
    converted, notes = to_json_safe({"x": value, "zero_d": np.array(value)})
    assert converted == {"x": str(value), "zero_d": str(value)}
    assert notes == []


def test_callable_names() -> None:
    """Callables become `<callable module.name>`, whatever attributes they lack."""
    value = {
        "hook": Hook(),
        "named": NamedHook(),
        "no_module": NoModuleHook(),
        "builtin_method": [].append,
        "job": Job,
        "partial_hook": functools.partial(Hook()),
    }
    converted, notes = to_json_safe(value)
    assert converted == {
        "hook": f"<callable {__name__}.Hook>",
        "named": f"<callable {__name__}.named_hook>",
        "no_module": f"<callable {__name__}.NoModuleHook.NoModuleHook>",
        "builtin_method": "<callable builtins.builtin_function_or_method.list.append>",
        "job": f"<callable {__name__}.Job>",
        "partial_hook": f"<callable {__name__}.Hook>",
    }
    assert notes == []


def test_set_is_ordered_by_json_text() -> None:
    """Sets become lists ordered by each element's JSON text (so 10 before 9, and mixed types work)."""
    converted, notes = to_json_safe({"ints": {9, 10}, "mixed": {1, "a", None}, "nested": {frozenset({1})}})
    assert converted == {"ints": [10, 9], "mixed": ["a", 1, None], "nested": [[1]]}
    assert notes == []


def test_set_of_records_is_ordered_by_their_written_text() -> None:
    """Elements that become objects are ordered by their text as written (sorted keys), not field order."""
    converted, _ = to_json_safe({Pair(b=1, a=2), Pair(b=2, a=1)})
    assert converted == [{"a": 1, "b": 2}, {"a": 2, "b": 1}]


@given(st.sets(st.one_of(st.integers(), st.text(max_size=4), st.booleans(), st.none())))
def test_any_set_becomes_its_elements_in_json_text_order(value: set[Any]) -> None:
    converted, notes = to_json_safe(value)
    assert isinstance(converted, list) and notes == []
    assert sorted(json.dumps(item) for item in converted) == [json.dumps(item) for item in converted]
    assert len(converted) == len(value)


def test_lossy_set_element_names_the_set() -> None:
    converted, notes = to_json_safe({"s": {object()}})
    assert converted == {"s": ["<object object>"]}
    assert notes == [".s[]: builtins.object is not JSON; wrote its repr"]


def test_keys_that_are_not_strings() -> None:
    """Non-str keys are converted, then written as their JSON text when the result is not a string."""
    converted, notes = to_json_safe({Color.RED: 1, Pair(b=1, a=2): 2, (1, "x"): 3, 7: 4, None: 5})
    assert converted == {"Color.RED": 1, '{"a": 2, "b": 1}': 2, '[1, "x"]': 3, "7": 4, "null": 5}
    assert notes == []


def test_lossy_key_names_the_mapping() -> None:
    converted, notes = to_json_safe({"m": {object(): 1}})
    assert converted == {"m": {"<object object>": 1}}
    assert notes == [".m[key]: builtins.object is not JSON; wrote its repr"]


def test_colliding_keys_keep_the_first_and_warn() -> None:
    """Two keys that become the same string: the first stays, the rest of the mapping is still written."""
    converted, notes = to_json_safe({"m": {1: "a", "1": "b", "z": 3}})
    assert converted == {"m": {"1": "a", "z": 3}}
    assert notes == [".m.1: two keys became the same string; kept the first"]


def test_broken_to_dict_warns() -> None:
    converted, notes = to_json_safe({"cfg": BrokenToDict()})
    assert converted == {"cfg": f"<{__name__}.BrokenToDict object>"}
    assert notes == [f".cfg: {__name__}.BrokenToDict.to_dict() raised RuntimeError"]


def test_broken_to_dict_of_a_dataclass_falls_back_to_its_fields() -> None:
    """A dataclass whose to_dict() raises is written field by field, each field under its own path."""
    converted, notes = to_json_safe({"cfg": HolderWithBrokenToDict(act=[1, {"k": 2}], extra=object())})
    assert converted == {"cfg": {"act": [1, {"k": 2}], "extra": "<object object>"}}
    assert notes == [
        f".cfg: {__name__}.HolderWithBrokenToDict.to_dict() raised RuntimeError",
        ".cfg.extra: builtins.object is not JSON; wrote its repr",
    ]


def test_to_dict_returning_itself_is_its_repr() -> None:
    converted, notes = to_json_safe({"cfg": SelfToDict()})
    assert converted == {"cfg": f"<{__name__}.SelfToDict object>"}
    assert notes == [f".cfg: {__name__}.SelfToDict.to_dict() returned itself; wrote its repr"]


def test_unreadable_field_is_marked_and_the_others_are_kept() -> None:
    converted, notes = to_json_safe({"cfg": FirstFieldRaises()})
    assert converted == {"cfg": {"x": "<unreadable: RuntimeError>", "y": 2}}
    assert notes == [".cfg.x: could not be read (RuntimeError)"]


def test_a_value_whose_conversion_raises_is_its_repr() -> None:
    """A container that raises while being read is written as its repr, with a warning naming the error."""
    converted, notes = to_json_safe({"m": BrokenMapping(), "after": Holder(act=1)})
    assert converted == {"m": "BrokenMapping(3 keys)", "after": {"act": 1, "extra": None}}
    assert notes == [f".m: {__name__}.BrokenMapping could not be converted (RuntimeError); wrote a string"]


class OldNumpyDtype:
    """A dtype as numpy < 1.25 makes it: its type is `numpy.dtype` itself, not a `...DType` subclass."""

    def __str__(self) -> str:
        return "float32"

    def __repr__(self) -> str:
        return "dtype('float32')"


OldNumpyDtype.__module__ = "numpy"
OldNumpyDtype.__name__ = "dtype"


def test_numpy_dtypes_old_and_new_are_their_names() -> None:
    """A numpy dtype is its name, whether its type is numpy.dtype (numpy < 1.25) or a DType subclass."""
    np = needs("numpy", install=TRAINER_EXTRA)
    value = {"old": OldNumpyDtype(), "new": np.dtype("int8"), "record": np.dtype([("a", "<i4")])}
    converted, notes = to_json_safe(value)
    assert converted == {"old": "float32", "new": "int8", "record": "[('a', '<i4')]"}
    assert notes == []
