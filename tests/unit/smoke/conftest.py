"""Fixtures of the smoke-profile tests: a network that refuses every connection, and one build."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from tests.support.needs import needs

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


class NetworkUsed(AssertionError):
    """Raised by the patched socket layer: something tried to reach the network."""


def _refuse(*args: Any, **kwargs: Any) -> Any:
    raise NetworkUsed(f"network access attempted: {args[1:] or args}")


def block_network(patch: pytest.MonkeyPatch) -> None:
    """The hub libraries' offline switches, and IP sockets that raise on any connection or lookup."""
    for name, value in OFFLINE_ENV.items():
        patch.setenv(name, value)
    real_connect = socket.socket.connect

    def connect(self: socket.socket, address: Any) -> Any:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            _refuse(self, address)
        return real_connect(self, address)

    patch.setattr(socket.socket, "connect", connect)
    patch.setattr(socket.socket, "connect_ex", connect)
    patch.setattr(socket, "create_connection", _refuse)
    patch.setattr(socket, "getaddrinfo", _refuse)


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No network for this test."""
    block_network(monkeypatch)
    return monkeypatch


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One smoke build for the whole session, made with the network blocked (only while it builds)."""
    needs("transformers", install="building the smoke model needs torch and transformers")
    from recipe.smoke import prepare_smoke_assets

    root = tmp_path_factory.mktemp("smoke") / "assets"
    with pytest.MonkeyPatch.context() as patch:
        block_network(patch)
        return prepare_smoke_assets(root)


def model_dir(built: Any) -> Path:
    """The built model directory."""
    return Path(built.model_path)
