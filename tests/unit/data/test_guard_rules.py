"""recipe/data/guard.py's rules, called directly on tiny folders: what is read, what is refused, and the exact line.

Each rule of the module docstring (and docs/data.md, "Hostile or broken input") is a table of
inputs and the one line a user then reads: the file or value named, the rule, nothing more.
The end-to-end runs through `datasets` are in test_hostile_sources.py; these take milliseconds.
The issue's rule that an image path is inside --source by its path parts, not by a string prefix
(`src-evil/` is not inside `src/`), has its own tests: SourceFolder.contains itself (hypothesis),
and the image reader, the folder check and the data-file check each refusing a sibling folder.
(The issue's other rule, the manifest written atomically, is in test_prepare_manifest_and_output.py.)
"""

from __future__ import annotations

import errno
import io
import json
import os
import socket
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from tests.support.needs import needs

from recipe.data import guard
from recipe.data.errors import RowError
from recipe.data.guard import (
    ImagePolicy,
    SourceFolder,
    check_data_files,
    check_image,
    check_saved_dataset,
    check_text,
    check_tree,
    printable,
    read_image_file,
    shown,
    summarise,
)

FOLDER_RULE = "the source folder may hold only regular files, folders, and symlinks to them inside it"
IMAGE_RULE = "an image path must name a regular file inside --source"
FORMATS = "PNG, JPEG, GIF, BMP, WEBP or TIFF"
LABEL = "--source=/data/src"


def png(size: tuple[int, int] = (8, 6), color: str = "red") -> bytes:
    needs("PIL", install="images need pillow (the trainer extra)")
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    return buffer.getvalue()


def jpeg(size: tuple[int, int] = (64, 64)) -> bytes:
    needs("PIL", install="images need pillow (the trainer extra)")
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size, "blue").save(buffer, format="JPEG")
    return buffer.getvalue()


@pytest.fixture
def src(tmp_path: Path) -> Path:
    source = tmp_path / "src"
    source.mkdir()
    return source


# --- how values are shown -------------------------------------------------------------------


def test_shown_cuts_at_120_characters_by_default() -> None:
    assert shown("x" * 118) == "'" + "x" * 118 + "'"
    assert shown("x" * 119) == "'" + "x" * 115 + "...'"


@pytest.mark.parametrize(
    ("value", "limit", "expected"),
    [
        ("train", 120, "'train'"),
        ("a\nb\x1b[2J", 120, "'a\\nb\\x1b[2J'"),  # a newline or escape cannot forge a second line
        ("x" * 8, 10, "'xxxxxxxx'"),  # exactly the limit: whole
        ("x" * 9, 10, "'xxxxx...'"),  # one over: cut to the limit, marked
        ("x" * 200, 120, "'" + "x" * 115 + "...'"),
        (None, 120, "None"),
    ],
)
def test_shown_is_one_line_cut_to_its_limit(value: object, limit: int, expected: str) -> None:
    assert shown(value, limit) == expected
    assert len(shown(value, limit)) <= limit


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("train", "train"),  # a plain split name is shown as it is
        ("x" * 80, "x" * 80),
        ("x" * 81, "'" + "x" * 75 + "...'"),
        ("tr\nain", "'tr\\nain'"),
    ],
)
def test_printable_keeps_a_short_plain_name_and_quotes_the_rest(value: str, expected: str) -> None:
    assert printable(value) == expected


# --- where a path is: inside --source by path parts -----------------------------------------


def test_a_source_folder_keeps_the_name_given_and_resolves_its_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    monkeypatch.chdir(tmp_path)
    folder = SourceFolder.of("link")
    assert (folder.path, folder.root) == (tmp_path / "link", real)  # relative paths start at the name given


@pytest.mark.parametrize(
    ("blobs", "parent", "root"),
    [
        (True, "snapshots", "repo"),  # `hf download` without --local-dir: files link to ../../blobs
        (False, "snapshots", "snapshot"),  # no blobs folder: not a cache, nothing widened
        (True, "revisions", "snapshot"),
    ],
)
def test_a_hugging_face_cache_snapshot_widens_the_root_to_its_repository(
    tmp_path: Path, blobs: bool, parent: str, root: str
) -> None:
    repo = tmp_path / "datasets--org--name"
    snapshot = repo / parent / "0123abcd"
    snapshot.mkdir(parents=True)
    if blobs:
        (repo / "blobs").mkdir()
    assert SourceFolder.of(snapshot).root == {"repo": repo, "snapshot": snapshot}[root]


def test_a_blobs_file_does_not_make_a_cache(tmp_path: Path) -> None:
    snapshot = tmp_path / "repo" / "snapshots" / "rev"
    snapshot.mkdir(parents=True)
    (tmp_path / "repo" / "blobs").write_text("a file, not a folder")
    assert SourceFolder.of(snapshot).root == snapshot


@given(name=st.from_regex(r"[a-z]{1,8}", fullmatch=True), suffix=st.from_regex(r"[-_.a-z0-9]{1,8}", fullmatch=True))
def test_inside_is_decided_by_path_parts_not_by_string_prefix(name: str, suffix: str) -> None:
    folder = SourceFolder(Path(f"/data/{name}"), Path(f"/data/{name}"))
    assert folder.contains(f"/data/{name}")
    assert folder.contains(f"/data/{name}/{suffix}")
    assert not folder.contains(f"/data/{name}{suffix}")  # src-evil is beside src, not in it
    assert not folder.contains(f"/data/{name}{suffix}/a.png")
    assert not folder.contains("/data")


