"""recipe.near_miss: one slip (a letter inserted or dropped, two neighbours swapped, the case) finds the name meant."""

from __future__ import annotations

import pytest
from hypothesis import assume, example, given
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
@example(("ABCD", "ABD"))  # the shortest typo that is still called a slip (MIN_SLIP_LENGTH letters)
@example(("ABCD", "BACD"))  # a swap at the start
@example(("ABCD", "ABDC"))  # a swap at the end
@example(("ABC_", "ABC"))  # the last letter dropped
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


@pytest.mark.parametrize(
    ("a", "b", "limit", "distance"),
    [
        ("abc", "abc", 1, 0),
        ("", "", 1, 0),
        ("abcd", "abdc", 1, 1),  # two neighbours swapped: one slip, not two changes
        ("abcd", "bacd", 1, 1),
        ("abc", "ab", 1, 1),
        ("ab", "abc", 1, 1),
        ("abc", "xyz", 1, 2),  # past the limit: limit + 1
        ("abc", "xyz", 5, 3),
        ("A", "ABCD", 1, 2),  # lengths three apart: past the limit before any row
        ("", "ab", 2, 2),
        ("ab", "", 5, 2),
        ("kitten", "sitting", 3, 3),
        ("kitten", "sitting", 2, 3),
        ("ca", "abc", 3, 3),  # the optimal string alignment distance, not Damerau's (2): no edit after a swap
        ("abcdef", "badcfe", 3, 3),  # three swaps
        ("abcdef", "badcfe", 2, 3),
        ("aaa", "a", 2, 2),  # no swap of a letter with nothing before the first
        ("ab", "bca", 1, 2),  # past the limit only in the last cell: still limit + 1
    ],
)
def test_the_distance_of_named_pairs(a: str, b: str, limit: int, distance: int) -> None:
    assert slips(a, b, limit=limit) == distance
    assert slips(b, a, limit=limit) == distance


def test_slips_counts_one_by_default() -> None:
    assert slips("abcd", "abce") == 1 and slips("abcd", "abef") == 2 and slips("abcd", "wxyz") == 2


@pytest.mark.parametrize(
    ("name", "candidates", "meant"),
    [
        ("TRAINER", ["trainer", "Trainer"], "Trainer"),  # the case alone, the first in sorted order
        ("LR", ["lr"], "lr"),  # the case alone, even shorter than MIN_SLIP_LENGTH
        ("abd", ["abcd"], "abcd"),  # exactly MIN_SLIP_LENGTH letters: a slip
        ("ab", ["abc"], None),  # one letter fewer: too short
        ("lrr", ["lrrr", "lr"], "lr"),  # a tie: the first in sorted order
        ("abcd", ["abce"], None),  # one letter changed
        ("abcd", ["abdc", "abce"], "abdc"),  # a swap changes two positions: a slip
        ("abcd", ["abcde"], "abcde"),
        ("abcd", ["abcd", "abc"], None),  # the name itself is read
        ("abcd", [], None),
        ("abcd", ("xabcd", "xabcd"), "xabcd"),  # any iterable, a name listed twice
    ],
)
def test_one_slip_from_named_cases(name: str, candidates: list[str], meant: str | None) -> None:
    assert one_slip_from(name, candidates) == meant
