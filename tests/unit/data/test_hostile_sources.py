"""prepare-data with hostile or broken sources: only the data the user meant, or one clear refusal.

Issue 11, items 15 and 16. A source row's image may carry a `path` and no bytes; a source
folder may hold FIFOs, symlinks out of it or a README whose `data_files` point elsewhere; a
split may be empty; a text column may be null, huge, empty or not text at all. Each is refused
with one line naming the split, row and column (or the file) and the rule, exit code 2, and no
file written. Sources are built here the way an attacker would: parquet files written with
pyarrow and the `datasets` feature metadata (so `datasets` reads the images column as Image),
and `save_to_disk` folders whose JSON is edited by hand.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import os
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings as hsettings, strategies as st

from tests.support.needs import needs

from recipe.cli import main
from recipe.data import prepare_dataset
from recipe.errors import RecipeConfigError

from ..envtools import clear_settings
from .conftest import make_image

pa = needs("pyarrow", install="parquet sources need pyarrow (the trainer extra)")
pq = needs("pyarrow.parquet", install="parquet sources need pyarrow (the trainer extra)")
datasets = needs("datasets", install="data preparation needs Hugging Face datasets (the trainer extra)")
needs("PIL", install="geo3k images need pillow (the trainer extra)")

#: Fake secrets put into the environment: none may reach anything printed or written.
SECRETS = {"WANDB_API_KEY": "wandb_FAKE_SECRET_0123456789abcdef", "HF_TOKEN": "hf_FAKE_SECRET_TOKEN_0123456789"}

def quiet(_: str) -> None:
    """A progress sink for tests that do not look at progress."""


def png(seed: int, size: tuple[int, int] = (24, 16)) -> bytes:
    buffer = io.BytesIO()
    make_image(*size, seed).save(buffer, format="PNG")
    return buffer.getvalue()


def geo3k_features() -> datasets.Features:
    from datasets import Features, Image, List, Value

    return Features({"images": List(Image()), "problem": Value("string"), "answer": Value("string")})


def write_geo3k_parquet(source: Path, train: list[list[Any]], test: list[list[Any]] | None = None) -> Path:
    """A hub-style geo3k folder (data/<split>-00000-of-00001.parquet) whose rows hold these images.

    An image given as `str` is a path with no bytes, as `bytes` is embedded, as `dict` is taken as is.
    Written with pyarrow: `datasets`' own writers would read (embed) the paths while writing.
    """
    schema = geo3k_features().arrow_schema
    folder = source / "data"
    folder.mkdir(parents=True, exist_ok=True)
    for split, rows in (("train", train), ("test", test if test is not None else [[png(99)]])):
        images = [
            [
                {"bytes": None, "path": image}
                if isinstance(image, str)
                else {"bytes": image, "path": None}
                if isinstance(image, bytes)
                else image
                for image in row
            ]
            for row in rows
        ]
        table = pa.Table.from_pydict(
            {"images": images, "problem": ["Find x."] * len(rows), "answer": ["3"] * len(rows)}, schema=schema
        )
        pq.write_table(table, folder / f"{split}-00000-of-00001.parquet")
    return source


def save_gsm8k(source: Path, train: dict[str, list[Any]], test: dict[str, list[Any]] | None = None) -> Path:
    """A `save_to_disk` gsm8k folder with these columns (typed by `datasets`' inference)."""
    test = test if test is not None else {"question": ["q"], "answer": ["#### 1"]}
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict(train), "test": datasets.Dataset.from_dict(test)}
    ).save_to_disk(str(source))
    return source


@pytest.fixture(autouse=True)
def hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`load_dataset` of a folder caches its arrow conversion: keep that in the test's folder."""
    cache = tmp_path / "hf-datasets-cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    return cache


@pytest.fixture
def secrets_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    return SECRETS


class Hung(Exception):
    """Raised by the alarm: the command blocked (a FIFO with no writer, an endless device)."""


