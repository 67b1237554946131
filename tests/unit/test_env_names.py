"""recipe/env_names.json: the variables each library of the images reads, read out of the libraries.

The table is checked against the images' locks (same versions), against the libraries installed
here (the same scanner finds the same names wherever the version is the table's), and the
scanner against files made to hold names, non-names and near-names. tests/images checks the
built images' own libraries against it (`python -m recipe.env_names check`).
"""

from __future__ import annotations

import io
import json
import re
import tarfile
import zipfile
from pathlib import Path

import pytest

from recipe import env_names

DOCKER = Path(__file__).resolve().parents[2] / "docker"


def _pins(device: str) -> dict[str, str]:
    """Normalised distribution -> version of every pin of docker/DEVICE/*.lock."""
    pins = {}
    for lock in sorted((DOCKER / device).glob("*.lock")):
        for match in re.finditer(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^ ;\\\n]+)", lock.read_text(), re.M):
            pins[re.sub(r"[-_.]+", "_", match.group(1)).lower()] = match.group(2)
    return pins


def _table() -> dict[str, dict]:
    return json.loads(env_names.TABLE.read_text(encoding="utf-8"))


def test_the_table_holds_every_owner_an_image_pins_at_the_pinned_version() -> None:
    owners = {owner for family in env_names.FAMILIES.values() for owner in family}
    pinned = {f"{name}=={version}" for device in ("gpu", "npu") for name, version in _pins(device).items() if name in owners}
    assert {"vllm==0.24.0", "vllm==0.23.0", "torch_npu==2.10.0.post4", "nvidia_nccl_cu13==2.28.9"} <= pinned
    # An entry of another version is a pin that moved: `python -m recipe.env_names write` (its docstring says where).
    assert set(_table()) == pinned


def test_the_table_is_what_the_libraries_installed_here_read() -> None:
    # The same scanner over the installed copies: where the version is the table's, the names are.
    installed = env_names.scan_installed()
    same = {key: entry for key, entry in installed.items() if key in _table()}
    # ray and datasets are pinned by pyproject (the others are whatever verl's install resolved: compared when equal).
    assert {"ray==2.60.0", "datasets==5.2.0"} <= set(same), sorted(installed)
    assert env_names.differences(_table(), same) == []


def test_check_names_each_name_the_table_lacks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:
    table = _table()
    table["ray==2.60.0"]["RAY_"].remove("RAY_DEDUP_LOGS")
    monkeypatch.setattr(env_names, "TABLE", tmp_path / "env_names.json")
    env_names.TABLE.write_text(json.dumps(table))
    assert env_names.main(["check"]) == 1
    assert "ray==2.60.0 RAY_*: reads ['RAY_DEDUP_LOGS'] too, not []" in capsys.readouterr().err


def _wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as wheel:
        for name, content in members.items():
            wheel.writestr(name, content)
    return path


def test_a_wheel_gives_quoted_names_in_python_and_whole_c_strings_in_libraries(tmp_path: Path) -> None:
    wheel = _wheel(
        tmp_path / "torch_npu-9.9-cp312-cp312-linux_aarch64.whl",
        {
            "torch_npu/env.py": b'os.getenv("HCCL_EXEC_TIMEOUT")\nPREFIX = "HCCL_PART_"\n# HCCL_IN_A_COMMENT\nx = "hccl_lower"\n',
            "torch_npu/lib/libtorch_npu.so.2": b"\x7fELF\x00HCCL_BUFFSIZE\x00xHCCL_INSIDE\x00HCCL_TAIL",
            "torch_npu/data.txt": b'"HCCL_IN_TEXT"',
        },
    )
    assert env_names.scan_archive(wheel) == ("torch_npu==9.9", {"HCCL_": ["HCCL_BUFFSIZE", "HCCL_EXEC_TIMEOUT"]})


