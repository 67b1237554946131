"""The two facts the chip check reads, and what `plan` says when no image names a chip.

Each fact comes from where vllm-ascend 0.23.0 reads it: the `__device_type__` line of the installed
package's generated `_build_info.py`, and torch_npu's `get_soc_version()` printed by a child interpreter.
Neither source is trusted to be clean text: the check says "cannot tell" (None) rather than fail.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recipe import chip
from recipe.chip import assumed_chip, built_device_type


def _build_info(folder: Path, content: bytes) -> Path:
    (folder / "_build_info.py").write_bytes(content)
    return folder


def test_a_build_info_with_bytes_other_than_utf8_in_a_comment_is_still_read(tmp_path: Path) -> None:
    """A latin-1 comment (an older generator, a hand edit) does not hide the device type."""
    _build_info(tmp_path, b"# G\xe9n\xe9r\xe9 automatiquement\n__device_type__ = 'A3'\n")
    assert built_device_type(tmp_path) == "A3"


def test_only_the_device_type_assignment_counts(tmp_path: Path) -> None:
    """Other string constants of the file, before it, are not the device type."""
    _build_info(tmp_path, b"__version__ = 'A2'\nbuild.kind = 'A2'\n__device_type__ = 'A3'\n")
    assert built_device_type(tmp_path) == "A3"
    _build_info(tmp_path, b"__version__ = 'A2'\n")
    assert built_device_type(tmp_path) is None


def test_the_build_info_is_cut_at_exactly_65536_characters(tmp_path: Path) -> None:
    """What follows the first 64 Ki characters is never parsed, even a syntax error right after them."""
    head = "__device_type__ = 'A3'\n"
    padding = "#" * (65536 - len(head) - 1) + "\n"
    assert len(head + padding) == 65536
    _build_info(tmp_path, (head + padding + "(\n").encode())
    assert built_device_type(tmp_path) == "A3"


#: What the default's reason adds: the setting an A2 owner needs.
FOR_A2 = "; for an Atlas A2, 910B node set CANN_CHIP=910b"


@pytest.mark.parametrize(
    ("labels", "reason"),
    [
        (None, "not in an image: the Dockerfile's default CANN_CHIP=a3" + FOR_A2),
        ({}, "the image has no io.grpo-recipe.cann.chip label: the Dockerfile's default CANN_CHIP=a3" + FOR_A2),
        ({"io.grpo-recipe.other": "910b"},
         "the image has no io.grpo-recipe.cann.chip label: the Dockerfile's default CANN_CHIP=a3" + FOR_A2),
    ],
)
def test_the_default_chip_says_whether_this_is_an_image_without_a_label_or_no_image(
    labels: dict[str, str] | None, reason: str
) -> None:
    assert assumed_chip(labels) == ("a3", reason)


@pytest.mark.parametrize("setting", ["a3", "910b"])
@pytest.mark.parametrize(
    ("labels", "where"),
    [
        (None, "not in an image"),
        ({}, "the image has no io.grpo-recipe.cann.chip label"),  # an image without labels: CANN_CHIP decides
        ({"io.grpo-recipe.cann.chip": "a9"}, "the image has no io.grpo-recipe.cann.chip label"),  # a label of no chip
    ],
)
def test_cann_chip_decides_where_no_label_names_a_chip(labels: dict[str, str] | None, where: str, setting: str) -> None:
    """Issue 52: an image without labels, CANN_CHIP set: the setting is planned for, never the default, and never
    refused (there is no label it could contradict)."""
    from recipe.chip import chip_setting_problem

    assert assumed_chip(labels, setting) == (setting, f"CANN_CHIP={setting}, {where}")  # type: ignore[arg-type]
    assert chip_setting_problem(labels, setting) is None  # type: ignore[arg-type]


def test_a_given_soc_version_is_not_asked_of_the_node_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """`chip_problem(soc_version=...)` compares the number it is given; it starts no probe."""

    def no_probe(*args: object, **kwargs: object) -> int:
        raise AssertionError("the node was asked although the soc_version was given")

    monkeypatch.setattr(chip, "node_soc_version", no_probe)
    line = chip.chip_problem(soc_version=252, built_type="A2")
    assert line is not None and "soc_version 252" in line and "built for 910b" in line


def _fake_python(tmp_path: Path, output: bytes) -> str:
    """An interpreter stand-in that prints OUTPUT (bytes as they are) and exits 0."""
    (tmp_path / "output").write_bytes(output)
    path = tmp_path / "python"
    path.write_text(f"#!/bin/sh\ncat '{tmp_path / 'output'}'\n")
    path.chmod(0o755)
    return str(path)


def test_chatter_that_is_not_utf8_before_the_answer_does_not_hide_it(tmp_path: Path) -> None:
    """CANN's warnings in another encoding (GBK, latin-1) come before the number: the number still counts."""
    assert chip.node_soc_version(_fake_python(tmp_path, b"\xb8\xe6\xbe\xaf: \xff\xfe CANN\n252\n"), timeout_s=5) == 252