@contextlib.contextmanager
def no_hang(seconds: int = 60) -> Iterator[None]:
    """Turn a hang into a test failure instead of a stuck CI job."""

    def ring(signum: int, frame: object) -> None:
        raise Hung(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def refused(dataset: str, out: Path, source: Path | None, **kwargs: Any) -> list[str]:
    """Run prepare_dataset expecting a refusal (exit 2 in the CLI); return its problem lines."""
    with no_hang(), pytest.raises(RecipeConfigError) as caught:
        prepare_dataset(dataset, out, source, progress=quiet, **kwargs)  # type: ignore[arg-type]
    problems = caught.value.problems
    assert problems
    for problem in problems:
        assert problem.isprintable(), repr(problem)  # one line, no escape sequence
        for secret in SECRETS.values():
            assert secret not in problem
    assert not out.exists()  # nothing written, not even the folder
    return problems


def cli(argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    """recipe.cli.main (what the entrypoint runs): its exit code and its `error: ` lines."""
    clear_settings(monkeypatch)
    with no_hang():
        code = main(argv)
    captured = capsys.readouterr()
    for secret in SECRETS.values():
        assert secret not in captured.out + captured.err
    return code, [line for line in captured.err.splitlines() if line.startswith("error: ")]


# --- item 15: image paths -------------------------------------------------------------------


def test_proc_self_environ_is_refused_and_the_secrets_go_nowhere(
    tmp_path: Path, secrets_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reproduction: HF_TOKEN and WANDB_API_KEY were copied into train.parquet."""
    source = write_geo3k_parquet(tmp_path / "src", [[png(1)], ["/proc/self/environ"]])
    out = tmp_path / "out"
    code, errors = cli(["prepare-data", "geo3k", "--source", str(source), "--out", str(out)], monkeypatch, capsys)
    assert code == 2
    assert errors == [
        (
            "error: geo3k train row 1: images[0] path '/proc/self/environ' is outside the source folder; "
            "an image path must name a regular file inside --source"
        )
    ]
    assert not out.exists()


@pytest.mark.parametrize(
    ("image", "rule"),
    [
        ("/etc/passwd", "is outside the source folder"),
        ("/etc/shadow", "is outside the source folder"),
        ("/dev/zero", "is outside the source folder"),
        ("/proc/self/cmdline", "is outside the source folder"),
        ("../outside/secret.png", "is outside the source folder"),
        ("data/../../outside/secret.png", "is outside the source folder"),
        ("{outside}/secret.png", "is outside the source folder"),
        ("{outside}/fifo.png", "is outside the source folder"),
        ("not-there.png", "names no such file in the source folder"),
        ("data", "is not a regular file (a directory)"),
        (".", "is not a regular file (a directory)"),
        ("bad\x00name.png", "is not a valid path"),
    ],
)
def test_image_paths_outside_the_source_or_not_files_are_refused(
    tmp_path: Path, secrets_env: dict[str, str], image: str, rule: str
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.png").write_bytes(png(7))  # a valid image: refused for where it is, not what it is
    os.mkfifo(outside / "fifo.png")
    image = image.replace("{outside}", str(outside))
    source = write_geo3k_parquet(tmp_path / "src", [[image]])
    [problem] = refused("geo3k", tmp_path / "out", source)
    assert problem.startswith(f"geo3k train row 0: images[0] path {image!r} ")
    assert rule in problem
    assert problem.endswith("; an image path must name a regular file inside --source")


def test_an_image_with_neither_bytes_nor_path_is_refused(tmp_path: Path) -> None:
    source = write_geo3k_parquet(tmp_path / "src", [[{"bytes": None, "path": None}]])
    assert refused("geo3k", tmp_path / "out", source) == ["geo3k train row 0: images[0] has neither bytes nor a path"]


@pytest.mark.parametrize(
    ("link", "target"),
    [
        ("link-to-secret.png", "{outside}/secret.png"),
        ("link-to-outside", "{outside}"),
        ("link-to-environ", "/proc/self/environ"),
        ("link-to-zero", "/dev/zero"),
        ("link-up.png", "../outside/secret.png"),
    ],
)
def test_a_symlink_out_of_the_source_is_refused_before_anything_is_read(
    tmp_path: Path, secrets_env: dict[str, str], link: str, target: str
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.png").write_bytes(png(7))
    source = write_geo3k_parquet(tmp_path / "src", [[link + ("/secret.png" if link == "link-to-outside" else "")]])
    (source / link).symlink_to(target.replace("{outside}", str(outside)))
    assert refused("geo3k", tmp_path / "out", source) == [
        (
            f"--source={source}: {link!r} is a symlink that points outside the source folder; "
            "the source folder may hold only regular files, folders, and symlinks to them inside it"
        )
    ]


def test_the_image_reader_itself_refuses_a_symlink_out(tmp_path: Path) -> None:
    """Behind the folder check (a link may appear after it): the reader resolves every path itself."""
    from recipe.data.errors import RowError
    from recipe.data.guard import ImagePolicy, SourceFolder, read_image_file

    (tmp_path / "outside.png").write_bytes(png(7))
    source = tmp_path / "src"
    source.mkdir()
    (source / "in.png").write_bytes(png(8))
    (source / "out.png").symlink_to(tmp_path / "outside.png")
    os.mkfifo(source / "fifo.png")
    policy = ImagePolicy(SourceFolder.of(source))
    assert read_image_file("in.png", policy) == png(8)
    with pytest.raises(RowError, match="is outside the source folder"):
        read_image_file("out.png", policy)
    with no_hang(), pytest.raises(RowError, match=r"is not a regular file \(a FIFO\)"):
        read_image_file("fifo.png", policy)


def test_a_path_relative_to_the_source_an_absolute_one_inside_it_and_a_symlink_inside_are_read(tmp_path: Path) -> None:
    from PIL import Image

    source = tmp_path / "src"
    (source / "figures").mkdir(parents=True)
    pictures = {name: png(seed) for seed, name in enumerate(["a.png", "b.png", "c.png"])}
    for name, data in pictures.items():
        (source / "figures" / name).write_bytes(data)
    (source / "alias.png").symlink_to("figures/c.png")  # inside: allowed
    write_geo3k_parquet(source, [["figures/a.png"], [str(source / "figures" / "b.png")], ["alias.png"]])
    prepared = prepare_dataset("geo3k", tmp_path / "out", source, progress=quiet)
    rows = pq.read_table(prepared.path("train")).to_pylist()
    assert [row["images"] for row in rows] == [
        [{"bytes": pictures["a.png"], "path": "a.png"}],
        [{"bytes": pictures["b.png"], "path": "b.png"}],
        [{"bytes": pictures["c.png"], "path": "alias.png"}],
    ]
    assert Image.open(io.BytesIO(rows[0]["images"][0]["bytes"])).size == (24, 16)


def test_a_hugging_face_cache_snapshot_may_link_into_its_own_blobs(tmp_path: Path) -> None:
    """`hf download` without --local-dir leaves snapshots/<rev>/... as symlinks to ../../blobs/<hash>."""
    repo = tmp_path / "hub" / "datasets--someone--figures"
    blobs, snapshot = repo / "blobs", repo / "snapshots" / "0123abcd"
    blobs.mkdir(parents=True)
    (snapshot / "images").mkdir(parents=True)
    (blobs / "f00d").write_bytes(png(3))
    (snapshot / "images" / "fig.png").symlink_to("../../../blobs/f00d")
    write_geo3k_parquet(snapshot, [["images/fig.png"]])
    prepared = prepare_dataset("geo3k", tmp_path / "out", snapshot, progress=quiet)
    assert pq.read_table(prepared.path("train")).to_pylist()[0]["images"][0]["bytes"] == png(3)


@pytest.mark.parametrize("kind", ["text file", "truncated png", "embedded text"])
def test_images_must_decode(tmp_path: Path, kind: str) -> None:
    """Non-image bytes were written with exit 0 and failed only at training time."""
    source = tmp_path / "src"
    source.mkdir()
    (source / "notes.png").write_bytes(b"root:x:0:0:root:/root:/bin/bash\n")
    (source / "cut.png").write_bytes(png(5)[:60])
    image = {"text file": "notes.png", "truncated png": "cut.png", "embedded text": b"just some text"}[kind]
    write_geo3k_parquet(source, [[png(1)], [png(2), image]])
    [problem] = refused("geo3k", tmp_path / "out", source)
    assert problem.startswith("geo3k train row 1: images[1] ")
    assert "does not decode as a PNG, JPEG, GIF, BMP, WEBP or TIFF image" in problem


def test_an_image_format_pil_would_hand_to_an_external_program_is_refused(tmp_path: Path) -> None:
    """PIL opens EPS by running Ghostscript: only plain raster formats are accepted."""
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n%%EOF\n"
    source = write_geo3k_parquet(tmp_path / "src", [[eps]])
    [problem] = refused("geo3k", tmp_path / "out", source)
    assert "does not decode as a PNG, JPEG, GIF, BMP, WEBP or TIFF image" in problem


def test_a_decompression_bomb_is_refused(tmp_path: Path) -> None:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("1", (10_000, 10_000)).save(buffer, format="PNG")  # a few kB, 100 megapixels
    source = write_geo3k_parquet(tmp_path / "src", [[buffer.getvalue()]])
    [problem] = refused("geo3k", tmp_path / "out", source)
    assert "10000x10000 pixels" in problem and "limit" in problem


def test_images_over_the_size_cap_are_refused(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    big = png(4, size=(200, 200))
    (source / "big.png").write_bytes(big)
    write_geo3k_parquet(source, [["big.png"], [big]])
    problems = refused("geo3k", tmp_path / "out", source, max_image_bytes=1000)
    over = "over the limit of 1000 bytes (--max-image-mib)"
    assert problems == [
        f"geo3k train row 0: images[0] path 'big.png' is {len(big)} bytes, {over}",
        f"geo3k train row 1: images[0] is {len(big)} bytes, {over}",
    ]


def test_the_size_cap_is_a_command_line_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "big.bin").write_bytes(os.urandom(3 * 2**20 // 2))  # 1.5 MiB: over 1 MiB, refused before decoding
    write_geo3k_parquet(source, [["big.bin"]])
    argv = ["prepare-data", "geo3k", "--source", str(source), "--out", str(tmp_path / "out")]
    code, errors = cli([*argv, "--max-image-mib", "1"], monkeypatch, capsys)
    assert code == 2
    assert errors == [
        (
            "error: geo3k train row 0: images[0] path 'big.bin' is 1572864 bytes, "
            "over the limit of 1048576 bytes (--max-image-mib)"
        )
    ]
    with pytest.raises(SystemExit) as caught:
        main([*argv, "--max-image-mib", "0"])
    assert caught.value.code == 2


def test_images_from_the_hub_must_carry_their_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no --source there is no folder a path may point into."""
    source = write_geo3k_parquet(tmp_path / "like-the-hub", [["/proc/self/environ"]])
    loaded = datasets.load_dataset(str(source))
    monkeypatch.setattr(datasets, "load_dataset", lambda *args, **kwargs: loaded)
    monkeypatch.setattr("recipe.data.source.hub_unreachable", lambda *args, **kwargs: None)  # the hub answers
    [problem] = refused("geo3k", tmp_path / "out", None)
    assert problem == (
        "geo3k train row 0: images[0] path '/proc/self/environ' has no bytes; "
        "images from the hub must carry their bytes (download the repository and pass --source)"
    )


def test_every_refused_row_is_named_up_to_a_limit(tmp_path: Path) -> None:
    source = write_geo3k_parquet(tmp_path / "src", [["/etc/passwd"]] * 30, [[b"text"]])
    problems = refused("geo3k", tmp_path / "out", source)
    assert len(problems) == 21
    rule = "is outside the source folder; an image path must name a regular file inside --source"
    assert problems[:2] == [
        f"geo3k train row 0: images[0] path '/etc/passwd' {rule}",
        f"geo3k train row 1: images[0] path '/etc/passwd' {rule}",
    ]
    assert problems[-1] == "... and 11 more refused rows (31 in all; the first 20 are shown)"


# --- the source folder itself ---------------------------------------------------------------


def test_a_fifo_in_the_source_folder_is_refused_without_hanging(tmp_path: Path) -> None:
    source = write_geo3k_parquet(tmp_path / "src", [["fifo.png"]])
    os.mkfifo(source / "fifo.png")
    [problem] = refused("geo3k", tmp_path / "out", source)
    assert problem == (
        f"--source={source}: 'fifo.png' is a FIFO; the source folder may hold only regular files, "
        "folders, and symlinks to them inside it"
    )


def test_a_fifo_readme_is_refused_without_hanging(tmp_path: Path) -> None:
    source = write_geo3k_parquet(tmp_path / "src", [[png(1)]])
    os.mkfifo(source / "README.md")
    [problem] = refused("geo3k", tmp_path / "out", source)
    assert "'README.md' is a FIFO" in problem


@pytest.mark.parametrize("target", ["/proc/self/environ", "/dev/zero", "../../outside.parquet", "/nonexistent"])
def test_a_data_file_that_links_out_of_the_source_is_refused(tmp_path: Path, target: str) -> None:
    source = write_geo3k_parquet(tmp_path / "src", [[png(1)]])
    (tmp_path / "outside.parquet").write_bytes((source / "data" / "test-00000-of-00001.parquet").read_bytes())
    (source / "data" / "validation-00000-of-00001.parquet").symlink_to(target)
    [problem] = refused("geo3k", tmp_path / "out", source)
    assert problem.startswith(f"--source={source}: 'data/validation-00000-of-00001.parquet' ")
    assert "points outside the source folder" in problem or "points to nothing" in problem


def test_a_readme_whose_data_files_point_out_of_the_source_is_refused(tmp_path: Path) -> None:
    """`datasets` follows a README's `configs: data_files: ../elsewhere/*` out of the folder."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for split in ("train", "test"):
        datasets.Dataset.from_dict({"question": ["someone else's"], "answer": ["#### 1"]}).to_parquet(
            str(elsewhere / f"{split}-0.parquet")
        )
    source = tmp_path / "src"
    source.mkdir()
    (source / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n"
        "  - split: train\n    path: ../elsewhere/train-*\n  - split: test\n    path: ../elsewhere/test-*\n---\n"
    )
    problems = refused("gsm8k", tmp_path / "out", source)
    assert [problem.split(" (split ")[1].split(")")[0] for problem in problems] == ["'train'", "'test'"]
    for problem, split in zip(problems, ("train", "test"), strict=True):
        assert problem.startswith(f"--source={source}: data file '")
        assert f"elsewhere/{split}-0.parquet' (split '{split}') is outside the source folder; " in problem
        assert problem.endswith("the dataset's files must be inside --source")


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        ({"dataset_dict.json": {"splits": ["train", "../../elsewhere"]}}, "split name '../../elsewhere'"),
        ({"dataset_dict.json": {"splits": ["train", "/etc"]}}, "split name '/etc'"),
        ({"dataset_dict.json": {"splits": "train"}}, "dataset_dict.json"),
        ({"train/state.json": {"_data_files": [{"filename": "../../elsewhere/data.arrow"}]}}, "data file name"),
        ({"train/state.json": {"_data_files": [{"filename": "/proc/self/environ"}]}}, "data file name"),
        ({"train/state.json": {"_data_files": "nope"}}, "state.json"),
    ],
)
def test_saved_dataset_json_cannot_name_files_out_of_the_folder(
    tmp_path: Path, edit: dict[str, dict[str, Any]], fragment: str
) -> None:
    source = save_gsm8k(tmp_path / "src", {"question": ["q"], "answer": ["#### 1"]})
    for name, change in edit.items():
        document = json.loads((source / name).read_text())
        document.update(change)
        (source / name).write_text(json.dumps(document))
    [problem] = refused("gsm8k", tmp_path / "out", source)
    assert problem.startswith(f"--source={source}: ")
    assert fragment in problem


def test_deeply_nested_json_in_a_saved_dataset_is_refused(tmp_path: Path) -> None:
    source = save_gsm8k(tmp_path / "src", {"question": ["q"], "answer": ["#### 1"]})
    (source / "dataset_dict.json").write_text("[" * 100_000 + "]" * 100_000)
    [problem] = refused("gsm8k", tmp_path / "out", source)
    assert problem.startswith(f"--source={source}: dataset_dict.json ")


# --- item 16: empty sources -----------------------------------------------------------------


@pytest.mark.parametrize("layout", ["save_to_disk", "parquet", "jsonl"])
def test_an_empty_split_is_one_clear_line_and_exit_2(
    tmp_path: Path, layout: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reproduction: an empty source dataset gave IndexError."""
    features = datasets.Features({"question": datasets.Value("string"), "answer": datasets.Value("string")})
    empty = datasets.Dataset.from_dict({"question": [], "answer": []}, features=features)
    full = datasets.Dataset.from_dict({"question": ["q"], "answer": ["#### 1"]}, features=features)
    source = tmp_path / "src"
    if layout == "save_to_disk":
        datasets.DatasetDict({"train": empty, "test": full}).save_to_disk(str(source))
    else:
        source.mkdir()
        if layout == "parquet":
            empty.to_parquet(str(source / "train.parquet"))
            full.to_parquet(str(source / "test.parquet"))
        else:
            (source / "train.jsonl").write_text("")
            full.to_json(str(source / "test.jsonl"))
    out = tmp_path / "out"
    code, errors = cli(["prepare-data", "gsm8k", "--source", str(source), "--out", str(out)], monkeypatch, capsys)
    assert code == 2
    assert errors == [f"error: --source={source}: split 'train' has no rows"]
    assert not out.exists()


def test_an_empty_split_from_the_hub_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    features = datasets.Features({"question": datasets.Value("string"), "answer": datasets.Value("string")})
    loaded = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"question": ["q"], "answer": ["#### 1"]}, features=features),
            "test": datasets.Dataset.from_dict({"question": [], "answer": []}, features=features),
        }
    )
    monkeypatch.setattr(datasets, "load_dataset", lambda *args, **kwargs: loaded)
    monkeypatch.setattr("recipe.data.source.hub_unreachable", lambda *args, **kwargs: None)  # the hub answers
    assert refused("gsm8k", tmp_path / "out", None) == ["openai/gsm8k: split 'test' has no rows"]