def test_everything_is_inside_the_filesystem_root() -> None:
    root = SourceFolder(Path("/"), Path("/"))
    assert root.contains("/") and root.contains("/etc/passwd")


@pytest.mark.parametrize("reference", ["../src-evil/a.png", "{tmp}/src-evil/a.png", "../src/../src-evil/a.png"])
def test_an_image_in_a_sibling_folder_sharing_the_sources_name_is_refused(
    tmp_path: Path, src: Path, reference: str
) -> None:
    """The issue's case: `src-evil/` starts with the characters of `src`, and is outside it."""
    evil = tmp_path / "src-evil"
    evil.mkdir()
    (evil / "a.png").write_bytes(png())
    path = reference.replace("{tmp}", str(tmp_path))
    with pytest.raises(RowError) as caught:
        read_image_file(path, ImagePolicy(SourceFolder.of(src)))
    assert str(caught.value) == f"path {path!r} is outside the source folder; {IMAGE_RULE}"


def test_a_symlink_into_a_sibling_folder_is_refused_by_the_folder_check(tmp_path: Path, src: Path) -> None:
    (tmp_path / "src-evil").mkdir()
    (tmp_path / "src-evil" / "a.png").write_bytes(png())
    (src / "a.png").symlink_to(tmp_path / "src-evil" / "a.png")
    assert check_tree(SourceFolder.of(src), LABEL) == [
        f"{LABEL}: 'a.png' is a symlink that points outside the source folder; {FOLDER_RULE}"
    ]


# --- the source folder ----------------------------------------------------------------------


def test_a_folder_of_files_folders_and_links_inside_it_passes(src: Path) -> None:
    (src / "data" / "deep").mkdir(parents=True)
    (src / "data" / "train.parquet").write_bytes(b"x")
    (src / "data" / "deep" / "test.parquet").write_bytes(b"")
    (src / "alias.parquet").symlink_to("data/train.parquet")
    (src / "also-data").symlink_to("data")
    assert check_tree(SourceFolder.of(src), LABEL) == []


def bound_socket(path: Path) -> None:
    """A unix socket file at `path` (the socket itself is closed; the file stays)."""
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(path))


@pytest.mark.parametrize(
    ("make", "line"),
    [
        (lambda s: os.mkfifo(s / "x"), "'x' is a FIFO"),
        (lambda s: bound_socket(s / "x"), "'x' is a socket"),
        (lambda s: (s / "x").symlink_to("nothing-here"), "'x' is a symlink that points to nothing"),
        (lambda s: (s / "x").symlink_to("/etc/passwd"), "'x' is a symlink that points outside the source folder"),
        (lambda s: (s / "x").symlink_to(".."), "'x' is a symlink that points outside the source folder"),
    ],
)
def test_entries_that_are_not_plain_files_or_folders_are_named(
    src: Path, make: Callable[[Path], object], line: str
) -> None:
    make(src)
    problems = check_tree(SourceFolder.of(src), LABEL)
    assert problems[0] == f"{LABEL}: {line}; {FOLDER_RULE}"


def test_a_symlink_to_a_fifo_inside_names_the_link_and_its_target_kind(src: Path) -> None:
    os.mkfifo(src / "pipe")
    (src / "x").symlink_to("pipe")
    assert check_tree(SourceFolder.of(src), LABEL) == [
        f"{LABEL}: 'pipe' is a FIFO; {FOLDER_RULE}",
        f"{LABEL}: 'x' is a symlink to a FIFO; {FOLDER_RULE}",
    ]


@pytest.mark.parametrize(
    ("mode", "kind"),
    [
        (stat.S_IFDIR, "a directory"),
        (stat.S_IFIFO, "a FIFO"),
        (stat.S_IFSOCK, "a socket"),
        (stat.S_IFCHR, "a character device"),
        (stat.S_IFBLK, "a block device"),
        (stat.S_IFLNK, "a symlink"),
        (stat.S_IFREG, "not a regular file"),
    ],
)
def test_a_refused_entry_is_named_by_its_file_type(mode: int, kind: str) -> None:
    # The words of the refusals ("is a character device; ..."): devices cannot be made without root.
    assert guard._file_kind(mode | 0o644) == kind


def test_each_real_folder_is_walked_once_and_loops_end(src: Path) -> None:
    """A link back to the folder, or to one already walked, is not walked again: each problem said once."""
    os.mkfifo(src / "pipe")
    (src / "sub").mkdir()
    os.mkfifo(src / "sub" / "pipe")
    (src / "sub" / "up").symlink_to("..")  # a loop back to the source folder itself
    (src / "zz-again").symlink_to("sub")  # the same folder under a second name, walked after it
    assert check_tree(SourceFolder.of(src), LABEL) == [
        f"{LABEL}: 'pipe' is a FIFO; {FOLDER_RULE}",
        f"{LABEL}: 'sub/pipe' is a FIFO; {FOLDER_RULE}",
    ]


def test_every_real_folder_is_walked(src: Path) -> None:
    for name in ("a", "b", "c/d"):
        (src / name).mkdir(parents=True)
        os.mkfifo(src / name / "pipe")
    assert check_tree(SourceFolder.of(src), LABEL) == [
        f"{LABEL}: {where!r} is a FIFO; {FOLDER_RULE}" for where in ("a/pipe", "b/pipe", "c/d/pipe")
    ]


