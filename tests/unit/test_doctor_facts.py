"""doctor's environment report, read in-process: labels and locks, Python, user, torch's CUDA, driver tools.

Each fact is read from what a real machine has: files written as the image stages write them,
version files laid out as the CUDA wheel and the CANN toolkit lay them out, and driver tools
(nvidia-smi, npu-smi) that are small shell scripts on PATH answering as the real ones do, fail
as they fail, or hang as a hung driver makes them hang.
"""

from __future__ import annotations

import hashlib
import os
import platform
import pwd
import sys
import time
from importlib.machinery import ModuleSpec
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recipe.doctor import facts

NVIDIA_QUERY = "nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader"


def tool(bin_dir: Path, name: str, script: str) -> Path:
    """An executable shell script NAME in bin_dir (made first on PATH by `on_path`)."""
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    return path


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH holding only the fake tools and the shell's basics: no real nvidia-smi or npu-smi is found."""
    folder = tmp_path / "bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}/usr/bin{os.pathsep}/bin")
    return folder


@pytest.fixture
def no_driver_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver's version files are absent (whatever this host has)."""
    monkeypatch.setattr(facts, "NVIDIA_PROC_VERSION", tmp_path / "absent" / "nvidia-version")
    monkeypatch.setattr(facts, "ASCEND_DRIVER_VERSION", tmp_path / "absent" / "version.info")
    monkeypatch.setattr(facts, "ASCEND_TOOLKIT_DEFAULT", tmp_path / "absent" / "toolkit")


# --- image labels and locks ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, Path("/etc/grpo-recipe")),
        ({"RECIPE_IMAGE_INFO_DIR": ""}, Path("/etc/grpo-recipe")),  # set but empty: the default, not the cwd
        ({"RECIPE_IMAGE_INFO_DIR": "/opt/info"}, Path("/opt/info")),
    ],
)
def test_the_image_info_dir_is_etc_grpo_recipe_unless_the_variable_moves_it(environ: dict[str, str], expected: Path) -> None:
    assert facts.image_info_dir(environ) == expected


def test_outside_an_image_there_are_no_labels(tmp_path: Path) -> None:
    assert facts.read_labels(tmp_path) is None
    (tmp_path / "labels.d").write_text("a file, not the folder")
    assert facts.read_labels(tmp_path) is None


def test_labels_are_read_in_file_name_order_a_later_stage_overriding_its_base(tmp_path: Path) -> None:
    folder = tmp_path / "labels.d"
    folder.mkdir()
    # Written out of order on purpose: the names, not the creation order, decide.
    (folder / "20-recipe.labels").write_text(
        "# written by the recipe stage\n"
        "# io.grpo-recipe.device=npu (a comment, not a label)\n"
        "\n"
        "  io.grpo-recipe.framework = full  \n"
        "org.opencontainers.image.version=0.4.0\n"
        "io.grpo-recipe.build-args=A=1,B=2\n"  # a value may hold '=': only the first one splits
        "not a label line\n"
    )
    (folder / "10-framework.labels").write_text("io.grpo-recipe.framework=core\nio.grpo-recipe.torch.version=2.11.0\n")
    (folder / "notes.txt").write_text("ignored=yes\n")
    labels, files = facts.read_labels(tmp_path) or ({}, [])
    assert labels == {
        "io.grpo-recipe.framework": "full",
        "io.grpo-recipe.torch.version": "2.11.0",
        "org.opencontainers.image.version": "0.4.0",
        "io.grpo-recipe.build-args": "A=1,B=2",
    }
    assert files == [str(folder / "10-framework.labels"), str(folder / "20-recipe.labels")]


def test_an_unreadable_labels_file_is_skipped_and_the_later_ones_still_count(tmp_path: Path) -> None:
    folder = tmp_path / "labels.d"
    folder.mkdir()
    (folder / "10-broken.labels").mkdir()  # reading it fails (a folder): the labels check names what is missing
    (folder / "20-recipe.labels").write_bytes(b"io.grpo-recipe.device=gpu\nio.grpo-recipe.note=caf\xe9\n")
    labels, files = facts.read_labels(tmp_path) or ({}, [])
    # Bytes that are not UTF-8 are replaced, not a crash of the whole report.
    assert labels == {"io.grpo-recipe.device": "gpu", "io.grpo-recipe.note": "caf\ufffd"}
    assert files == [str(folder / "10-broken.labels"), str(folder / "20-recipe.labels")]


