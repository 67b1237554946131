"""The run record by direct calls (recipe.provenance.build_record and its parts): what it holds, what it hashes,
what it refuses with which line, and that no secret reaches its settings.

docs/reproducibility.md: the record holds the recipe and framework versions, inside an image its labels and
the sha256 of its locks, the sha256 of the model's config, tokenizer and processor files and safetensors index
(not the weights), path, size, rows and sha256 of TRAIN_FILES and VAL_FILES, the layout, every Hydra override
that shapes training, the oc.env reads, the files config keys name, and the settings with no secret; a larger
input than its bound, or one that is not a regular file, is refused with one line naming its variable.
test_provenance.py reaches this through `plan` and `run` (slow: verl's config is composed); this file pins it
in milliseconds: sparse files stand for large ones, digests come from hashlib.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import re
from pathlib import Path
from typing import Any

import pytest

from recipe import __version__, provenance
from recipe.digests import MAX_DATA_BYTES, MAX_MODEL_FILE_BYTES, FileRefused
from recipe.errors import RecipeConfigError
from recipe.provenance import (
    FRAMEWORKS,
    MODEL_FILES,
    build_record,
    data_file,
    image_facts,
    installed_versions,
    model_files,
    referenced_file,
    split_override,
    training_overrides,
)
from recipe.settings import REDACTED
from tests.unit.envtools import settings_of


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as handle:
        handle.truncate(size)  # nothing on disk and nothing read: the size alone refuses it
    return path


def _environ(tmp_path: Path) -> dict[str, str]:
    """A private hash cache and no image: the record of a plain machine."""
    return {"XDG_CACHE_HOME": str(tmp_path / "cache"), "RECIPE_IMAGE_INFO_DIR": str(tmp_path / "no-image")}


# --- data files: path, size, rows and sha256, or nothing when there is no file -----------------


def test_a_data_file_is_its_path_size_rows_and_sha256(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = tmp_path / "train.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b", "c"]}), parquet)
    assert data_file(parquet, _environ(tmp_path)) == {
        "path": str(parquet), "size": parquet.stat().st_size, "rows": 3, "sha256": _sha(parquet.read_bytes()),
    }  # fmt: skip
    # Not parquet: still hashed, its rows unknown.
    text = tmp_path / "train.jsonl"
    text.write_bytes(b'{"prompt": "a"}\n')
    assert data_file(text, _environ(tmp_path)) == {"path": str(text), "size": 16, "rows": None, "sha256": _sha(text.read_bytes())}


@pytest.mark.parametrize("kind", ["missing", "directory", "fifo", "dangling link"])
def test_a_data_path_that_is_no_regular_file_is_recorded_as_nothing(tmp_path: Path, kind: str) -> None:
    # plan refuses these itself (_data_file_problems) or run's preflight does: the record only says "none".
    path = tmp_path / "train.parquet"
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "dangling link":
        path.symlink_to(tmp_path / "gone")
    assert data_file(path, _environ(tmp_path)) is None


def test_a_data_file_above_64_gib_is_refused_not_left_out(tmp_path: Path) -> None:
    big = _sparse(tmp_path / "train.parquet", MAX_DATA_BYTES + 1)
    with pytest.raises(FileRefused, match="above the 64.0 GiB bound"):
        data_file(big, _environ(tmp_path))


def test_a_data_file_replaced_while_it_is_hashed_is_recorded_as_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The file is swapped for a FIFO between the look and the hash: the hash refuses the FIFO, but what is
    # at the path now is no file, so the record says "none" (plan's own checks name it) instead of failing.
    path = tmp_path / "train.parquet"
    path.write_bytes(b"x")

    def swapped(target: Path, environ: Any) -> Any:
        target.unlink()
        os.mkfifo(target)
        raise FileRefused(f"{target}: not a regular file")

    monkeypatch.setattr(provenance, "cached_digest", swapped)
    assert data_file(path, _environ(tmp_path)) is None


def test_a_data_file_that_cannot_be_read_is_recorded_as_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests run as root here, which reads any mode: the error the kernel gives a user without read access.
    path = tmp_path / "train.parquet"
    path.write_bytes(b"x")

    def denied(target: Path, environ: Any) -> Any:
        raise PermissionError(13, "Permission denied", str(target))

    monkeypatch.setattr(provenance, "cached_digest", denied)
    assert data_file(path, _environ(tmp_path)) is None


# --- the model's files: each of its config, tokenizer, processor files and index, never the weights --


def test_each_model_file_present_is_hashed_and_the_weights_never(tmp_path: Path) -> None:
    present = {
        "config.json": b'{"model_type": "qwen3_5_moe"}',
        "tokenizer.json": b"{}",
        "chat_template.jinja": b"{{ messages }}",
        "model.safetensors.index.json": b'{"weight_map": {}}',
    }
    for name, content in present.items():
        (tmp_path / name).write_bytes(content)
    (tmp_path / "model-00001-of-00001.safetensors").write_bytes(b"weights")
    (tmp_path / "README.md").write_bytes(b"not the math")
    assert model_files(tmp_path) == {name: _sha(content) for name, content in present.items()}


def test_the_model_files_are_the_ones_that_decide_its_math_and_text() -> None:
    # docs/reproducibility.md: config.json, the tokenizer and processor files and the safetensors index; no weights, no README.
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "vocab.json",
                 "merges.txt", "special_tokens_map.json", "added_tokens.json", "chat_template.jinja",
                 "chat_template.json", "preprocessor_config.json", "video_preprocessor_config.json",
                 "processor_config.json", "model.safetensors.index.json"):  # fmt: skip
        assert name in MODEL_FILES
    assert not [name for name in MODEL_FILES if name.endswith((".safetensors", ".bin"))]


def test_every_model_file_is_found_under_its_own_name(tmp_path: Path) -> None:
    for name in MODEL_FILES:
        (tmp_path / name).write_text(name)
    assert model_files(tmp_path) == {name: _sha(name.encode()) for name in MODEL_FILES}


def test_an_empty_model_folder_holds_no_files(tmp_path: Path) -> None:
    assert model_files(tmp_path) == {}


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("dangling link", "a link to nothing"),
        ("folder", "not a regular file"),
        ("fifo", "not a regular file"),
        ("looping link", "cannot be read (Too many levels of symbolic links)"),
        ("above 1 GiB", "1.0 GiB, above the 1.0 GiB bound"),
    ],
)
def test_a_model_file_the_trainer_would_read_but_cannot_be_hashed_is_refused_naming_it(
    tmp_path: Path, kind: str, reason: str
) -> None:
    """Left out, it would let a changed tokenizer pass the drift guard: refused, never skipped."""
    path = tmp_path / "tokenizer.json"
    if kind == "dangling link":
        path.symlink_to(tmp_path / "gone.json")
    elif kind == "folder":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "looping link":
        path.symlink_to(path)
    else:
        _sparse(path, MAX_MODEL_FILE_BYTES + 1)
    with pytest.raises(FileRefused) as caught:
        model_files(tmp_path)
    assert str(caught.value) == f"{path}: {reason}"


def test_an_unreadable_model_file_without_a_reason_is_named_by_its_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "config.json").write_text("{}")

    def failing(path: Path, limit: int) -> str:
        raise OSError("no strerror")  # an OSError raised by code, not by the kernel: no errno text

    monkeypatch.setattr(provenance, "sha256_file", failing)
    with pytest.raises(FileRefused) as caught:
        model_files(tmp_path)
    assert str(caught.value) == f"{tmp_path / 'config.json'}: cannot be read (OSError)"


# --- frameworks and the image --------------------------------------------------------------


def _installed() -> dict[str, str]:
    """Every installed distribution's version by its normalised name: the oracle, read another way."""
    return {re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower(): d.version for d in importlib.metadata.distributions()}