# --- text columns ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("question", "answer", "expected"),
    [
        (None, "#### 1", "gsm8k train row 0: question is missing (null)"),
        ("", "#### 1", "gsm8k train row 0: question is empty"),
        ("  \n\t", "#### 1", "gsm8k train row 0: question is empty"),
        ("q", None, "gsm8k train row 0: answer is missing (null)"),
        ("q" * 70_000, "#### 1", "gsm8k train row 0: question is 70000 characters, over the limit of 65536"),
        ("q", "#### ,.,", "gsm8k train row 0: answer's final line '#### ,.,' has no number"),
        ("q", "the answer is 2", "gsm8k train row 0: answer has no final line '#### <number>'"),
    ],
)
def test_bad_text_values_name_the_row_and_the_column(
    tmp_path: Path, question: str | None, answer: str | None, expected: str
) -> None:
    features = datasets.Features({"question": datasets.Value("string"), "answer": datasets.Value("string")})
    source = tmp_path / "src"
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"question": [question], "answer": [answer]}, features=features),
            "test": datasets.Dataset.from_dict({"question": ["q"], "answer": ["#### 1"]}, features=features),
        }
    ).save_to_disk(str(source))
    assert refused("gsm8k", tmp_path / "out", source) == [expected]


@pytest.mark.parametrize(
    ("values", "shown"),
    [
        ([1, 2], "int64"),
        ([1.5, 2.0], "float64"),
        ([["a"], ["b"]], "List(Value('string'))"),
        ([{"text": "a"}, {"text": "b"}], "{'text': Value('string')}"),
        ([b"a", b"b"], "binary"),
    ],
)
def test_text_columns_of_another_type_are_refused(tmp_path: Path, values: list[Any], shown: str) -> None:
    source = save_gsm8k(tmp_path / "src", {"question": values, "answer": ["#### 1", "#### 2"]})
    [problem] = refused("gsm8k", tmp_path / "out", source)
    assert problem.startswith(f"--source={source}: split 'train' column question is ")
    assert shown in problem
    assert problem.endswith("; it must be text (string)")


