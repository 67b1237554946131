"""Facts about the image the recipe runs in: its labels, the locks it was installed from, the versions installed.

A container has no Docker API, so each image stage that sets labels also writes them, one
`key=value` a line, into IMAGE_INFO_DIR/labels.d/<stage>.labels, and the lock the framework was
installed from is copied beside them (IMAGE_INFO_DIR/*.lock). Outside an image the directory does
not exist. `plan` reads the chip label, the run record (recipe.provenance) the labels and the
locks' digests, `doctor` all of it: this room sits below the three. Every file here is read
through recipe.read_back (a FIFO named *.labels is refused, never opened in a blocking way).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

from recipe.read_back import FileRefused, read_file

#: Where an image keeps its labels and locks; RECIPE_IMAGE_INFO_DIR moves it (tests, other images).
IMAGE_INFO_DIR = Path("/etc/grpo-recipe")
IMAGE_INFO_VARIABLE = "RECIPE_IMAGE_INFO_DIR"

#: Distributions whose versions the report shows, per device (None: not installed).
REPORTED_DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "gpu": (
        "grpo-recipe", "torch", "vllm", "verl", "megatron-core", "megatron-bridge", "transformer-engine",
        "transformer-engine-torch", "transformers", "ray", "triton", "flash-linear-attention",
        "flashinfer-python", "TransferQueue",
    ),
    "npu": (
        "grpo-recipe", "torch", "torch-npu", "vllm", "vllm-ascend", "verl", "megatron-core", "megatron-bridge",
        "transformers", "ray", "triton-ascend", "TransferQueue",
    ),
}  # fmt: skip


def image_info_dir(environ: Mapping[str, str]) -> Path:
    """Where this image keeps its labels and locks: RECIPE_IMAGE_INFO_DIR (when set, not empty), else IMAGE_INFO_DIR."""
    return Path(environ.get(IMAGE_INFO_VARIABLE) or IMAGE_INFO_DIR)


def _is_folder(path: Path) -> bool:
    """Path.is_dir, where a path the OS refuses to look at (too long: ENAMETOOLONG; EACCES) is no folder either."""
    try:
        return path.is_dir()
    except OSError:
        return False


#: An image's label file or lock is kilobytes; one past this is not what the image carries.
MAX_IMAGE_INFO_BYTES = 16 << 20


def read_labels(directory: Path) -> tuple[dict[str, str], list[str]] | None:
    """Labels from directory/labels.d/*.labels (`key=value` lines, `#` comments); None outside an image.

    Files are read in name order, a later file overriding an earlier one as a later image
    stage overrides its base's label. The second item lists the files read.
    """
    folder = directory / "labels.d"
    if not _is_folder(folder):
        return None
    labels: dict[str, str] = {}
    files = sorted(folder.glob("*.labels"))
    for path in files:
        try:  # a FIFO or folder named *.labels is refused at once, never read (recipe.read_back)
            text = read_file(path, MAX_IMAGE_INFO_BYTES).decode("utf-8", errors="replace")
        except FileRefused:
            continue  # the labels check then names what it cannot find
        for line in text.splitlines():
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                key, _, value = line.partition("=")
                labels[key.strip()] = value.strip()
    return labels, [str(path) for path in files]


def lock_digests(directory: Path) -> dict[str, str]:
    """sha256 of each lock file an image carries (name -> hex digest)."""
    digests = {}
    if _is_folder(directory):
        for path in sorted(directory.glob("*.lock")):
            try:
                digests[path.name] = hashlib.sha256(read_file(path, MAX_IMAGE_INFO_BYTES)).hexdigest()
            except FileRefused:  # a folder or FIFO named *.lock, or unreadable: left out (doctor prints the locks it found)
                continue
    return digests


def distribution_version(name: str) -> str | None:
    """The installed version of distribution NAME (from its metadata, nothing imported); None when not installed."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
