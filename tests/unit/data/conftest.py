"""Small stand-ins for the hub datasets, built offline with the hub's columns and feature types.

hiyouga/geometry3k: images (a list of datasets Image), problem (text starting with `<image>`),
answer. openai/gsm8k, config `main`: question, answer (reasoning, then `#### <number>`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.support.needs import needs

if TYPE_CHECKING:  # imported where used, so the pure tests here run without them
    import datasets
    from PIL import Image as PILImage

GEO3K_ROWS = {
    "train": [
        # (image sizes, problem, answer): the hub's rows have one image and start with <image>.
        ([(96, 64)], "<image>Find x.", "3"),
        ([(64, 80)], "<image>Find the area of the triangle. Round to the nearest tenth.", "10.5"),
        ([(72, 72)], "Find m \\angle 2.", "\\frac{2}{3}"),  # placeholder lost: the converter adds it
        ([(64, 64), (80, 56)], "<image>Both figures are similar. Find y.", "12"),  # two images, one placeholder
        ([(56, 90)], "<image>Find the perimeter.", "24"),
    ],
    "validation": [([(64, 64)], "<image>Find z.", "7")],
    "test": [
        ([(70, 60)], "<image>Find the measure of \\angle B.", "60"),
        ([(64, 100)], "<image>Find the radius.", "5"),
        ([(90, 70)], "<image>Find the area of the circle.", "78.5"),
    ],
}

GSM8K_ROWS = {
    "train": [
        (
            "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
            "How many clips did Natalia sell altogether in April and May?",
            "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips.\n#### 72",
        ),
        ("A shop sells 1,200 pens a day. How many in 3 days?", "1,200*3=<<1200*3=3600>>3,600\n#### 3,600"),
        ("The temperature fell from 5 to -3. What is the change?", "-3-5=<<-3-5=-8>>-8\n#### -8"),
    ],
    "test": [
        ("Janet has 16 eggs and eats 3. How many are left?", "16-3=<<16-3=13>>13\n#### 13"),
        ("What is 0.5 of 9?", "0.5*9=<<0.5*9=4.5>>4.5\n#### 4.5"),
    ],
}


def make_image(width: int, height: int, seed: int) -> PILImage.Image:
    """A small diagram-like RGB image whose pixels differ per seed."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    draw.line((0, 0, width - 1, height - 1), fill=(seed * 37 % 256, 0, 0), width=2)
    draw.rectangle((seed % 10, seed % 7, width // 2, height // 2), outline="black")
    return image


def geo3k_dataset_dict() -> datasets.DatasetDict:
    """A DatasetDict with geometry3k's splits, columns and feature types."""
    import datasets
    from datasets import Features, Image, List, Value

    features = Features({"images": List(Image()), "problem": Value("string"), "answer": Value("string")})
    splits = {}
    seed = 0
    for split, rows in GEO3K_ROWS.items():
        images = []
        for sizes, _, _ in rows:
            seed += 1
            images.append([make_image(w, h, seed + i) for i, (w, h) in enumerate(sizes)])
        splits[split] = datasets.Dataset.from_dict(
            {"images": images, "problem": [r[1] for r in rows], "answer": [r[2] for r in rows]}, features=features
        )
    return datasets.DatasetDict(splits)


def gsm8k_dataset_dict() -> datasets.DatasetDict:
    """A DatasetDict with gsm8k's splits and columns."""
    import datasets

    return datasets.DatasetDict(
        {
            split: datasets.Dataset.from_dict({"question": [q for q, _ in rows], "answer": [a for _, a in rows]})
            for split, rows in GSM8K_ROWS.items()
        }
    )


@pytest.fixture
def needs_datasets() -> None:
    """Skip (with the reason) where Hugging Face datasets or pillow is not installed."""
    needs("datasets", install="data preparation needs Hugging Face datasets (the trainer extra)")
    needs("PIL", install="geo3k images need pillow (the trainer extra)")


@pytest.fixture
def geo3k_source(tmp_path: Path, needs_datasets: None) -> Path:
    """geometry3k stand-in saved with `save_to_disk`, as a user's offline copy."""
    path = tmp_path / "geo3k-src"
    geo3k_dataset_dict().save_to_disk(str(path))
    return path


@pytest.fixture
def gsm8k_hub_snapshot(tmp_path: Path, needs_datasets: None) -> Path:
    """gsm8k stand-in laid out like a download of the hub repository: configs main and socratic."""
    root = tmp_path / "gsm8k-snapshot"
    data = gsm8k_dataset_dict()
    for config in ("main", "socratic"):
        (root / config).mkdir(parents=True)
        for split, rows in data.items():
            if config == "socratic":  # different content, to prove `main` is the config read
                rows = rows.map(lambda r: {"answer": "How? " + r["answer"]})
            rows.to_parquet(str(root / config / f"{split}-00000-of-00001.parquet"))
    configs = "".join(
        f"- config_name: {c}\n  data_files:\n"
        f"  - split: train\n    path: {c}/train-*\n  - split: test\n    path: {c}/test-*\n"
        for c in ("main", "socratic")
    )
    (root / "README.md").write_text(f"---\nconfigs:\n{configs}---\n# gsm8k stand-in\n")
    return root
