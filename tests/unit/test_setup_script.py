"""tests/setup.sh, the README's test command: its refusals are one line each, and a second run installs nothing.

Each test runs the real script from a copy of it in a folder of its own (it works on the folder above its own,
as in the checkout), with pip cut off from this machine's configuration and indexes: the torch it may find is a
stand-in wheel made here (a CPU build, or a CUDA build that requires nvidia packages), so nothing is downloaded.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from .envtools import REPO

SCRIPT = REPO / "tests" / "setup.sh"
#: What pytest itself would take a minute or more for: the stand-in project installs in seconds.
TIMEOUT_S = 240


def _wheel(folder: Path, name: str, version: str, requires: list[str]) -> Path:
    """A minimal wheel of NAME==VERSION requiring REQUIRES (enough for pip's resolver and installer)."""
    dist = f"{name}-{version}.dist-info"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"{name}/__init__.py", "")
        wheel.writestr(f"{dist}/METADATA", metadata)
        wheel.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{dist}/RECORD", f"{name}/__init__.py,,\n{dist}/METADATA,,\n{dist}/WHEEL,,\n{dist}/RECORD,,\n")
    return path


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A stand-in checkout: the real tests/setup.sh, a project with the two extras and no dependency, and a
    Megatron-Bridge step that counts its runs."""
    root = tmp_path / "checkout"
    (root / "tests").mkdir(parents=True)
    (root / "tests" / "setup.sh").write_bytes(SCRIPT.read_bytes())
    # An in-tree build backend with nothing to download: an editable wheel of a .pth file.
    (root / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "standin_backend"\nbackend-path = ["."]\n'
    )
    (root / "standin_backend.py").write_text(STANDIN_BACKEND)
    (root / ".ci").mkdir()
    (root / ".ci" / "install-megatron-bridge.sh").write_text(f'echo ran >>"{tmp_path}/bridge-runs"\n')
    (tmp_path / "wheels").mkdir()
    return root


STANDIN_BACKEND = """
import os, zipfile

def _wheel(directory):
    name = "standin-0-py3-none-any.whl"
    dist = "standin-0.dist-info"
    with zipfile.ZipFile(os.path.join(directory, name), "w") as wheel:
        wheel.writestr("standin.pth", os.getcwd() + "\\n")
        wheel.writestr(dist + "/METADATA", "Metadata-Version: 2.1\\nName: standin\\nVersion: 0\\n"
                       "Provides-Extra: trainer\\nProvides-Extra: test\\n")
        wheel.writestr(dist + "/WHEEL", "Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n")
        wheel.writestr(dist + "/RECORD", "standin.pth,,\\n" + dist + "/METADATA,,\\n" + dist + "/WHEEL,,\\n" + dist + "/RECORD,,\\n")
    return name

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory)

def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory)
"""


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """This environment without pip's configuration: only the stand-in wheels, no index."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "VIRTUAL_ENV"))}
    env |= {
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(tmp_path / "wheels"),
        "TORCH_INDEX_URL": f"file://{tmp_path}/no-such-index",
        "PYTHON": sys.executable,
    }
    return env | extra


def _setup(checkout: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(checkout / "tests" / "setup.sh"), *args], env=env, capture_output=True,
                          text=True, timeout=TIMEOUT_S, check=False)


def _one_line_refusal(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("setup: "), done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    return lines[0]


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="the script's own check refuses any Python but 3.11")
def test_a_second_run_installs_nothing_and_says_so(checkout: Path, tmp_path: Path) -> None:
    _wheel(tmp_path / "wheels", "torch", "2.13.0+cpu", ["filelock"])
    env = _env(tmp_path)
    first = _setup(checkout, env, "--no-tests")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "[setup] venv .venv: created with Python 3.11" in first.stdout
    assert "[setup] torch 2.13.0+cpu (CPU): installed from file://" in first.stdout
    assert "): installed, editable" in first.stdout
    site = next((checkout / ".venv" / "lib").glob("python3.*/site-packages"))
    before = {path.name: path.stat().st_mtime_ns for path in site.iterdir()}

    second = _setup(checkout, env, "--no-tests")
    assert second.returncode == 0, second.stdout + second.stderr
    said = [re.sub(r" \(\d+ s\)$", "", line) for line in second.stdout.splitlines()]  # without the clock
    assert said[0] == "[setup] venv .venv: reused"
    assert said[1] == "[setup] torch 2.13.0+cpu (CPU): current"
    assert said[2].startswith("[setup] recipe [trainer,test] (pyproject.toml ") and said[2].endswith("): current")
    assert said[3].startswith("[setup] Megatron-Bridge (") and said[3].endswith("): current")
    assert len(said) == 4, said
    assert (tmp_path / "bridge-runs").read_text() == "ran\n", "the Megatron-Bridge step ran again"
    assert {path.name: path.stat().st_mtime_ns for path in site.iterdir()} == before, "site-packages changed"

    # A changed project is installed again, and only it.
    pyproject = checkout / "pyproject.toml"
    pyproject.write_text(pyproject.read_text() + "# changed\n")
    third = _setup(checkout, env, "--no-tests")
    assert "): installed, editable" in third.stdout and "torch 2.13.0+cpu (CPU): current" in third.stdout


def test_any_python_but_3_11_is_refused_in_one_line_naming_what_was_found(checkout: Path, tmp_path: Path) -> None:
    fake = tmp_path / "python3.12"
    fake.write_text("#!/bin/sh\necho 3.12.1\n")
    fake.chmod(0o755)
    line = _one_line_refusal(_setup(checkout, _env(tmp_path, PYTHON=str(fake))))
    assert "is Python 3.12.1" in line and str(fake) in line and "need Python 3.11" in line
    assert "pyenv's 3.11 would be at" in line or "no pyenv here" in line
    assert not (checkout / ".venv").exists()


def test_a_machine_that_is_not_x86_64_is_refused_in_one_line(checkout: Path, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "uname").write_text("#!/bin/sh\necho aarch64\n")
    (bin_dir / "uname").chmod(0o755)
    env = _env(tmp_path, PATH=f"{bin_dir}:{os.environ['PATH']}")
    line = _one_line_refusal(_setup(checkout, env))
    assert "this machine is aarch64" in line and "x86_64" in line
    assert not (checkout / ".venv").exists()


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="the script's own check refuses any Python but 3.11")
def test_no_torch_in_any_source_is_refused_in_one_line(checkout: Path, tmp_path: Path) -> None:
    line = _one_line_refusal(_setup(checkout, _env(tmp_path)))
    assert "pip finds no torch==2.13.0" in line and f"file://{tmp_path}/no-such-index" in line
    assert not (tmp_path / "bridge-runs").exists()


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="the script's own check refuses any Python but 3.11")
def test_only_a_cuda_build_of_torch_is_refused_in_one_line(checkout: Path, tmp_path: Path) -> None:
    _wheel(tmp_path / "wheels", "torch", "2.13.0", ["nvidia-cublas-cu12==12.8.4.1", "filelock"])
    line = _one_line_refusal(_setup(checkout, _env(tmp_path)))
    assert "only a CUDA build of torch==2.13.0" in line
    site = next((checkout / ".venv" / "lib").glob("python3.*/site-packages"))
    assert not list(site.glob("torch*")), "the CUDA build was installed"
