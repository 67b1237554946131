"""Which checks `doctor` runs and the in-process ones: called directly, each against docs/doctor.md's words.

The machine is stubbed where a real one would answer differently from node to node (the uid,
free space, /dev/shm's size, installed distributions and their metadata, the cores): every
expected reason below is written out by hand from docs/doctor.md ("doctor: check an image and a node"),
not copied from the module's tables.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import types
from collections import namedtuple
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from recipe.device import DeviceDetection
from recipe.doctor import checks, facts, trainer_imports
from recipe.doctor.runner import CheckResult, Probe, Step

Usage = namedtuple("Usage", "total used free")
GIB = 1 << 30


# --- names ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "normal", "squashed"),
    [
        ("TransferQueue", "transferqueue", "transferqueue"),
        ("qwen_vl_utils", "qwen-vl-utils", "qwenvlutils"),
        ("Megatron.Core", "megatron-core", "megatroncore"),
        ("a__-.b", "a-b", "ab"),
    ],
)
def test_distribution_names_compare_as_pep_503_says(name: str, normal: str, squashed: str) -> None:
    assert trainer_imports.normalize(name) == normal
    assert trainer_imports._squash(name) == squashed


def test_an_import_checks_name_is_import_colon_distribution() -> None:
    assert trainer_imports.ImportTarget("TransferQueue", ["transfer_queue"], "0.1", "why").name == "import:TransferQueue"


# --- what the trainer needs: verl's verl-core extra and the modules that prove each import ------


def fake_metadata(
    monkeypatch: pytest.MonkeyPatch,
    *,
    requires: list[str] | None = None,
    verl_installed: bool = True,
    packages: dict[str, list[str]] | None = None,
    installed: dict[str, str] | None = None,
    spelled: dict[str, str] | None = None,
) -> None:
    """The installed distributions' metadata as checks.py reads it: verl's requirements, top-level modules, versions."""
    installed = installed or {}

    class NotFound(Exception):
        pass

    def requires_of(name: str) -> list[str] | None:
        assert name == "verl"
        if not verl_installed:
            raise NotFound(name)
        return requires

    def distribution(name: str) -> Any:
        if trainer_imports.normalize(name) not in {trainer_imports.normalize(n) for n in installed}:
            raise NotFound(name)
        return types.SimpleNamespace(metadata={"Name": (spelled or {}).get(name, name)})

    monkeypatch.setattr(trainer_imports, "metadata", types.SimpleNamespace(
        PackageNotFoundError=NotFound, requires=requires_of, distribution=distribution,
        packages_distributions=lambda: packages or {},
    ))  # fmt: skip
    monkeypatch.setattr(facts, "distribution_version", lambda name: installed.get(name))


@pytest.mark.parametrize(
    ("requires", "names"),
    [
        (None, []),  # verl without requirements at all
        (
            [
                'msgspec; extra == "verl-core"',
                "pytest>=7.0; extra == 'verl-core'",
                'hydra-core (>=1.3) ; extra=="verl-core"',
                'ray[default]>=2.41; extra == "verl-core"',
                'qwen_vl_utils~=0.0.11; extra == "verl-core" and python_version >= "3.10"',
                ' torchdata!=0.9; extra == "verl-core"',
                'pandas<3; extra == "verl-core"',
                'vllm; extra == "vllm"',  # another extra
                "numpy",  # a base requirement: not the extra's
                "verl-core-tools; python_version > '3'",
            ],
            ["msgspec", "pytest", "hydra-core", "ray", "qwen_vl_utils", "torchdata", "pandas"],
        ),
    ],
)
def test_verl_core_requirements_are_the_names_in_that_extra(
    monkeypatch: pytest.MonkeyPatch, requires: list[str] | None, names: list[str]
) -> None:
    fake_metadata(monkeypatch, requires=requires)
    assert trainer_imports.verl_core_requirements() == names


def test_without_verl_its_requirements_cannot_be_read(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_metadata(monkeypatch, verl_installed=False)
    assert trainer_imports.verl_core_requirements() is None


@pytest.fixture
def importable(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """Top-level modules find_spec finds (add to the set); every other one is not installed."""
    found: set[str] = set()
    for module in (checks, trainer_imports):  # both look modules up: the plan's probes, the imports' names
        monkeypatch.setattr(module, "find_spec", lambda name: object() if name in found else None)
    return found


@pytest.mark.parametrize(
    ("distribution", "tops", "found", "modules"),
    [
        # TransferQueue ships `recipe`, `tests` and `scripts` beside its module: the one named like it wins.
        ("TransferQueue", {"transferqueue": ["recipe", "tests", "transfer_queue", "scripts"]}, set(), ["transfer_queue"]),
        ("Foo-Bar", {"foo-bar": ["foo_bar", "FooBar", "foobar_ext"]}, set(), ["foo_bar"]),  # the first of those
        # No top-level name like the distribution's: every importable one, but none that wheels ship by mistake.
        ("hydra-core", {"hydra-core": ["hydra", "tests"]}, {"hydra", "tests"}, ["hydra"]),
        ("pyzmq", {"pyzmq": ["zmq", "_zmq_private", "1bad", "zmq-x"]}, {"zmq", "_zmq_private", "1bad", "zmq-x"}, ["zmq"]),
        ("multi", {"multi": ["zeta", "alpha", "gone", "alpha"]}, {"zeta", "alpha"}, ["alpha", "zeta"]),
        ("PyYAML", {"pyyaml": ["yaml"]}, {"yaml"}, ["yaml"]),
        ("Py_YAML", {"py-yaml": ["yaml"]}, {"yaml"}, ["yaml"]),  # looked up by the normalized name
        # Nothing usable: the distribution's name as a module.
        ("Qwen-VL-Utils", {}, set(), ["qwen_vl_utils"]),
        ("setuptools", {"setuptools": ["docs", "tests"]}, {"docs", "tests"}, ["setuptools"]),
    ],
)
def test_the_modules_that_prove_a_distribution_come_from_its_own_metadata(
    importable: set[str], distribution: str, tops: dict[str, list[str]], found: set[str], modules: list[str]
) -> None:
    importable.update(found)
    assert trainer_imports._modules_of(distribution, tops) == modules


@pytest.fixture
def trainer_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    """What `run` checks and what the trainer imports, as small as the rules need (module -> distribution)."""
    monkeypatch.setattr(trainer_imports, "TRAINER_MODULES", {"gpu": {"verl": "verl", "megatron.bridge": "megatron-bridge"},
                                                    "npu": {"verl": "verl", "torch_npu": "torch_npu"}})  # fmt: skip
    monkeypatch.setattr(trainer_imports, "TRAINER_SUPPORT_MODULES", {"transfer_queue": "TransferQueue", "qwen_vl_utils": "qwen-vl-utils"})
    # verl is named twice with the same module: it is imported once.
    monkeypatch.setattr(trainer_imports, "DOCTOR_MODULES", {"gpu": {"torch": "torch", "verl.trainer": "verl", "verl": "verl"},
                                                   "npu": {"torch": "torch"}})  # fmt: skip


def test_import_targets_merge_what_run_checks_the_trainer_imports_and_verl_core(
    monkeypatch: pytest.MonkeyPatch, importable: set[str], trainer_modules: None
) -> None:
    fake_metadata(
        monkeypatch,
        requires=[
            'msgspec; extra == "verl-core"', 'TransferQueue; extra == "verl-core"', 'pytest; extra == "verl-core"',
            'pytest-asyncio; extra == "verl-core"', 'Pytest_Rerunfailures; extra == "verl-core"',
            'torchcodec; extra == "verl-core"', 'Absent-Dist; extra == "verl-core"', 'qwen_vl_utils; extra == "verl-core"',
            'pyzmq>=25; extra == "verl-core"',
        ],
        packages={"msgspec": ["msgspec"], "torchcodec": ["torchcodec"], "qwen_vl_utils": ["qwen-vl-utils"], "zmq": ["PyZMQ"]},
        installed={"verl": "0.9.1", "torch": "2.11.0", "TransferQueue": "0.1.11", "msgspec": "0.19", "torchcodec": "0.8",
                   "qwen-vl-utils": "0.0.11", "pyzmq": "26.2"},
        spelled={"qwen-vl-utils": "qwen-vl-utils"},
    )  # fmt: skip
    importable.add("zmq")
    targets, notes = trainer_imports.import_targets("gpu")
    assert notes == []
    assert [(t.distribution, t.modules, t.version, t.why) for t in targets] == [
        ("Absent-Dist", ["Absent_Dist"], None, "verl's verl-core extra"),  # not installed: its name as a module
        ("megatron-bridge", ["megatron.bridge"], None, "run checks it"),
        ("msgspec", ["msgspec"], "0.19", "verl's verl-core extra"),
        ("pyzmq", ["zmq"], "26.2", "verl's verl-core extra"),  # its module, from the installed files' metadata
        ("qwen-vl-utils", ["qwen_vl_utils"], "0.0.11", "the trainer imports it, declared by no dependency"),
        ("torch", ["torch"], "2.11.0", "the trainer imports it"),
        ("torchcodec", ["torchcodec"], "0.8", "verl's verl-core extra"),
        ("TransferQueue", ["transfer_queue"], "0.1.11", "the trainer imports it, declared by no dependency"),
        ("verl", ["verl", "verl.trainer"], "0.9.1", "run checks it"),  # one target, both modules imported
    ]
    # verl-core's test tooling is no image's business; torchcodec is left out of the npu image on purpose.
    npu = {t.distribution for t in trainer_imports.import_targets("npu")[0]}
    assert "torchcodec" not in npu and "torch_npu" in npu and not {"pytest", "pytest-asyncio"} & npu


def test_an_installed_distribution_is_named_as_its_metadata_spells_it(
    monkeypatch: pytest.MonkeyPatch, importable: set[str], trainer_modules: None
) -> None:
    fake_metadata(monkeypatch, requires=['torchvision; extra == "verl-core"'], packages={"torchvision": ["torchvision"]},
                  installed={"qwen-vl-utils": "0.0.11", "torch": "2.11.0", "torchvision": "0.26.0"},
                  spelled={"qwen-vl-utils": "Qwen_VL_Utils", "torch": ""})  # fmt: skip
    names = [t.distribution for t in trainer_imports.import_targets("npu")[0]]
    # An empty Name in the metadata keeps the name asked for; sorted as pip lists them, case-insensitively.
    assert names == ["Qwen_VL_Utils", "torch", "torch_npu", "torchvision", "TransferQueue", "verl"]


def test_without_verl_the_report_says_its_requirements_cannot_be_read(
    monkeypatch: pytest.MonkeyPatch, importable: set[str], trainer_modules: None
) -> None:
    fake_metadata(monkeypatch, verl_installed=False)
    targets, notes = trainer_imports.import_targets("gpu")
    assert notes == ["verl is not installed: its verl-core requirements cannot be read"]
    assert [t.distribution for t in targets] == ["megatron-bridge", "qwen-vl-utils", "torch", "TransferQueue", "verl"]


# --- probes: heavy imports spread over processes ---------------------------------------------


def chain(name: str, weight: int) -> tuple[int, list[Step]]:
    return weight, [Step(name, "import", "imports", 1.0)]


@pytest.mark.parametrize(
    ("chains", "count", "expected"),
    [
        # Longest first onto the least loaded probe; on a tie, the first probe.
        ([chain("light1", 1), chain("verl", 3), chain("vllm", 3), chain("light2", 1)], 2,
         [["verl", "light1"], ["vllm", "light2"]]),
        ([chain("a", 1), chain("b", 2), chain("c", 4), chain("d", 1)], 2, [["c"], ["b", "a", "d"]]),
        ([chain("a", 1), chain("b", 1), chain("c", 1)], 3, [["a"], ["b"], ["c"]]),
        ([chain("a", 1)], 4, [["a"]]),  # no empty probe
        ([chain("a", 1), chain("b", 5)], 1, [["b", "a"]]),
        ([chain("a", 1), chain("b", 5)], 0, [["b", "a"]]),  # no cores known: still one probe
        ([], 3, []),
    ],
)  # fmt: skip
def test_probes_take_the_heaviest_imports_first_onto_the_least_loaded(
    chains: list[tuple[int, list[Step]]], count: int, expected: list[list[str]]
) -> None:
    assert [[step.name for step in steps] for steps in checks.split_into_probes(chains, count)] == expected


def test_a_chain_of_steps_stays_together_in_its_order() -> None:
    bridge = [Step("import:megatron-bridge", "import", "imports", 1.0), Step("transformer_engine", "transformer_engine", "framework", 1.0)]
    probes = checks.split_into_probes([chain("torch", 4), (3, bridge), chain("a", 1)], 2)
    assert [[s.name for s in p] for p in probes] == [["torch"], ["import:megatron-bridge", "transformer_engine", "a"]]


@pytest.mark.parametrize(("affinity", "cpu_count", "cores"), [({0, 3}, 8, 2), (None, 6, 6), (None, None, 1)])
def test_the_usable_cores_are_this_process_affinity_else_the_cpu_count(
    monkeypatch: pytest.MonkeyPatch, affinity: set[int] | None, cpu_count: int | None, cores: int
) -> None:
    def no_affinity(pid: int) -> set[int]:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(os, "sched_getaffinity", (lambda pid: affinity) if affinity else no_affinity)
    monkeypatch.setattr(os, "cpu_count", lambda: cpu_count)
    assert checks._usable_cores() == cores


def test_a_platform_without_affinity_uses_the_cpu_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "sched_getaffinity")
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    assert checks._usable_cores() == 3


def test_only_keeps_the_selected_checks_and_drops_empty_probes() -> None:
    def noop() -> tuple[str, str]:
        return "ok", ""

    plan = checks.Plan(
        local=[("user", "environment", noop), ("shm", "environment", noop)],
        probes=[Probe("imports-0", [Step("import:a", "import", "imports", 1.0), Step("triton_launcher", "t", "framework", 1.0)], {}),
                Probe("device", [Step("matmul", "matmul", "device", 1.0)], {})],
        decided=[CheckResult("import:gone", "imports", "fail", "not installed", 0.0), CheckResult("import:b", "imports", "fail", "x", 0.0)],
        missing=["gone", "b"],
    )  # fmt: skip
    assert plan.names() == ["user", "shm", "import:gone", "import:b", "import:a", "triton_launcher", "matmul"]
    plan.select(lambda name: name.startswith("import:") and name != "import:b" or name == "shm")
    assert plan.names() == ["shm", "import:gone", "import:a"]
    assert plan.missing == ["gone"]
    assert [p.name for p in plan.probes] == ["imports-0"]


# --- in-process checks -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uid", "name", "in_image", "expected"),
    [
        (1000, "recipe", True, ("ok", "uid 1000 (recipe), not root")),
        (4242, None, False, ("ok", "uid 4242 (no passwd entry), not root")),
        (0, "root", True, ("fail", "running as root (uid 0): the image's user is recipe (uid 1000); do not override --user")),
        (0, "root", False, ("warn", "running as root (uid 0); the images run as uid 1000")),
    ],
)
def test_root_fails_in_an_image_and_warns_outside(
    monkeypatch: pytest.MonkeyPatch, uid: int, name: str | None, in_image: bool, expected: tuple[str, str]
) -> None:
    monkeypatch.setattr(os, "getuid", lambda: uid)
    monkeypatch.setattr(facts, "user_facts", lambda: {"uid": uid, "gid": uid, "name": name, "groups": []})
    assert checks.check_user(in_image) == expected


@pytest.fixture
def free_space(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every volume reports 12.34 GiB free; the list holds the paths asked about."""
    asked: list[Path] = []
    monkeypatch.setattr(shutil, "disk_usage", lambda path: asked.append(Path(path)) or Usage(100 * GIB, 0, int(12.34 * GIB)))
    monkeypatch.setattr(os, "getuid", lambda: 1000)
    return asked