def test_an_sdist_gives_only_its_packages_names(tmp_path: Path) -> None:
    sdist = tmp_path / "vllm-1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as archive:
        for name, text in {"vllm-1.0/vllm/envs.py": b'"VLLM_PORT"', "vllm-1.0/tests/test_x.py": b'"VLLM_TEST_ONLY"'}.items():
            entry = tarfile.TarInfo(name)
            entry.size = len(text)
            archive.addfile(entry, io.BytesIO(text))
    assert env_names.scan_archive(sdist) == ("vllm==1.0", {"VLLM_": ["VLLM_PORT"]})


def test_an_archive_of_no_familys_owner_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="numpy owns no family"):
        env_names.scan_archive(_wheel(tmp_path / "numpy-2.0-cp312-cp312-linux_x86_64.whl", {}))


def test_write_adds_the_archives_entries_and_keeps_the_others(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:
    monkeypatch.setattr(env_names, "TABLE", tmp_path / "env_names.json")
    env_names.TABLE.write_text(json.dumps({"ray==1.0": {"RAY_": ["RAY_ADDRESS"]}, "wandb==2.0": {"WANDB_": ["WANDB_MODE"]}}))
    wheel = _wheel(tmp_path / "wandb-3.0-py3-none-any.whl", {"wandb/env.py": b'"WANDB_PROJECT"'})
    assert env_names.main(["write", str(wheel)]) == 0
    assert json.loads(env_names.TABLE.read_text()) == {
        "ray==1.0": {"RAY_": ["RAY_ADDRESS"]}, "wandb==2.0": {"WANDB_": ["WANDB_MODE"]}, "wandb==3.0": {"WANDB_": ["WANDB_PROJECT"]},
    }  # fmt: skip
    assert capsys.readouterr().out.splitlines() == ["ray==1.0: 1 RAY_*", "wandb==2.0: 1 WANDB_*", "wandb==3.0: 1 WANDB_*"]


def test_write_without_archives_scans_what_is_installed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(env_names, "TABLE", tmp_path / "env_names.json")
    assert env_names.main(["write"]) == 0
    assert json.loads(env_names.TABLE.read_text()) == env_names.scan_installed()


def test_check_names_an_installed_version_the_table_lacks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:
    monkeypatch.setattr(env_names, "TABLE", tmp_path / "env_names.json")
    env_names.TABLE.write_text("{}")
    assert env_names.main(["check"]) == 1
    err = capsys.readouterr().err
    assert "env_names: ray==2.60.0 is installed, env_names.json has no entry for it" in err.splitlines()


def test_check_names_a_name_the_library_no_longer_reads() -> None:
    assert env_names.differences({"x==1": {"RAY_": ["RAY_A", "RAY_OLD"]}}, {"x==1": {"RAY_": ["RAY_A"]}}) == [
        "x==1 RAY_*: reads [] too, not ['RAY_OLD']"
    ]
    assert env_names.differences({"x==1": {}}, {"x==1": {"RAY_": ["RAY_A"]}}) == ["x==1 RAY_*: reads ['RAY_A'] too, not []"]


@pytest.mark.parametrize("name", ["notes.txt", "wandb.zip", "wandb-1.0.tar.bz2"])
def test_a_file_that_is_no_archive_is_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(SystemExit, match=f"error: {re.escape(name)}: neither a wheel nor an sdist"):
        env_names.scan_archive(tmp_path / name)


def test_a_command_is_required() -> None:
    with pytest.raises(SystemExit) as refused:
        env_names.main([])
    assert refused.value.code == 2


def test_a_file_past_the_size_bound_is_not_read(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    wheel = _wheel(tmp_path / "ray-1.0-py3-none-any.whl", {"ray/a.py": b'"RAY_AA"', "ray/b.py": b'"RAY_BBBBBB"'})
    monkeypatch.setattr(env_names, "MAX_FILE_BYTES", len(b'"RAY_AA"'))
    assert env_names.scan_archive(wheel) == ("ray==1.0", {"RAY_": ["RAY_AA"]})
