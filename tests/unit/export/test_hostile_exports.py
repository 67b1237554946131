"""Hostile exports through `verify-export` and the watcher (issue 11, items 10-13).

Every malformed input ends as exit 2 ("cannot check", one `error:` line) or a
classified BROKEN report naming the problem in one line; never a traceback, never a
file opened outside the export, never a forged report line.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import stat
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recipe.export.commands import add_export_commands, run_verify_export
from recipe.export.hf_check import verify_export
from recipe.export.shards import INDEX_NAME
from recipe.export.watch import watch_exports

NORM = "model.language_model.norm.weight"


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_export_commands(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(list(argv))


def verify(directory: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, str, str]:
    code = run_verify_export(parse("verify-export", str(directory), *flags))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.fixture
def no_hang() -> Iterator[None]:
    """Fail (instead of hanging the suite) if something blocks on a FIFO."""

    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError("blocked for 60 s: a FIFO or device was opened")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def shard_of(directory: Path, tensor: str = NORM) -> Path:
    return directory / json.loads((directory / INDEX_NAME).read_text())["weight_map"][tensor]


def edit_header(path: Path, change: Callable[[dict[str, Any]], str | None]) -> None:
    """Rewrite a shard's JSON header (data kept); `change` edits it in place or returns raw header text."""
    content = path.read_bytes()
    (length,) = struct.unpack("<Q", content[:8])
    header = json.loads(content[8 : 8 + length])
    raw = change(header)
    text = (raw if raw is not None else json.dumps(header)).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + content[8 + length :])


# --- item 10: malformed shards, indexes and configs --------------------------------------


@pytest.mark.parametrize(
    "shape",
    ['["abc"]', "[null]", "[[1]]", "[Infinity]", "[-1]", "[1.5]", "[true]", '{"a":1}'],
)
def test_malformed_shape_is_broken_with_one_line(
    qwen35_copy: Path, shape: str, capsys: pytest.CaptureFixture[str]
) -> None:
    shard = shard_of(qwen35_copy)

    def damage(header: dict[str, Any]) -> str:
        header[NORM]["shape"] = "@SHAPE@"
        return json.dumps(header).replace('"@SHAPE@"', shape)

    edit_header(shard, damage)
    code, out, err = verify(qwen35_copy, capsys)
    assert (code, err) == (1, "")
    assert out.splitlines()[0].endswith(")") and ": BROKEN (" in out.splitlines()[0]
    (line,) = [line for line in out.splitlines() if line.startswith(f"    - {shard.name}: ")]
    assert (NORM in line and "shape" in line) or "not JSON the loader reads" in line


