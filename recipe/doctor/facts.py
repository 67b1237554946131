"""The environment report of `doctor`: read from files and metadata, never by importing a framework.

The image's own facts (labels, locks, versions) live a room below, in recipe.image_facts, which
plan and the run record read too; the driver, the toolkit, the user and Python are read here.
"""

from __future__ import annotations

import os
import platform
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from recipe.image_facts import (  # noqa: F401 - doctor's modules read them through here
    IMAGE_INFO_DIR,
    IMAGE_INFO_VARIABLE,
    REPORTED_DISTRIBUTIONS,
    distribution_version,
    image_info_dir,
    lock_digests,
    read_labels,
)

#: Seconds a driver tool (nvidia-smi, npu-smi) may take; a hung driver makes it hang.
DRIVER_TOOL_TIMEOUT_S = 20.0

NVIDIA_PROC_VERSION = Path("/proc/driver/nvidia/version")
ASCEND_DRIVER_VERSION = Path("/usr/local/Ascend/driver/version.info")
ASCEND_TOOLKIT_DEFAULT = Path("/usr/local/Ascend/ascend-toolkit/latest")


def user_facts() -> dict[str, Any]:
    uid = os.getuid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = None
    return {"uid": uid, "gid": os.getgid(), "name": name, "groups": sorted(os.getgroups())}


def torch_cuda_version() -> str | None:
    """CUDA version torch was built for, read from torch/version.py without importing torch."""
    spec = find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    match = re.search(r"^cuda\b[^=\n]*=\s*['\"]([^'\"]+)['\"]", text, flags=re.MULTILINE)
    return match.group(1) if match else None


def _run_tool(argv: list[str]) -> tuple[str | None, str | None]:
    """(stdout, None), or (None, why not) for a tool that is missing, fails or hangs.

    Output goes to files, not pipes, and a tool that outlives its timeout is killed with its
    process group and then left alone: one stuck in the kernel (a hung driver) cannot be
    reaped, and waiting for its pipes to close would hang doctor with it.
    """
    if shutil.which(argv[0]) is None:
        return None, f"{argv[0]} not found"
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True)
        except OSError as error:
            return None, f"{argv[0]}: {error.strerror}"
        try:
            code = process.wait(timeout=DRIVER_TOOL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
            return None, f"{' '.join(argv)} gave no answer in {DRIVER_TOOL_TIMEOUT_S:g} s (hung driver?)"
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode(errors="replace")
        stderr = err.read().decode(errors="replace")
    if code != 0:
        last = next((line.strip() for line in reversed((stdout + stderr).splitlines()) if line.strip()), "")
        return None, f"{' '.join(argv)} exited {code}: {last[:200]}"
    return stdout, None


@dataclass
class DriverFacts:
    """What the driver side says, and why it could not say more."""

    facts: dict[str, Any] = field(default_factory=dict)
    problem: str | None = None


def nvidia_driver() -> DriverFacts:
    found = DriverFacts()
    try:
        text = NVIDIA_PROC_VERSION.read_text(errors="replace")
        match = re.search(r"Kernel Module(?: for \w+)?\s+([\d.]+)", text)
        found.facts["kernel_module"] = match.group(1) if match else text.splitlines()[0].strip()
    except OSError:
        pass
    output, problem = _run_tool(
        ["nvidia-smi", "--query-gpu=index,name,driver_version,memory.total", "--format=csv,noheader"]
    )
    if output is not None:
        rows = [[cell.strip() for cell in line.split(",")] for line in output.splitlines() if line.strip()]
        found.facts["gpus"] = [
            {"index": r[0], "name": r[1], "driver_version": r[2], "memory_total": r[3]} for r in rows if len(r) >= 4
        ]
        if rows and len(rows[0]) >= 3:
            found.facts["driver_version"] = rows[0][2]
        table, _ = _run_tool(["nvidia-smi"])
        match = re.search(r"CUDA Version:\s*([\d.]+)", table or "")
        if match:
            found.facts["cuda_driver_version"] = match.group(1)
    elif "kernel_module" in found.facts or problem and "not found" not in problem:
        found.problem = problem
    return found


def cann_version_files(environ: Mapping[str, str]) -> list[tuple[Path, str]]:
    """(path, text) of the CANN toolkit's version files: <home>/*/ascend_toolkit_install.info, <home>/version.cfg."""
    homes = [environ.get("ASCEND_TOOLKIT_HOME"), environ.get("ASCEND_HOME_PATH"), str(ASCEND_TOOLKIT_DEFAULT)]
    found = []
    for home in dict.fromkeys(filter(None, homes)):
        root = Path(home)
        for path in [*sorted(root.glob("*/ascend_toolkit_install.info")), root / "version.cfg"]:
            try:
                found.append((path, path.read_text(errors="replace")))
            except OSError:
                continue
    return found


def cann_version_text(environ: Mapping[str, str]) -> tuple[str | None, str | None]:
    """(CANN version, the file it came from) from the toolkit's version files, if any."""
    for path, text in cann_version_files(environ):
        match = re.search(r"^\s*version\s*=\s*\[?([0-9A-Za-z.]+)", text, flags=re.MULTILINE | re.IGNORECASE) or re.search(
            r"version=\[?([0-9A-Za-z.]+)", text
        )
        if match:
            return match.group(1), str(path)
    return None, None


def ascend_driver(environ: Mapping[str, str]) -> DriverFacts:
    found = DriverFacts()
    try:
        text = ASCEND_DRIVER_VERSION.read_text(errors="replace")
        match = re.search(r"^\s*Version\s*=\s*(\S+)", text, flags=re.MULTILINE | re.IGNORECASE)
        if match:
            found.facts["driver_version"] = match.group(1)
    except OSError:
        pass
    cann, source = cann_version_text(environ)
    if cann:
        found.facts["cann_version"] = cann
        found.facts["cann_version_file"] = source
    output, problem = _run_tool(["npu-smi", "info"])
    if output is not None:
        match = re.search(r"Version:\s*(\S+)", output)
        if match:
            found.facts["npu_smi_version"] = match.group(1)
    elif "driver_version" in found.facts or problem and "not found" not in problem:
        found.problem = problem
    return found


def driver_facts(device: str, environ: Mapping[str, str]) -> DriverFacts:
    return nvidia_driver() if device == "gpu" else ascend_driver(environ)


def python_facts() -> dict[str, Any]:
    return {
        "version": platform.python_version(),
        "implementation": platform.python_implementation(),
        "executable": sys.executable,
        "machine": platform.machine(),
    }