def test_each_framework_is_its_installed_version_or_null() -> None:
    versions = installed_versions()
    installed = _installed()
    assert list(versions) == list(FRAMEWORKS)
    assert versions == {name: installed.get(name) for name in FRAMEWORKS}


def test_a_framework_not_installed_is_null(monkeypatch: pytest.MonkeyPatch) -> None:
    # A CPU machine lacks torch-npu, an npu image lacks CUDA's vllm: which one is absent depends on the machine.
    monkeypatch.setattr(provenance, "FRAMEWORKS", ("grpo-recipe-no-such-distribution", "pytest"))
    assert installed_versions() == {"grpo-recipe-no-such-distribution": None, "pytest": pytest.__version__}


def test_the_frameworks_are_those_that_decide_the_math() -> None:
    for name in ("verl", "torch", "torch-npu", "vllm", "vllm-ascend", "megatron-core", "megatron-bridge",
                 "transformers", "ray"):  # fmt: skip
        assert name in FRAMEWORKS


def test_inside_an_image_its_labels_and_lock_digests_are_recorded(tmp_path: Path) -> None:
    info = tmp_path / "image"
    (info / "labels.d").mkdir(parents=True)
    (info / "labels.d" / "10-base.labels").write_text("org.opencontainers.image.version=1.2\n")
    (info / "gpu.lock").write_bytes(b"verl==0.9.1\n")
    assert image_facts({"RECIPE_IMAGE_INFO_DIR": str(info)}) == {
        "labels": {"org.opencontainers.image.version": "1.2"},
        "locks": {"gpu.lock": _sha(b"verl==0.9.1\n")},
    }