def test_a_writable_volume_is_ok_with_its_free_space_and_leaves_nothing(tmp_path: Path, free_space: list[Path]) -> None:
    assert checks.check_writable("CHECKPOINT_DIR", tmp_path) == (
        "ok", f"CHECKPOINT_DIR={str(tmp_path)!r}: writable by uid 1000, 12.3 GiB free"
    )
    assert list(tmp_path.iterdir()) == [] and free_space == [tmp_path]


def test_a_missing_volume_is_checked_where_run_creates_it(tmp_path: Path, free_space: list[Path]) -> None:
    target = tmp_path / "a" / "b"
    assert checks.check_writable("HF_HOME", target) == (
        "ok", f"HF_HOME={str(target)!r} (missing; its parent {tmp_path} is where run creates it): writable by uid 1000, 12.3 GiB free"
    )
    assert list(tmp_path.iterdir()) == [] and free_space == [tmp_path]


def test_a_volume_under_a_file_is_not_a_directory(tmp_path: Path, free_space: list[Path]) -> None:
    (tmp_path / "file").write_text("")
    assert checks.check_writable("HF_HOME", tmp_path / "file" / "hub") == (
        "fail", f"HF_HOME={str(tmp_path / 'file' / 'hub')!r}: {tmp_path / 'file'} is not a directory"
    )
    assert checks.check_writable("TMPDIR", tmp_path / "file") == (
        "fail", f"TMPDIR={str(tmp_path / 'file')!r}: {tmp_path / 'file'} is not a directory"
    )


