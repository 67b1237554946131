"""The image runs as the unprivileged `recipe` user (uid 1000), never as root."""

from __future__ import annotations

from typing import Any

from conftest import Image


def test_default_user_is_not_root(host: Any) -> None:
    assert host.user().uid != 0


def test_default_user_is_recipe(host: Any) -> None:
    assert host.user().name == "recipe"


def test_recipe_uid_is_1000(host: Any) -> None:
    assert host.user("recipe").uid == 1000


def test_image_config_names_a_non_root_user(image: Image) -> None:
    # An empty User means root; so do "0" and "root" with or without a group.
    assert image.config.get("User", "").split(":")[0] not in ("", "0", "root")


def test_home_is_owned_by_recipe(host: Any) -> None:
    assert host.file("/home/recipe").user == "recipe"
