"""Row converters: pure functions, no `datasets` needed."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from tests.support.needs import needs

from recipe.data.guard import ImagePolicy, SourceFolder
from recipe.data.specs import (
    GEO3K_INSTRUCTION,
    GSM8K_INSTRUCTION,
    SPECS,
    RowError,
    convert_geo3k,
    convert_gsm8k,
    gsm8k_final_answer,
    with_image_placeholders,
)


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("48/2 = 24\n#### 72", "72"),
        ("1,200*3 = 3,600\n#### 3,600", "3600"),
        ("#### -8", "-8"),
        ("half is 4.5\n#### 4.5", "4.5"),
        ("#### 1\nthen corrected\n#### 2", "2"),  # the last marker wins, like verl's reward
    ],
)
def test_gsm8k_final_answer_is_the_number_after_the_last_marker(answer: str, expected: str) -> None:
    assert gsm8k_final_answer(answer) == expected


def test_gsm8k_answer_without_marker_is_a_row_error() -> None:
    with pytest.raises(RowError, match="####"):
        gsm8k_final_answer("The answer is 72.")


@pytest.mark.parametrize(
    ("text", "n_images", "expected"),
    [
        ("<image>Find x.", 1, "<image>Find x."),
        ("Find x.", 1, "<image>Find x."),
        ("<image>Find y.", 2, "<image><image>Find y."),
        ("Find x.", 0, "Find x."),
    ],
)
def test_placeholders_match_the_image_count(text: str, n_images: int, expected: str) -> None:
    assert with_image_placeholders(text, n_images) == expected
    assert expected.count("<image>") == n_images


@pytest.mark.parametrize(("text", "n_images"), [("<image><image>Find x.", 1), ("<video>Find x.", 0)])
def test_unrepairable_placeholders_are_row_errors(text: str, n_images: int) -> None:
    with pytest.raises(RowError):
        with_image_placeholders(text, n_images)


def png(seed: int) -> bytes:
    """A small real PNG: converters check that every image decodes."""
    needs("PIL", install="geo3k images need pillow (the trainer extra)")
    from .conftest import make_image

    buffer = io.BytesIO()
    make_image(20, 12, seed).save(buffer, format="PNG")
    return buffer.getvalue()


def test_geo3k_row_has_verl_columns_and_keeps_image_bytes() -> None:
    picture = png(1)
    row = convert_geo3k(
        {
            "images": [{"bytes": picture, "path": "/hub/cache/img_1.png"}],
            "problem": "<image>Find x.",
            "answer": "3",
        },
        7,
        "train",
    )
    assert row == {
        "data_source": "hiyouga/geometry3k",
        "prompt": [{"role": "user", "content": "<image>Find x. " + GEO3K_INSTRUCTION}],
        "images": [{"bytes": picture, "path": "img_1.png"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "3"},
        "extra_info": {"split": "train", "index": 7, "answer": "3", "question": "<image>Find x."},
    }


def test_geo3k_image_given_by_path_inside_the_source_is_embedded(tmp_path: Path) -> None:
    picture = tmp_path / "fig.png"
    picture.write_bytes(png(2))
    source = ImagePolicy(SourceFolder.of(tmp_path))
    for path in (str(picture), "fig.png"):
        example = {"images": [{"bytes": None, "path": path}], "problem": "Find x.", "answer": "1"}
        row = convert_geo3k(example, 0, "test", source)
        assert row["images"] == [{"bytes": png(2), "path": "fig.png"}]
        assert row["prompt"][0]["content"].startswith("<image>Find x. ")


def test_geo3k_image_path_is_read_only_with_a_source_folder(tmp_path: Path) -> None:
    (tmp_path / "fig.png").write_bytes(png(2))
    with pytest.raises(RowError, match=r"^images\[0\] path '.*fig.png' has no bytes; images from the hub must carry"):
        convert_geo3k(
            {"images": [{"bytes": None, "path": str(tmp_path / "fig.png")}], "problem": "x", "answer": "1"}, 0, "train"
        )


def test_geo3k_image_path_that_is_gone_is_a_row_error(tmp_path: Path) -> None:
    with pytest.raises(RowError, match=r"^images\[0\] path 'missing.png' names no such file in the source folder"):
        convert_geo3k(
            {"images": [{"bytes": None, "path": "missing.png"}], "problem": "x", "answer": "1"},
            0,
            "train",
            ImagePolicy(SourceFolder.of(tmp_path)),
        )


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"question": None, "answer": "#### 1"}, "question is missing (null)"),
        ({"question": 3, "answer": "#### 1"}, "question is int, not text"),
        ({"question": " ", "answer": "#### 1"}, "question is empty"),
        ({"question": "q", "answer": "#### " + "1" * 70_000}, "answer is 70005 characters, over the limit of 65536"),
        ({"question": "q", "answer": "#### ."}, "answer's final line '#### .' has no number"),
    ],
)
def test_gsm8k_values_that_are_not_usable_text_are_row_errors(row: dict[str, object], message: str) -> None:
    with pytest.raises(RowError) as caught:
        convert_gsm8k(row, 0, "train")
    assert str(caught.value) == message


def test_gsm8k_row_has_verl_columns() -> None:
    row = convert_gsm8k({"question": "How many?", "answer": "2+2=4\n#### 4"}, 3, "test")
    assert row == {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": "How many? " + GSM8K_INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "4"},
        "extra_info": {"split": "test", "index": 3, "answer": "2+2=4\n#### 4", "question": "How many?"},
    }


def test_data_sources_are_the_ids_verls_reward_routes_on() -> None:
    # verl.utils.reward_score.default_compute_score dispatches on exactly these strings.
    assert SPECS["geo3k"].hub_id == "hiyouga/geometry3k"
    assert SPECS["gsm8k"].hub_id == "openai/gsm8k"
