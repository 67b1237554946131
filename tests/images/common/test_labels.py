"""OCI labels carry what the image is and which versions it holds."""

from __future__ import annotations

import pytest

from conftest import Image

OCI = "org.opencontainers.image."


@pytest.mark.parametrize("key", ["title", "description", "version", "licenses"])
def test_oci_label_present(image: Image, key: str) -> None:
    assert image.labels.get(OCI + key), f"label {OCI + key} missing or empty"


def test_version_label_is_the_repo_version(image: Image, expected_version: str) -> None:
    assert image.labels[OCI + "version"] == expected_version


def test_device_label_names_gpu_or_npu(image: Image) -> None:
    assert image.device in ("gpu", "npu")


def test_framework_label_says_full_or_standin(image: Image) -> None:
    assert image.labels.get("io.grpo-recipe.framework") in ("full", "standin")


def test_image_env_device_matches_device_label(image: Image) -> None:
    assert image.env.get("DEVICE") == image.device