def test_outside_an_image_the_labels_are_null_and_there_are_no_locks(tmp_path: Path) -> None:
    assert image_facts({"RECIPE_IMAGE_INFO_DIR": str(tmp_path / "none")}) == {"labels": None, "locks": {}}


# --- the overrides that shape training --------------------------------------------------


@pytest.mark.parametrize(
    ("override", "key", "value"),
    [
        ("data.seed=42", "data.seed", "42"),
        ("+trainer.x=1", "trainer.x", "1"),
        ("++trainer.x=1", "trainer.x", "1"),
        ("~trainer.x", "trainer.x", ""),
        ("~trainer.x=", "trainer.x", ""),
        ("a.b=c=d", "a.b", "c=d"),  # only the first `=` splits: a value may hold one
        ("+XLA.flag=1", "XLA.flag", "1"),  # the Hydra prefix goes, never a letter of the key
        ("trainer.logger=['console']", "trainer.logger", "['console']"),
    ],
)
def test_an_override_is_its_key_without_the_hydra_prefix_and_its_value(override: str, key: str, value: str) -> None:
    assert split_override(override) == (key, value)


#: Keys that say where files are, how often to save or validate, what to log and whether to resume: never drift
#: (docs/reproducibility.md: "a file that moved with the same content is no drift, nor are save and validation frequencies,
#: loggers or names"), nor where the workers write their logs under the checkpoint folder.
NO_MATH = [
    "data.train_files", "data.val_files", "actor_rollout_ref.model.path", "trainer.default_local_dir",
    "trainer.logger", "trainer.project_name", "trainer.experiment_name", "trainer.save_freq", "trainer.test_freq",
    "trainer.val_before_train", "trainer.resume_mode", "trainer.resume_from_path",
    "ray_kwargs.ray_init.runtime_env.env_vars.TENSORBOARD_DIR",
    "ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH",
]  # fmt: skip


@pytest.mark.parametrize("key", NO_MATH)
def test_what_cannot_change_the_math_is_not_a_training_override(key: str) -> None:
    for written in (f"{key}=v", f"+{key}=v", f"++{key}=v"):
        assert training_overrides([written, "data.seed=1"]) == {"data.seed": "1"}


def test_the_training_overrides_keep_every_other_key_as_passed_in_order() -> None:
    overrides = ["actor_rollout_ref.actor.optim.lr=1e-6", "+data.seed=7", "trainer.total_training_steps=3",
                 "data.train_batch_size=8"]  # fmt: skip
    assert list(training_overrides(overrides).items()) == [
        ("actor_rollout_ref.actor.optim.lr", "1e-6"), ("data.seed", "7"), ("trainer.total_training_steps", "3"),
        ("data.train_batch_size", "8"),
    ]  # fmt: skip


def test_a_key_given_twice_is_recorded_with_its_last_value() -> None:
    # Hydra applies overrides in order: the last one is what verl reads.
    assert training_overrides(["data.seed=1", "data.seed=2"]) == {"data.seed": "2"}


# --- files a config key names --------------------------------------------------------------


def test_a_referenced_file_is_its_path_and_sha256(tmp_path: Path) -> None:
    code = tmp_path / "reward.py"
    code.write_bytes(b"def compute_score(*a): return 1.0\n")
    assert referenced_file(str(code)) == {"path": str(code), "sha256": _sha(code.read_bytes())}


