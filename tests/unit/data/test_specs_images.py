"""geo3k's images and placeholders, row by row: which image values are taken, and the line each refusal prints.

Direct calls of the converter (no `datasets`): each refusal's text is what `prepare-data` prints
after the row's number, so it is compared whole.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from tests.support.needs import needs

from recipe.data.guard import ImagePolicy, SourceFolder
from recipe.data.specs import GEO3K_INSTRUCTION, NO_IMAGE_PATHS, RowError, convert_geo3k, with_image_placeholders


def _png() -> bytes:
    needs("PIL", install="geo3k images need pillow (the trainer extra)")
    from .conftest import make_image

    buffer = io.BytesIO()
    make_image(20, 12, 3).save(buffer, format="PNG")
    return buffer.getvalue()


def _row(images: Any, problem: str = "Find x.") -> dict[str, Any]:
    return {"images": images, "problem": problem, "answer": "3"}


def _refusal(images: Any, policy: ImagePolicy = NO_IMAGE_PATHS) -> str:
    with pytest.raises(RowError) as caught:
        convert_geo3k(_row(images), 0, "train", policy)
    return str(caught.value)


# --- placeholders ----------------------------------------------------------------------------------


def test_other_media_placeholders_are_named_sorted_and_once() -> None:
    with pytest.raises(RowError) as caught:
        with_image_placeholders("<video><audio><video><image>Find x.", 1)
    assert str(caught.value) == "problem text contains <audio>, <video> but the row has no such media"


def test_too_many_image_placeholders_say_both_counts() -> None:
    with pytest.raises(RowError) as caught:
        with_image_placeholders("<image><image><image>Find x.", 2)
    assert str(caught.value) == "problem text has 3 <image> placeholders but the row has 2 images"


# --- which image values are taken ------------------------------------------------------------------


def test_no_images_at_all_is_a_text_only_row() -> None:
    row = convert_geo3k(_row(None), 0, "train")
    assert row["images"] == [] and row["prompt"][0]["content"] == "Find x. " + GEO3K_INSTRUCTION


def test_a_single_image_instead_of_a_list_is_one_image() -> None:
    picture = _png()
    row = convert_geo3k(_row({"bytes": picture, "path": "fig.png"}), 0, "train")
    assert row["images"] == [{"bytes": picture, "path": "fig.png"}]
    assert row["prompt"][0]["content"].startswith("<image>Find x. ")


def test_an_image_with_bytes_and_no_path_key_is_taken() -> None:
    picture = _png()
    assert convert_geo3k(_row([{"bytes": picture}]), 0, "train")["images"] == [{"bytes": picture, "path": None}]


def test_an_image_with_a_path_and_no_bytes_key_is_read_from_the_source(tmp_path: Path) -> None:
    picture = _png()
    (tmp_path / "fig.png").write_bytes(picture)
    row = convert_geo3k(_row([{"path": "fig.png"}]), 0, "train", ImagePolicy(SourceFolder.of(tmp_path)))
    assert row["images"] == [{"bytes": picture, "path": "fig.png"}]


@pytest.mark.parametrize(
    ("path", "label"),
    [
        ("/hub/cache/" + "a" * 251 + ".png", "a" * 251 + ".png"),  # 255 characters: kept
        ("/hub/cache/" + "a" * 252 + ".png", None),  # 256: too long to be a file name
        ("/hub/cache/" + "a" * 300 + ".png", None),
        ("/hub/cache/fig\n1.png", None),  # unprintable: never written as a label
        ("/hub/cache/fig\x1b[31m.png", None),
        ("/", None),  # no file name at all
        ("", None),
    ],
)
def test_only_a_short_printable_file_name_is_kept_beside_the_bytes(path: str, label: str | None) -> None:
    picture = _png()
    assert convert_geo3k(_row([{"bytes": picture, "path": path}]), 0, "train")["images"] == [{"bytes": picture, "path": label}]


# --- the line each refused image prints ------------------------------------------------------------


@pytest.mark.parametrize(
    ("image", "message"),
    [
        ("fig.png", "images[0] is str, expected an undecoded image {bytes, path}"),
        (3, "images[0] is int, expected an undecoded image {bytes, path}"),
        ({"src": "fig.png"}, "images[0] is dict, expected an undecoded image {bytes, path}"),
        ({}, "images[0] is dict, expected an undecoded image {bytes, path}"),
        ({"bytes": None, "path": 5}, "images[0] path is int, not text"),
        ({"bytes": "iVBORw0KGgo=", "path": "fig.png"}, "images[0] bytes is str, not bytes"),
        ({"bytes": None, "path": None}, "images[0] has neither bytes nor a path"),
    ],
)
def test_an_image_value_that_is_no_undecoded_image_is_refused_by_its_type(image: Any, message: str) -> None:
    assert _refusal([image]) == message


def test_an_image_read_from_a_path_that_does_not_decode_names_the_path(tmp_path: Path) -> None:
    (tmp_path / "notes.png").write_bytes(b"not an image at all")
    message = _refusal([{"bytes": None, "path": "notes.png"}], ImagePolicy(SourceFolder.of(tmp_path)))
    assert message.startswith("images[0] path 'notes.png' does not decode as a "), message