def test_a_volume_where_no_file_can_be_created_fails_even_for_root() -> None:
    # /proc takes no files, whoever asks: the check really creates one where run writes.
    status, reason = checks.check_writable("CHECKPOINT_DIR", Path("/proc/doctor-checkpoints"))
    assert status == "fail"
    assert reason.startswith(
        f"CHECKPOINT_DIR='/proc/doctor-checkpoints' (missing; its parent /proc is where run creates it): not writable by uid {os.getuid()} ("
    )


def test_a_volume_that_refuses_a_file_fails_naming_the_uid_and_the_error(
    tmp_path: Path, free_space: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A read-only mount or one owned by root (root itself may write anywhere, so the refusal is stubbed).
    def refuse(prefix: str, dir: Path) -> tuple[int, str]:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    assert checks.check_writable("CHECKPOINT_DIR", tmp_path / "ck") == (
        "fail", (f"CHECKPOINT_DIR={str(tmp_path / 'ck')!r} (missing; its parent {tmp_path} is where run creates it): "
        "not writable by uid 1000 (Permission denied)")
    )


@pytest.mark.parametrize(
    ("total", "free", "expected"),
    [
        (64 << 20, 64 << 20, ("warn", ("/dev/shm is 64 MiB: NCCL fails in Docker's default 64 MB and Ray's object store lives "
                                      "there (compose: shm_size; Kubernetes: a memory emptyDir)"))),
        (GIB - (1 << 20), 0, ("warn", ("/dev/shm is 1023 MiB: NCCL fails in Docker's default 64 MB and Ray's object store "
                                      "lives there (compose: shm_size; Kubernetes: a memory emptyDir)"))),
        (GIB, GIB // 2, ("ok", "/dev/shm is 1.0 GiB (0.5 GiB free)")),  # docs/doctor.md: warn under 1 GiB
        (64 * GIB, 60 * GIB, ("ok", "/dev/shm is 64.0 GiB (60.0 GiB free)")),
    ],
)  # fmt: skip
def test_shm_warns_under_1_gib_naming_its_size(
    monkeypatch: pytest.MonkeyPatch, total: int, free: int, expected: tuple[str, str]
) -> None:
    asked: list[Path] = []
    monkeypatch.setattr(shutil, "disk_usage", lambda path: asked.append(path) or Usage(total, total - free, free))
    assert checks.check_shm() == expected
    assert asked == [Path("/dev/shm")]


def test_a_missing_shm_is_a_warning_naming_who_needs_it(tmp_path: Path) -> None:
    assert checks.check_shm(tmp_path / "shm") == (
        "warn", f"{tmp_path / 'shm'}: No such file or directory; NCCL/HCCL and Ray's object store use it"
    )


@pytest.mark.parametrize(
    ("installed", "labelled", "same"),
    [
        ("2.11.0+cu130", "2.11.0", True),
        ("0.23.0+empty", "0.23.0", True),
        ("0.9.1", "0.9.1", True),
        ("0.9.1", "0.9.0", False),
        ("2.11.0", "2.11.0+cu130", True),
        ("1!2.0", "2.0", False),  # an epoch is part of the release
        ("custom-build+x", "custom-build", True),  # not a version packaging parses: compared as text
        ("custom-build+x", "custom-other", False),
        ("custom-build+x", "custom-build+y", True),
        ("custom+a+b", "custom+c+d", True),  # the first '+' starts the local part
        ("0.23.0rc1", "0.23.0-rc1", True),  # another spelling of the same version
        ("1.0", "v1.0", True),
    ],
)
def test_a_local_build_suffix_does_not_change_the_release(installed: str, labelled: str, same: bool) -> None:
    assert checks.same_release(installed, labelled) is same


@pytest.fixture
def installed_versions(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    """Installed distributions (name -> version) as facts reports them; torch built for CUDA 12.8; no CANN."""
    versions: dict[str, str] = {}
    monkeypatch.setattr(facts, "distribution_version", lambda name: versions.get(name))
    monkeypatch.setattr(facts, "torch_cuda_version", lambda: "12.8")
    monkeypatch.setattr(facts, "ASCEND_TOOLKIT_DEFAULT", tmp_path / "no-toolkit")
    return versions


def test_outside_an_image_there_are_no_labels_to_compare(tmp_path: Path) -> None:
    assert checks.check_labels(None, tmp_path, "gpu", {}) == (
        "warn", f"not in an image ({tmp_path}/labels.d is missing): no labels to compare"
    )


def test_labels_that_match_name_each_matched_version(installed_versions: dict[str, str], tmp_path: Path) -> None:
    installed_versions.update({"torch": "2.11.0+cu128", "verl": "0.9.1", "grpo-recipe": "0.4.0", "megatron-core": "0.19.2"})
    labels = {
        "io.grpo-recipe.torch.version": "2.11.0",
        "io.grpo-recipe.verl.version": "0.9.1",
        "io.grpo-recipe.megatron-core.version": "0.19",  # a shorter label: 0.19.2 is a 0.19
        "io.grpo-recipe.cuda.version": "12.8",
        "org.opencontainers.image.version": "0.4.0",
        "io.grpo-recipe.device": "gpu",
        "io.grpo-recipe.framework": "full",
        "io.grpo-recipe.cuda.versionx": "1",  # not a version label
        "org.opencontainers.image.title": "grpo-recipe",
    }
    assert checks.check_labels(labels, tmp_path, "gpu", {}) == (
        "ok", "framework full; 5 labelled version(s) match: cuda, grpo-recipe, megatron-core, torch, verl"
    )


def test_labels_without_versions_match_none(tmp_path: Path, installed_versions: dict[str, str]) -> None:
    assert checks.check_labels({"io.grpo-recipe.device": "npu"}, tmp_path, "npu", {}) == (
        "ok", "framework ?; 0 labelled version(s) match: none"
    )


def test_labels_that_disagree_fail_naming_each_in_label_order(installed_versions: dict[str, str], tmp_path: Path) -> None:
    installed_versions.update({"verl": "0.9.1", "torch": "2.11.0", "grpo-recipe": "0.4.0"})
    labels = {
        "io.grpo-recipe.vllm.version": "0.24.0",
        "io.grpo-recipe.verl.version": "0.9.0",
        "io.grpo-recipe.torch.version": "2.1",  # 2.11.0 is not a 2.1
        "io.grpo-recipe.cuda.version": "13.0",
        "org.opencontainers.image.version": "0.3.0",
        "io.grpo-recipe.device": "npu",
    }
    assert checks.check_labels(labels, tmp_path, "gpu", {}) == (
        "fail",
        ("cuda 12.8 installed, 13.0 labelled; this image is built for npu, DEVICE resolves to gpu; "
        "torch 2.11.0 installed, 2.1 labelled; verl 0.9.1 installed, 0.9.0 labelled; "
        "vllm 0.24.0 labelled, not installed (or not found); grpo-recipe 0.4.0 installed, 0.3.0 labelled"),
    )


@pytest.mark.parametrize(
    ("label", "version_file", "expected"),
    [
        ("9.1.0", "version=9.1.0\n", ("ok", "framework ?; 1 labelled version(s) match: cann")),
        # As tests/images checks it: a label that appears in the toolkit's version files matches.
        ("8.1.RC1", "version=8.1.RC1.alpha002\n", ("ok", "framework ?; 1 labelled version(s) match: cann")),
        ("9.0.0", "version=9.1.0\n", ("fail", "cann 9.1.0 installed, 9.0.0 labelled")),
        ("9.1.0", None, ("fail", "cann 9.1.0 labelled, not installed (or not found)")),
    ],
)
def test_the_cann_label_is_compared_with_the_toolkits_version_files(
    installed_versions: dict[str, str], tmp_path: Path, label: str, version_file: str | None, expected: tuple[str, str]
) -> None:
    home = tmp_path / "toolkit"
    (home / "aarch64-linux").mkdir(parents=True)
    if version_file is not None:
        (home / "aarch64-linux" / "ascend_toolkit_install.info").write_text(f"package_name=Ascend-cann-toolkit\n{version_file}")
    assert checks.check_labels({"io.grpo-recipe.cann.version": label}, tmp_path, "npu", {"ASCEND_TOOLKIT_HOME": str(home)}) == expected


@pytest.mark.parametrize(
    ("device", "driver", "torch_cuda", "expected"),
    [
        ("gpu", facts.DriverFacts({"kernel_module": "550.54.15"}, "nvidia-smi -q gave no answer in 20 s (hung driver?)"), "12.8",
         ("fail", "nvidia-smi -q gave no answer in 20 s (hung driver?)")),
        ("gpu", facts.DriverFacts(), "12.8",
         ("warn", "no NVIDIA driver visible (no /proc/driver/nvidia/version, no nvidia-smi)")),
        ("gpu", facts.DriverFacts({"kernel_module": "550.54.15"}), "12.8", ("ok", "NVIDIA driver 550.54.15")),
        ("gpu", facts.DriverFacts({"kernel_module": "550.1", "driver_version": "550.54.15", "cuda_driver_version": "12.4",
                                   "gpus": [{"name": "NVIDIA H200"}, {"name": "NVIDIA H200"}]}), "12.8",
         ("ok", "NVIDIA driver 550.54.15, supports CUDA 12.4; 2 x NVIDIA H200")),
        ("gpu", facts.DriverFacts({"driver_version": "580.1", "gpus": [{"name": "NVIDIA L4"}]}), "13.0",
         ("ok", "NVIDIA driver 580.1; 1 x NVIDIA L4")),
        ("gpu", facts.DriverFacts({"driver_version": "580.1", "cuda_driver_version": "13.0", "gpus": []}), "13.0",
         ("ok", "NVIDIA driver 580.1, supports CUDA 13.0")),
        ("gpu", facts.DriverFacts({"driver_version": "580.1", "cuda_driver_version": "13.0"}), None,
         ("ok", "NVIDIA driver 580.1, supports CUDA 13.0")),  # a CPU torch needs no CUDA
        ("gpu", facts.DriverFacts({"driver_version": "550.54.15", "cuda_driver_version": "12.4"}), "13.0",
         ("fail", "NVIDIA driver 550.54.15, supports CUDA 12.4; torch is built for CUDA 13.0: the host needs a newer driver")),
        ("npu", facts.DriverFacts(), None, ("warn", "no Ascend driver visible (/usr/local/Ascend/driver/version.info missing, no npu-smi)")),
        ("npu", facts.DriverFacts({"npu_smi_version": "24.1.rc3"}), None, ("ok", "Ascend driver 24.1.rc3, CANN version not found")),
        ("npu", facts.DriverFacts({"driver_version": "24.1.rc2", "npu_smi_version": "24.1.rc3", "cann_version": "8.1.RC1"}), None,
         ("ok", "Ascend driver 24.1.rc2, CANN 8.1.RC1")),
        ("npu", facts.DriverFacts({"driver_version": "24.1.rc2"}, "npu-smi info exited 1: dcmi failed"), None,
         ("fail", "npu-smi info exited 1: dcmi failed")),
    ],
)  # fmt: skip
def test_the_driver_answers_and_is_new_enough_for_torchs_cuda(
    monkeypatch: pytest.MonkeyPatch, device: str, driver: facts.DriverFacts, torch_cuda: str | None, expected: tuple[str, str]
) -> None:
    monkeypatch.setattr(facts, "torch_cuda_version", lambda: torch_cuda)
    assert checks.check_driver(device, driver) == expected


# --- the plan ----------------------------------------------------------------------------------


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A machine for build_plan: 2 cores, no driver files, and the in-process checks recorded, not run."""
    calls: dict[str, Any] = {}
    monkeypatch.setattr(checks, "_usable_cores", lambda: 2)
    monkeypatch.setattr(facts, "NVIDIA_PROC_VERSION", tmp_path / "absent-nvidia")
    monkeypatch.setattr(facts, "ASCEND_DRIVER_VERSION", tmp_path / "absent-ascend")
    monkeypatch.setattr(checks, "check_user", lambda in_image: ("ok", f"user in_image={in_image}"))
    monkeypatch.setattr(checks, "check_writable", lambda variable, path: ("ok", f"{variable} {path}"))
    monkeypatch.setattr(checks, "check_labels", lambda labels, info_dir, device, environ: (
        "ok", f"labels {labels} {info_dir} {device} {sorted(environ)}"))  # fmt: skip
    monkeypatch.setattr(checks, "check_driver", lambda device, driver: ("ok", f"driver {device} {driver.facts}"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    yield calls


def target(distribution: str, version: str | None = "1.0", modules: list[str] | None = None) -> trainer_imports.ImportTarget:
    return trainer_imports.ImportTarget(distribution, modules or [distribution.replace("-", "_")], version, f"why {distribution}")


def plan_of(
    monkeypatch: pytest.MonkeyPatch,
    device: str = "gpu",
    visible: int = 0,
    targets: list[trainer_imports.ImportTarget] | None = None,
    **overrides: Any,
) -> checks.Plan:
    monkeypatch.setattr(checks, "import_targets", lambda dev: (list(targets or []), [f"note for {dev}"]))
    arguments: dict[str, Any] = {
        "checkpoint_dir": Path("/ck"), "expandable_segments": True, "labels": None, "info_dir": Path("/info"),
        "driver": lambda: facts.DriverFacts({"driver_version": "550"}), "environ": {"HF_HOME": "/hf"}, "timeout_s": None,
    }  # fmt: skip
    arguments.update(overrides)
    return checks.build_plan(device, DeviceDetection(device, "setting", "why not", visible_devices=visible), **arguments)


def steps_of(plan: checks.Plan) -> dict[str, Step]:
    return {step.name: step for probe in plan.probes for step in probe.steps}


def test_the_environment_checks_come_first_each_with_what_it_checks(
    monkeypatch: pytest.MonkeyPatch, machine: dict[str, Any], tmp_path: Path
) -> None:
    plan = plan_of(monkeypatch, labels={"io.grpo-recipe.device": "gpu"}, environ={"HF_HOME": "/hf", "X": "1"})
    local = {name: (category, check()) for name, category, check in plan.local}
    assert list(local) == ["user", "writable:CHECKPOINT_DIR", "writable:HF_HOME", "writable:TMPDIR", "shm", "labels", "devices"]
    assert local["user"] == ("environment", ("ok", "user in_image=True"))
    assert local["writable:CHECKPOINT_DIR"] == ("environment", ("ok", "CHECKPOINT_DIR /ck"))
    assert local["writable:HF_HOME"] == ("environment", ("ok", "HF_HOME /hf"))
    assert local["writable:TMPDIR"] == ("environment", ("ok", f"TMPDIR {tmp_path / 'tmp'}"))
    assert local["labels"] == ("environment", ("ok", "labels {'io.grpo-recipe.device': 'gpu'} /info gpu ['HF_HOME', 'X']"))
    assert [(name, category) for name, category, check in plan.local if check is checks.check_shm] == [("shm", "environment")]
    assert plan.notes == ["note for gpu"]


def test_hf_home_defaults_to_the_home_cache_and_no_labels_means_not_in_an_image(
    monkeypatch: pytest.MonkeyPatch, machine: dict[str, Any], tmp_path: Path
) -> None:
    plan = plan_of(monkeypatch, environ={}, labels=None)
    local = {name: check() for name, _, check in plan.local}
    assert local["writable:HF_HOME"] == ("ok", f"HF_HOME {tmp_path / 'home' / '.cache' / 'huggingface'}")
    assert local["user"] == ("ok", "user in_image=False")


@pytest.mark.parametrize("device", ["gpu", "npu"])
def test_without_a_device_the_node_fails_saying_why_and_no_device_probe_runs(
    monkeypatch: pytest.MonkeyPatch, machine: dict[str, Any], device: str
) -> None:
    """Issue 54: a node that lost its device mounts fails the check meant to catch it; the line names the flag for a
    machine that has none by design."""
    plan = plan_of(monkeypatch, device)
    name, category, check = plan.local[-1]
    assert (name, category, check()) == ("devices", "device", (
        "fail", f"no {device} device visible (why not): device, memory, matmul, expandable-segments and collective "
        "checks not run; on a machine without accelerators by design (CI, a build host): doctor --no-devices"
    ))  # fmt: skip
    assert "driver" not in plan.names()
    assert [p.name for p in plan.probes if p.name == "device"] == []


@pytest.mark.parametrize("device", ["gpu", "npu"])
def test_with_no_devices_asked_for_a_missing_device_is_a_warning(
    monkeypatch: pytest.MonkeyPatch, machine: dict[str, Any], device: str
) -> None:
    plan = plan_of(monkeypatch, device, devices_required=False)
    name, category, check = plan.local[-1]
    assert (name, category, check()) == ("devices", "device", (
        "warn", f"no {device} device visible (why not): device, memory, matmul, expandable-segments and collective "
        "checks not run (--no-devices)"
    ))  # fmt: skip
    assert "driver" not in plan.names()
    assert [p.name for p in plan.probes if p.name == "device"] == []


@pytest.mark.parametrize(
    ("device", "visible", "driver_file", "has_driver"),
    [
        ("gpu", 1, None, True),
        ("gpu", 0, "nvidia", True),  # the kernel module is loaded, though no device node is visible
        ("gpu", 0, "ascend", False),
        ("npu", 0, "ascend", True),
        ("npu", 0, "nvidia", False),
        ("npu", 0, None, False),
    ],
)
def test_the_driver_is_checked_where_a_device_or_its_driver_is_visible(
    monkeypatch: pytest.MonkeyPatch, machine: dict[str, Any], tmp_path: Path,
    device: str, visible: int, driver_file: str | None, has_driver: bool,
) -> None:  # fmt: skip
    if driver_file is not None:
        (tmp_path / f"absent-{driver_file}").write_text("present after all\n")
    plan = plan_of(monkeypatch, device, visible)
    drivers = [(category, check()) for name, category, check in plan.local if name == "driver"]
    assert drivers == ([("device", ("ok", f"driver {device} {{'driver_version': '550'}}"))] if has_driver else [])


def test_a_distribution_not_installed_is_decided_without_a_probe(
    monkeypatch: pytest.MonkeyPatch, machine: dict[str, Any], importable: set[str]
) -> None:
    importable.add("no_metadata")
    plan = plan_of(monkeypatch, targets=[target("absent-dist", None), target("no-metadata", None), target("msgspec", "0.19")])
    assert plan.missing == ["absent-dist"]
    assert plan.decided == [CheckResult("import:absent-dist", "imports", "fail", "not installed (why absent-dist)", 0.0, None)]
    steps = steps_of(plan)
    # Importable without metadata (a source checkout on PYTHONPATH): checked, and said so.
    assert steps["import:no-metadata"].args == {"modules": ["no_metadata"], "what": "no-metadata (no metadata)"}
    assert steps["import:msgspec"] == Step("import:msgspec", "import", "imports", 180.0, {"modules": ["msgspec"], "what": "msgspec 0.19"})


def probe_layout(plan: checks.Plan) -> list[tuple[str, list[str], str]]:
    return [(p.name, [s.name for s in p.steps], p.on_hang) for p in plan.probes]


def test_gpu_probes_spread_torch_heavy_imports_and_framework_checks_over_the_cores(
    monkeypatch: pytest.MonkeyPatch, machine: dict[str, Any]
) -> None:
    plan = plan_of(monkeypatch, targets=[target("a-light"), target("torch"), target("verl"), target("b-light")])
    # Weights: torch 4, heavy 3 (verl; transformer_engine without Megatron-Bridge), framework 2, light 1;
    # longest first onto the least loaded of 2 probes (by hand: 4|3, 4|6, 6|6, 8|6, 8|7, 8|8).
    assert probe_layout(plan) == [
        ("imports-0", ["import:torch", "triton_launcher", "allocator_switch"], "continue"),
        ("imports-1", ["import:verl", "transformer_engine", "import:a-light", "import:b-light"], "continue"),
    ]
    steps = steps_of(plan)
    assert steps["transformer_engine"] == Step("transformer_engine", "transformer_engine", "framework", 120.0)
    assert steps["triton_launcher"] == Step("triton_launcher", "triton_launcher", "framework", 120.0)
    assert steps["allocator_switch"] == Step("allocator_switch", "allocator_switch", "framework", 120.0,
                                             {"device": "gpu", "required": True})  # fmt: skip


def test_transformer_engine_runs_after_megatron_bridge_in_its_process(monkeypatch: pytest.MonkeyPatch, machine: dict[str, Any]) -> None:
    plan = plan_of(monkeypatch, targets=[target("Megatron_Bridge"), target("torch"), target("x")], expandable_segments=False)
    # megatron-bridge (3) carries transformer_engine; torch 4; framework 2; x 1 (by hand: 4|3, 4|5, 6|5, 6|6).
    assert probe_layout(plan) == [
        ("imports-0", ["import:torch", "allocator_switch"], "continue"),
        ("imports-1", ["import:Megatron_Bridge", "transformer_engine", "triton_launcher", "import:x"], "continue"),
    ]
    assert steps_of(plan)["allocator_switch"].args == {"device": "gpu", "required": False}


def test_npu_imports_run_without_torch_npu_autoload_and_check_torch_npu_on_its_own(
    monkeypatch: pytest.MonkeyPatch, machine: dict[str, Any]
) -> None:
    monkeypatch.setattr(checks, "_usable_cores", lambda: 1)
    environ = {"HF_HOME": "/hf", "ASCEND_HOME_PATH": "/toolkit"}
    plan = plan_of(monkeypatch, "npu", 2, targets=[target("megatron-bridge"), target("x")], environ=environ)
    imports, device = plan.probes
    assert (imports.name, [s.name for s in imports.steps]) == (
        "imports-0", ["import:megatron-bridge", "torch_npu", "allocator_switch", "import:x"]
    )
    assert imports.env == {**environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    assert device.env == environ  # the device checks load torch_npu as the trainer does
    assert steps_of(plan)["torch_npu"] == Step("torch_npu", "torch_npu", "framework", 120.0)


def test_gpu_imports_keep_the_environment(monkeypatch: pytest.MonkeyPatch, machine: dict[str, Any]) -> None:
    plan = plan_of(monkeypatch, environ={"HF_HOME": "/hf"}, targets=[target("x")])
    assert [p.env for p in plan.probes] == [{"HF_HOME": "/hf"}, {"HF_HOME": "/hf"}]


@pytest.mark.parametrize(("cores", "probes"), [(1, 1), (3, 3), (16, 4)])
def test_imports_use_as_many_probes_as_cores_and_at_most_4(
    monkeypatch: pytest.MonkeyPatch, machine: dict[str, Any], cores: int, probes: int
) -> None:
    monkeypatch.setattr(checks, "_usable_cores", lambda: cores)
    plan = plan_of(monkeypatch, targets=[target(f"d{i}") for i in range(8)])
    assert [p.name for p in plan.probes] == [f"imports-{i}" for i in range(probes)]


@pytest.mark.parametrize(("device", "device_type", "backend"), [("gpu", "cuda", "nccl"), ("npu", "npu", "hccl")])
def test_with_devices_the_device_probe_runs_its_checks_in_order_and_stops_after_a_hang(
    monkeypatch: pytest.MonkeyPatch, machine: dict[str, Any], device: str, device_type: str, backend: str
) -> None:
    plan = plan_of(monkeypatch, device, visible=8, assumed_memory=(80.0, "an H100 80GB"))
    probe = plan.probes[-1]
    assert (probe.name, probe.on_hang) == ("device", "stop")
    args = {"device_type": device_type}
    assert probe.steps == [
        Step("devices", "devices", "device", 60.0, {**args, "nodes": 8}),
        Step("memory", "memory", "device", 60.0, {**args, "assumed_gib": 80.0, "assumed_source": "an H100 80GB"}),
        Step("matmul", "matmul", "device", 60.0, args),
        Step("expandable_segments", "expandable_segments", "device", 60.0, args),
        Step("collective", "collective", "device", 60.0, {**args, "backend": backend}),
    ]
    assert "devices" not in [name for name, _, _ in plan.local]
    # Without an estimate to compare with, the memory check only reads the free memory.
    assert steps_of(plan_of(monkeypatch, device, visible=1))["memory"].args == args


def test_timeout_sets_every_checks_limit(monkeypatch: pytest.MonkeyPatch, machine: dict[str, Any]) -> None:
    plan = plan_of(monkeypatch, visible=1, targets=[target("x")], timeout_s=7.5)
    assert {step.timeout_s for step in steps_of(plan).values()} == {7.5}


def test_default_limits_are_180_s_an_import_120_s_a_framework_check_60_s_on_a_device(
    monkeypatch: pytest.MonkeyPatch, machine: dict[str, Any]
) -> None:
    plan = plan_of(monkeypatch, visible=1, targets=[target("x")])
    limits = {step.category: step.timeout_s for step in steps_of(plan).values()}
    assert limits == {"imports": 180.0, "framework": 120.0, "device": 60.0}


@pytest.mark.parametrize(("module", "exists"), [("json", True), ("doctor_no_such_module", False),
                                                 ("json.no_such.deeper", False), ("..relative", False)])  # fmt: skip
def test_a_module_that_cannot_be_found_is_not_installed(module: str, exists: bool) -> None:
    assert checks._spec_exists(module) is exists


def test_a_module_loaded_without_a_spec_is_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "doctor_specless", types.ModuleType("doctor_specless"))
    sys.modules["doctor_specless"].__spec__ = None  # find_spec raises ValueError for it
    assert checks._spec_exists("doctor_specless") is False


def test_a_local_check_is_timed_and_one_that_raises_is_its_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([10.0, 12.5, 20.0, 20.25])
    monkeypatch.setattr(checks, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    assert checks.run_local("shm", "environment", lambda: ("warn", "small")) == CheckResult(
        "shm", "environment", "warn", "small", 2.5, None
    )

    def broken() -> tuple[str, str]:
        raise OSError("statvfs failed")

    assert checks.run_local("shm", "environment", broken) == CheckResult(
        "shm", "environment", "fail", "OSError: statvfs failed", 0.25, None
    )