@pytest.mark.parametrize(
    "damage",
    ["data cut to the header plus 100 bytes", "offsets beyond the end", "overlapping offsets", "negative offsets", "unknown dtype", "float shape"],
)
def test_issue_examples_are_not_complete(qwen35_copy: Path, damage: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Each of these was reported COMPLETE (exit 0) although safetensors refuses the shard."""
    shard = shard_of(qwen35_copy)
    if damage == "data cut to the header plus 100 bytes":
        content = shard.read_bytes()
        (length,) = struct.unpack("<Q", content[:8])
        shard.write_bytes(content[: 8 + length + 100])
    else:

        def change(header: dict[str, Any]) -> None:
            entry = header[NORM]
            start, end = entry["data_offsets"]
            if damage == "offsets beyond the end":
                entry["data_offsets"] = [start, end + 10**6]
            elif damage == "overlapping offsets":
                entry["data_offsets"] = [start - 4, end - 4]
            elif damage == "negative offsets":
                entry["data_offsets"] = [-start, end]
            elif damage == "unknown dtype":
                entry["dtype"] = "F33"
            else:
                entry["shape"] = [float(d) for d in entry["shape"]]

        edit_header(shard, change)
    code, out, _ = verify(qwen35_copy, capsys)
    assert code == 1 and ": BROKEN (" in out.splitlines()[0]
    assert any(line.startswith(f"    - {shard.name}: ") for line in out.splitlines())


@pytest.mark.parametrize("where", ["shard header", "index"])
def test_json_nested_100k_levels_is_broken(qwen35_copy: Path, where: str, capsys: pytest.CaptureFixture[str]) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    if where == "index":
        (qwen35_copy / INDEX_NAME).write_text('{"weight_map":' + deep + "}")
        prefix = f"    - {INDEX_NAME}: "
    else:
        shard = shard_of(qwen35_copy)
        edit_header(shard, lambda header: '{"x":' + deep + "}")
        prefix = f"    - {shard.name}: "
    code, out, err = verify(qwen35_copy, capsys)
    assert (code, err) == (1, "")
    assert [line for line in out.splitlines() if line.startswith(prefix)]


@pytest.mark.parametrize(
    "content",
    [b"\xff\xfe{}", b'{"weight_map": {"a": ' + b"9" * 5000 + b"}}", b'{"weight_map": ["x"]}', b"[]", b"", b"{"],
    ids=["not UTF-8", "5000-digit number", "weight_map a list", "an array", "empty", "cut"],
)
def test_malformed_index_is_broken_with_one_line(
    qwen35_copy: Path, content: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    (qwen35_copy / INDEX_NAME).write_bytes(content)
    code, out, err = verify(qwen35_copy, capsys)
    assert (code, err) == (1, "")
    assert [line for line in out.splitlines() if line.startswith(f"    - {INDEX_NAME}: ")]


@pytest.mark.parametrize(
    "config",
    [
        '{"model_type": "qwen3_5_moe", "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
        "\xff\xfe",
        '{"model_type": "qwen3_5_moe", "architectures": 5}',
        '{"model_type": "qwen3_5_moe", "architectures": "Qwen3_5MoeForConditionalGeneration"}',
        '{"model_type": "qwen3_5_moe", "architectures": [5]}',
        '{"model_type": "qwen3_5_moe", "architectures": [["Qwen3_5MoeForConditionalGeneration"]]}',
        '{"model_type": "qwen3_5_moe", "architectures": ["__class__"]}',
        '{"model_type": "qwen3_5_moe", "architectures": ["pipeline"]}',
        '{"model_type": "qwen3_5_moe", "architectures": ["AutoModelForCausalLM"]}',
        '{"model_type": "qwen3_5_moe", "architectures": ["../../x"]}',
        "[]",
    ],
    ids=[
        "nested 100k",
        "not UTF-8",
        "architectures a number",
        "architectures a string",
        "architectures of numbers",
        "architectures nested",
        "dunder",
        "a function",
        "an auto class",
        "a path",
        "an array",
    ],
)
def test_malformed_config_cannot_be_checked(
    qwen35_copy: Path, config: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (qwen35_copy / "config.json").write_bytes(config.encode("utf-8", "surrogateescape") if config != "\xff\xfe" else b"\xff\xfe")
    code, out, err = verify(qwen35_copy, capsys)
    assert (code, out) == (2, "")
    one_error_line(err)


def test_trainer_named_by_architectures_is_never_constructed(
    qwen35_copy: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import transformers

    built: list[str] = []
    monkeypatch.setattr(transformers.Trainer, "__init__", lambda self, *a, **k: built.append("Trainer"))
    config = json.loads((qwen35_copy / "config.json").read_text())
    config["architectures"] = ["Trainer"]
    (qwen35_copy / "config.json").write_text(json.dumps(config))
    code, out, err = verify(qwen35_copy, capsys)
    assert built == []
    assert (code, out) == (2, "")
    assert "Trainer" in one_error_line(err) and "model class" in err
    # A model class after a non-model one is still found.
    config["architectures"] = ["Trainer", "Qwen3_5MoeForConditionalGeneration"]
    (qwen35_copy / "config.json").write_text(json.dumps(config))
    assert verify(qwen35_copy, capsys)[0] == 0 and built == []


def test_unprintable_directory_name_gives_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = tmp_path / "a\nHF export x: COMPLETE\x1b[2K"
    directory.mkdir()
    code, out, err = verify(directory, capsys)
    assert (code, out) == (2, "")
    assert "\x1b" not in one_error_line(err)


def test_config_json_fifo_or_outside_symlink_cannot_be_checked(
    qwen35_copy: Path, tmp_path: Path, no_hang: None, capsys: pytest.CaptureFixture[str]
) -> None:
    outside = tmp_path / "outside.json"
    outside.write_bytes((qwen35_copy / "config.json").read_bytes())
    (qwen35_copy / "config.json").unlink()
    (qwen35_copy / "config.json").symlink_to(outside)
    code, out, err = verify(qwen35_copy, capsys)
    assert (code, out) == (2, "") and "outside the checkpoint directory" in one_error_line(err)
    (qwen35_copy / "config.json").unlink()
    os.mkfifo(qwen35_copy / "config.json")
    code, out, err = verify(qwen35_copy, capsys)
    assert (code, out) == (2, "") and "not a regular file" in one_error_line(err)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_damaged_shards_are_never_complete(qwen35_saved: Path, data: st.DataObject) -> None:
    """Bytes of a real export damaged at random: whenever safetensors refuses a shard, the export is BROKEN."""
    import shutil
    import tempfile

    from safetensors import safe_open

    with tempfile.TemporaryDirectory() as folder:
        export = Path(folder) / "export"
        shutil.copytree(qwen35_saved, export)
        shard = data.draw(st.sampled_from(sorted(export.glob("*.safetensors"))), label="shard")
        content = bytearray(shard.read_bytes())
        (length,) = struct.unpack("<Q", content[:8])
        for _ in range(data.draw(st.integers(1, 3), label="damages")):
            where = data.draw(st.integers(0, min(len(content), 8 + length + 16)), label="where")
            action = data.draw(st.sampled_from(["set", "insert", "cut", "truncate"]), label="action")
            if action == "set" and where < len(content):
                content[where] = data.draw(st.integers(0, 255), label="byte")
            elif action == "insert":
                content[where:where] = data.draw(st.sampled_from([b"[", b"-", b"1", b"\\u", b"\xff", b" "]), label="bytes")
            elif action == "cut":
                del content[where : where + 1]
            else:
                del content[where:]
        shard.write_bytes(bytes(content))
        try:
            with safe_open(str(shard), framework="numpy"):
                refused = False
        except Exception:  # noqa: BLE001 - any refusal of the loader is a refusal
            refused = True
        report = verify_export(export)
        if refused:
            assert report.status == "broken"
            assert [e for e in report.errors if e.startswith(f"{shard.name}: ")], report.errors
        assert all("\n" not in line for line in report.errors)


# --- item 11: reads outside the export directory ------------------------------------------


@pytest.fixture
def outside_shard(tmp_path: Path) -> Path:
    """A valid safetensors file outside the export, holding a tensor nobody should see."""
    import torch
    from safetensors.torch import save_file

    path = tmp_path / "elsewhere" / "secret.safetensors"
    path.parent.mkdir()
    save_file({"secret.weight": torch.ones(2)}, path)
    return path


@pytest.mark.parametrize(
    "name",
    ["../elsewhere/secret.safetensors", "/proc/self/environ", "/etc/passwd", "..", ".", "", "sub/x.safetensors", "a\\b"],
)
def test_index_names_outside_the_directory_are_not_opened(
    qwen35_copy: Path, outside_shard: Path, name: str, capsys: pytest.CaptureFixture[str], rewrite_index
) -> None:
    if name.startswith("../"):
        name = os.path.relpath(outside_shard, qwen35_copy)
    (qwen35_copy / "sub").mkdir()
    rewrite_index(qwen35_copy, lambda weight_map: weight_map.update({NORM: name, "secret.weight": name}))
    report = verify_export(qwen35_copy)
    assert report.status == "broken"
    assert "secret.weight" not in report.unindexed + report.unexpected
    assert {NORM, "secret.weight"} <= set(report.ghosts)
    (error,) = [e for e in report.errors if "weight_map names" in e]
    assert f"weight_map names {name!r} for 2 tensor(s): not a plain file name" in error
    assert not any("header" in e for e in report.errors)  # nothing was read from it


def test_symlinked_shard_outside_is_not_opened(qwen35_copy: Path, outside_shard: Path) -> None:
    shard = shard_of(qwen35_copy)
    link = qwen35_copy / "model-extra.safetensors"
    link.symlink_to(outside_shard)
    shard.unlink()
    shard.symlink_to(outside_shard)
    report = verify_export(qwen35_copy)
    assert report.status == "broken"
    assert "secret.weight" not in report.unindexed + report.unexpected
    for name in (shard.name, link.name):
        assert any(e.startswith(f"{name}: a symlink to ") and "outside the checkpoint directory" in e for e in report.errors)


def test_symlink_inside_the_directory_is_followed(qwen35_copy: Path) -> None:
    shard = shard_of(qwen35_copy)
    (qwen35_copy / "store").mkdir()
    shard.rename(qwen35_copy / "store" / "real")
    shard.symlink_to(Path("store") / "real")
    assert verify_export(qwen35_copy).status == "complete"


def test_hugging_face_cache_snapshot_is_read(qwen35_saved: Path, tmp_path: Path) -> None:
    """A snapshot of the HF cache is all symlinks into ../../blobs: that is allowed (e.g. --reference $MODEL_PATH)."""
    repo = tmp_path / "hub" / "models--Qwen--Tiny"
    snapshot = repo / "snapshots" / "0123abcd"
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for number, source in enumerate(sorted(qwen35_saved.iterdir())):
        blob = repo / "blobs" / f"{number:040x}"
        blob.write_bytes(source.read_bytes())
        (snapshot / source.name).symlink_to(Path("..") / ".." / "blobs" / blob.name)
    report = verify_export(snapshot, reference=snapshot)
    assert report.status == "complete", report.summary()
    # A blob of another repository is outside.
    other = tmp_path / "hub" / "models--Other--Repo" / "blobs"
    other.mkdir(parents=True)
    shard = shard_of(snapshot)
    target = other / "x"
    target.write_bytes(shard.resolve().read_bytes())
    shard.unlink()
    shard.symlink_to(target)
    assert verify_export(snapshot).status == "broken"


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every path os.open is called with while the test runs."""
    paths: list[str] = []
    real_open = os.open

    def spy(path: Any, *args: Any, **kwargs: Any) -> int:
        paths.append(str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", spy)
    return paths


@pytest.mark.parametrize("what", ["shard", "index", "shard named by the index"])
def test_fifo_is_never_opened(qwen35_copy: Path, what: str, no_hang: None, opened: list[str]) -> None:
    if what == "shard":
        target = shard_of(qwen35_copy)
        target.unlink()
    elif what == "index":
        target = qwen35_copy / INDEX_NAME
        target.unlink()
    else:
        target = qwen35_copy / "fifo.bin"
        edit = json.loads((qwen35_copy / INDEX_NAME).read_text())
        edit["weight_map"][NORM] = target.name
        (qwen35_copy / INDEX_NAME).write_text(json.dumps(edit))
    os.mkfifo(target)
    report = verify_export(qwen35_copy)
    assert report.status == "broken"
    assert f"{target.name}: not a regular file (not read)" in report.errors
    assert str(target) not in opened


def test_device_symlink_is_never_opened(qwen35_copy: Path, no_hang: None, opened: list[str]) -> None:
    (qwen35_copy / "zero.safetensors").symlink_to("/dev/zero")
    report = verify_export(qwen35_copy)
    assert report.status == "broken"
    assert any(e.startswith("zero.safetensors: a symlink to '/dev/zero'") for e in report.errors)
    assert not [path for path in opened if "zero" in path]
    assert opened  # the spy saw the real shards being read


def test_device_inside_the_directory_is_never_opened(qwen35_copy: Path, opened: list[str]) -> None:
    device = qwen35_copy / "null.safetensors"
    try:
        os.mknod(device, 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # what /dev/null is
    except (PermissionError, OSError) as error:
        pytest.skip(f"cannot create a device node here (needs CAP_MKNOD): {error}")
    report = verify_export(qwen35_copy)
    assert "null.safetensors: not a regular file (not read)" in report.errors
    assert str(device) not in opened


# --- item 12: the watcher ----------------------------------------------------------------


def verl_tree(root: Path, source: Path, steps: list[int]) -> dict[int, Path]:
    import shutil

    dirs = {}
    for step in steps:
        actor = root / f"global_step_{step}" / "actor"
        shutil.copytree(source, actor / "model" / "huggingface")
        (actor / "ckpt_contents.json").write_text("{}")
        dirs[step] = actor / "model" / "huggingface"
    return dirs


def run_watch_once(root: Path, **kwargs: Any) -> dict[int, Any]:
    """One watcher pass over what is there now (the stop event is already set)."""
    stop = threading.Event()
    stop.set()
    return watch_exports(root, stop, interval_s=0.01, **kwargs)


def test_watcher_checks_exports_after_an_unparseable_one(
    qwen35_saved: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dirs = verl_tree(tmp_path / "run", qwen35_saved, [2, 4, 6])
    (dirs[2] / INDEX_NAME).write_text('{"weight_map":' + "[" * 100_000 + "]" * 100_000 + "}")
    edit_header(shard_of(dirs[4]), lambda header: '{"a":{"dtype":"U8","shape":["abc"],"data_offsets":[0,1]}}')
    with caplog.at_level(logging.INFO, logger="recipe.export.watch"):
        results = run_watch_once(tmp_path / "run")
    assert {step: (report.status if report else None) for step, report in results.items()} == {
        2: "broken",
        4: "broken",
        6: "complete",
    }
    assert all((dirs[step].parent / "hf_export_report.json").is_file() for step in (2, 4, 6))
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert [m.splitlines()[0] for m in errors] == ["BROKEN HF export at step 2", "BROKEN HF export at step 4"]


def test_watcher_survives_a_check_that_raises(
    qwen35_saved: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Whatever goes wrong with one export (a bug included) is reported for that export only."""
    from recipe.export import watch

    dirs = verl_tree(tmp_path / "run", qwen35_saved, [2, 4])
    real = watch.verify_export

    def flaky(directory: Path, *args: Any, **kwargs: Any) -> Any:
        if directory == dirs[2]:
            raise RuntimeError("unexpected\nfailure")
        return real(directory, *args, **kwargs)

    monkeypatch.setattr(watch, "verify_export", flaky)
    seen: list[tuple[int, str | None]] = []
    with caplog.at_level(logging.INFO, logger="recipe.export.watch"):
        results = run_watch_once(
            tmp_path / "run", on_report=lambda export, report: seen.append((export.step, report and report.status))
        )
    assert seen == [(2, None), (4, "complete")]  # each export once, in order, the failing one included
    assert sorted(results) == [2, 4] and results[2] is None
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "step 2" in errors[0].getMessage()
    assert errors[0].getMessage().splitlines()[0] == errors[0].getMessage()


# --- item 13: report text -----------------------------------------------------------------


FORGED = "x\x1b[2K\rHF export /x: COMPLETE (1 tensors present, 1 expected by X)\n  every expected tensor is present\u2028"


def test_tensor_names_cannot_forge_report_lines(
    qwen35_copy: Path, rewrite_checkpoint, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    rewrite_checkpoint(qwen35_copy, lambda tensors: tensors.update({FORGED: torch.ones(1)}))
    code, out, _ = verify(qwen35_copy, capsys)
    assert code == 1
    assert all(char.isprintable() for line in out.splitlines() for char in line)
    lines = out.splitlines()
    assert lines[0].startswith(f"HF export {qwen35_copy}: BROKEN (")
    escaped = (
        "    - x\\x1b[2K\\rHF export /x: COMPLETE (1 tensors present, 1 expected by X)"
        "\\n  every expected tensor is present\\u2028"
    )
    assert [line for line in lines if "COMPLETE" in line] == [escaped]
    # The JSON report keeps the exact name.
    assert run_verify_export(parse("verify-export", str(qwen35_copy), "--json")) == 1
    assert json.loads(capsys.readouterr().out)["unexpected"] == [FORGED]


def test_index_names_cannot_forge_report_lines(qwen35_copy: Path, rewrite_index, capsys) -> None:
    rewrite_index(qwen35_copy, lambda weight_map: weight_map.update({"ghost\n  NOT": "evil\x1b]0;x\x07.safetensors"}))
    code, out, _ = verify(qwen35_copy, capsys)
    assert code == 1
    assert "\x1b" not in out and "\x07" not in out
    assert not any(line.startswith("  NOT") for line in out.splitlines()[:-1])
