"""What each supported dataset is, and how one of its rows becomes one row of verl's RL parquet.

verl 0.9.1's `RLHFDataset` reads these columns (verl/utils/dataset/rl_dataset.py):
`prompt` (chat messages; with images, each `<image>` in a message's text is replaced by the
next entry of `images`, and the number of placeholders must equal the number of images),
`images`, `extra_info` (its `index` becomes the sample index), and passes `data_source` and
`reward_model.ground_truth` to the reward function, which picks its scorer by `data_source`
(verl/utils/reward_score/__init__.py). So `data_source` stays the hub id even when the rows
come from a local copy.

The converters are pure functions of one row: they are unit-tested without `datasets`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # `datasets` is heavy; imported where a conversion actually runs.
    import datasets

DatasetName = Literal["geo3k", "gsm8k"]

#: The splits written, as `<split>.parquet`; the recipe trains on train and validates on test.
SPLITS: tuple[str, ...] = ("train", "test")

# The instructions appended to each question are the ones of verl's reference preprocessing
# (examples/data_preprocess/{geo3k,gsm8k}.py), so that runs compare with upstream's. They are
# also what the rule rewards look for: geo3k's scorer gives its format credit for
# `<think>...</think>` followed by `\boxed{...}`, gsm8k's reads the number after `####`.
GEO3K_INSTRUCTION = (
    "You FIRST think about the reasoning process as an internal monologue and then provide the final answer. "
    "The reasoning process MUST BE enclosed within <think> </think> tags. "
    r"The final answer MUST BE put in \boxed{}."
)
GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'

#: Placeholders verl's RLHFDataset splits message text on (`_build_messages`).
_MEDIA_PLACEHOLDER = re.compile(r"<(image|video|audio)>")
IMAGE_PLACEHOLDER = "<image>"

#: GSM8K's reference answers end in a line `#### 1,234`; the reward compares the number without commas.
_GSM8K_FINAL = re.compile(r"####\s*(-?[0-9.,]+)")


class RowError(ValueError):
    """A source row that cannot be converted; the caller adds the dataset, split and row index."""


@dataclass(frozen=True)
class DatasetSpec:
    """One supported dataset: where it comes from and how a row is converted."""

    name: DatasetName
    hub_id: str
    """Hugging Face dataset id; also the `data_source` written, which selects verl's reward."""
    hub_config: str | None
    """The dataset's config name on the hub (gsm8k has `main` and `socratic`)."""
    columns: tuple[str, ...]
    """Source columns the converter reads; any others are dropped."""
    has_images: bool
    convert: Callable[[Mapping[str, Any], int, str], dict[str, Any]]
    """(source row, row index, split) -> output row."""


def _message(content: str) -> list[dict[str, str]]:
    """A single-turn chat prompt."""
    return [{"role": "user", "content": content}]


def with_image_placeholders(text: str, n_images: int) -> str:
    """Return `text` with exactly `n_images` `<image>` placeholders.

    verl asserts that every image is consumed by one placeholder. Geometry3k's problems
    already start with `<image>`; a copy whose text lost it gets the missing ones in front,
    which is where the chat templates of Qwen-VL models put images. More placeholders than
    images, or a `<video>`/`<audio>` placeholder, cannot be repaired and raises RowError.
    """
    found = _MEDIA_PLACEHOLDER.findall(text)
    others = sorted({kind for kind in found if kind != "image"})
    if others:
        raise RowError(f"problem text contains <{'>, <'.join(others)}> but the row has no such media")
    n_found = len(found)
    if n_found > n_images:
        raise RowError(f"problem text has {n_found} {IMAGE_PLACEHOLDER} placeholders but the row has {n_images} images")
    return IMAGE_PLACEHOLDER * (n_images - n_found) + text


def _embedded_image(image: Any) -> dict[str, Any]:
    """An undecoded image (`{"bytes", "path"}`) with its bytes inside, so the parquet is self-contained.

    Hub copies carry the bytes; a local image folder may only carry file paths, which would not
    exist on the training node. Only the file name is kept as a label.
    """
    if not isinstance(image, Mapping) or ("bytes" not in image and "path" not in image):
        raise RowError(f"image is {type(image).__name__}, expected an undecoded image {{bytes, path}}")
    data = image.get("bytes")
    path = image.get("path")
    if not data:
        if not path:
            raise RowError("image has neither bytes nor a path")
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise RowError(f"image file {path}: {exc.strerror or exc}") from None
    return {"bytes": bytes(data), "path": Path(path).name if path else None}


def convert_geo3k(example: Mapping[str, Any], index: int, split: str) -> dict[str, Any]:
    """One Geometry3k row (images, problem, answer) -> one verl row with its images."""
    problem = str(example["problem"])
    answer = str(example["answer"])
    raw_images = example["images"]
    images: Sequence[Any] = [] if raw_images is None else raw_images
    if isinstance(images, Mapping):  # a single Image column instead of a list of them
        images = [images]
    embedded = [_embedded_image(image) for image in images]
    content = with_image_placeholders(problem, len(embedded)) + " " + GEO3K_INSTRUCTION
    return {
        "data_source": SPECS["geo3k"].hub_id,
        "prompt": _message(content),
        "images": embedded,
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": problem},
    }


def gsm8k_final_answer(answer: str) -> str:
    """The number after GSM8K's `####` marker, commas removed (what verl's gsm8k reward compares)."""
    matches = _GSM8K_FINAL.findall(answer)
    if not matches:
        raise RowError("answer has no final line '#### <number>'")
    return matches[-1].replace(",", "")


def convert_gsm8k(example: Mapping[str, Any], index: int, split: str) -> dict[str, Any]:
    """One GSM8K row (question, answer with `#### N`) -> one verl row."""
    question = str(example["question"])
    answer = str(example["answer"])
    return {
        "data_source": SPECS["gsm8k"].hub_id,
        "prompt": _message(question + " " + GSM8K_INSTRUCTION),
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": gsm8k_final_answer(answer)},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": question},
    }


SPECS: dict[str, DatasetSpec] = {
    "geo3k": DatasetSpec(
        name="geo3k",
        hub_id="hiyouga/geometry3k",
        hub_config=None,
        columns=("images", "problem", "answer"),
        has_images=True,
        convert=convert_geo3k,
    ),
    "gsm8k": DatasetSpec(
        name="gsm8k",
        hub_id="openai/gsm8k",
        hub_config="main",
        columns=("question", "answer"),
        has_images=False,
        convert=convert_gsm8k,
    ),
}


def output_features(spec: DatasetSpec) -> datasets.Features:
    """The parquet schema written for `spec`, in column order.

    Images are `List(Image())`: stored as {bytes, path} structs with the `datasets` feature
    metadata, so verl's `datasets.load_dataset("parquet", ...)` hands them back as PIL images.
    """
    from datasets import Features, Image, List, Value

    string = Value("string")
    columns: dict[str, Any] = {
        "data_source": string,
        "prompt": List({"role": string, "content": string}),
    }
    if spec.has_images:
        columns["images"] = List(Image())
    columns |= {
        "ability": string,
        "reward_model": {"style": string, "ground_truth": string},
        "extra_info": {"split": string, "index": Value("int64"), "answer": string, "question": string},
    }
    return Features(columns)
