#!/usr/bin/env python3
"""Resolve each image's requirements.in into a hash-pinned requirements.lock.

Usage: python3 docker/lock.py [gpu|npu ...]      (default: both)

Needs `uv` on PATH and `packaging` (pip install uv packaging) and PyPI. Resolution runs from PyPI metadata
for the image's own Python and platform, so it works on a machine whose Python
(3.11 here) is not the image's (3.12).

The npu image builds vLLM from its source release with VLLM_TARGET_DEVICE=empty
(the way vllm-ascend installs it): the PyPI vllm wheels are CUDA builds that pin a
CUDA torch. So for npu this script also downloads the vLLM sdist, checks its sha256
against PyPI, writes that pin to vllm-source.lock, and feeds vLLM's own
requirements/common.txt to the resolver. It pins the vllm-ascend sdist the same way
(vllm-ascend-source.lock), which the builder compiles for Atlas A3.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

DOCKER_DIR = Path(__file__).resolve().parent
PYTHON_VERSION = "3.12"
PYPI_SIMPLE = "https://pypi.org/simple"


@dataclass(frozen=True)
class Target:
    """One image's lock inputs and the platform it is resolved for."""

    device: str
    # uv --python-platform values; one lock per image, so a second platform is
    # resolved as a check that the same pins install there too.
    platforms: tuple[str, ...]
    vllm_source: str | None = None  # "vllm==X.Y.Z" when vLLM is built from its sdist
    # "vllm-ascend==X.Y.Z": its sdist, built for Atlas A3 (CANN_CHIP=a3) where PyPI's wheels are A2 only
    vllm_ascend_source: str | None = None
    python_version: str = PYTHON_VERSION
    extra_uv_args: tuple[str, ...] = field(default=())

    @property
    def dir(self) -> Path:
        """Folder holding requirements.in, overrides.txt, ... for this image."""
        return DOCKER_DIR / self.device


TARGETS = {
    # glibc 2.39 (Ubuntu 24.04): nvidia-resiliency-ext, required by megatron-bridge,
    # ships manylinux_2_39 wheels only.
    "gpu": Target("gpu", ("x86_64-manylinux_2_39",)),
    # glibc 2.35 (the CANN base is Ubuntu 22.04); arm64, the usual Ascend server.
    # x86_64 is not locked: torch_npu's x86_64 wheel requires torch==2.10.0+cpu, which
    # only PyTorch's own index serves (not PyPI). See docs/images.md.
    "npu": Target(
        "npu",
        ("aarch64-manylinux_2_35",),
        vllm_source="vllm==0.23.0",
        vllm_ascend_source="vllm-ascend==0.23.0",
    ),
    # CI's stand-in framework base: Debian bookworm (Python 3.11, glibc 2.36) with only
    # the recipe's runtime dependencies, so the recipe layer builds and runs without GPUs.
    "standin": Target("standin", ("x86_64-manylinux_2_36",), python_version="3.11"),
}