def test_geo3k_text_columns_are_checked_too(tmp_path: Path) -> None:
    from datasets import Features, Image, List, Value

    features = Features({"images": List(Image()), "problem": Value("string"), "answer": Value("string")})
    rows = {"images": [[png(1)], [png(2)]], "problem": ["Find x.", None], "answer": ["", "2"]}
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict(rows, features=features),
            "test": datasets.Dataset.from_dict(
                {"images": [[png(3)]], "problem": ["Find y."], "answer": ["1"]}, features=features
            ),
        }
    ).save_to_disk(str(tmp_path / "src"))
    assert refused("geo3k", tmp_path / "out", tmp_path / "src") == [
        "geo3k train row 0: answer is empty",
        "geo3k train row 1: problem is missing (null)",
    ]


def test_row_messages_escape_what_the_row_holds(tmp_path: Path) -> None:
    """A path with a newline and an ANSI escape cannot forge a second line of output."""
    forged = "x\n\x1b[32mwrote /data/geo3k/train.parquet: 1 rows"
    source = write_geo3k_parquet(tmp_path / "src", [[forged]])
    [problem] = refused("geo3k", tmp_path / "out", source)
    assert problem.startswith(f"geo3k train row 0: images[0] path {forged!r} ")


# --- generated batteries ----------------------------------------------------------------------