@pytest.mark.parametrize("kind", ["missing", "directory", "fifo", "looping link"])
def test_a_referenced_path_that_is_no_regular_file_has_a_null_sha256(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "reward.py"
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "looping link":
        path.symlink_to(path)
    assert referenced_file(str(path)) == {"path": str(path), "sha256": None}


def test_a_referenced_file_above_1_gib_is_refused(tmp_path: Path) -> None:
    big = _sparse(tmp_path / "reward.py", MAX_MODEL_FILE_BYTES + 1)
    with pytest.raises(FileRefused, match=r"reward\.py: 1\.0 GiB, above the 1\.0 GiB bound"):
        referenced_file(str(big))


# --- the whole record ----------------------------------------------------------------------


def _inputs(tmp_path: Path) -> dict[str, Any]:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_bytes(b'{"model_type": "qwen3_5_moe"}')
    train, val = tmp_path / "train.jsonl", tmp_path / "val.jsonl"
    train.write_bytes(b"train\n")
    val.write_bytes(b"val\n")
    reward = tmp_path / "reward.py"
    reward.write_bytes(b"def compute_score(): ...\n")
    return {
        "settings_shown": {"TP": 2, "SEED": 42, "MODEL_PATH": str(model)},
        "setting_keys": {"data.seed": "SEED", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size": "TP"},
        "layout": {"tp": 2, "pp": 1},
        "overrides": ["data.seed=42", "trainer.save_freq=5", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"],
        "extra_overrides": ["actor_rollout_ref.actor.clip_ratio=0.3"],
        "environment_reads": {"MY_LR": "1e-6", "A_FIRST": None},
        "referenced_files": {"reward.custom_reward_function.path": str(reward), "data.custom_cls.path": str(tmp_path / "none.py")},
        "model_dir": model,
        "train_files": train,
        "val_files": val,
        "environ": _environ(tmp_path),
    }


def test_the_record_holds_every_input_the_readme_names(tmp_path: Path) -> None:
    inputs = _inputs(tmp_path)
    record = build_record(**inputs)
    train, val, model = inputs["train_files"], inputs["val_files"], inputs["model_dir"]
    assert record == {
        "schema_version": 1,
        "recipe_version": __version__,
        "frameworks": installed_versions(),
        "image": {"labels": None, "locks": {}},
        "model": {"path": str(model), "files": {"config.json": _sha(b'{"model_type": "qwen3_5_moe"}')}},
        "data": {
            "TRAIN_FILES": {"path": str(train), "size": 6, "rows": None, "sha256": _sha(b"train\n")},
            "VAL_FILES": {"path": str(val), "size": 4, "rows": None, "sha256": _sha(b"val\n")},
        },
        "layout": {"tp": 2, "pp": 1},
        "training": {"data.seed": "42", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size": "2"},
        "environment_reads": {"A_FIRST": None, "MY_LR": "1e-6"},
        "referenced_files": {
            "data.custom_cls.path": {"path": str(tmp_path / "none.py"), "sha256": None},
            "reward.custom_reward_function.path": {"path": str(tmp_path / "reward.py"),
                                                   "sha256": _sha(b"def compute_score(): ...\n")},
        },
        "extra_overrides": ["actor_rollout_ref.actor.clip_ratio=0.3"],
        "setting_keys": {"actor_rollout_ref.actor.megatron.tensor_model_parallel_size": "TP", "data.seed": "SEED"},
        "settings": {"TP": 2, "SEED": 42, "MODEL_PATH": str(model)},
    }  # fmt: skip


def test_the_records_maps_are_in_sorted_order_whatever_order_they_came_in(tmp_path: Path) -> None:
    """No time, no host, sorted keys: the same inputs give the same bytes."""
    record = build_record(**_inputs(tmp_path))
    for field in ("environment_reads", "referenced_files", "setting_keys"):
        assert list(record[field]) == sorted(record[field]), field


def test_the_same_inputs_give_the_same_record(tmp_path: Path) -> None:
    inputs = _inputs(tmp_path)
    assert build_record(**inputs) == build_record(**inputs)


def test_a_plain_record_needs_no_optional_inputs(tmp_path: Path) -> None:
    inputs = _inputs(tmp_path)
    for optional in ("extra_overrides", "environment_reads", "referenced_files"):
        del inputs[optional]
    record = build_record(**inputs)
    assert (record["extra_overrides"], record["environment_reads"], record["referenced_files"]) == ([], {}, {})


def test_a_set_secret_never_reaches_the_records_settings(tmp_path: Path) -> None:
    """A secret in the record, even as `**********`, would be replayed as HF_TOKEN=********** over the real one."""
    settings = settings_of(HF_TOKEN="hf_real_token", WANDB_API_KEY="wandb_real_key", RAY_AUTH_TOKEN="ray_real",
                           EXPERIMENT_NAME="e")  # fmt: skip
    record = build_record(**(_inputs(tmp_path) | {"settings_shown": settings.redacted()}))
    shown = record["settings"]
    assert not {"HF_TOKEN", "WANDB_API_KEY", "RAY_AUTH_TOKEN"} & set(shown)
    assert REDACTED not in shown.values() and "hf_real_token" not in repr(record)
    assert shown["EXPERIMENT_NAME"] == "e" and shown["SEED"] == 42  # the rest stays, to be replayed


def test_secrets_set_in_the_environment_never_reach_the_records_settings(
    tmp_path: Path, clean_env: pytest.MonkeyPatch
) -> None:
    """How users give them: the container's environment (docker compose, a Kubernetes secret)."""
    from recipe.settings import Settings

    for name, value in (("HF_TOKEN", "hf_env_token"), ("WANDB_API_KEY", "wandb_env_key"), ("RAY_AUTH_TOKEN", "ray_env")):
        clean_env.setenv(name, value)
    clean_env.setenv("SEED", "7")
    record = build_record(**(_inputs(tmp_path) | {"settings_shown": Settings().redacted()}))
    assert not {"HF_TOKEN", "WANDB_API_KEY", "RAY_AUTH_TOKEN"} & set(record["settings"])
    assert REDACTED not in repr(record)
    assert not [value for value in ("hf_env_token", "wandb_env_key", "ray_env") if value in repr(record)]
    assert record["settings"]["SEED"] == 7


def test_an_unset_secret_is_recorded_as_unset(tmp_path: Path) -> None:
    # Nothing to hide: replay then leaves the variable to the environment it runs in.
    record = build_record(**(_inputs(tmp_path) | {"settings_shown": settings_of().redacted()}))
    assert record["settings"]["HF_TOKEN"] is None


@pytest.mark.parametrize(
    ("field", "variable"),
    [("train_files", "TRAIN_FILES"), ("val_files", "VAL_FILES")],
)
def test_a_data_file_above_its_bound_is_one_line_naming_its_variable(tmp_path: Path, field: str, variable: str) -> None:
    inputs = _inputs(tmp_path)
    big = _sparse(tmp_path / "big.parquet", MAX_DATA_BYTES + 1)
    with pytest.raises(RecipeConfigError) as caught:
        build_record(**(inputs | {field: big}))
    assert caught.value.problems == [
        (
            f"{variable}={str(big)!r}: {big}: 64.0 GiB, above the 64.0 GiB bound; a run record hashes it "
            "(the bounds: docs/reproducibility.md)"
        )
    ]


def test_every_input_above_its_bound_is_named_at_once(tmp_path: Path) -> None:
    inputs = _inputs(tmp_path)
    model = inputs["model_dir"]
    _sparse(model / "tokenizer.json", MAX_MODEL_FILE_BYTES + 1)
    big = _sparse(tmp_path / "big.parquet", MAX_DATA_BYTES + 1)
    reward = _sparse(tmp_path / "reward.py", MAX_MODEL_FILE_BYTES + 1)
    with pytest.raises(RecipeConfigError) as caught:
        build_record(**(inputs | {"train_files": big, "val_files": big,
                                  "referenced_files": {"reward.custom_reward_function.path": str(reward)}}))  # fmt: skip
    tail = "; a run record hashes it (the bounds: docs/reproducibility.md)"
    assert caught.value.problems == [
        f"MODEL_PATH={str(model)!r}: {model / 'tokenizer.json'}: 1.0 GiB, above the 1.0 GiB bound{tail}",
        f"TRAIN_FILES={str(big)!r}: {big}: 64.0 GiB, above the 64.0 GiB bound{tail}",
        f"VAL_FILES={str(big)!r}: {big}: 64.0 GiB, above the 64.0 GiB bound{tail}",
        f"reward.custom_reward_function.path={str(reward)!r}: {reward}: 1.0 GiB, above the 1.0 GiB bound{tail}",
    ]


def test_each_referenced_file_is_hashed_from_its_own_path(tmp_path: Path) -> None:
    """Several keys: each entry holds its own file's digest, not the last one's."""
    files = {}
    for name in ("a", "b", "c"):
        (tmp_path / f"{name}.py").write_text(name)
        files[f"{name}.path"] = str(tmp_path / f"{name}.py")
    record = build_record(**(_inputs(tmp_path) | {"referenced_files": files}))
    assert record["referenced_files"] == {
        f"{name}.path": {"path": str(tmp_path / f"{name}.py"), "sha256": _sha(name.encode())} for name in "abc"
    }