def _sdist(name: str, version: str) -> tuple[str, str]:
    """Return (url, sha256) of NAME==VERSION's sdist from PyPI's JSON simple API."""
    request = urllib.request.Request(
        f"{PYPI_SIMPLE}/{name}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    wanted = {f"{name}-{version}.tar.gz", f"{name.replace('-', '_')}-{version}.tar.gz"}  # PEP 625 normalises it
    for entry in files:
        if entry["filename"] in wanted:
            return entry["url"], entry["hashes"]["sha256"]
    raise SystemExit(f"{' or '.join(sorted(wanted))}: not on PyPI")


def _checked_download(url: str, sha256: str) -> bytes:
    with urllib.request.urlopen(url, timeout=600) as response:
        blob = response.read()
    if hashlib.sha256(blob).hexdigest() != sha256:
        raise SystemExit(f"{url}: sha256 does not match PyPI's")
    return blob


def write_vllm_source(target: Target) -> Path:
    """Pin the vLLM sdist by hash and extract its runtime requirements for the resolver."""
    if target.vllm_source is None:
        raise ValueError(f"{target.device}: no vLLM source release to pin")
    name, version = target.vllm_source.split("==")
    url, sha256 = _sdist(name, version)
    blob = _checked_download(url, sha256)
    with tarfile.open(fileobj=io.BytesIO(blob)) as archive:
        member = archive.extractfile(f"{name}-{version}/requirements/common.txt")
        if member is None:
            raise SystemExit(f"{url}: no requirements/common.txt")
        common = member.read().decode()
    (target.dir / "vllm-source.lock").write_text(
        "# vLLM built from source with VLLM_TARGET_DEVICE=empty; written by docker/lock.py\n"
        f"{target.vllm_source} --hash=sha256:{sha256}\n"
    )
    generated = target.dir / "vllm-common.txt"
    generated.write_text(
        f"# Runtime requirements of {target.vllm_source} (its requirements/common.txt),\n"
        "# extracted by docker/lock.py from the hash-checked sdist. Do not edit.\n" + common
    )
    return generated


def write_vllm_ascend_source(target: Target) -> Path:
    """Pin the vllm-ascend sdist by hash: the builder compiles it for the A3 SOC when CANN_CHIP=a3."""
    if target.vllm_ascend_source is None:
        raise ValueError(f"{target.device}: no vllm-ascend source release to pin")
    name, version = target.vllm_ascend_source.split("==")
    url, sha256 = _sdist(name, version)
    _checked_download(url, sha256)
    lock = target.dir / "vllm-ascend-source.lock"
    lock.write_text(
        "# vllm-ascend built from source for Atlas A3 (CANN_CHIP=a3, SOC_VERSION=ascend910_9391): its PyPI\n"
        "# wheels are built for Atlas A2 only (docs/images.md). Written by docker/lock.py\n"
        f"{target.vllm_ascend_source} --hash=sha256:{sha256}\n"
    )
    return lock


def compile_lock(target: Target) -> None:
    """Run uv pip compile for every platform of TARGET; write the first one's lock."""
    uv = shutil.which("uv")
    if uv is None:
        raise SystemExit("uv not found: pip install uv")
    inputs = [target.dir / "requirements.in"]
    if target.vllm_source:
        inputs.append(write_vllm_source(target))
    if target.vllm_ascend_source:
        write_vllm_ascend_source(target)
    options: list[str] = []
    for name, flag in (("overrides.txt", "--overrides"), ("excludes.txt", "--excludes")):
        if (target.dir / name).exists():
            options += [flag, str(target.dir / name)]
    lock = target.dir / "requirements.lock"
    for index, platform in enumerate(target.platforms):
        output = lock if index == 0 else target.dir / f".check-{platform}.lock"
        command = [
            uv, "pip", "compile", *map(str, inputs), *options,
            "--python-version", target.python_version, "--python-platform", platform,
            "--generate-hashes", "--no-header", "--emit-index-url",
            "--custom-compile-command", f"python3 docker/lock.py {target.device}",
            "--output-file", str(output), *target.extra_uv_args,
        ]  # fmt: skip
        print("+", " ".join(command), flush=True)
        subprocess.run(command, check=True, env={**os.environ, "UV_PYTHON_DOWNLOADS": "never"})
        if index:
            _same_pins(lock, output)
            output.unlink()
    split_source_pins(lock, target.platforms[0], target.python_version)


def _wheel_fits(filename: str, version: str, platform: str, python: str) -> bool:
    """True when wheel FILENAME of VERSION installs on CPython PYTHON on uv PLATFORM."""
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    try:
        _, wheel_version, _, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return False
    if str(wheel_version) != version and filename.split("-")[1] != version:
        return False
    py_minor = int(python.split(".")[1])
    arch, glibc = platform.split("-manylinux_2_")
    platforms = {f"manylinux_2_{minor}_{arch}" for minor in range(5, int(glibc) + 1)}
    platforms |= {f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}", "any"}
    for tag in tags:
        # cp312 / py312 / py37 -> "12" / "12" / "7": the Python 3 minor the wheel targets.
        minor = tag.interpreter[3:] if tag.interpreter.startswith(("cp3", "py3")) else ""
        python_ok = tag.interpreter in {"py3", "py2.py3"} or (
            minor.isdigit()
            and int(minor) <= py_minor
            and (tag.abi in {"none", "abi3"} or int(minor) == py_minor)
        )
        if python_ok and tag.platform in platforms:
            return True
    return False


def _has_wheel(pin: tuple[str, str], platform: str, python: str) -> bool:
    """Ask PyPI whether NAME==VERSION has a wheel for PLATFORM (else it builds from source)."""
    name, version = pin
    request = urllib.request.Request(
        f"{PYPI_SIMPLE}/{name}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    return any(_wheel_fits(f["filename"], version, platform, python) for f in files)


def split_source_pins(lock: Path, platform: str, python: str) -> None:
    """Move pins without a wheel for PLATFORM from LOCK to requirements-source.lock.

    The image installs requirements.lock with --only-binary (nothing compiles there)
    and builds the few source pins in a builder stage that has the compilers.
    """
    blocks: list[list[str]] = []
    for line in lock.read_text().splitlines():
        if line and not line.startswith((" ", "#", "-")):
            blocks.append([line])
        elif blocks:
            blocks[-1].append(line)
    head = lock.read_text().split("\n\n", 1)[0]
    pins = [tuple(b[0].split(" ")[0].split(";")[0].split("==")) for b in blocks]
    names = [p[0].split("[")[0] for p in pins]
    with ThreadPoolExecutor(16) as pool:
        wheel = list(pool.map(lambda p: _has_wheel(p, platform, python), zip(names, (p[1] for p in pins))))
    keep = ["\n".join(b) for b, ok in zip(blocks, wheel) if ok]
    move = ["\n".join(b) for b, ok in zip(blocks, wheel) if not ok]
    lock.write_text(head + "\n\n" + "\n".join(keep) + "\n")
    source = lock.with_name("requirements-source.lock")
    if not move:
        source.unlink(missing_ok=True)
        print(f"{lock}: {len(keep)} wheel pins, nothing builds from source")
        return
    source.write_text(
        f"# Pins with no wheel for {platform}: built in the Dockerfile's builder stage.\n"
        f"# Written by docker/lock.py from the same resolution as requirements.lock.\n"
        + head + "\n\n" + "\n".join(move) + "\n"
    )
    print(f"{lock}: {len(keep)} wheel pins; {source.name}: {[n for n, ok in zip(names, wheel) if not ok]}")


def _pins(path: Path) -> dict[str, str]:
    """name -> version for every `name==version` line of a lock file."""
    pins = {}
    for line in path.read_text().splitlines():
        if "==" in line and not line.startswith((" ", "#")):
            name, version = line.split(" ")[0].split("==")
            pins[name] = version
    return pins


def _same_pins(first: Path, second: Path) -> None:
    """Fail if two platforms' resolutions pin a shared package differently."""
    a, b = _pins(first), _pins(second)
    differ = {n: (a[n], b[n]) for n in a.keys() & b.keys() if a[n] != b[n]}
    only = sorted(a.keys() ^ b.keys())
    if differ:
        raise SystemExit(f"platforms resolve differently: {differ}")
    if only:
        print(f"note: packages on one platform only: {only}")


def main(argv: list[str]) -> int:
    """Lock the named images (all when none are named)."""
    names = argv or list(TARGETS)
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        print(f"unknown image(s): {unknown}; choose from {list(TARGETS)}", file=sys.stderr)
        return 2
    for name in names:
        compile_lock(TARGETS[name])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