def test_each_lock_file_is_reported_with_its_sha256(tmp_path: Path) -> None:
    (tmp_path / "requirements.lock").write_bytes(b"verl==0.9.1 \\\n    --hash=sha256:00\n")
    (tmp_path / "a.lock").write_bytes(b"")
    (tmp_path / "folder.lock").mkdir()  # not a file: no digest
    (tmp_path / "labels.d").mkdir()
    assert facts.lock_digests(tmp_path) == {
        "a.lock": hashlib.sha256(b"").hexdigest(),
        "requirements.lock": hashlib.sha256(b"verl==0.9.1 \\\n    --hash=sha256:00\n").hexdigest(),
    }
    assert list(facts.lock_digests(tmp_path)) == ["a.lock", "requirements.lock"]
    assert facts.lock_digests(tmp_path / "absent") == {}



def test_a_path_the_os_refuses_to_look_at_is_no_image(tmp_path: Path) -> None:
    """A folder name past NAME_MAX (ENAMETOOLONG from stat): no labels, no locks, as outside an image."""
    too_long = tmp_path / ("x" * 300)
    assert facts.read_labels(too_long) is None
    assert facts.lock_digests(too_long) == {}


@settings(max_examples=200)
@given(value=st.text(max_size=600) | st.builds(lambda n: "/" + "d" * n, st.integers(200, 5000)))
def test_any_image_info_dir_gives_image_facts_never_an_exception(value: str) -> None:
    """RECIPE_IMAGE_INFO_DIR is read from the environment by plan, run and doctor: whatever it holds, the facts come back."""
    from recipe.provenance import image_facts

    found = image_facts({facts.IMAGE_INFO_VARIABLE: value})
    assert set(found) == {"labels", "locks"}
    assert found["labels"] is None or isinstance(found["labels"], dict)

# --- versions, Python, user -------------------------------------------------------------------


def test_a_distribution_version_comes_from_its_metadata_and_none_when_absent() -> None:
    from importlib import metadata

    assert facts.distribution_version("packaging") == metadata.version("packaging")
    assert facts.distribution_version("doctor-no-such-distribution") is None


def test_python_facts_are_this_interpreters() -> None:
    assert facts.python_facts() == {
        "version": platform.python_version(),
        "implementation": platform.python_implementation(),
        "executable": sys.executable,
        "machine": platform.machine(),
    }


def test_user_facts_name_the_uid_and_sorted_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "getgroups", lambda: [27, 0, 1000])
    found = facts.user_facts()
    assert found == {"uid": os.getuid(), "gid": os.getgid(), "name": pwd.getpwuid(os.getuid()).pw_name,
                     "groups": [0, 27, 1000]}  # fmt: skip


def test_a_uid_without_a_passwd_entry_has_no_name(monkeypatch: pytest.MonkeyPatch) -> None:
    # `docker run --user 4242` on an image whose /etc/passwd has no such user.
    def no_entry(uid: int) -> pwd.struct_passwd:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    assert facts.user_facts()["name"] is None


