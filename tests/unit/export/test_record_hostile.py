"""Run records, the hash cache and the drift guard against hostile files and values (issue 22).

Each class of the adversarial pass is tried as a family: every stat field of the cache key,
every kind of special file where a record or a cache should be, any JSON value anywhere in a
record, sparse files past every hashing bound. The consumers are the real ones: `plan`'s
build_plan, `run` and `replay` through the CLI, `prepare-data` on a real source tree.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recipe.digests import (
    MAX_DATA_BYTES,
    MAX_MODEL_FILE_BYTES,
    RACY_NS,
    cache_dir,
    cached_digest,
    hash_cache_path,
    identity,
    sha256_file,
)
from recipe.errors import RecipeConfigError
from recipe.provenance import drift, drift_problems
from recipe.record_file import RECORD_NAME, REWARD_FUNCTION_KEY, UnreadableRecord, copy_into_new_steps, read_record, record_bytes, write_record
from recipe.replay import replay_lines, run_replay
from recipe.replay_files import FORMATS
from tests.unit.envtools import HANG_GUARD_S
from tests.unit.export.conftest import plan_of, saved_run
from tests.unit.runtools import DRIVER, cli, layout_of_one, run_environment

STAT_FIELDS = ("st_size", "st_mtime_ns", "st_ctime_ns", "st_ino", "st_dev")
OTHER_UID = 4242


def _finishes(call: Callable[[], Any], seconds: float = 60) -> Any:
    """call()'s result; fails (instead of hanging the suite) when it blocks, as on a FIFO."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = call()
        except BaseException as error:  # noqa: BLE001 - re-raised in the test's thread
            box["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s"
    if "error" in box:
        raise box["error"]
    return box["value"]


def _sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as handle:
        handle.truncate(size)
    return path


def _aged(path: Path) -> Path:
    """Wait until `path` is no longer "racy" (changed within RACY_NS), so that its digest may be cached."""
    time.sleep(max(0.0, (RACY_NS - (time.time_ns() - path.stat().st_ctime_ns)) / 1e9) + 0.05)
    return path


# --- class 5: the cache is trusted only as far as its evidence goes ---------------------------


@given(field=st.sampled_from(STAT_FIELDS), delta=st.integers(min_value=1, max_value=2**40))
def test_every_stat_field_is_part_of_the_cache_key(field: str, delta: int) -> None:
    """A file whose size, mtime, ctime, inode or device moved is not the file that was hashed."""
    base = {name: 10**12 for name in STAT_FIELDS}
    moved = base | {field: base[field] + delta}
    path = Path("/data/train.parquet")
    assert identity(path, SimpleNamespace(**base)) != identity(path, SimpleNamespace(**moved))  # type: ignore[arg-type]


def test_a_file_rewritten_in_place_with_its_mtime_restored_is_hashed_again(tmp_path: Path) -> None:
    environ = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    data = tmp_path / "train.parquet"
    data.write_bytes(b"the data that was recorded")
    _aged(data)
    before = os.stat(data)
    assert cached_digest(data, environ)[0] == sha256_file(data)
    assert hash_cache_path(environ).is_file()
    with open(data, "r+b") as handle:  # same inode, same size
        handle.write(b"THE")
    os.utime(data, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(data).st_mtime_ns == before.st_mtime_ns and os.stat(data).st_size == before.st_size
    assert cached_digest(data, environ)[0] == sha256_file(data) != "0" * 64


def test_a_file_changed_within_the_racy_window_is_never_cached(tmp_path: Path) -> None:
    environ = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    data = tmp_path / "train.parquet"
    data.write_bytes(b"fresh")
    cached_digest(data, environ)
    assert not hash_cache_path(environ).exists()


def _forged_cache(environ: dict[str, str], data: Path) -> Path:
    """Fill the cache honestly, then make its entry for `data` lie."""
    _aged(data)
    cached_digest(data, environ)
    cache = hash_cache_path(environ)
    entries = json.loads(cache.read_text())
    for entry in entries.values():
        entry["sha256"] = "0" * 64
    cache.write_text(json.dumps(entries))
    assert cached_digest(data, environ)[0] == "0" * 64  # the premise: a private cache is believed
    return cache


def _world_writable(cache: Path) -> None:
    cache.parent.chmod(0o777)


def _group_readable(cache: Path) -> None:
    cache.parent.chmod(0o750)


def _folder_of_another_user(cache: Path) -> None:
    os.chown(cache.parent, OTHER_UID, -1)


def _file_of_another_user(cache: Path) -> None:
    os.chown(cache, OTHER_UID, -1)


def _folder_is_a_link(cache: Path) -> None:
    real = cache.parent.with_name("elsewhere")
    cache.parent.rename(real)
    cache.parent.symlink_to(real)


def _file_is_a_link(cache: Path) -> None:
    real = cache.with_name("forged.json")
    cache.rename(real)
    cache.symlink_to(real)


@pytest.mark.parametrize(
    "make_hostile",
    [_world_writable, _group_readable, _folder_of_another_user, _file_of_another_user, _folder_is_a_link, _file_is_a_link],
)
def test_a_cache_others_could_have_written_is_ignored(tmp_path: Path, make_hostile: Callable[[Path], None]) -> None:
    if os.geteuid() != 0 and make_hostile in (_folder_of_another_user, _file_of_another_user):
        pytest.skip("chown to another user needs root")  # CI and this machine run as root
    environ = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    data = tmp_path / "train.parquet"
    data.write_bytes(b"rows")
    make_hostile(_forged_cache(environ, data))
    assert cached_digest(data, environ)[0] == sha256_file(data)


def test_the_cache_folder_is_made_private(tmp_path: Path) -> None:
    environ = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    data = _aged(_write(tmp_path / "train.parquet", b"rows"))
    old = os.umask(0)
    try:
        cached_digest(data, environ)
    finally:
        os.umask(old)
    info = os.lstat(cache_dir(environ))
    assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.geteuid()


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    "plant",
    [
        pytest.param(lambda cache: os.mkfifo(cache), id="fifo"),
        pytest.param(lambda cache: cache.symlink_to("/dev/zero"), id="link-to-dev-zero"),
        pytest.param(lambda cache: cache.write_text("[" * 100_000 + "]" * 100_000), id="deep-json"),
        pytest.param(lambda cache: _sparse(cache, 1 << 40), id="sparse-1-TiB"),
        pytest.param(lambda cache: cache.mkdir(), id="directory"),
        pytest.param(lambda cache: cache.write_bytes(b"\xff\xfe{"), id="not-utf8"),
    ],
)
def test_a_special_cache_file_is_an_empty_cache_at_once(tmp_path: Path, plant: Callable[[Path], None]) -> None:
    environ = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    data = _aged(_write(tmp_path / "train.parquet", b"rows"))
    cache = hash_cache_path(environ)
    cache.parent.mkdir(parents=True, mode=0o700)
    plant(cache)
    assert _finishes(lambda: cached_digest(data, environ))[0] == sha256_file(data)


@pytest.mark.parametrize(
    "extra",
    [
        ("actor_rollout_ref.actor.optim.lr=${oc.env:MY_LR}",),
        # The variable's name assembled by other interpolations: no text search sees `oc.env:MY_LR`.
        ("+trainer.lr_name=env", "+trainer.lr_var=MY_LR",
         """actor_rollout_ref.actor.optim.lr='${oc.decode:"${oc.${trainer.lr_name}:${trainer.lr_var}}"}'"""),
    ],
    ids=["literal", "assembled"],
)  # fmt: skip
def test_overrides_that_read_the_environment_are_recorded_resolved(
    inputs: dict[str, str], monkeypatch: pytest.MonkeyPatch, extra: tuple[str, ...]
) -> None:
    """`lr=${oc.env:MY_LR}` trains differently when MY_LR changes: that is drift, named by the variable."""
    monkeypatch.setenv("MY_LR", "1e-6")
    root = saved_run(inputs, extra, environ={"MY_LR": "1e-6"})
    stored = json.loads((root / RECORD_NAME).read_text())["provenance"]
    assert stored["environment_reads"] == {"MY_LR": "1e-6"}
    monkeypatch.setenv("MY_LR", "2e-6")
    with pytest.raises(RecipeConfigError) as caught:
        plan_of(inputs, extra, environ={"MY_LR": "2e-6"})
    [line] = caught.value.problems
    assert line.startswith("MY_LR: 1e-6 when the checkpoint's run started") and "2e-6 now" in line
    assert plan_of(inputs | {"ALLOW_DRIFT": "MY_LR"}, extra, environ={"MY_LR": "2e-6"}).drift_accepted


#: Every way an override can make verl import code from a file: (overrides, the key that names it).
CODE_FILE_OVERRIDES = {
    "reward function": (("{key}={path}", "reward.custom_reward_function.name=score"), REWARD_FUNCTION_KEY),
    "reward function as a dict": (("reward.custom_reward_function={{path: {path}, name: score}}",), REWARD_FUNCTION_KEY),
    "reward function through oc.env": (("{key}=${{oc.env:REWARD_PY}}", "reward.custom_reward_function.name=score"),
                                       REWARD_FUNCTION_KEY),
    "reward manager module": (("reward.reward_manager.source=importlib", "reward.reward_manager.module.path={path}",
                               "reward.reward_manager.name=Manager"), "reward.reward_manager.module.path"),
    "dataset class": (("data.custom_cls.path={path}", "data.custom_cls.name=Dataset"), "data.custom_cls.path"),
}  # fmt: skip


@pytest.mark.parametrize("way", sorted(CODE_FILE_OVERRIDES))
def test_a_changed_code_file_is_drift_however_the_config_names_it(
    inputs: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, way: str
) -> None:
    """The record hashes what verl's resolved config names, not what the override's text looks like."""
    code = tmp_path / "code.py"
    code.write_text("def score(**kwargs):\n    return 1.0\n")
    monkeypatch.setenv("REWARD_PY", str(code))
    texts, key = CODE_FILE_OVERRIDES[way]
    extra = tuple(text.format(key=REWARD_FUNCTION_KEY, path=code) for text in texts)
    root = saved_run(inputs, extra, environ={"REWARD_PY": str(code)})
    stored = json.loads((root / RECORD_NAME).read_text())["provenance"]
    assert stored["referenced_files"][key] == {"path": str(code), "sha256": sha256_file(code)}
    code.write_text("def score(**kwargs):\n    return 0.0\n")
    with pytest.raises(RecipeConfigError) as caught:
        plan_of(inputs, extra, environ={"REWARD_PY": str(code)})
    assert [line.split(":")[0] for line in caught.value.problems] == [key]


def test_a_record_of_the_earlier_schema_keeps_its_reward_function(tmp_path: Path) -> None:
    path = tmp_path / RECORD_NAME
    earlier = {"path": "/r.py", "sha256": "a" * 64}
    path.write_text(json.dumps({"provenance": {"schema_version": 1, "reward_function": earlier}}))
    stored = read_record(path)
    assert stored is not None and stored["referenced_files"] == {REWARD_FUNCTION_KEY: earlier} and "reward_function" not in stored


# --- class 6: a stored record that cannot be read is exit 2, never a skipped guard -----------


def _loop(path: Path) -> None:
    path.symlink_to(path.name)


HOSTILE_RECORD_PATHS: dict[str, Callable[[Path], None]] = {
    "symlink loop": _loop,
    "dangling symlink": lambda path: path.symlink_to(path.with_name("gone.json")),
    "fifo": lambda path: os.mkfifo(path),
    "link to /dev/zero": lambda path: path.symlink_to("/dev/zero"),
    "directory": lambda path: path.mkdir(),
    "sparse 1 TiB": lambda path: _sparse(path, 1 << 40),
    "deep JSON": lambda path: path.write_text('{"provenance": ' + "[" * 100_000 + "]" * 100_000 + "}"),
    "schema_version 1.0": lambda path: path.write_text('{"provenance": {"schema_version": 1.0}}'),
    "schema_version true": lambda path: path.write_text('{"provenance": {"schema_version": true}}'),
}


@pytest.mark.parametrize("kind", sorted(HOSTILE_RECORD_PATHS))
def test_an_unreadable_stored_record_refuses_the_resume_whatever_allow_drift_says(
    inputs: dict[str, str], kind: str
) -> None:
    root = saved_run(inputs)
    (root / RECORD_NAME).unlink()
    HOSTILE_RECORD_PATHS[kind](root / RECORD_NAME)
    everything = "TRAIN_FILES,VAL_FILES,MODEL_PATH,RECIPE,FRAMEWORKS,IMAGE,TP,PP,EP"
    with pytest.raises(RecipeConfigError) as caught:
        _finishes(lambda: plan_of(inputs | {"ALLOW_DRIFT": everything}))
    [line] = caught.value.problems
    # A folder or a FIFO at the record's name is refused first as a path of the run's (recipe.own_paths).
    prefix = "a file of the run, " if kind in ("directory", "fifo") else ""
    assert line.startswith(f"CHECKPOINT_DIR={inputs['CHECKPOINT_DIR']!r}: {prefix}{root / RECORD_NAME}")
    assert "\n" not in line


@pytest.mark.parametrize("kind", sorted(HOSTILE_RECORD_PATHS))
def test_replay_of_an_unreadable_record_is_one_line_and_exit_2(tmp_path: Path, kind: str) -> None:
    path = tmp_path / RECORD_NAME
    HOSTILE_RECORD_PATHS[kind](path)
    code, out, err = _finishes(lambda: _replay(path))
    assert (code, out) == (2, "") and err.startswith("error: RECORD=") and err.count("\n") == 1


def _replay(path: Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run_replay(argparse.Namespace(record=path, format="shell"))
    return code, out.getvalue(), err.getvalue()


# --- class 8: any JSON anywhere in a record: read, compared and replayed, or refused ---------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(value, dict):
        for key, inner in value.items():
            found += _paths(inner, (*prefix, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            found += _paths(inner, (*prefix, index))
    return found


@pytest.fixture(scope="module")
def real_record(tmp_path_factory: pytest.TempPathFactory, qwen35_saved: Path) -> dict[str, Any]:
    """The provenance of a real plan, as `run` writes it."""
    from recipe.smoke.arithmetic import write_dataset

    data = tmp_path_factory.mktemp("data")
    write_dataset(data, seed=0, train_rows=4, test_rows=2)
    values = {**layout_of_one(), "MODEL_PATH": str(qwen35_saved), "TRAIN_FILES": str(data / "train.parquet"),
              "VAL_FILES": str(data / "test.parquet"), "CHECKPOINT_DIR": str(data / "ck")}  # fmt: skip
    return plan_of(values).provenance


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_json_anywhere_in_a_record_is_used_or_refused_never_a_traceback(real_record: dict[str, Any], data: Any) -> None:
    record = json.loads(json.dumps(real_record))
    where = data.draw(st.sampled_from(_paths(record)[1:]))
    value = data.draw(JSON)
    target = record
    for part in where[:-1]:
        target = target[part]
    target[where[-1]] = value
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / RECORD_NAME
        path.write_text(json.dumps({"provenance": record}))
        try:
            stored = read_record(path)
        except UnreadableRecord as error:
            assert str(error).startswith(str(path)) and "\n" not in str(error)
            return
        assert stored is not None
        for line in [*drift(stored, real_record).values()]:
            assert "\n" not in "".join(line)
        for form in FORMATS:
            try:
                replay_lines(stored, path, form)
            except ValueError as error:  # UnwritableRecord: names the setting
                assert "\n" not in str(error)


@given(text=st.sampled_from(["", " ", "\n"]))
def test_an_empty_value_is_shown_as_empty_not_as_nothing(text: str) -> None:
    [(then, now)] = drift({"recipe_version": text}, {"recipe_version": "0.4.0"}).values()
    assert then and then.strip() and "\n" not in then and now == "0.4.0"


# --- class 7 and 8: writes never follow links, and a failed write is one line ----------------


def test_a_link_planted_where_a_steps_record_goes_is_replaced_not_followed(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    outside.mkdir()
    (root / "global_step_2").mkdir(parents=True)
    (root / "global_step_2" / RECORD_NAME).symlink_to(outside / "written-through.json")
    (root / "global_step_3").symlink_to(outside)  # a step that is a link is not written into
    data = record_bytes({"schema_version": 1})
    assert copy_into_new_steps(root, set(), data) == [root / "global_step_2" / RECORD_NAME]
    assert list(outside.iterdir()) == []
    assert not (root / "global_step_2" / RECORD_NAME).is_symlink()
    assert (root / "global_step_2" / RECORD_NAME).read_bytes() == data
    (root / RECORD_NAME).symlink_to(outside / "root-record.json")
    write_record(root, data)
    assert list(outside.iterdir()) == [] and (root / RECORD_NAME).read_bytes() == data


def test_run_with_a_checkpoint_root_that_is_a_file_is_one_line(tmp_path: Path, qwen35_saved: Path) -> None:
    env = run_environment(tmp_path, qwen35_saved, **layout_of_one())
    Path(env["CHECKPOINT_DIR"]).write_text("not a directory")
    for command in (["plan"], ["run"]):
        done = cli(command, env)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert f"CHECKPOINT_DIR={env['CHECKPOINT_DIR']!r}: " in done.stderr and ", not a directory" in done.stderr
    assert not (tmp_path / "record.json").exists()  # the trainer never started


def test_run_on_a_full_disk_is_one_line_and_starts_nothing(tmp_path: Path, qwen35_saved: Path) -> None:
    """RLIMIT_FSIZE makes every file write past a few bytes fail (EFBIG), as ENOSPC would."""
    env = run_environment(tmp_path, qwen35_saved, **layout_of_one()) | {"XDG_CACHE_HOME": str(tmp_path / "cache")}

    def full_disk() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))

    done = subprocess.run([sys.executable, "-c", DRIVER, "run"], env=env, capture_output=True, text=True,
                          timeout=HANG_GUARD_S, preexec_fn=full_disk)  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "cannot write the run record" in done.stderr and "nothing was started" in done.stderr
    assert not (tmp_path / "record.json").exists()


# --- class 9: hashing is bounded --------------------------------------------------------------


def test_a_sparse_train_file_past_the_bound_is_refused_by_name_without_reading_it(inputs: dict[str, str]) -> None:
    train = _sparse(Path(inputs["TRAIN_FILES"]), 2 << 40)
    with pytest.raises(RecipeConfigError) as caught:
        _finishes(lambda: plan_of(inputs))
    [line] = caught.value.problems
    assert line.startswith(f"TRAIN_FILES={str(train)!r}: ") and f"{MAX_DATA_BYTES >> 30}.0 GiB" in line


def test_a_sparse_model_file_past_the_bound_is_refused_by_name(inputs: dict[str, str], tmp_path: Path) -> None:
    import shutil

    model = tmp_path / "model"
    shutil.copytree(inputs["MODEL_PATH"], model)
    _sparse(model / "tokenizer.json", MAX_MODEL_FILE_BYTES + 1)
    with pytest.raises(RecipeConfigError) as caught:
        _finishes(lambda: plan_of(inputs | {"MODEL_PATH": str(model)}))
    assert [line.split("=")[0] for line in caught.value.problems] == ["MODEL_PATH"]


def test_replay_of_a_record_naming_a_sparse_file_says_it_was_not_compared(inputs: dict[str, str]) -> None:
    root = saved_run(inputs)
    _sparse(Path(inputs["TRAIN_FILES"]), 2 << 40)
    code, out, err = _finishes(lambda: _replay(root / RECORD_NAME))
    assert code == 0 and out
    assert "replay: TRAIN_FILES not compared: " in err and "above the 64.0 GiB" in err


# --- class 10: smaller ---------------------------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="a root-only file is only readable to root")
def test_replay_never_reads_a_file_the_records_owner_could_not(inputs: dict[str, str], tmp_path: Path) -> None:
    """Read by root, a planted record could otherwise learn whether any root-only file changed."""
    # In a folder everyone can search (pytest's own are root's 0700): only the file's mode hides it.
    shared = Path(tempfile.mkdtemp(prefix="replay-owner-"))
    shared.chmod(0o755)
    secret = shared / "root-only"
    secret.write_text("root's")
    secret.chmod(0o600)
    root = saved_run(inputs | {"TRAIN_FILES": str(secret)})
    os.chown(root / RECORD_NAME, OTHER_UID, -1)
    environ_cache = tmp_path / "replay-cache"
    os.environ["XDG_CACHE_HOME"] = str(environ_cache)
    try:
        code, _, err = _replay(root / RECORD_NAME)
    finally:
        del os.environ["XDG_CACHE_HOME"]
        shutil.rmtree(shared)
    assert code == 0
    assert f"replay: TRAIN_FILES not compared: {secret} is neither the record owner's (uid {OTHER_UID})" in err
    assert not environ_cache.exists()  # replay never fills the cache


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), bad=st.sampled_from(["\x00", "\ud800", "\udfff"]), as_key=st.booleans())
def test_a_nul_or_a_lone_surrogate_anywhere_refuses_the_record(real_record: dict[str, Any], data: Any, bad: str, as_key: bool) -> None:
    # No value of ours holds one, and either breaks the next reader (open() of a path, an encoder): refused as a whole.
    record = json.loads(json.dumps(real_record))
    where = data.draw(st.sampled_from([p for p in _paths(record)[1:] if isinstance(p[-1], str)]))
    target = record
    for part in where[:-1]:
        target = target[part]
    if as_key:
        target[f"k{bad}"] = target.pop(where[-1])
    else:
        target[where[-1]] = f"/p{bad}q"
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / RECORD_NAME
        path.write_text(json.dumps({"provenance": record}))  # json.dumps escapes both as \u0000 / \ud800
        with pytest.raises(UnreadableRecord, match="a NUL or a lone surrogate"):
            read_record(path)
        code, out, err = _replay(path)
        assert code == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_json_that_is_not_json_is_refused(tmp_path: Path, constant: str) -> None:
    path = tmp_path / RECORD_NAME
    path.write_text('{"provenance": {"schema_version": 1, "layout": {"tp": %s}}}' % constant)
    with pytest.raises(UnreadableRecord, match=f"{constant} is not JSON"):
        read_record(path)


@pytest.mark.parametrize("name", ["b" * 300, "a\x00b"])
def test_a_record_argument_no_file_system_takes_is_one_line(tmp_path: Path, name: str) -> None:
    code, out, err = _replay(tmp_path / name / "x")
    assert code == 2 and out == "" and err.startswith("error: RECORD=") and err.count("\n") == 1


def test_replay_never_reads_a_file_whose_folder_its_owner_cannot_search(inputs: dict[str, str], tmp_path: Path) -> None:
    """The file's own mode is not enough: a 0700 folder of another user hides a world-readable file from the owner."""
    hidden = tmp_path / "private"
    hidden.mkdir(mode=0o700)
    data = hidden / "train.parquet"
    shutil.copy(inputs["TRAIN_FILES"], data)
    data.chmod(0o644)
    root = saved_run(inputs | {"TRAIN_FILES": str(data)})
    os.chown(root / RECORD_NAME, OTHER_UID, -1)
    code, _, err = _replay(root / RECORD_NAME)
    assert code == 0
    assert f"replay: TRAIN_FILES not compared: {data}: the record owner (uid {OTHER_UID}) cannot reach it through {hidden}" in err


@pytest.mark.parametrize("left", ["only the step's record", "both records"])
def test_the_record_of_the_step_verl_resumes_is_compared_too(inputs: dict[str, str], left: str) -> None:
    """The run's record deleted (or kept), the resumed step's record drifted: the guard compares what is there."""
    root = saved_run(inputs)
    step_record = json.loads((root / RECORD_NAME).read_text())
    step_record["provenance"]["layout"]["tp"] = 8
    (root / "global_step_1" / RECORD_NAME).write_text(json.dumps(step_record))
    if left == "only the step's record":
        (root / RECORD_NAME).unlink()
    with pytest.raises(RecipeConfigError) as caught:
        plan_of(inputs)
    [line] = caught.value.problems  # one line per field, however many records say it
    assert line.startswith("TP: 8 when the checkpoint's run started") and "global_step_1" in line


def _fifo(path: Path) -> None:
    os.mkfifo(path)


SPECIAL_MODEL_FILES: dict[str, Callable[[Path], None]] = {
    "a FIFO": _fifo,
    "a link to /dev/zero": lambda path: path.symlink_to("/dev/zero"),
    "a link to nothing": lambda path: path.symlink_to(path.with_name("gone")),
    "a folder": lambda path: path.mkdir(),
}


@pytest.mark.parametrize("kind", sorted(SPECIAL_MODEL_FILES))
@pytest.mark.parametrize("name", ["generation_config.json", "preprocessor_config.json", "model.safetensors.index.json"])
def test_a_model_file_that_is_no_regular_file_is_refused_not_left_out(
    inputs: dict[str, str], tmp_path: Path, name: str, kind: str
) -> None:
    """The trainer reads it: a record that silently left it out would compare nothing about it."""
    model = tmp_path / "model"
    shutil.copytree(inputs["MODEL_PATH"], model)
    (model / name).unlink(missing_ok=True)
    SPECIAL_MODEL_FILES[kind](model / name)
    with pytest.raises(RecipeConfigError) as caught:
        _finishes(lambda: plan_of(inputs | {"MODEL_PATH": str(model)}))
    [line] = caught.value.problems
    assert line.startswith(f"MODEL_PATH={str(model)!r}: {model / name}: ")


@pytest.mark.parametrize("part", ["environment_reads", "layout", "training", "model"])
@pytest.mark.parametrize("name", ["", " ", "\t"])
def test_a_blank_name_in_a_record_is_shown_quoted_not_as_nothing(part: str, name: str) -> None:
    stored = {"model": {"files": {name: "a" * 64}}} if part == "model" else {part: {name: "1"}}
    lines = drift_problems(stored, {}, [], Path("/ck/run-record.json"))[0]
    [line] = lines
    expected = f"MODEL_PATH: {json.dumps(name)} " if part == "model" else f"{json.dumps(name)}: "
    assert line.startswith(expected), line


def test_a_checkpoint_folder_moved_with_its_runs_is_no_drift(inputs: dict[str, str], tmp_path: Path) -> None:
    """The workers' log paths follow CHECKPOINT_DIR: moving the folder (and pointing CHECKPOINT_DIR at it) resumes."""
    saved_run(inputs)
    moved = tmp_path / "moved"
    shutil.move(inputs["CHECKPOINT_DIR"], moved)
    assert plan_of(inputs | {"CHECKPOINT_DIR": str(moved)}).drift_accepted == []
