"""What each supported dataset is, and how one of its rows becomes one row of verl's RL parquet.

verl 0.9.1's `RLHFDataset` reads these columns (verl/utils/dataset/rl_dataset.py):
`prompt` (chat messages; with images, each `<image>` in a message's text is replaced by the
next entry of `images`, and the number of placeholders must equal the number of images),
`images`, `extra_info` (its `index` becomes the sample index), and passes `data_source` and
`reward_model.ground_truth` to the reward function, which picks its scorer by `data_source`
(verl/utils/reward_score/__init__.py). So `data_source` stays the hub id even when the rows
come from a local copy.

The converters are pure functions of one row (plus, for images, the rules of what may be read:
recipe/data/guard.py): they are unit-tested without `datasets`. Every value they take from the
row is checked; a bad one raises RowError naming the column and the rule.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from recipe.data.errors import RowError  # raised by the converters; importable from here too
from recipe.data.guard import ImagePolicy, check_image, check_text, read_image_file, shown

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


#: With no source folder: an image must carry its bytes (no path is read).
NO_IMAGE_PATHS = ImagePolicy()


class RowConverter(Protocol):
    """(source row, row index, split, where images may be read from) -> output row."""

    def __call__(
        self, example: Mapping[str, Any], index: int, split: str, images: ImagePolicy = NO_IMAGE_PATHS
    ) -> dict[str, Any]: ...


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
    convert: RowConverter
    """(source row, row index, split, image policy) -> output row; RowError for a row it refuses."""

    @property
    def text_columns(self) -> tuple[str, ...]:
        """The source columns that must hold text (all but the images)."""
        return tuple(column for column in self.columns if column != "images")


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


def _label(path: str | None) -> str | None:
    """The file name kept beside embedded bytes: a short printable name, or none."""
    if not path:
        return None
    name = Path(path).name
    return name if name and len(name) <= 255 and name.isprintable() else None


def _embedded_image(image: Any, images: ImagePolicy) -> dict[str, Any]:
    """An undecoded image (`{"bytes", "path"}`) with its bytes inside, so the parquet is self-contained.

    Hub copies carry the bytes; a local image folder may only carry file paths, which would not
    exist on the training node. A path is read only under `images`' rules (inside the source
    folder, a regular file, within the size cap); the bytes must decode as an image. Only the
    file name is kept as a label.
    """
    if not isinstance(image, Mapping) or ("bytes" not in image and "path" not in image):
        raise RowError(f"is {type(image).__name__}, expected an undecoded image {{bytes, path}}")
    data = image.get("bytes")
    path = image.get("path")
    if path is not None and not isinstance(path, str):
        raise RowError(f"path is {type(path).__name__}, not text")
    if data is not None and not isinstance(data, bytes | bytearray | memoryview):
        raise RowError(f"bytes is {type(data).__name__}, not bytes")
    if not data:
        if not path:
            raise RowError("has neither bytes nor a path")
        data = read_image_file(path, images)
        try:
            check_image(data, images.max_bytes)
        except RowError as exc:
            raise RowError(f"path {shown(path)} {exc}") from None
    else:
        data = bytes(data)
        check_image(data, images.max_bytes)
    return {"bytes": data, "path": _label(path)}


def convert_geo3k(
    example: Mapping[str, Any], index: int, split: str, images: ImagePolicy = NO_IMAGE_PATHS
) -> dict[str, Any]:
    """One Geometry3k row (images, problem, answer) -> one verl row with its images."""
    problem = check_text(example["problem"], "problem")
    answer = check_text(example["answer"], "answer")
    raw_images = example["images"]
    listed: Sequence[Any] = [] if raw_images is None else raw_images
    if isinstance(listed, Mapping):  # a single Image column instead of a list of them
        listed = [listed]
    embedded = []
    for position, image in enumerate(listed):
        try:
            embedded.append(_embedded_image(image, images))
        except RowError as exc:
            raise RowError(f"images[{position}] {exc}") from None
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
    matches = list(_GSM8K_FINAL.finditer(answer))
    if not matches:
        raise RowError("answer has no final line '#### <number>'")
    final = matches[-1]
    number = final.group(1).replace(",", "")
    if not any(character.isdigit() for character in number):
        raise RowError(f"answer's final line {shown(final.group(0))} has no number")
    return number


def convert_gsm8k(
    example: Mapping[str, Any], index: int, split: str, images: ImagePolicy = NO_IMAGE_PATHS
) -> dict[str, Any]:
    """One GSM8K row (question, answer with `#### N`) -> one verl row (`images` is unused: text only)."""
    question = check_text(example["question"], "question")
    answer = check_text(example["answer"], "answer")
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
    # lazy: datasets is heavy or absent where this module is imported; loaded only here
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