@pytest.mark.parametrize("answer", ["²", "2²", "25 2", "+252", "252.0"])
def test_an_answer_that_is_not_plain_digits_is_no_answer(tmp_path: Path, answer: str) -> None:
    """A digit-like character int() refuses ('²') is no answer, never a crash."""
    assert chip.node_soc_version(_fake_python(tmp_path, f"{answer}\n".encode()), timeout_s=5) is None


@settings(max_examples=50)
@given(output=st.binary(max_size=64), number=st.one_of(st.none(), st.integers(0, 10**6)))
def test_any_bytes_the_probe_prints_give_a_number_or_no_answer(output: bytes, number: int | None) -> None:
    """Whatever the child prints, the read is a number or None, never a crash; a last line of ASCII digits counts."""
    printed = output + (f"\n{number}\n".encode() if number is not None else b"")
    with tempfile.TemporaryDirectory() as folder:
        found = chip.node_soc_version(_fake_python(Path(folder), printed), timeout_s=5)
    assert found is None or isinstance(found, int)
    if number is not None:
        assert found == number


# --- named edges (issue 52) ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("label", "setting", "line"),
    [
        ("a3", "910b", "CANN_CHIP=910b: this image is built for a3 (Atlas A3, 910C; its label io.grpo-recipe.cann.chip), "
                       "and its vllm-ascend would refuse 910b NPUs; unset CANN_CHIP, or rebuild the image with "
                       "CANN_CHIP=910b (docker compose build npu)"),
        ("910b", "a3", "CANN_CHIP=a3: this image is built for 910b (Atlas A2, 910B; its label io.grpo-recipe.cann.chip), "
                       "and its vllm-ascend would refuse a3 NPUs; unset CANN_CHIP, or rebuild the image with "
                       "CANN_CHIP=a3 (docker compose build npu)"),
        ("a3", "a3", None),  # the label and the setting agree
        ("910b", "910b", None),
        ("a3", None, None),  # no setting: the label decides
    ],
)  # fmt: skip
def test_cann_chip_against_the_images_label(label: str, setting: str | None, line: str | None) -> None:
    from recipe.chip import CHIP_LABEL, chip_setting_problem

    labels = {CHIP_LABEL: label, "other.label": "x"}
    assert chip_setting_problem(labels, setting) == line  # type: ignore[arg-type]
    assert assumed_chip(labels, setting) == (label, f"the image's label {CHIP_LABEL}={label}")  # type: ignore[arg-type]


@pytest.mark.parametrize(("printed", "number"), [("0\n", 0), ("252\n", 252), (f"{chip.MAX_SOC_VERSION}\n", chip.MAX_SOC_VERSION),
                                                 (f"{chip.MAX_SOC_VERSION + 1}\n", None), ("warning\n  \n", None)])  # fmt: skip
def test_the_soc_version_is_read_within_its_bounds(monkeypatch: pytest.MonkeyPatch, printed: str, number: int | None) -> None:
    """The probe's last line, 0 and MAX_SOC_VERSION included; past that, or no digits, is no answer (no process starts)."""
    import subprocess

    def answered(args: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(args, 0, stdout=f"CANN says hello\n{printed}", stderr="")

    monkeypatch.setattr(chip.subprocess, "run", answered)
    assert chip.node_soc_version("python") == number