BENIGN_KINDS = ("bytes", "relative", "absolute inside", "symlink inside", "dot-dot staying inside")
#: Refused by the row check: each names the row.
ROW_KINDS = (
    "/proc/self/environ",
    "/proc/self/cmdline",
    "/dev/zero",
    "/dev/urandom",
    "/etc/passwd",
    "outside absolute",
    "outside via ../",
    "fifo outside",
    "not an image inside",
    "non-image bytes",
    "missing",
    "directory",
    "nul in path",
    "neither bytes nor path",
)
#: Refused by the folder check, before any row is read: each adds an entry to the source folder.
FOLDER_KINDS = (
    "symlink to outside file",
    "through a symlinked folder",
    "symlink to /proc/self/environ",
    "symlink to /dev/zero",
    "fifo inside",
)


class Battery:
    """The world a generated case lives in: an outside folder with a valid image and a FIFO."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.outside = root / "outside"
        self.outside.mkdir(parents=True)
        (self.outside / "secret.png").write_bytes(png(77))
        os.mkfifo(self.outside / "fifo.png")
        self.counter = itertools.count()

    def source(self) -> Path:
        source = self.root / f"src-{next(self.counter)}"
        (source / "figures").mkdir(parents=True)
        (source / "figures" / "fig.png").write_bytes(png(11))
        (source / "notes.txt").write_bytes(b"HF_TOKEN=" + SECRETS["HF_TOKEN"].encode())
        (source / "alias.png").symlink_to("figures/fig.png")
        return source

    def image(self, kind: str, source: Path) -> tuple[Any, bytes | None]:
        """The value put in the row, and the bytes expected in the output (None: refused)."""
        fig = png(11)
        n = next(self.counter)
        if kind in FOLDER_KINDS:
            name = f"entry-{n}"
            if kind == "fifo inside":
                os.mkfifo(source / name)
            else:
                target = {
                    "symlink to outside file": self.outside / "secret.png",
                    "through a symlinked folder": self.outside,
                    "symlink to /proc/self/environ": Path("/proc/self/environ"),
                    "symlink to /dev/zero": Path("/dev/zero"),
                }[kind]
                (source / name).symlink_to(target)
            return (f"{name}/secret.png" if kind == "through a symlinked folder" else name), None
        return {
            "bytes": (png(12), png(12)),
            "relative": ("figures/fig.png", fig),
            "absolute inside": (str(source / "figures" / "fig.png"), fig),
            "symlink inside": ("alias.png", fig),
            "dot-dot staying inside": ("figures/../figures/./fig.png", fig),
            "/proc/self/environ": ("/proc/self/environ", None),
            "/proc/self/cmdline": ("/proc/self/cmdline", None),
            "/dev/zero": ("/dev/zero", None),
            "/dev/urandom": ("/dev/urandom", None),
            "/etc/passwd": ("/etc/passwd", None),
            "outside absolute": (str(self.outside / "secret.png"), None),
            "outside via ../": ("figures/../../outside/secret.png", None),
            "fifo outside": (str(self.outside / "fifo.png"), None),
            "not an image inside": ("notes.txt", None),
            "non-image bytes": (b"HF_TOKEN=" + SECRETS["HF_TOKEN"].encode(), None),
            "missing": ("figures/none.png", None),
            "directory": ("figures", None),
            "nul in path": ("figures/fig.png\x00.txt", None),
            "neither bytes nor path": ({"bytes": None, "path": None}, None),
        }[kind]


@pytest.fixture
def battery(tmp_path: Path, secrets_env: dict[str, str]) -> Battery:
    return Battery(tmp_path / "battery")


image_kinds = st.sampled_from(BENIGN_KINDS + ROW_KINDS + FOLDER_KINDS)
#: Arbitrary text as a path: it names no image in the source (the folder holds no such names).
any_path = st.text(st.characters(exclude_categories=("Cs",)), max_size=40).map(lambda p: ("text", p))


@hsettings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.lists(
        st.lists(st.one_of(st.sampled_from(BENIGN_KINDS), image_kinds, any_path), max_size=3), min_size=1, max_size=4
    )
)
def test_generated_image_references_are_embedded_only_when_they_are_images_inside_the_source(
    battery: Battery, tmp_path: Path, rows: list[list[Any]]
) -> None:
    """Mixes of benign references and hostile ones, through prepare_dataset's real loader and writer."""
    source = battery.source()
    values: list[list[Any]] = []
    expected: list[list[bytes | None]] = []
    for row in rows:
        values.append([])
        expected.append([])
        for kind in row:
            value, wanted = (kind[1], None) if isinstance(kind, tuple) else battery.image(kind, source)
            values[-1].append(value)
            expected[-1].append(wanted)
    write_geo3k_parquet(source, values)
    out = tmp_path / f"out-{source.name}"
    bad_rows = [index for index, row in enumerate(expected) if any(wanted is None for wanted in row)]
    folder_level = any(kind in FOLDER_KINDS for row in rows for kind in row)
    event("refused by the folder check" if folder_level else "refused rows" if bad_rows else "written")
    if folder_level:
        problems = refused("geo3k", out, source)
        assert all(p.startswith(f"--source={source}: 'entry-") for p in problems)
    elif bad_rows:
        problems = refused("geo3k", out, source)
        assert [int(p.split()[3].rstrip(":")) for p in problems] == bad_rows
    else:
        with no_hang():
            prepared = prepare_dataset("geo3k", out, source, progress=quiet)
        written = pq.read_table(prepared.path("train")).to_pylist()
        assert [[image["bytes"] for image in row["images"]] for row in written] == expected
        for row in written:
            assert row["prompt"][0]["content"].count("<image>") == len(row["images"])