def test_a_linked_folder_inside_is_walked_too(tmp_path: Path, src: Path) -> None:
    """Nothing a link leads to escapes the check: a FIFO reached only through a linked folder is named."""
    hidden = src / "a-link"
    (src / "zz-real").mkdir()
    os.mkfifo(src / "zz-real" / "pipe")
    hidden.symlink_to("zz-real")
    assert check_tree(SourceFolder.of(src), LABEL) == [f"{LABEL}: 'a-link/pipe' is a FIFO; {FOLDER_RULE}"]


@pytest.mark.parametrize(
    ("entries", "refused"),
    [(3, False), (4, True)],
)
def test_a_folder_with_too_many_entries_is_refused_at_the_bound(
    src: Path, monkeypatch: pytest.MonkeyPatch, entries: int, refused: bool
) -> None:
    monkeypatch.setattr(guard, "MAX_SOURCE_ENTRIES", 3)
    for index in range(entries - 1):
        (src / f"f{index}").write_bytes(b"x")
    os.mkfifo(src / "z-pipe")  # the last entry: refused on its own when the walk gets that far
    expected = (
        [f"{LABEL}: holds more than 3 entries; point --source at the dataset's own folder"]
        if refused
        else [f"{LABEL}: 'z-pipe' is a FIFO; {FOLDER_RULE}"]
    )
    assert check_tree(SourceFolder.of(src), LABEL) == expected


@pytest.mark.parametrize(
    ("name", "size", "refused"),
    [
        ("README.md", 10, False),
        ("README.md", 11, True),
        ("readme.MD", 11, True),
        ("dataset_info.json", 11, True),
        ("dataset_infos.json", 11, True),
        ("dataset_dict.json", 11, True),
        ("state.json", 11, True),
        ("train.parquet", 11, False),  # read in batches, not whole
    ],
)
def test_a_file_datasets_reads_whole_is_bounded_by_size(
    src: Path, monkeypatch: pytest.MonkeyPatch, name: str, size: int, refused: bool
) -> None:
    monkeypatch.setattr(guard, "MAX_JSON_BYTES", 10)
    (src / "sub").mkdir()
    (src / "sub" / name).write_bytes(b"x" * size)
    expected = [f"{LABEL}: 'sub/{name}' is {size} bytes, which `datasets` reads whole; at most 10"]
    assert check_tree(SourceFolder.of(src), LABEL) == (expected if refused else [])


