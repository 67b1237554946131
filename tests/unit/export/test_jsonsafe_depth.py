"""How deep the JSON-safe converter goes, and the paths its warnings name: a value nested in any mix of
containers is written down to `max_depth` levels, then replaced by a marker naming its type, with one
warning naming where; cycles become markers too."""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from recipe.export.jsonsafe import to_json_safe
from tests.support.needs import TRAINER_EXTRA, needs


@dataclasses.dataclass
class Inner:
    act: Any = None
    size: int = 2


class WithToDict:
    def __init__(self, payload: Any) -> None:
        self.payload = payload

    def to_dict(self) -> Any:
        return self.payload


class PointsBack:
    """A config whose to_dict() holds the config itself."""

    def to_dict(self) -> Any:
        return {"me": self}


LEAF_NOTE = "builtins.object is not JSON; wrote its repr"

#: kind -> (wrap the inner value, the JSON it becomes around the inner JSON, path step, marker type).
KINDS: dict[str, Any] = {
    "list": (lambda inner: [inner], lambda out: [out], "[0]", "builtins.list"),
    "tuple": (lambda inner: (inner,), lambda out: [out], "[0]", "builtins.tuple"),
    "dict": (lambda inner: {"k": inner}, lambda out: {"k": out}, ".k", "builtins.dict"),
    "dataclass": (lambda inner: Inner(act=inner), lambda out: {"act": out, "size": 2}, ".act", f"{__name__}.Inner"),
    "frozenset": (lambda inner: frozenset([inner]), lambda out: [out], "[]", "builtins.frozenset"),
}


def expected(kinds: list[str], max_depth: int) -> tuple[Any, list[str]]:
    """What the rules promise for object() nested in `kinds` (outermost first): each container is one level;
    a to_dict() object is one level and the dict it returns another."""
    path, depth, wrappers = "", 0, []
    for kind in kinds:
        if kind == "to_dict":
            steps = [(f"{__name__}.WithToDict", lambda out: out, ""), ("builtins.dict", lambda out: {"k": out}, ".k")]
        else:
            _, around, step, marker = KINDS[kind]
            steps = [(marker, around, step)]
        for marker, around, step in steps:
            if depth >= max_depth:
                note = f"{path or '<root>'}: nested deeper than {max_depth}; wrote a marker"
                return unwrap(wrappers, f"<too deep: {marker}>"), [note]
            wrappers.append(around)
            path, depth = path + step, depth + 1
    return unwrap(wrappers, "<object object>"), [f"{path or '<root>'}: {LEAF_NOTE}"]


def unwrap(wrappers: list[Any], out: Any) -> Any:
    for around in reversed(wrappers):
        out = around(out)
    return out


def build(kinds: list[str]) -> Any:
    value: Any = object()
    for kind in reversed(kinds):
        value = WithToDict({"k": value}) if kind == "to_dict" else KINDS[kind][0](value)
    return value


@given(st.lists(st.sampled_from(["list", "tuple", "dict", "dataclass", "to_dict"]), max_size=8), st.integers(0, 12))
def test_nesting_is_written_down_to_max_depth(kinds: list[str], max_depth: int) -> None:
    converted, notes = to_json_safe(build(kinds), max_depth=max_depth)
    assert (converted, notes) == expected(kinds, max_depth)


@given(st.lists(st.sampled_from(["tuple", "frozenset"]), max_size=8), st.integers(0, 10))
def test_sets_count_one_level_like_other_containers(kinds: list[str], max_depth: int) -> None:
    converted, notes = to_json_safe(build(kinds), max_depth=max_depth)
    assert (converted, notes) == expected(kinds, max_depth)


def test_default_depth_keeps_a_config_whole() -> None:
    """64 levels are written by default; the 65th is a marker."""
    _, notes = to_json_safe(build(["list"] * 64))
    assert notes == ["[0]" * 64 + f": {LEAF_NOTE}"]
    _, notes = to_json_safe(build(["list"] * 65))
    assert notes == ["[0]" * 64 + ": nested deeper than 64; wrote a marker"]


def test_a_non_string_key_counts_one_level_below_its_mapping() -> None:
    """A tuple key is converted one level below its mapping, so it can be the part that is too deep."""
    assert to_json_safe({(1, 2): "v"}, max_depth=2) == ({"[1, 2]": "v"}, [])
    converted, notes = to_json_safe({(1, 2): "v"}, max_depth=1)
    assert converted == {"<too deep: builtins.tuple>": "v"}
    assert notes == ["[key]: nested deeper than 1; wrote a marker"]


def test_numpy_arrays_and_torch_sizes_count_a_level_for_the_list_they_become() -> None:
    """A numpy array or torch.Size takes one level and the list it becomes the next (a 2-D array's rows one more)."""
    np = needs("numpy", install=TRAINER_EXTRA)
    torch = needs("torch", install=TRAINER_EXTRA)
    assert to_json_safe({"a": np.zeros((2, 2))}, max_depth=4) == ({"a": [[0.0, 0.0], [0.0, 0.0]]}, [])
    converted, notes = to_json_safe({"a": np.zeros((2, 2))}, max_depth=3)
    assert converted == {"a": ["<too deep: builtins.list>", "<too deep: builtins.list>"]}
    assert notes == [".a[0]: nested deeper than 3; wrote a marker", ".a[1]: nested deeper than 3; wrote a marker"]
    assert to_json_safe({"s": torch.Size([2, 3])}, max_depth=3) == ({"s": [2, 3]}, [])
    converted, notes = to_json_safe({"s": torch.Size([2, 3])}, max_depth=2)
    assert converted == {"s": "<too deep: builtins.list>"}
    assert notes == [".s: nested deeper than 2; wrote a marker"]


def test_cycles_become_markers_with_their_path() -> None:
    cyclic: list[Any] = [1]
    cyclic.append(cyclic)
    converted, notes = to_json_safe({"list": cyclic, "config": PointsBack()})
    assert converted == {"list": [1, "<cycle: builtins.list>"], "config": {"me": f"<cycle: {__name__}.PointsBack>"}}
    assert notes == [
        ".list[1]: refers back to itself; wrote a marker",
        ".config.me: refers back to itself; wrote a marker",
    ]