def text_value(valid: st.SearchStrategy[str]) -> st.SearchStrategy[tuple[str | None, bool]]:
    """A text cell and whether it is acceptable."""
    printable = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=30)
    good = valid.map(lambda v: (v, True))
    return st.one_of(
        good,
        good,
        good,
        st.just((None, False)),
        st.sampled_from(["", " ", "\n\t"]).map(lambda v: (v, False)),
        st.just(("x" * 65_537, False)),
        printable.filter(lambda v: v.strip() != "").map(lambda v: ("\x1b[2J" + v + "\n", True)),
    )


good_questions = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=50).filter(str.strip)
questions = text_value(good_questions)
valid_answers = st.integers(-(10**6), 10**6).map(lambda n: (f"reasoning\n#### {n:,}", True))
answers = st.one_of(
    valid_answers,
    valid_answers,
    valid_answers,
    valid_answers,
    st.sampled_from(["#### .", "####", "no marker", "#### ,", "####-"]).map(lambda a: (a, False)),
    st.just((None, False)),
    st.just(("#### 1" + " " * 70_000, False)),
)


@hsettings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.one_of(
        st.lists(st.tuples(good_questions.map(lambda q: (q, True)), valid_answers), min_size=1, max_size=4),
        st.lists(st.tuples(questions, answers), min_size=1, max_size=4),
    )
)
def test_generated_gsm8k_rows_are_written_or_refused_row_by_row(tmp_path: Path, rows: list[Any]) -> None:
    with tempfile.TemporaryDirectory(dir=tmp_path) as scratch:
        root = Path(scratch)
        features = datasets.Features({"question": datasets.Value("string"), "answer": datasets.Value("string")})
        train = {"question": [q for (q, _), _ in rows], "answer": [a for _, (a, _) in rows]}
        datasets.DatasetDict(
            {
                "train": datasets.Dataset.from_dict(train, features=features),
                "test": datasets.Dataset.from_dict({"question": ["q"], "answer": ["#### 1"]}, features=features),
            }
        ).save_to_disk(str(root / "src"))
        bad = [index for index, ((_, q_ok), (_, a_ok)) in enumerate(rows) if not (q_ok and a_ok)]
        event("refused rows" if bad else "written")
        if bad:
            problems = refused("gsm8k", root / "out", root / "src")
            assert [int(p.split()[3].rstrip(":")) for p in problems] == bad
            assert all(p.startswith(("gsm8k train row ",)) for p in problems)
        else:
            prepared = prepare_dataset("gsm8k", root / "out", root / "src", progress=quiet)
            written = pq.read_table(prepared.path("train")).to_pylist()
            assert [row["extra_info"]["question"] for row in written] == train["question"]
            assert [row["reward_model"]["ground_truth"] for row in written] == [
                a.rsplit("#### ", 1)[1].replace(",", "") for a in train["answer"]
            ]


