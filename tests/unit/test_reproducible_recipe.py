"""The recipe stage's reproducibility: what the Dockerfiles need, and the tool that names a difference.

The proof itself (two no-cache builds, one image ID) needs buildah and runs in CI
(.ci/reproducible-recipe.sh); these checks run everywhere.
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path

import pytest

from .envtools import REPO

sys.path.insert(0, str(REPO / "tests" / "images"))
import oci_diff  # noqa: E402  (a script beside the image suites, not a package)


def test_recipe_stage_takes_source_date_epoch_before_its_first_run() -> None:
    # Without it pip stamps .pyc files with the build's clock and useradd dates /etc/shadow
    # by today: two builds of one commit differ (measured: 44 files in the npu stage).
    lines = (REPO / "docker" / "Dockerfile").read_text().splitlines()
    stage = lines[next(i for i, line in enumerate(lines) if line.endswith(" AS recipe")) :]
    first_run = next(i for i, line in enumerate(stage) if line.startswith("RUN "))
    assert "ARG SOURCE_DATE_EPOCH" in stage[:first_run]


def test_the_recipe_stage_is_written_once() -> None:
    # One stage on either framework (issue 24): DEVICE picks the framework, and nothing else is copied twice.
    text = "\n".join(path.read_text() for path in REPO.glob("docker/**/Dockerfile"))
    assert text.count(" AS recipe\n") == 1 and text.count("COPY recipe ") == 1
    assert "ARG RECIPE_BASE=${DEVICE}-framework" in text


def _write_layout(root: Path, tag: str, files: dict[str, bytes], created: str = "2026-01-01T00:00:00Z") -> None:
    """An OCI layout holding one single-layer image, written the way skopeo writes one."""
    blobs = root / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)

    def put(data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return f"sha256:{digest}"

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as layer:
        for name, content in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(content), 1_700_000_000
            layer.addfile(info, io.BytesIO(content))
    layer_digest = put(buffer.getvalue())
    config = {"created": created, "rootfs": {"type": "layers", "diff_ids": [layer_digest]}}
    config_digest = put(json.dumps(config, sort_keys=True).encode())
    manifest = {"schemaVersion": 2, "config": {"digest": config_digest}, "layers": [{"digest": layer_digest}]}
    manifest_digest = put(json.dumps(manifest).encode())
    index_path = root / "index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {"schemaVersion": 2, "manifests": []}
    index["manifests"].append({"digest": manifest_digest, "annotations": {"org.opencontainers.image.ref.name": tag}})
    index_path.write_text(json.dumps(index))


def test_oci_diff_same_image_is_exit_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = {"etc/a": b"1", "opt/b.pyc": b"\x00" * 16}
    _write_layout(tmp_path, "one", files)
    _write_layout(tmp_path, "two", files)
    assert oci_diff.main([f"{tmp_path}:one", f"{tmp_path}:two"]) == 0
    first, second = capsys.readouterr().out.splitlines()
    assert first.split()[-1] == second.split()[-1]


def test_oci_diff_names_the_file_and_the_config_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write_layout(tmp_path, "one", {"etc/a": b"1", "opt/b.pyc": b"stamped 1"})
    _write_layout(tmp_path, "two", {"etc/a": b"1", "opt/b.pyc": b"stamped 2"}, created="2026-01-02T00:00:00Z")
    assert oci_diff.main([f"{tmp_path}:one", f"{tmp_path}:two"]) == 1
    out = capsys.readouterr().out
    assert "layer 0: 1 file(s) differ" in out
    assert "opt/b.pyc" in out and "etc/a" not in out
    assert "config created" in out


def test_oci_diff_refuses_an_unknown_tag(tmp_path: Path) -> None:
    _write_layout(tmp_path, "one", {"etc/a": b"1"})
    with pytest.raises(SystemExit, match="no image tagged 'missing'"):
        oci_diff.main([f"{tmp_path}:one", f"{tmp_path}:missing"])
