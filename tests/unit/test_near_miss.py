"""recipe.near_miss: one slip (a letter inserted or dropped, two neighbours swapped, the case) finds the name meant."""

from __future__ import annotations

from hypothesis import assume, given
from hypothesis import strategies as st

from recipe.near_miss import MIN_SLIP_LENGTH, one_slip_from, slips

_names = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ_0123456789", min_size=MIN_SLIP_LENGTH + 1, max_size=30)


@st.composite
def _slipped(draw: st.DrawFn) -> tuple[str, str]:
    name = draw(_names)
    at = draw(st.integers(0, len(name) - 1))
    kind = draw(st.sampled_from(["drop", "insert", "swap"]))
    letter = draw(st.sampled_from("ABCDEFGHIJKLMNOPQRSTUVWXYZ_"))
    typo = {
        "drop": name[:at] + name[at + 1 :],
        "insert": name[:at] + letter + name[at:],
        "swap": name[:at] + name[at + 1 : at + 2] + name[at : at + 1] + name[at + 2 :],
    }[kind]
    return name, typo


@given(_slipped())
def test_any_one_slip_finds_the_name(pair: tuple[str, str]) -> None:
    name, typo = pair
    assume(typo != name and len(typo) >= MIN_SLIP_LENGTH)
    assert slips(typo, name) == 1
    assert one_slip_from(typo, ["SOMETHING_ELSE_ENTIRELY", name]) == name


@given(_names, _names)
def test_the_distance_is_symmetric_and_zero_only_for_the_same_name(a: str, b: str) -> None:
    assert slips(a, b) == slips(b, a)
    assert (slips(a, b) == 0) is (a == b)


def test_what_is_no_slip() -> None:
    assert one_slip_from("RAY_NODE_IP", ["RAY_NODE_ID"]) is None  # one letter changed: two real names
    assert one_slip_from("HF_TOKEN", ["HF_TOKEN"]) is None  # the name itself
    assert one_slip_from("lo", ["lr"]) is None  # too short to call a slip
    assert one_slip_from("HF_TKOEN_X", ["HF_TOKEN"]) is None  # two slips
    assert one_slip_from("Trainer", ["trainer", "trainers"]) == "trainer"  # the case alone wins
    assert one_slip_from("lrr", ["lr", "lr_warmup"]) == "lr"
    assert slips("ABCDEF", "FEDCBA", limit=1) == 2  # past the limit: limit + 1