# --- verl reads what was accepted -----------------------------------------------------------


@pytest.mark.verl
def test_images_read_from_paths_load_in_verls_rlhfdataset(tmp_path: Path) -> None:
    """Embedded from paths inside the source, the images reach verl's loader with no path needed."""
    needs("verl", install="needs the trainer extra: pip install -e '.[trainer]' (CI installs it)")
    from PIL import Image

    from .test_verl_compat import rl_dataset
    from .tiny_vl import import_qwen_vl_utils, tiny_processor

    import_qwen_vl_utils()
    source = tmp_path / "src"
    (source / "figures").mkdir(parents=True)
    (source / "figures" / "a.png").write_bytes(png(21, size=(64, 56)))
    (source / "alias.png").symlink_to("figures/a.png")
    write_geo3k_parquet(source, [["figures/a.png"], ["alias.png", png(22, size=(56, 56))]])
    prepared = prepare_dataset("geo3k", tmp_path / "out", source, progress=quiet)
    (source / "figures" / "a.png").unlink()  # the parquet is self-contained: the training node has no source
    dataset = rl_dataset(prepared.path("train"), tmp_path, processor=tiny_processor())
    assert len(dataset) == 2
    for index, sizes in enumerate([[(64, 56)], [(64, 56), (56, 56)]]):
        content = dataset[index]["raw_prompt"][0]["content"]
        images = [part["image"] for part in content if part["type"] == "image"]
        assert all(isinstance(image, Image.Image) and image.mode == "RGB" for image in images)
        assert [image.size for image in images] == sizes