def fake_torch(root: Path, version_py: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A torch package at root/torch whose version.py says VERSION_PY (None: no such file); found, not imported."""
    package = root / "torch"
    package.mkdir(parents=True)
    if version_py is not None:
        (package / "version.py").write_text(version_py)
    spec = ModuleSpec("torch", None, is_package=True)
    spec.submodule_search_locations = [str(package)]
    monkeypatch.setattr(facts, "find_spec", lambda name: spec if name == "torch" else None)


@pytest.mark.parametrize(
    ("version_py", "expected"),
    [
        # torch's generated version.py, as the CUDA wheels write it
        (("from typing import Optional\n__version__ = '2.11.0+cu130'\ndebug = False\ncuda: Optional[str] = '13.0'\n"
         "git_version = 'abc'\nhip: Optional[str] = None\n"), "13.0"),
        ('__version__ = "2.8.0+cu128"\ncuda = "12.8"\n', "12.8"),
        ("__version__ = '2.11.0+cpu'\ncuda: Optional[str] = None\n", None),  # a CPU build
        ("cudnn = '9.1'\n", None),  # another name that starts with cuda
        ("# cuda = '12.8'\n", None),  # not at the start of a line
    ],
)
def test_torchs_cuda_version_is_read_from_its_version_file_without_importing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version_py: str, expected: str | None
) -> None:
    fake_torch(tmp_path, version_py, monkeypatch)
    assert facts.torch_cuda_version() == expected


def test_no_torch_or_no_version_file_is_no_cuda_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_torch(tmp_path, None, monkeypatch)
    assert facts.torch_cuda_version() is None
    monkeypatch.setattr(facts, "find_spec", lambda name: None)
    assert facts.torch_cuda_version() is None
    # A namespace-less module spec (a torch.py, not a package): nowhere to look.
    monkeypatch.setattr(facts, "find_spec", lambda name: ModuleSpec("torch", None))
    assert facts.torch_cuda_version() is None


# --- driver tools --------------------------------------------------------------------------


def test_a_missing_tool_is_named(bin_dir: Path) -> None:
    assert facts._run_tool(["nvidia-smi", "-L"]) == (None, "nvidia-smi not found")


def test_a_tool_that_answers_gives_its_output(bin_dir: Path) -> None:
    tool(bin_dir, "npu-smi", 'echo "npu-smi $1"; echo "to stderr" >&2\n')
    assert facts._run_tool(["npu-smi", "info"]) == ("npu-smi info\n", None)


def test_output_that_is_not_utf8_is_replaced_not_a_crash(bin_dir: Path) -> None:
    tool(bin_dir, "nvidia-smi", "printf 'GPU \\377\\n'\n")
    assert facts._run_tool(["nvidia-smi"]) == ("GPU \ufffd\n", None)


@pytest.mark.parametrize(
    ("script", "reason"),
    [
        # The last line said, from stdout then stderr, stripped: what the driver complained about.
        (("echo 'NVIDIA-SMI has failed'; echo '  Failed to initialize NVML: Driver/library version mismatch  ' >&2;"
         " echo >&2; exit 18\n"), "nvidia-smi -L exited 18: Failed to initialize NVML: Driver/library version mismatch"),
        ("echo 'only stdout'; exit 9\n", "nvidia-smi -L exited 9: only stdout"),
        ("exit 3\n", "nvidia-smi -L exited 3: "),
        (f"echo y{'x' * 299} >&2; exit 1\n", f"nvidia-smi -L exited 1: y{'x' * 199}"),  # one line, cut at 200
        ("printf 'NVML: bad \\377 byte\\n' >&2; exit 4\n", "nvidia-smi -L exited 4: NVML: bad \ufffd byte"),
    ],
)
def test_a_tool_that_fails_is_named_with_its_exit_code_and_last_line(bin_dir: Path, script: str, reason: str) -> None:
    tool(bin_dir, "nvidia-smi", script)
    assert facts._run_tool(["nvidia-smi", "-L"]) == (None, reason)


def test_a_tool_never_waits_on_doctors_stdin(bin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`docker compose run` attaches a terminal: a tool that asks a question must not wait for an answer."""
    tool(bin_dir, "npu-smi", 'read answer; echo "answer=$answer"\n')
    monkeypatch.setattr(facts, "DRIVER_TOOL_TIMEOUT_S", 5.0)
    terminal, _writer = os.pipe()  # a stdin that is open and never answers
    saved = os.dup(0)
    os.dup2(terminal, 0)
    try:
        assert facts._run_tool(["npu-smi", "info"]) == ("answer=\n", None)
    finally:
        os.dup2(saved, 0)
        for fd in (saved, terminal, _writer):
            os.close(fd)


def test_a_tool_that_cannot_be_executed_is_named_with_the_os_error(bin_dir: Path) -> None:
    broken = bin_dir / "npu-smi"
    broken.write_bytes(b"\x7fELF\x00not really")  # executable bit, but no program the kernel can run
    broken.chmod(0o755)
    assert facts._run_tool(["npu-smi", "info"]) == (None, "npu-smi: Exec format error")


def test_a_hung_tool_is_killed_and_doctor_goes_on(bin_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hung driver makes nvidia-smi hang: after the timeout it is killed (not waited for) and named as hung."""
    pid_file = tmp_path / "pid"
    tool(bin_dir, "nvidia-smi", f"echo $$ > {pid_file}\nexec sleep 5\n")
    monkeypatch.setattr(facts, "DRIVER_TOOL_TIMEOUT_S", 0.5)
    began = time.monotonic()
    assert facts._run_tool(["nvidia-smi", "-q"]) == (None, "nvidia-smi -q gave no answer in 0.5 s (hung driver?)")
    assert time.monotonic() - began < 5  # not the tool's 5 s: it was killed
    with pytest.raises(ProcessLookupError):  # killed and reaped, not left running
        os.kill(int(pid_file.read_text()), 0)


NVIDIA_SMI = """case "$*" in
  "--query-gpu=index,name,driver_version,memory.total --format=csv,noheader") printf '%s\\n' {rows};;
  "") echo "| NVIDIA-SMI 550.54.15    Driver Version: 550.54.15    CUDA Version: {cuda} |";;
  *) echo "unexpected arguments: $*" >&2; exit 2;;
