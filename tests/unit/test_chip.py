"""The npu chip: what the image's vllm-ascend was built for against what the node has, and the defaults it sets.

The device facts are stubbed the way they reach the recipe on a real node: a vllm_ascend
package whose generated `_build_info.py` names its device type, and a torch_npu whose
`npu.get_soc_version()` answers in a child process (vllm-ascend 0.23.0's own two sources).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from recipe import chip
from recipe.chip import CHIPS, built_device_type, chip_of_soc_version, mismatch
from recipe.errors import RecipeConfigError
from recipe.plan import build_plan
from tests.unit.envtools import settings_of
from tests.unit.runtools import cli, layout_of_one, run_environment

A2_SOCS = st.integers(min_value=220, max_value=225)
A3_SOCS = st.integers(min_value=250, max_value=255)
OTHER_SOCS = st.integers(min_value=-5, max_value=400).filter(lambda n: chip_of_soc_version(n) is None)


def fake_npu_packages(root: Path, device_type: str, soc_version: int) -> Path:
    """A vllm_ascend built for `device_type` and a torch_npu on a node of `soc_version`, importable from root."""
    (root / "vllm_ascend").mkdir(parents=True)
    (root / "vllm_ascend" / "__init__.py").write_text("raise ImportError('never imported: needs CANN')\n")
    (root / "vllm_ascend" / "_build_info.py").write_text(f"# Auto-generated file\n__device_type__ = '{device_type}'\n")
    (root / "torch_npu").mkdir()
    (root / "torch_npu" / "__init__.py").write_text(
        f"class npu:\n    @staticmethod\n    def get_soc_version():\n        return {soc_version}\n"
    )
    return root


@given(soc=A3_SOCS)
def test_an_a2_image_on_an_a3_node_names_both_chips_and_the_rebuild(soc: int) -> None:
    line = mismatch("A2", soc, "torch_npu")
    assert line is not None and "\n" not in line
    assert "this node's NPUs are a3" in line and "built for 910b" in line and line.endswith(
        "rebuild the image with CANN_CHIP=a3 (docker compose build --build-arg CANN_CHIP=a3 npu)"
    )


@given(soc=A2_SOCS)
def test_an_a3_image_on_an_a2_node_names_both_chips_and_the_rebuild(soc: int) -> None:
    line = mismatch("A3", soc, "torch_npu")
    assert line is not None and "this node's NPUs are 910b" in line and "built for a3" in line
    assert "CANN_CHIP=910b" in line


@given(soc=A2_SOCS | A3_SOCS | OTHER_SOCS | st.none(), built=st.sampled_from(["A2", "A3", "_310P", "A5", "", None]))
def test_matching_or_unknown_is_no_mismatch(soc: int | None, built: str | None) -> None:
    found, made = chip.chip_of_soc_version(soc), chip.chip_of_device_type(built)
    assert (mismatch(built, soc, "torch_npu") is None) == (found is None or made is None or found == made)


def test_the_chips_facts_are_vllm_ascends() -> None:
    """vllm_ascend/utils.py (0.23.0) check_ascend_device_type: 220-225 -> A2, 250-255 -> A3."""
    assert {name: (facts.device_type, facts.soc_versions, facts.devices_per_node) for name, facts in CHIPS.items()} == {
        "a3": ("A3", range(250, 256), 16),
        "910b": ("A2", range(220, 226), 8),
    }


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("# Auto-generated file\n__device_type__ = 'A3'\n", "A3"),
        ("__device_type__ = \"A2\"\n", "A2"),
        ("__device_type__ = os.environ['X']\n", None),  # not a literal: never evaluated
        ("__device_type__ = 3\n", None),
        ("def broken(:\n", None),
        ("", None),
        ("\x00\xff", None),
    ],
)
def test_the_build_info_is_read_as_text_never_run(tmp_path: Path, source: str, expected: str | None) -> None:
    (tmp_path / "_build_info.py").write_text(source, errors="surrogateescape")
    assert built_device_type(tmp_path) == expected


def test_no_build_info_is_unknown(tmp_path: Path) -> None:
    assert built_device_type(tmp_path) is None


def _npu_run(tmp_path: Path, model: Path, device_type: str, soc_version: int) -> subprocess.CompletedProcess[str]:
    """`run` on an npu node of `soc_version` with an image whose vllm-ascend is built for `device_type`."""
    fakes = fake_npu_packages(tmp_path / "fakes", device_type, soc_version)
    env = run_environment(tmp_path, model, **layout_of_one(DEVICE="npu"))
    env["PYTHONPATH"] = f"{fakes}:{env['PYTHONPATH']}"
    return cli(["run"], env)


def test_run_refuses_an_image_built_for_the_other_chip_before_anything_starts(tmp_path: Path, model: Path) -> None:
    done = _npu_run(tmp_path, model, "A2", 252)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    [line] = [text for text in done.stderr.splitlines() if "CANN_CHIP" in text]
    assert "this node's NPUs are a3" in line and "built for 910b" in line and "CANN_CHIP=a3" in line
    assert not (tmp_path / "record.json").exists()  # the trainer never started


def test_run_goes_on_when_the_chips_match(tmp_path: Path, model: Path) -> None:
    done = _npu_run(tmp_path, model, "A3", 252)
    assert done.returncode == 0 and "CANN_CHIP" not in done.stderr, done.stderr
    assert (tmp_path / "record.json").exists()


@pytest.mark.parametrize(("device_type", "soc", "code"), [("A2", 252, 2), ("A3", 223, 2), ("A3", 252, None), ("A2", 999, None)])
def test_doctor_refuses_an_image_built_for_the_other_chip_with_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    device_type: str, soc: int, code: int | None,
) -> None:  # fmt: skip
    from recipe.doctor import command

    fakes = fake_npu_packages(tmp_path / "fakes", device_type, soc)
    monkeypatch.syspath_prepend(str(fakes))
    monkeypatch.setenv("PYTHONPATH", str(fakes))
    for name, value in {"DEVICE": "npu", "CHECKPOINT_DIR": tmp_path / "ck", "HF_HOME": tmp_path / "hf"}.items():
        monkeypatch.setenv(name, str(value))
    detect = command.detect_device
    monkeypatch.setattr(command, "detect_device", lambda *a, **k: dataclasses.replace(detect(*a, **k), visible_devices=16))
    done = command.run_doctor(argparse.Namespace(json=True, only=["user"], timeout=None))
    document = json.loads(capsys.readouterr().out)
    if code is None:
        assert done != 2 and document["command"] == "doctor" and "errors" not in document
    else:
        assert done == code == 2 and len(document["errors"]) == 1 and "CANN_CHIP=" in document["errors"][0]


# --- defaults follow the chip ------------------------------------------------------------------


def _labels(tmp_path: Path, chip_name: str) -> dict[str, str]:
    (tmp_path / "labels.d").mkdir(exist_ok=True)
    (tmp_path / "labels.d" / "framework.labels").write_text(f"io.grpo-recipe.cann.chip={chip_name}\n")
    return {"RECIPE_IMAGE_INFO_DIR": str(tmp_path)}


@pytest.mark.parametrize(("chip_name", "devices", "pp"), [("a3", 16, 2), ("910b", 8, 1)])
def test_npu_defaults_follow_the_images_chip_and_the_plan_says_why(
    tmp_path: Path, chip_name: str, devices: int, pp: int
) -> None:
    plan = build_plan(settings_of(DEVICE="npu"), environ=_labels(tmp_path, chip_name))
    assert (plan.layout.ndevices_per_node, plan.layout.pp) == (devices, pp)
    assert plan.to_dict()["chip"] == {"name": chip_name, "reason": f"the image's label io.grpo-recipe.cann.chip={chip_name}"}
    assert f"chip     {chip_name} (the image's label" in plan.to_text()


def test_outside_an_image_npu_assumes_the_default_chip_and_gpu_has_none(tmp_path: Path) -> None:
    npu = build_plan(settings_of(DEVICE="npu"), environ={"RECIPE_IMAGE_INFO_DIR": str(tmp_path / "none")})
    assert npu.to_dict()["chip"]["name"] == "a3" and "CANN_CHIP=a3" in npu.to_dict()["chip"]["reason"]
    assert npu.layout.ndevices_per_node == 16
    assert build_plan(settings_of(DEVICE="gpu"), environ={}).to_dict()["chip"] is None


# --- upstream's known failure: GEN_TP=4 for Qwen3.5-35B-A3B on npu -------------------------------


def test_gen_tp_4_for_this_model_on_npu_is_refused_citing_upstream() -> None:
    with pytest.raises(RecipeConfigError) as caught:
        build_plan(settings_of(DEVICE="npu", GEN_TP=4), environ={})
    [line] = caught.value.problems
    assert line.startswith("GEN_TP=4: ") and "vllm-ascend#10014" in line and "ALLOW_UPSTREAM_ISSUE=vllm-ascend#10014" in line


def test_allow_upstream_issue_lets_gen_tp_4_through_and_gpu_never_refuses_it() -> None:
    assert build_plan(settings_of(DEVICE="npu", GEN_TP=4, ALLOW_UPSTREAM_ISSUE="vllm-ascend#10014"), environ={}).layout.gen_tp == 4
    assert build_plan(settings_of(DEVICE="gpu", GEN_TP=4), environ={}).layout.gen_tp == 4


@pytest.mark.parametrize("value", ["10014", "vllm-ascend 10014", "#10014", "a#b"])
def test_allow_upstream_issue_takes_issue_references_only(value: str) -> None:
    with pytest.raises(Exception) as caught:
        settings_of(ALLOW_UPSTREAM_ISSUE=value)
    assert "vllm-ascend#10014" in str(caught.value)


# --- the two facts, asked of the machine ---------------------------------------------------------


def _fake_python(tmp_path: Path, script: str) -> str:
    """An interpreter stand-in: a shell script that answers `python -c PROBE` as SCRIPT says."""
    path = tmp_path / "python"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("echo 252\n", 252),
        ("echo 'CANN warning: something'; echo 223\n", 223),  # CANN's chatter before the answer
        ("echo 252; exit 1\n", None),  # torch_npu failed after printing
        ("echo A3\n", None),
        ("exit 0\n", None),
        ("echo -252\n", None),
        ("sleep 30; echo 252\n", None),  # hung: the probe gives up
    ],
)
def test_the_soc_version_comes_from_a_child_process_and_only_a_clean_answer_counts(
    tmp_path: Path, script: str, expected: int | None
) -> None:
    assert chip.node_soc_version(_fake_python(tmp_path, script), timeout_s=2) == expected


def test_a_missing_interpreter_is_no_answer(tmp_path: Path) -> None:
    assert chip.node_soc_version(str(tmp_path / "no-python"), timeout_s=2) is None


def test_the_probe_asks_torch_npu_for_the_soc_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real probe text in a real interpreter, against a torch_npu that answers 251."""
    import sys

    fakes = fake_npu_packages(tmp_path / "fakes", "A3", 251)
    monkeypatch.setenv("PYTHONPATH", str(fakes))
    assert chip.node_soc_version(sys.executable) == 251


def test_chip_problem_asks_the_installed_packages_when_not_told(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fakes = fake_npu_packages(tmp_path / "fakes", "A2", 252)
    monkeypatch.syspath_prepend(str(fakes))
    monkeypatch.setenv("PYTHONPATH", str(fakes))
    assert built_device_type() == "A2"
    line = chip.chip_problem()
    assert line is not None and "torch_npu.npu.get_soc_version() says soc_version 252" in line
    assert chip.chip_problem(soc_version=252, built_type="A3") is None
    assert chip.chip_problem(soc_version=223, built_type="_310P") is None  # a chip the recipe does not target


def test_without_vllm_ascend_there_is_nothing_to_compare(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(chip, "find_spec", lambda name: None)
    assert built_device_type() is None and chip.chip_problem(soc_version=252) is None


def test_a_huge_build_info_is_read_only_to_its_first_64_kib(tmp_path: Path) -> None:
    (tmp_path / "_build_info.py").write_text("# x\n" * 20000 + "__device_type__ = 'A3'\n")
    assert built_device_type(tmp_path) is None
    (tmp_path / "_build_info.py").write_text("__device_type__ = 'A3'\n" + "# x\n" * 20000)
    assert built_device_type(tmp_path) == "A3"