def test_a_source_tree_past_the_hashing_bound_is_refused_and_leaves_nothing(
    gsm8k_hub_snapshot: Path, tmp_path: Path
) -> None:
    """The manifest hashes the whole --source; a 2 TiB sparse file in it is refused without being read."""
    from recipe.digests import MAX_DATA_BYTES

    with open(gsm8k_hub_snapshot / "huge.bin", "wb") as handle:
        handle.truncate(2 << 40)
    out = tmp_path / "new" / "out"
    with pytest.raises(RecipeConfigError) as caught:
        prepare_dataset("gsm8k", out, gsm8k_hub_snapshot, progress=quiet)
    [line] = caught.value.problems
    assert line.startswith(f"--source={str(gsm8k_hub_snapshot)!r}: ") and f"{MAX_DATA_BYTES >> 30} GiB" in line
    assert not (tmp_path / "new").exists()


@given(name=st.from_regex(r"[a-z]{1,8}", fullmatch=True), suffix=st.from_regex(r"[-_.a-z0-9]{1,8}", fullmatch=True))
def test_a_sibling_folder_that_shares_the_sources_name_is_outside_it(name: str, suffix: str) -> None:
    """`src-evil/` is not inside `src/`: the check compares whole path parts, never a string prefix."""
    from recipe.data.guard import SourceFolder

    with tempfile.TemporaryDirectory() as scratch:
        source = Path(scratch) / name
        source.mkdir()
        folder = SourceFolder.of(source)
        assert folder.contains(os.path.join(folder.root, "images", "a.png"))
        assert not folder.contains(f"{folder.root}{suffix}/a.png")
        assert not folder.contains(f"{folder.root}{suffix}")


@pytest.mark.parametrize("name", ["README.md", "readme.MD", "dataset_info.json", "state.json"])
def test_a_file_datasets_reads_whole_is_bounded(gsm8k_hub_snapshot: Path, tmp_path: Path, name: str) -> None:
    """A 4 GiB sparse dataset card took 8.5 GB of memory to load: refused by its size, never read, nothing left."""
    from recipe.data.guard import MAX_JSON_BYTES

    with open(gsm8k_hub_snapshot / name, "wb") as handle:
        handle.truncate(4 << 30)
    out = tmp_path / "new" / "out"
    with pytest.raises(RecipeConfigError) as caught:
        prepare_dataset("gsm8k", out, gsm8k_hub_snapshot, progress=quiet)
    assert any(f"{name}' is {4 << 30} bytes, which `datasets` reads whole; at most {MAX_JSON_BYTES}" in p for p in caught.value.problems)
    assert not (tmp_path / "new").exists()