esac
"""


def nvidia_smi(bin_dir: Path, rows: list[str], cuda: str = "12.4") -> None:
    quoted = " ".join(f"'{row}'" for row in rows)
    tool(bin_dir, "nvidia-smi", NVIDIA_SMI.replace("{rows}", quoted).replace("{cuda}", cuda))


def test_nvidia_facts_come_from_nvidia_smi_and_the_kernel_module(
    bin_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_driver_files: None
) -> None:
    proc = tmp_path / "nvidia-version"
    proc.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build  (dvs-builder)\n"
                    "GCC version:  gcc version 12.3.0\n")  # fmt: skip
    monkeypatch.setattr(facts, "NVIDIA_PROC_VERSION", proc)
    nvidia_smi(bin_dir, ["0, NVIDIA H200, 570.86.15, 143771 MiB", "1,NVIDIA H200 ,570.86.15,143771 MiB", ""], cuda="12.8")
    found = facts.nvidia_driver()
    assert found.problem is None
    assert found.facts == {
        "kernel_module": "570.86.15",
        "gpus": [
            {"index": "0", "name": "NVIDIA H200", "driver_version": "570.86.15", "memory_total": "143771 MiB"},
            {"index": "1", "name": "NVIDIA H200", "driver_version": "570.86.15", "memory_total": "143771 MiB"},
        ],
        "driver_version": "570.86.15",
        "cuda_driver_version": "12.8",
    }


@pytest.mark.parametrize(
    ("proc_text", "kernel_module"),
    [
        ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:05 UTC 2024\n", "550.54.15"),
        ("NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.65.06  Release Build\n", "580.65.06"),
        ("  NVRM version: something new  \nsecond line \xff\n", "NVRM version: something new"),  # unknown: its first line
    ],
)
def test_the_kernel_module_version_is_read_from_proc(
    bin_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_driver_files: None, proc_text: str, kernel_module: str
) -> None:
    proc = tmp_path / "nvidia-version"
    proc.write_bytes(proc_text.encode("latin-1"))  # \xff: a byte that is not UTF-8 is no crash
    monkeypatch.setattr(facts, "NVIDIA_PROC_VERSION", proc)
    found = facts.nvidia_driver()
    assert found.facts == {"kernel_module": kernel_module}
    # The module is loaded, yet its tool is missing: that is the problem to report.
    assert found.problem == "nvidia-smi not found"


def test_a_short_nvidia_smi_row_gives_the_driver_version_but_no_gpu(bin_dir: Path, no_driver_files: None) -> None:
    nvidia_smi(bin_dir, ["0, NVIDIA H200, 570.86.15"], cuda="")  # and a table without a CUDA version
    assert facts.nvidia_driver().facts == {"gpus": [], "driver_version": "570.86.15"}
    nvidia_smi(bin_dir, ["0, NVIDIA H200"])
    assert facts.nvidia_driver().facts == {"gpus": [], "cuda_driver_version": "12.4"}
    nvidia_smi(bin_dir, [])  # no GPU listed at all
    assert facts.nvidia_driver().facts == {"gpus": [], "cuda_driver_version": "12.4"}


def test_no_nvidia_driver_at_all_is_no_facts_and_no_problem(bin_dir: Path, no_driver_files: None) -> None:
    found = facts.nvidia_driver()
    assert (found.facts, found.problem) == ({}, None)


def test_an_nvidia_smi_that_fails_is_the_problem_even_without_the_kernel_module(bin_dir: Path, no_driver_files: None) -> None:
    tool(bin_dir, "nvidia-smi", "echo 'Failed to initialize NVML: Driver/library version mismatch' >&2; exit 18\n")
    found = facts.nvidia_driver()
    assert found.facts == {}
    assert found.problem == f"{NVIDIA_QUERY} exited 18: Failed to initialize NVML: Driver/library version mismatch"


# --- Ascend: driver, CANN, npu-smi ---------------------------------------------------------


def toolkit(home: Path, install_info: str | None = None, version_cfg: str | None = None) -> Path:
    """A CANN toolkit home as the installer lays it out: <arch>/ascend_toolkit_install.info, version.cfg."""
    home.mkdir(parents=True)
    if install_info is not None:
        (home / "aarch64-linux").mkdir()
        (home / "aarch64-linux" / "ascend_toolkit_install.info").write_text(install_info)
    if version_cfg is not None:
        (home / "version.cfg").write_text(version_cfg)
    return home


def test_cann_version_files_are_read_from_each_toolkit_home_once_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = toolkit(tmp_path / "first", install_info="version=8.1.RC1\n")
    second = toolkit(tmp_path / "second", version_cfg="runtime_version=[8.0.0]\n")
    # An install.info that cannot be read (here a folder) does not hide the version.cfg beside it.
    (second / "x86_64-linux" / "ascend_toolkit_install.info").mkdir(parents=True)
    (second / "version.cfg").write_bytes(b"runtime_version=[8.0.0]\n# \xff\n")
    default = toolkit(tmp_path / "default", install_info="version=7.0.0\n", version_cfg="[version]\n")
    monkeypatch.setattr(facts, "ASCEND_TOOLKIT_DEFAULT", default)
    environ = {"ASCEND_TOOLKIT_HOME": str(first), "ASCEND_HOME_PATH": str(second)}
    assert facts.cann_version_files(environ) == [
        (first / "aarch64-linux" / "ascend_toolkit_install.info", "version=8.1.RC1\n"),
        (second / "version.cfg", "runtime_version=[8.0.0]\n# \ufffd\n"),
        (default / "aarch64-linux" / "ascend_toolkit_install.info", "version=7.0.0\n"),
        (default / "version.cfg", "[version]\n"),
    ]
    # set_env.sh sets both variables to the same home: it is read once.
    same = {"ASCEND_TOOLKIT_HOME": str(default), "ASCEND_HOME_PATH": str(default)}
    assert [path for path, _ in facts.cann_version_files(same)] == [
        default / "aarch64-linux" / "ascend_toolkit_install.info", default / "version.cfg"
    ]


@pytest.mark.parametrize(
    ("install_info", "version_cfg", "expected"),
    [
        ("package_name=Ascend-cann-toolkit\nversion=8.1.RC1\ninnerversion=V100R001\n", None, ("8.1.RC1", "info")),
        ("package_name=Ascend-cann-toolkit\nVersion = [9.1.0]\n", None, ("9.1.0", "info")),
        (None, "[version]\nruntime_running_version=[8.0.0.beta1:8.0.RC3]\n", ("8.0.0.beta1", "cfg")),
        ("package_name=Ascend-cann-toolkit\n", "toolkit_version=[8.0.RC3]\n", ("8.0.RC3", "cfg")),  # the first with one
        ("package_name=Ascend-cann-toolkit\n", None, (None, None)),
        (None, None, (None, None)),
    ],
)
def test_the_cann_version_is_the_first_one_a_version_file_states(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    install_info: str | None, version_cfg: str | None, expected: tuple[str | None, str | None],
) -> None:  # fmt: skip
    home = toolkit(tmp_path / "toolkit", install_info, version_cfg)
    monkeypatch.setattr(facts, "ASCEND_TOOLKIT_DEFAULT", tmp_path / "absent")
    files = {"info": str(home / "aarch64-linux" / "ascend_toolkit_install.info"), "cfg": str(home / "version.cfg")}
    version, source = expected
    assert facts.cann_version_text({"ASCEND_TOOLKIT_HOME": str(home)}) == (version, files.get(source or ""))


def test_ascend_facts_come_from_the_driver_file_the_toolkit_and_npu_smi(
    bin_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_driver_files: None
) -> None:
    driver = tmp_path / "version.info"
    driver.write_text("package_version=x\nVersion=24.1.rc3\nascendhal_version=7.35.23\n")
    monkeypatch.setattr(facts, "ASCEND_DRIVER_VERSION", driver)
    home = toolkit(tmp_path / "toolkit", install_info="version=8.1.RC1\n")
    tool(bin_dir, "npu-smi", 'test "$1" = info || exit 2\necho "+---| npu-smi 24.1.rc3    Version: 24.1.rc3  |"\n')
    found = facts.ascend_driver({"ASCEND_HOME_PATH": str(home)})
    assert found.problem is None
    assert found.facts == {
        "driver_version": "24.1.rc3",
        "cann_version": "8.1.RC1",
        "cann_version_file": str(home / "aarch64-linux" / "ascend_toolkit_install.info"),
        "npu_smi_version": "24.1.rc3",
    }


@pytest.mark.parametrize(
    ("text", "version"),
    [(b"Version=24.1.rc3\n", "24.1.rc3"), (b"package=x\n  version = 25.0.rc1 \n", "25.0.rc1"),
     (b"\xff\nVersion=23.0.0\n", "23.0.0")],
)  # fmt: skip
def test_the_ascend_driver_version_is_read_from_version_info(
    bin_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_driver_files: None, text: bytes, version: str
) -> None:
    (tmp_path / "version.info").write_bytes(text)
    monkeypatch.setattr(facts, "ASCEND_DRIVER_VERSION", tmp_path / "version.info")
    assert facts.ascend_driver({}).facts == {"driver_version": version}


def test_ascend_driver_file_without_a_version_and_npu_smi_without_one(
    bin_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_driver_files: None
) -> None:
    driver = tmp_path / "version.info"
    driver.write_text("package_version=x\n")
    monkeypatch.setattr(facts, "ASCEND_DRIVER_VERSION", driver)
    tool(bin_dir, "npu-smi", "echo 'no version here'\n")
    found = facts.ascend_driver({})
    assert (found.facts, found.problem) == ({}, None)


@pytest.mark.parametrize(
    ("driver_file", "script", "problem"),
    [
        (None, None, None),  # no Ascend driver at all: nothing to complain about
        ("Version=24.1.rc3\n", None, "npu-smi not found"),  # the driver is there, its tool is not
        (None, "echo 'dcmi module initialize failed. ret is -8005' >&2; exit 1\n",
         "npu-smi info exited 1: dcmi module initialize failed. ret is -8005"),
    ],
)
def test_an_npu_smi_problem_is_reported_when_a_driver_is_there_or_the_tool_fails(
    bin_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_driver_files: None,
    driver_file: str | None, script: str | None, problem: str | None,
) -> None:  # fmt: skip
    if driver_file is not None:
        (tmp_path / "version.info").write_text(driver_file)
        monkeypatch.setattr(facts, "ASCEND_DRIVER_VERSION", tmp_path / "version.info")
    if script is not None:
        tool(bin_dir, "npu-smi", script)
    assert facts.ascend_driver({}).problem == problem


def test_driver_facts_ask_the_device_own_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    nvidia, ascend = facts.DriverFacts({"from": "nvidia"}), facts.DriverFacts({"from": "ascend"})
    asked: list[object] = []
    monkeypatch.setattr(facts, "nvidia_driver", lambda: nvidia)
    monkeypatch.setattr(facts, "ascend_driver", lambda environ: asked.append(environ) or ascend)
    environ = {"ASCEND_HOME_PATH": "/x"}
    assert facts.driver_facts("gpu", environ) is nvidia
    assert facts.driver_facts("npu", environ) is ascend
    assert asked == [environ]
