"""No secret or token is baked into the image: not in its environment, history or files."""

from __future__ import annotations

import re
from typing import Any

import pytest

from conftest import Image, docker

SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|API_KEY|ACCESS_KEY|CREDENTIAL)", re.I)
# Shapes of real credentials: Hugging Face, W&B-style 40-hex keys after a key name, GitHub,
# AWS, private keys.
SECRET_VALUE = re.compile(
    r"(hf_[A-Za-z0-9]{30,}|ghp_[A-Za-z0-9]{30,}|AKIA[0-9A-Z]{16}|-----BEGIN [A-Z ]*PRIVATE KEY-----"
    r"|(?:TOKEN|API_KEY|SECRET)\s*[=:]\s*['\"]?[A-Za-z0-9_\-]{16,})"
)
CREDENTIAL_FILES = [
    "/home/recipe/.cache/huggingface/token",
    "/cache/huggingface/token",
    "/home/recipe/.netrc",
    "/root/.netrc",
    "/home/recipe/.git-credentials",
    "/home/recipe/.ray/auth_token",
    "/home/recipe/.config/wandb/settings",
    "/opt/recipe/.env",
]


def test_image_env_has_no_secret_variables(image: Image) -> None:
    assert [name for name, value in image.env.items() if SECRET_NAME.search(name) and value] == []


def test_image_env_values_hold_no_credentials(image: Image) -> None:
    assert [name for name, value in image.env.items() if SECRET_VALUE.search(value)] == []


def test_image_history_holds_no_credentials(image: Image) -> None:
    history = docker("history", "--no-trunc", "--format", "{{.CreatedBy}}", image.ref).stdout
    assert SECRET_VALUE.findall(history) == []


def test_build_args_carry_no_secret_names(image: Image) -> None:
    # Build args used by a RUN show up in history as NAME=value.
    history = docker("history", "--no-trunc", "--format", "{{.CreatedBy}}", image.ref).stdout
    assert re.findall(r"\b(HF_TOKEN|WANDB_API_KEY|HUGGING_FACE_HUB_TOKEN)=\S+", history) == []


@pytest.mark.parametrize("path", CREDENTIAL_FILES)
def test_no_credential_file(host: Any, path: str) -> None:
    assert not host.file(path).exists


@pytest.mark.parametrize("folder", ["/opt/recipe", "/home/recipe", "/cache", "/checkpoints"])
def test_no_credentials_in_files(host: Any, folder: str) -> None:
    # grep exits 1 when nothing matches; 0 (found) or 2 (error) fail the test.
    result = host.run(
        "grep -rIlE %s %s",
        r"hf_[A-Za-z0-9]{30,}|ghp_[A-Za-z0-9]{30,}|AKIA[0-9A-Z]{16}|BEGIN [A-Z ]*PRIVATE KEY",
        folder,
    )
    assert result.rc == 1, result.stdout + result.stderr
