"""`doctor --json` run inside the image: the image checks itself, and these tests read its verdict.

The testinfra checks beside this file look from outside (user, files, labels); these ask the
image's own `doctor`, as a user's CI or a new node would (issue 14). Breakage tests remove a
distribution in a throwaway container (as root) and expect doctor to name it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conftest import Image, docker

REPO = Path(__file__).resolve().parents[3]
#: Labels the image writes for doctor (labels.d) as well as in its config.
FILE_LABELS = ("io.grpo-recipe.", "org.opencontainers.image.version")


@dataclass(frozen=True)
class DoctorRun:
    """One `doctor --json` run: its exit code and its document."""

    returncode: int
    document: dict[str, Any]
    stderr: str

    def check(self, name: str) -> dict[str, Any]:
        """The check called NAME; fails the test when doctor did not report it."""
        found = [c for c in self.document["checks"] if c["name"] == name]
        assert found, f"doctor reported no check {name!r}: {[c['name'] for c in self.document['checks']]}"
        return found[0]


def run_doctor(image: Image, *args: str, as_root_first: str | None = None) -> DoctorRun:
    """`doctor --json ARGS` in a fresh container; AS_ROOT_FIRST, a shell line run as root before it."""
    if as_root_first is None:
        result = docker("run", "--rm", image.ref, "doctor", "--json", *args, check=False)
    else:
        quoted = " ".join(f"'{a}'" for a in args)
        script = f"{as_root_first} >/dev/null 2>&1 && exec python3 /opt/recipe/entrypoint.py doctor --json {quoted}"
        result = docker("run", "--rm", "--user", "0", "--entrypoint", "bash", image.ref, "-c", script, check=False)
    assert result.stdout.strip(), f"doctor printed nothing (exit {result.returncode}): {result.stderr[-2000:]}"
    return DoctorRun(result.returncode, json.loads(result.stdout), result.stderr)


@pytest.fixture(scope="module")
def doctor(image: Image) -> DoctorRun:
    """The image's `doctor --json --no-devices`, run once as its default user: CI's machine has no accelerator by
    design, which the flag says (a node without its devices fails: test_a_node_without_its_devices_fails)."""
    return run_doctor(image, "--no-devices")


def test_document_is_schema_1_and_its_exit_code_is_the_processs(doctor: DoctorRun) -> None:
    assert doctor.document["schema_version"] == 1
    assert doctor.document["exit_code"] == doctor.returncode
    assert doctor.returncode == (1 if doctor.document["summary"]["failed"] else 0)


def test_every_check_has_a_status_a_reason_and_a_time(doctor: DoctorRun) -> None:
    for check in doctor.document["checks"]:
        assert check["status"] in ("ok", "warn", "fail"), check
        assert check["reason"] and "\n" not in check["reason"], check
        assert check["seconds"] >= 0, check


def test_runs_as_the_non_root_user(doctor: DoctorRun) -> None:
    assert doctor.check("user")["status"] == "ok"
    assert doctor.document["environment"]["user"]["uid"] == 1000


@pytest.mark.parametrize("variable", ["CHECKPOINT_DIR", "HF_HOME"])
def test_run_can_write_where_it_writes(doctor: DoctorRun, variable: str) -> None:
    assert doctor.check(f"writable:{variable}")["status"] == "ok"


def test_labels_doctor_reads_are_the_images_labels(doctor: DoctorRun, image: Image) -> None:
    from_config = {k: v for k, v in image.labels.items() if k.startswith(FILE_LABELS)}
    assert doctor.document["environment"]["image"]["labels"] == from_config


def test_device_is_the_images_own(doctor: DoctorRun, image: Image) -> None:
    assert doctor.document["environment"]["device"]["name"] == image.device


def test_without_a_device_the_device_checks_warn_not_fail(doctor: DoctorRun) -> None:
    devices = [c for c in doctor.document["checks"] if c["category"] == "device"]
    assert devices and all(c["status"] == "warn" for c in devices), devices


def test_a_node_without_its_devices_fails(image: Image) -> None:
    """Without --no-devices, the image on a node whose devices are not visible fails its devices check, exit 1."""
    result = run_doctor(image, "--only", "devices")
    assert result.returncode == 1 and result.document["summary"]["failed"] == ["devices"], result.document


@pytest.mark.framework
def test_a_full_image_passes_doctor(doctor: DoctorRun) -> None:
    summary = doctor.document["summary"]
    assert (doctor.returncode, summary["failed"], summary["missing"]) == (0, [], [])


@pytest.mark.framework
def test_installed_versions_match_the_labels(doctor: DoctorRun) -> None:
    labels = doctor.check("labels")
    assert labels["status"] == "ok", labels["reason"]


@pytest.mark.framework
def test_locks_carried_are_the_repositorys(doctor: DoctorRun, image: Image) -> None:
    expected = {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted((REPO / "docker" / str(image.device)).glob("*.lock"))
    }
    assert doctor.document["environment"]["image"]["locks"] == expected


@pytest.mark.framework
@pytest.mark.parametrize("name", ["import:TransferQueue", "import:verl", "import:vllm", "allocator_switch"])
def test_trainer_checks_pass(doctor: DoctorRun, name: str) -> None:
    check = doctor.check(name)
    assert check["status"] == "ok", check["reason"]


@pytest.mark.framework
def test_transferqueue_uninstalled_is_a_named_failure(image: Image) -> None:
    broken = run_doctor(image, "--only", "import:TransferQueue", as_root_first="pip uninstall -y TransferQueue")
    assert broken.returncode == 1
    assert broken.check("import:TransferQueue")["status"] == "fail"
    assert "import:TransferQueue" in broken.document["summary"]["failed"]


@pytest.mark.framework
def test_transformer_engine_removed_is_a_failure_not_a_mock(image: Image) -> None:
    if image.device != "gpu":
        pytest.skip("Transformer Engine is checked on gpu; the npu image has none")
    # Megatron imports without TE (HAVE_TE=False): only doctor's own check can see it is gone.
    broken = run_doctor(image, "--only", "transformer_engine", as_root_first="pip uninstall -y transformer-engine-torch")
    assert broken.returncode == 1
    assert broken.check("transformer_engine")["status"] == "fail"


def test_stand_in_reports_the_missing_framework_by_name(image: Image) -> None:
    if image.full_framework:
        pytest.skip("checks the stand-in framework; this image's framework is full")
    result = run_doctor(image, "--no-devices")
    assert result.returncode == 1
    missing = result.document["summary"]["missing"]
    # The stand-in has no verl, so the names come from what `run` checks (recipe.run.preflight).
    assert {"torch", "megatron-core", "verl"} <= {name.lower() for name in missing}, missing
