"""`python -m recipe.env_names`: its command line, what `write` and `check` print and write, and `readers`.

Everything here runs on made-up archives, a made-up installed distribution and a table in a
temporary folder: what is installed here is never scanned (test_env_names.py does that, once).
"""

from __future__ import annotations

import io
import json
import tarfile
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from recipe import env_names


def _wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as wheel:
        for name, content in members.items():
            wheel.writestr(name, content)
    return path


def _sdist(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for name, content in members.items():
            entry = tarfile.TarInfo(name)
            entry.size = len(content)
            archive.addfile(entry, io.BytesIO(content))
    return path


def _no_installed_scan() -> dict[str, dict[str, list[str]]]:
    raise AssertionError("what is installed here was scanned")


# --- the command line ------------------------------------------------------------------------------


def test_a_usage_error_names_the_command_as_it_is_run(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        env_names.main(["scan"])
    assert refused.value.code == 2
    assert capsys.readouterr().err.startswith("usage: python -m recipe.env_names [-h] {write,check} ...")


def test_help_says_what_the_table_is_and_what_each_command_does(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        env_names.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "The environment variables that the recipe's libraries read, by family" in out
    assert "write scan what is installed here (or only ARCHIVE...), update env_names.json" in out
    assert "check exit 1 if what is installed here reads other names than env_names.json says" in out


def test_write_help_shows_its_archives_as_archive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        env_names.main(["write", "--help"])
    assert capsys.readouterr().out.startswith("usage: python -m recipe.env_names write [-h] [ARCHIVE ...]")


# --- write -----------------------------------------------------------------------------------------


def test_write_of_archives_reads_nothing_installed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Scanning a wheel works where what is installed cannot be scanned (another image's libraries)."""
    monkeypatch.setattr(env_names, "TABLE", tmp_path / "env_names.json")
    monkeypatch.setattr(env_names, "scan_installed", _no_installed_scan)
    wheel = _wheel(tmp_path / "ray-3.0-py3-none-any.whl", {"ray/env.py": b'"RAY_ADDRESS"'})
    assert env_names.main(["write", str(wheel)]) == 0
    assert json.loads(env_names.TABLE.read_text()) == {"ray==3.0": {"RAY_": ["RAY_ADDRESS"]}}


def test_write_with_nothing_new_leaves_the_committed_table_byte_for_byte(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The table's layout (one-space indent, sorted, final newline) is the one `write` writes: no churn in review."""
    committed = env_names.TABLE.read_text(encoding="utf-8")
    monkeypatch.setattr(env_names, "TABLE", tmp_path / "env_names.json")
    env_names.TABLE.write_text(committed, encoding="utf-8")
    monkeypatch.setattr(env_names, "scan_installed", dict)
    assert env_names.main(["write"]) == 0
    assert env_names.TABLE.read_text(encoding="utf-8") == committed


def test_a_library_of_two_families_gets_both_and_write_counts_each(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(env_names, "TABLE", tmp_path / "env_names.json")
    wheel = _wheel(
        tmp_path / "vllm_ascend-1.0-cp312-cp312-linux_aarch64.whl",
        {"vllm_ascend/envs.py": b'os.environ["VLLM_ASCEND_X"]\nos.getenv("HCCL_OP_EXPANSION_MODE")\n'},
    )
    assert env_names.main(["write", str(wheel)]) == 0
    assert json.loads(env_names.TABLE.read_text()) == {
        "vllm_ascend==1.0": {"VLLM_": ["VLLM_ASCEND_X"], "HCCL_": ["HCCL_OP_EXPANSION_MODE"]}
    }
    assert capsys.readouterr().out.splitlines() == ["vllm_ascend==1.0: 1 VLLM_*, 1 HCCL_*"]


# --- check -----------------------------------------------------------------------------------------


def test_check_passes_and_says_so_when_the_table_is_what_is_installed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    installed = {"ray==1.0": {"RAY_": ["RAY_A"]}, "wandb==2.0": {"WANDB_": ["WANDB_MODE"]}}
    monkeypatch.setattr(env_names, "TABLE", tmp_path / "env_names.json")
    env_names.TABLE.write_text(json.dumps({**installed, "vllm==0.1": {"VLLM_": []}}))  # other images' entries stay
    monkeypatch.setattr(env_names, "scan_installed", lambda: installed)
    assert env_names.main(["check"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "env_names: 2 distributions checked, 0 differ\n" and captured.err == ""


def test_check_counts_what_differs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(env_names, "TABLE", tmp_path / "env_names.json")
    env_names.TABLE.write_text(json.dumps({"ray==1.0": {"RAY_": ["RAY_A"]}}))
    monkeypatch.setattr(env_names, "scan_installed", lambda: {"ray==1.0": {"RAY_": ["RAY_B"]}, "wandb==2.0": {"WANDB_": []}})
    assert env_names.main(["check"]) == 1
    assert capsys.readouterr().out == "env_names: 2 distributions checked, 2 differ\n"


# --- what is scanned -------------------------------------------------------------------------------


def _installed(root: Path, name: str, version: str, files: dict[str, bytes], listed_only: tuple[str, ...] = ()) -> metadata.Distribution:
    """A distribution installed under root: its dist-info lists FILES (written) and LISTED_ONLY (absent)."""
    info = root / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    for path, content in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(content)
    (info / "RECORD").write_text("".join(f"{path},,\n" for path in [*files, *listed_only]))
    return metadata.PathDistribution(info)


def _only_installed(monkeypatch: pytest.MonkeyPatch, distribution: metadata.Distribution, name: str) -> None:
    def lookup(wanted: str) -> metadata.Distribution:
        if wanted != name:
            raise metadata.PackageNotFoundError(wanted)
        return distribution

    monkeypatch.setattr(env_names.metadata, "distribution", lookup)


def test_an_installed_file_its_record_lists_but_that_is_gone_is_skipped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ray = _installed(tmp_path, "ray", "9.9", {"ray/env.py": b'"RAY_KEPT"'}, listed_only=("ray/gone.py", "ray/_lib.so"))
    _only_installed(monkeypatch, ray, "ray")
    assert env_names.scan_installed() == {"ray==9.9": {"RAY_": ["RAY_KEPT"]}}


def test_an_installed_file_of_exactly_the_size_bound_is_read(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ray = _installed(tmp_path, "ray", "9.9", {"ray/a.py": b'"RAY_AA"', "ray/b.py": b'"RAY_BBBBBB"'})
    _only_installed(monkeypatch, ray, "ray")
    monkeypatch.setattr(env_names, "MAX_FILE_BYTES", len(b'"RAY_AA"'))
    assert env_names.scan_installed() == {"ray==9.9": {"RAY_": ["RAY_AA"]}}


def test_an_sdist_file_of_exactly_the_size_bound_is_read(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    sdist = _sdist(tmp_path / "ray-1.0.tar.gz", {"ray-1.0/ray/a.py": b'"RAY_AA"', "ray-1.0/ray/b.py": b'"RAY_BBBBBB"'})
    monkeypatch.setattr(env_names, "MAX_FILE_BYTES", len(b'"RAY_AA"'))
    assert env_names.scan_archive(sdist) == ("ray==1.0", {"RAY_": ["RAY_AA"]})


def test_an_archive_names_its_distribution_by_pypis_rule(tmp_path: Path) -> None:
    """`Vllm.Ascend` and `vllm__ascend` are vllm_ascend (PEP 503: runs of `-_.` are one `_`, case aside)."""
    for spelling in ("Vllm.Ascend", "vllm__ascend"):
        wheel = _wheel(tmp_path / f"{spelling}-1.0-py3-none-any.whl", {"vllm_ascend/envs.py": b'"VLLM_ASCEND_X"'})
        assert env_names.scan_archive(wheel) == ("vllm_ascend==1.0", {"VLLM_": ["VLLM_ASCEND_X"], "HCCL_": []})


def test_an_archive_of_no_familys_owner_names_every_family(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as refused:
        env_names.scan_archive(_wheel(tmp_path / "numpy-2.0-cp312-cp312-linux_x86_64.whl", {}))
    assert str(refused.value.code) == (
        "error: numpy-2.0-cp312-cp312-linux_x86_64.whl: numpy owns no family (RAY_, HF_, WANDB_, VLLM_, NCCL_, HCCL_)"
    )


# --- readers ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "libraries"),
    [
        ("HF_HOME", ["accelerate", "datasets", "huggingface_hub"]),
        ("RAY_ADDRESS", ["ray"]),
        ("VLLM_DISABLE_SHARED_EXPERTS_STREAM", ["vllm", "vllm_ascend"]),  # both vllm versions: one name
        ("RAY_NO_SUCH_VARIABLE", []),
    ],
)
def test_readers_are_the_libraries_that_read_a_name_without_versions(name: str, libraries: list[str]) -> None:
    assert env_names.readers(name) == libraries