def test_a_link_to_a_large_card_is_bounded_by_its_target(src: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(guard, "MAX_JSON_BYTES", 10)
    (src / "card.txt").write_bytes(b"x" * 11)
    (src / "README.md").symlink_to("card.txt")
    assert check_tree(SourceFolder.of(src), LABEL) == [
        f"{LABEL}: 'README.md' is 11 bytes, which `datasets` reads whole; at most 10"
    ]


@pytest.fixture
def unexaminable(src: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[OSError]]:
    """`lstat` of the entry `bad` fails with the error the test puts in the list (root can read anything)."""
    (src / "bad").write_bytes(b"x")
    errors: list[OSError] = []
    real_lstat = os.lstat

    def lstat(path: str | os.PathLike[str], *args: object, **kwargs: object) -> os.stat_result:
        if os.fspath(path).endswith(os.sep + "bad"):
            raise errors[0]
        return real_lstat(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "lstat", lstat)
    yield errors


@pytest.mark.parametrize(
    ("error", "why"),
    [(PermissionError(errno.EACCES, "Permission denied"), "Permission denied"), (PermissionError(), "PermissionError")],
)
def test_an_entry_that_cannot_be_examined_is_named_with_the_reason(
    src: Path, unexaminable: list[OSError], error: OSError, why: str
) -> None:
    unexaminable.append(error)
    assert check_tree(SourceFolder.of(src), LABEL) == [f"{LABEL}: 'bad' cannot be examined ({why})"]


@pytest.mark.parametrize(
    ("error", "line"),
    [
        (PermissionError(errno.EACCES, "Permission denied", "{sub}"), "'sub' cannot be listed (Permission denied)"),
        (PermissionError(errno.EACCES, "Permission denied"), "a folder cannot be listed (Permission denied)"),
        (PermissionError(), "a folder cannot be listed (PermissionError)"),
    ],
)
def test_a_folder_that_cannot_be_listed_is_named(
    src: Path, monkeypatch: pytest.MonkeyPatch, error: OSError, line: str
) -> None:
    (src / "sub").mkdir()
    if error.filename:
        error.filename = str(src / "sub")
    real_scandir = os.scandir

    def scandir(path: str) -> object:
        if os.fspath(path) == str(src / "sub"):
            raise error
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    assert check_tree(SourceFolder.of(src), LABEL) == [f"{LABEL}: {line}"]


# --- save_to_disk folders: the JSON that names files ----------------------------------------


def saved(src: Path, splits: object = ("train", "test"), states: dict[str, object] | None = None) -> SourceFolder:
    """A save_to_disk layout: dataset_dict.json and each split's state.json (written as given)."""
    (src / "dataset_dict.json").write_text(json.dumps({"splits": list(splits) if isinstance(splits, tuple) else splits}))
    for split, state in (states or {}).items():
        (src / split).mkdir(exist_ok=True)
        (src / split / "state.json").write_text(state if isinstance(state, str) else json.dumps(state))
    return SourceFolder.of(src)


GOOD_STATE = {"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}


def test_a_plain_saved_dataset_passes(src: Path) -> None:
    assert check_saved_dataset(saved(src, states={"train": GOOD_STATE, "test": GOOD_STATE}), LABEL) == []


@pytest.mark.parametrize(
    ("document", "line"),
    [
        ('{"splits": "train"}', "dataset_dict.json: 'splits' must be a list of split names"),
        ('{"splits": ["train", 3]}', "dataset_dict.json: 'splits' must be a list of split names"),
        ('["train", "test"]', "dataset_dict.json: 'splits' must be a list of split names"),
        ("{}", "dataset_dict.json: 'splits' must be a list of split names"),
        ("", "dataset_dict.json is not valid JSON ('Expecting value: line 1 column 1 (char 0)')"),
        ('{"splits": [', "dataset_dict.json is not valid JSON ('Expecting value: line 1 column 13 (char 12)')"),
        ("[" * 100_000, "dataset_dict.json cannot be parsed (nested too deeply)"),
    ],
)
def test_a_bad_dataset_dict_is_one_line(src: Path, document: str, line: str) -> None:
    (src / "dataset_dict.json").write_text(document)
    assert check_saved_dataset(SourceFolder.of(src), LABEL) == [f"{LABEL}: {line}"]


def test_a_dataset_dict_that_is_not_utf8_is_refused(src: Path) -> None:
    (src / "dataset_dict.json").write_bytes(b'{"splits": ["\xff"]}')
    assert check_saved_dataset(SourceFolder.of(src), LABEL) == [
        f"{LABEL}: dataset_dict.json cannot be read (UnicodeDecodeError)"
    ]


@pytest.mark.parametrize(("size", "refused"), [(10, False), (11, True)])
def test_a_dataset_dict_is_read_only_up_to_the_json_bound(
    src: Path, monkeypatch: pytest.MonkeyPatch, size: int, refused: bool
) -> None:
    monkeypatch.setattr(guard, "MAX_JSON_BYTES", 10)
    (src / "dataset_dict.json").write_text('{"a": 1}'.ljust(size))
    expected = f"{LABEL}: dataset_dict.json is over 10 bytes"
    problems = check_saved_dataset(SourceFolder.of(src), LABEL)
    assert (problems == [expected]) is refused
    if not refused:
        assert problems == [f"{LABEL}: dataset_dict.json: 'splits' must be a list of split names"]


def test_an_unreadable_state_json_names_the_file_and_the_error(src: Path) -> None:
    folder = saved(src, splits=["train"])
    (src / "train").mkdir()
    (src / "train" / "state.json").mkdir()  # a folder where a file should be: reading it fails
    assert check_saved_dataset(folder, LABEL) == [f"{LABEL}: 'train/state.json' cannot be read (IsADirectoryError)"]


@pytest.mark.parametrize(
    "split", ["", ".", "..", "../elsewhere", "/etc", "a\\b", "a\x00b", "s3://bucket/x"]
)
def test_a_split_name_must_be_a_plain_folder_name(src: Path, split: str) -> None:
    folder = saved(src, splits=["train", split, "test"], states={"train": GOOD_STATE, "test": GOOD_STATE})
    assert check_saved_dataset(folder, LABEL) == [
        f"{LABEL}: dataset_dict.json: split name {split!r} is not a plain folder name"
    ]


@pytest.mark.parametrize(
    ("state", "line"),
    [
        ({"_data_files": "data.arrow"}, "'train/state.json': '_data_files' must be a list of {filename: ...}"),
        ({"_data_files": ["data.arrow"]}, "'train/state.json': '_data_files' must be a list of {filename: ...}"),
        ({}, "'train/state.json': '_data_files' must be a list of {filename: ...}"),
        ([], "'train/state.json': '_data_files' must be a list of {filename: ...}"),
        ({"_data_files": []}, "split 'train' has no rows"),
        (
            {"_data_files": [{"filename": "../../elsewhere/data.arrow"}]},
            "'train/state.json': data file name '../../elsewhere/data.arrow' is not a plain file name in the "
            "split's folder",
        ),
        (
            {"_data_files": [{"name": "data.arrow"}]},
            "'train/state.json': data file name None is not a plain file name in the split's folder",
        ),
        ("{", "'train/state.json' is not valid JSON ('Expecting property name enclosed in double quotes: line 1 "
              "column 2 (char 1)')"),
    ],
)
def test_a_split_state_must_name_plain_data_files(src: Path, state: object, line: str) -> None:
    folder = saved(src, states={"train": state, "test": GOOD_STATE})
    assert check_saved_dataset(folder, LABEL) == [f"{LABEL}: {line}"]


def test_every_bad_split_is_named_not_only_the_first(src: Path) -> None:
    bad_file = {"_data_files": [{"filename": "ok.arrow"}, {"filename": "/proc/self/environ"}]}
    folder = saved(src, splits=["..", "train", "test"], states={"train": {"_data_files": 1}, "test": bad_file})
    assert check_saved_dataset(folder, LABEL) == [
        f"{LABEL}: dataset_dict.json: split name '..' is not a plain folder name",
        f"{LABEL}: 'train/state.json': '_data_files' must be a list of {{filename: ...}}",
        f"{LABEL}: 'test/state.json': data file name '/proc/self/environ' is not a plain file name in the split's folder",
    ]


def test_a_missing_state_json_does_not_hide_the_next_splits_problems(src: Path) -> None:
    folder = saved(src, splits=["train", "test"], states={"test": {"_data_files": [{"filename": "../x.arrow"}]}})
    assert check_saved_dataset(folder, LABEL) == [
        f"{LABEL}: 'train/state.json' is missing",
        f"{LABEL}: 'test/state.json': data file name '../x.arrow' is not a plain file name in the split's folder",
    ]


def test_a_missing_state_json_is_named(src: Path) -> None:
    folder = saved(src, splits=["train", "test"], states={"test": GOOD_STATE})
    assert check_saved_dataset(folder, LABEL) == [f"{LABEL}: 'train/state.json' is missing"]


# --- the files `datasets` resolved -----------------------------------------------------------


class NamedSplit:
    """Stands for datasets.NamedSplit: the key `datasets` uses; its str() is the split name."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"NamedSplit({self.name!r})"


def test_resolved_data_files_inside_the_folder_pass(src: Path) -> None:
    (src / "train.parquet").write_bytes(b"x")
    (src / "test-empty.parquet").write_bytes(b"")
    (src / "test.parquet").write_bytes(b"x")
    files = {NamedSplit("train"): [str(src / "train.parquet")],
             "test": [str(src / "test-empty.parquet"), str(src / "test.parquet")]}  # fmt: skip
    assert check_data_files(files, SourceFolder.of(src), LABEL) == []


@pytest.mark.parametrize(
    ("path", "rule"),
    [
        ("hf://datasets/org/name/train.parquet", "is not a local file; the dataset's files must be inside --source"),
        ("zip://train.parquet::{src}/a.zip", "is not a local file; the dataset's files must be inside --source"),
        ("{tmp}/src-evil/train.parquet", "is outside the source folder; the dataset's files must be inside --source"),
        ("/etc/passwd", "is outside the source folder; the dataset's files must be inside --source"),
        ("{src}/missing.parquet", "cannot be read (No such file or directory)"),
        ("{src}/folder", "is a directory, not a regular file"),
        ("{src}/pipe", "is a FIFO, not a regular file"),
    ],
)
def test_a_resolved_data_file_must_be_a_local_regular_file_inside_the_folder(
    tmp_path: Path, src: Path, path: str, rule: str
) -> None:
    (tmp_path / "src-evil").mkdir()
    (tmp_path / "src-evil" / "train.parquet").write_bytes(b"x")
    (src / "folder").mkdir()
    os.mkfifo(src / "pipe")
    path = path.replace("{src}", str(src)).replace("{tmp}", str(tmp_path))
    files = {NamedSplit("train"): [path]}
    assert check_data_files(files, SourceFolder.of(src), LABEL) == [
        f"{LABEL}: data file {path!r} (split 'train') {rule}"
    ]


def test_a_chained_fsspec_path_is_not_a_local_file(src: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`simplecache::/etc/passwd` has no `://`, and fsspec would read /etc/passwd through it."""
    monkeypatch.chdir(src)  # as a relative name it would even resolve inside the folder
    assert check_data_files({"train": ["simplecache::/etc/passwd"]}, SourceFolder.of(src), LABEL) == [
        f"{LABEL}: data file 'simplecache::/etc/passwd' (split 'train') is not a local file; "
        "the dataset's files must be inside --source"
    ]


def test_every_refused_data_file_of_a_split_is_named(tmp_path: Path, src: Path) -> None:
    (src / "folder").mkdir()
    os.mkfifo(src / "pipe")
    paths = ["hf://x/train.parquet", "/etc/passwd", str(src / "missing"), str(src / "folder"), str(src / "pipe")]
    assert check_data_files({"train": paths}, SourceFolder.of(src), LABEL) == [
        f"{LABEL}: data file {paths[0]!r} (split 'train') is not a local file; the dataset's files must be inside --source",
        f"{LABEL}: data file {paths[1]!r} (split 'train') is outside the source folder; "
        "the dataset's files must be inside --source",
        f"{LABEL}: data file {paths[2]!r} (split 'train') cannot be read (No such file or directory)",
        f"{LABEL}: data file {paths[3]!r} (split 'train') is a directory, not a regular file",
        f"{LABEL}: data file {paths[4]!r} (split 'train') is a FIFO, not a regular file",
    ]


def test_a_data_file_that_cannot_be_statted_says_why(src: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (src / "train.parquet").write_bytes(b"x")
    real_stat = os.stat

    def failing(path: str, *args: object, **kwargs: object) -> os.stat_result:
        if os.fspath(path).endswith("train.parquet"):
            raise OSError()
        return real_stat(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "stat", failing)
    path = str(src / "train.parquet")
    assert check_data_files({"train": [path]}, SourceFolder.of(src), LABEL) == [
        f"{LABEL}: data file {path!r} (split 'train') cannot be read (OSError)"
    ]


@pytest.mark.parametrize(
    ("sizes", "no_rows"),
    [
        ([0], True),
        ([0, 0], True),
        ([0, 1], False),
        ([], False),  # no files at all: `datasets` itself says so
    ],
)
def test_a_split_whose_files_are_all_empty_has_no_rows(src: Path, sizes: list[int], no_rows: bool) -> None:
    paths = []
    for index, size in enumerate(sizes):
        (src / f"train-{index}.jsonl").write_bytes(b"{}\n" * size)
        paths.append(str(src / f"train-{index}.jsonl"))
    expected = [f"{LABEL}: split 'train' has no rows"] if no_rows else []
    assert check_data_files({NamedSplit("train"): paths}, SourceFolder.of(src), LABEL) == expected


def test_an_empty_file_beside_a_refused_one_is_not_also_called_empty(src: Path) -> None:
    """The refused file is the problem; the split may well have rows once it is fixed."""
    (src / "train.jsonl").write_bytes(b"")
    paths = [str(src / "train.jsonl"), "/etc/passwd"]
    assert check_data_files({"train": paths}, SourceFolder.of(src), LABEL) == [
        f"{LABEL}: data file '/etc/passwd' (split 'train') is outside the source folder; "
        "the dataset's files must be inside --source"
    ]


# --- text values -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (None, "question is missing (null)"),
        (3, "question is int, not text"),
        (b"q", "question is bytes, not text"),
        ("", "question is empty"),
        (" \n\t", "question is empty"),
        ("q" * 65_537, "question is 65537 characters, over the limit of 65536"),
    ],
)
def test_a_text_value_that_is_refused_names_the_column_and_the_rule(value: object, error: str) -> None:
    with pytest.raises(RowError) as caught:
        check_text(value, "question")
    assert str(caught.value) == error


@pytest.mark.parametrize("value", ["q", " q ", "q" * 65_536, "\x1b[2J text"])
def test_a_usable_text_value_is_returned_as_it_is(value: str) -> None:
    assert check_text(value, "question") == value


# --- image files read from a path ------------------------------------------------------------


def test_a_hub_row_must_carry_its_bytes() -> None:
    with pytest.raises(RowError) as caught:
        read_image_file("figures/a.png", ImagePolicy())
    assert str(caught.value) == (
        "path 'figures/a.png' has no bytes; images from the hub must carry their bytes "
        "(download the repository and pass --source)"
    )


@pytest.mark.parametrize(
    ("path", "rule"),
    [
        ("a\x00.png", f"is not a valid path (it contains a NUL character); {IMAGE_RULE}"),
        ("missing.png", f"names no such file in the source folder; {IMAGE_RULE}"),
        ("a.png/inner.png", f"cannot be read (Not a directory); {IMAGE_RULE}"),
        ("figures", f"is not a regular file (a directory); {IMAGE_RULE}"),
        ("pipe.png", f"is not a regular file (a FIFO); {IMAGE_RULE}"),
        ("/etc/passwd", f"is outside the source folder; {IMAGE_RULE}"),
        ("figures/../../outside.png", f"is outside the source folder; {IMAGE_RULE}"),
    ],
)
def test_an_image_path_that_is_refused_says_why(src: Path, path: str, rule: str) -> None:
    (src / "a.png").write_bytes(png())
    (src / "figures").mkdir()
    os.mkfifo(src / "pipe.png")
    (src.parent / "outside.png").write_bytes(png())
    with pytest.raises(RowError) as caught:
        read_image_file(path, ImagePolicy(SourceFolder.of(src)))
    assert str(caught.value) == f"path {path!r} {rule}"


def test_relative_absolute_and_linked_paths_inside_are_read_whole(src: Path) -> None:
    data = os.urandom(3 * 2**20 + 5)  # several reads' worth: nothing lost between them
    (src / "figures").mkdir()
    (src / "figures" / "a.bin").write_bytes(data)
    (src / "alias.bin").symlink_to("figures/a.bin")
    policy = ImagePolicy(SourceFolder.of(src), max_bytes=len(data))
    for path in ("figures/a.bin", str(src / "figures" / "a.bin"), "alias.bin", "figures/../figures/a.bin"):
        assert read_image_file(path, policy) == data, path


@pytest.mark.parametrize(("cap", "refused"), [(100, False), (99, True)])
def test_an_image_file_over_the_cap_is_refused_before_it_is_read(src: Path, cap: int, refused: bool) -> None:
    (src / "a.png").write_bytes(b"x" * 100)
    policy = ImagePolicy(SourceFolder.of(src), max_bytes=cap)
    if not refused:
        assert read_image_file("a.png", policy) == b"x" * 100
        return
    with pytest.raises(RowError) as caught:
        read_image_file("a.png", policy)
    assert str(caught.value) == "path 'a.png' is 100 bytes, over the limit of 99 bytes (--max-image-mib)"


def _stat_as(monkeypatch: pytest.MonkeyPatch, target: Path, change: object) -> None:
    """Make `os.stat(target)` report what `change(real result)` returns: a file that changes after the check."""
    real_stat = os.stat

    def patched(path: str | os.PathLike[str], *args: object, **kwargs: object) -> os.stat_result:
        result = real_stat(path, *args, **kwargs)  # type: ignore[arg-type]
        return change(result) if os.fspath(path) == str(target) else result  # type: ignore[operator]

    monkeypatch.setattr(os, "stat", patched)


def test_a_file_that_grows_after_the_check_is_still_capped(src: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (src / "a.png").write_bytes(b"x" * 5000)
    _stat_as(monkeypatch, src / "a.png", lambda r: os.stat_result((*r[:6], 10, *r[7:])))  # looked 10 bytes long
    with pytest.raises(RowError) as caught:
        read_image_file("a.png", ImagePolicy(SourceFolder.of(src), max_bytes=4000))
    # It reads one byte past the cap, no more: enough to know, never the whole file.
    assert str(caught.value) == "path 'a.png' is 4001 bytes, over the limit of 4000 bytes (--max-image-mib)"


def test_a_file_that_grew_past_a_one_mib_cap_is_refused_not_cut(src: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads go in 1 MiB pieces: the byte past the cap is read even when the cap is a whole number of them."""
    (src / "a.png").write_bytes(b"x" * (2**20 + 100))
    _stat_as(monkeypatch, src / "a.png", lambda r: os.stat_result((*r[:6], 10, *r[7:])))
    with pytest.raises(RowError) as caught:
        read_image_file("a.png", ImagePolicy(SourceFolder.of(src), max_bytes=2**20))
    assert str(caught.value) == "path 'a.png' is 1048577 bytes, over the limit of 1048576 bytes (--max-image-mib)"


def test_a_file_swapped_after_the_check_is_refused(src: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (src / "a.png").write_bytes(png())
    (src / "b.png").write_bytes(png())
    other = os.stat(src / "b.png")
    _stat_as(monkeypatch, src / "a.png", lambda r: other)  # the check saw another file than the one opened
    with pytest.raises(RowError) as caught:
        read_image_file("a.png", ImagePolicy(SourceFolder.of(src)))
    assert str(caught.value) == f"path 'a.png' changed while it was opened; {IMAGE_RULE}"


def test_a_fifo_swapped_in_after_the_check_neither_blocks_nor_is_read(src: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (src / "a.png").write_bytes(png())

    def swap(result: os.stat_result) -> os.stat_result:
        os.unlink(src / "a.png")
        os.mkfifo(src / "a.png")  # no writer: a blocking open would wait forever
        return result

    _stat_as(monkeypatch, src / "a.png", swap)
    with pytest.raises(RowError) as caught:
        read_image_file("a.png", ImagePolicy(SourceFolder.of(src)))
    assert str(caught.value) == f"path 'a.png' changed while it was opened; {IMAGE_RULE}"


def test_a_symlink_swapped_in_after_the_check_is_not_followed(
    tmp_path: Path, src: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (src / "a.png").write_bytes(png())
    (tmp_path / "secret.png").write_bytes(png(color="black"))

    def swap(result: os.stat_result) -> os.stat_result:
        os.unlink(src / "a.png")
        (src / "a.png").symlink_to(tmp_path / "secret.png")
        return result

    _stat_as(monkeypatch, src / "a.png", swap)
    with pytest.raises(RowError) as caught:
        read_image_file("a.png", ImagePolicy(SourceFolder.of(src)))
    assert str(caught.value) == f"path 'a.png' cannot be read (Too many levels of symbolic links); {IMAGE_RULE}"


def test_an_opened_file_that_resolves_outside_the_folder_is_refused(
    src: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel's own name for the open file (/proc/self/fd/N) is checked too: a folder renamed mid-read."""
    (src / "a.png").write_bytes(png())
    real_readlink = os.readlink
    monkeypatch.setattr(
        os, "readlink", lambda p: "/elsewhere/a.png" if str(p).startswith("/proc/self/fd/") else real_readlink(p)
    )
    with pytest.raises(RowError) as caught:
        read_image_file("a.png", ImagePolicy(SourceFolder.of(src)))
    assert str(caught.value) == f"path 'a.png' is outside the source folder; {IMAGE_RULE}"


@pytest.mark.parametrize(
    ("error", "line"),
    [
        (PermissionError(errno.EACCES, "Permission denied"), f"cannot be read (Permission denied); {IMAGE_RULE}"),
        (OSError(), f"cannot be read (OSError); {IMAGE_RULE}"),
    ],
)
def test_an_image_that_cannot_be_opened_says_why(
    src: Path, monkeypatch: pytest.MonkeyPatch, error: OSError, line: str
) -> None:
    (src / "a.png").write_bytes(png())

    def refuse(*args: object, **kwargs: object) -> int:
        raise error

    monkeypatch.setattr(os, "open", refuse)
    with pytest.raises(RowError) as caught:
        read_image_file("a.png", ImagePolicy(SourceFolder.of(src)))
    assert str(caught.value) == f"path 'a.png' {line}"


@pytest.mark.parametrize(
    ("error", "line"),
    [
        (PermissionError(errno.EACCES, "Permission denied"), f"cannot be read (Permission denied); {IMAGE_RULE}"),
        (OSError(), f"cannot be read (OSError); {IMAGE_RULE}"),
    ],
)
def test_an_image_that_cannot_be_statted_says_why(
    src: Path, monkeypatch: pytest.MonkeyPatch, error: OSError, line: str
) -> None:
    (src / "a.png").write_bytes(png())

    def refuse(result: os.stat_result) -> os.stat_result:
        raise error

    _stat_as(monkeypatch, src / "a.png", refuse)
    with pytest.raises(RowError) as caught:
        read_image_file("a.png", ImagePolicy(SourceFolder.of(src)))
    assert str(caught.value) == f"path 'a.png' {line}"


def test_a_read_that_would_block_is_refused(src: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (src / "a.png").write_bytes(png())

    def would_block(*args: object) -> bytes:
        raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "read", would_block)
    with pytest.raises(RowError) as caught:
        read_image_file("a.png", ImagePolicy(SourceFolder.of(src)))
    assert str(caught.value) == f"path 'a.png' cannot be read without blocking; {IMAGE_RULE}"


def test_reading_images_leaves_no_descriptor_open(src: Path) -> None:
    """Thousands of rows are read in one process: each file is closed, read or refused."""
    (src / "a.png").write_bytes(png())
    (src / "big.png").write_bytes(b"x" * 100)
    policy = ImagePolicy(SourceFolder.of(src), max_bytes=50)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        read_image_file("a.png", ImagePolicy(SourceFolder.of(src)))
        with pytest.raises(RowError):
            read_image_file("big.png", policy)
    assert len(os.listdir("/proc/self/fd")) == before


# --- image content ---------------------------------------------------------------------------


@pytest.mark.parametrize("image", ["png", "jpeg"])
def test_a_plain_raster_image_is_accepted(image: str) -> None:
    data = {"png": png, "jpeg": jpeg}[image]()
    assert check_image(data, len(data)) is None


def test_embedded_bytes_over_the_cap_are_refused_before_decoding() -> None:
    with pytest.raises(RowError) as caught:
        check_image(b"x" * 101, 100)
    assert str(caught.value) == "is 101 bytes, over the limit of 100 bytes (--max-image-mib)"


@pytest.mark.parametrize(
    ("data", "detail"),
    [
        (b"root:x:0:0:root:/root:/bin/bash\n", ""),  # not an image at all: nothing more to say
        (b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n%%EOF\n", ""),  # PIL would run Ghostscript
        (b"", ""),
        ("jpeg-cut", " (OSError: 'image file is truncated (3 bytes not processed)')"),  # only a full decode sees it
        ("png-cut", " (OSError: 'Truncated File Read')"),
    ],
)
def test_bytes_that_do_not_decode_are_refused_naming_the_formats(data: bytes | str, detail: str) -> None:
    if data == "jpeg-cut":
        data = jpeg()[:-10]
    elif data == "png-cut":
        data = png((64, 64))[:76]
    assert isinstance(data, bytes)
    with pytest.raises(RowError) as caught:
        check_image(data, 2**20)
    assert str(caught.value) == f"does not decode as a {FORMATS} image{detail}"


@pytest.mark.parametrize("kind", ["PPM", "TGA", "ICO"])
def test_an_image_pil_reads_but_outside_the_plain_formats_is_refused(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the listed formats are opened at all: each other PIL plugin is more code reading hostile bytes.

    So such a file is refused for its format before anything of it is parsed, its size included.
    """
    from PIL import Image

    monkeypatch.setattr(guard, "MAX_IMAGE_PIXELS", 100)  # 16x16 would be over it, were the header read
    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), "red").save(buffer, format=kind)
    with pytest.raises(RowError) as caught:
        check_image(buffer.getvalue(), 2**20)
    assert str(caught.value) == f"does not decode as a {FORMATS} image"


def test_a_decoders_long_message_is_cut_to_one_short_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """PIL's messages may quote the file's own bytes: at most 80 characters of one are shown."""
    from PIL import PngImagePlugin

    def verify(self: object) -> None:
        raise ValueError("z" * 200)

    monkeypatch.setattr(PngImagePlugin.PngImageFile, "verify", verify)
    with pytest.raises(RowError) as caught:
        check_image(png(), 2**20)
    assert str(caught.value) == f"does not decode as a {FORMATS} image (ValueError: '{'z' * 75}...')"


@pytest.mark.parametrize(("size", "refused"), [((10, 10), False), ((11, 10), True)])
def test_an_image_over_the_pixel_limit_is_refused(
    monkeypatch: pytest.MonkeyPatch, size: tuple[int, int], refused: bool
) -> None:
    monkeypatch.setattr(guard, "MAX_IMAGE_PIXELS", 100)
    data = png(size)
    if not refused:
        check_image(data, 2**20)
        return
    with pytest.raises(RowError) as caught:
        check_image(data, 2**20)
    assert str(caught.value) == "is 11x10 pixels, over the limit of 100 pixels"


def test_an_image_pil_itself_calls_a_bomb_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past twice PIL's own limit PIL refuses to open it: the same rule, said in our words."""
    from PIL import Image

    data = png((20, 20))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # 400 pixels > 2 x 100
    with pytest.raises(RowError) as caught:
        check_image(data, 2**20)
    assert str(caught.value) == f"has more than {guard.MAX_IMAGE_PIXELS} pixels, over the limit"


def test_pils_own_bomb_warning_is_not_shown(monkeypatch: pytest.MonkeyPatch, recwarn: pytest.WarningsRecorder) -> None:
    """Between PIL's limit and twice it PIL only warns; our limit decides, and no warning reaches the log."""
    from PIL import Image

    data = png((12, 12))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # 144 pixels: over PIL's limit, under twice it
    check_image(data, 2**20)
    assert [w for w in recwarn if issubclass(w.category, Image.DecompressionBombWarning)] == []


# --- many refused rows -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("count", "limit", "expected"),
    [
        (3, 3, ["row 0", "row 1", "row 2"]),
        (4, 3, ["row 0", "row 1", "row 2", "... and 1 more refused rows (4 in all; the first 3 are shown)"]),
        (2, 1, ["row 0", "... and 1 more refused rows (2 in all; the first 1 are shown)"]),
    ],
)
def test_refused_rows_are_listed_up_to_a_limit_then_counted(count: int, limit: int, expected: list[str]) -> None:
    assert summarise([f"row {index}" for index in range(count)], limit) == expected


@pytest.mark.parametrize(("count", "shown_rows"), [(20, 20), (21, 20)])
def test_twenty_refused_rows_are_shown_by_default(count: int, shown_rows: int) -> None:
    summary = summarise([f"row {index}" for index in range(count)])
    assert summary[:shown_rows] == [f"row {index}" for index in range(shown_rows)]
    assert len(summary) == min(count, 21)
    if count > 20:
        assert summary[-1] == f"... and {count - 20} more refused rows ({count} in all; the first 20 are shown)"
