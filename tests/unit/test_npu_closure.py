"""docker/npu/closure.py on tiny shared objects compiled here and zipped into fake wheels.

No network: gcc builds four one-function libraries for the host, each test packs some of
them into wheels and checks that the closure check passes when every DT_NEEDED entry is
provided and fails, naming wheel, file and soname, when one is not.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

from .envtools import REPO

pytest.importorskip("elftools", reason="pyelftools not installed (pip install pyelftools==0.33)")
CC = shutil.which("gcc") or shutil.which("cc")
pytestmark = pytest.mark.skipif(CC is None, reason="needs a C compiler to build the test libraries")


def _load_closure() -> ModuleType:
    """Import docker/npu/closure.py (a script, not a package) as a module."""
    spec = importlib.util.spec_from_file_location("npu_closure", REPO / "docker" / "npu" / "closure.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


closure = _load_closure()

SOURCES = {
    # the library nobody ships: only linked against, never packed into a wheel
    "libnobody.so": ("int nobody(void) { return 1; }\n", []),
    # libbase.so calls puts(), so it needs libc.so.6 with a GLIBC_2.x symbol version
    "libbase.so": ('#include <stdio.h>\nint base(const char *s) { return puts(s); }\n', []),
    # the same soname, but this build also needs libnobody.so
    "libbase-bad.so": (
        '#include <stdio.h>\nint nobody(void);\nint base(const char *s) { return puts(s) + nobody(); }\n',
        ["-lnobody"],
    ),
    # an extension that needs libbase.so and finds it through RUNPATH $ORIGIN/../base/lib
    "ext-rpath.so": (
        'int base(const char *s);\nint ext(void) { return base("x"); }\n',
        ["-lbase", "-Wl,-rpath,$ORIGIN/../base/lib"],
    ),
    # the same extension without a RUNPATH
    "ext-plain.so": ('int base(const char *s);\nint ext(void) { return base("x"); }\n', ["-lbase"]),
    # an extension that needs libnobody.so
    "ext-bad.so": ("int nobody(void);\nint bad(void) { return nobody(); }\n", ["-lnobody"]),
}


@pytest.fixture(scope="module")
def libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Compile SOURCES once; returns file name -> built shared object."""
    assert CC is not None
    build = tmp_path_factory.mktemp("elf")
    built: dict[str, Path] = {}
    for name in ("libnobody.so", "libbase.so", "libbase-bad.so", "ext-rpath.so", "ext-plain.so", "ext-bad.so"):
        source, flags = SOURCES[name]
        c_file = build / f"{name}.c"
        c_file.write_text(source)
        soname = "libbase.so" if name.startswith("libbase") else name
        out = build / name
        # libbase-bad.so must not shadow libbase.so for the links that follow
        link_dir = build / "link"
        link_dir.mkdir(exist_ok=True)
        cmd = [CC, "-shared", "-fPIC", "-O1", f"-Wl,-soname,{soname}", "-o", str(out), str(c_file), f"-L{link_dir}", *flags]
        subprocess.run(cmd, check=True, capture_output=True)
        if name in ("libnobody.so", "libbase.so"):
            shutil.copy(out, link_dir / name)
        built[name] = out
    return built


def _wheel(directory: Path, dist: str, files: dict[str, Path], version: str = "1.0") -> Path:
    """A minimal wheel DIST-VERSION holding FILES (member path -> local file)."""
    path = directory / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for member, local in files.items():
            archive.write(local, member)
        info = f"{dist}-{version}.dist-info"
        archive.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")
    return path


def _needed(obj_path: Path) -> tuple[str, ...]:
    """DT_NEEDED of one built file, read through the checker's own reader."""
    with obj_path.open("rb") as stream:
        obj = closure.read_elf(stream, obj_path, obj_path.name)
    assert obj is not None
    needed: tuple[str, ...] = obj.needed
    return needed


def test_the_test_libraries_need_what_the_tests_assume(libs: dict[str, Path]) -> None:
    assert "libnobody.so" in _needed(libs["ext-bad.so"])
    assert "libnobody.so" in _needed(libs["libbase-bad.so"])
    assert "libbase.so" in _needed(libs["ext-rpath.so"])
    assert "libc.so.6" in _needed(libs["libbase.so"])


def test_closed_when_a_wheel_provides_the_library_on_the_runpath(tmp_path: Path, libs: dict[str, Path]) -> None:
    _wheel(tmp_path, "base", {"base/lib/libbase.so": libs["libbase.so"]})
    _wheel(tmp_path, "ext", {"ext/_ext.so": libs["ext-rpath.so"]})
    report = closure.check(tmp_path, roots=["ext"])
    assert report.ok
    kinds = {(r.obj.member, r.soname): r.kind for r in report.resolutions}
    assert kinds[("ext/_ext.so", "libbase.so")] == "rpath"
    assert kinds[("base/lib/libbase.so", "libc.so.6")] == "system"


def test_the_closure_follows_needed_libraries_into_other_wheels(tmp_path: Path, libs: dict[str, Path]) -> None:
    _wheel(tmp_path, "base", {"base/lib/libbase.so": libs["libbase.so"]})
    _wheel(tmp_path, "ext", {"ext/_ext.so": libs["ext-rpath.so"]})
    report = closure.check(tmp_path, roots=["ext"])
    assert {o.member for o in report.checked} == {"ext/_ext.so", "base/lib/libbase.so"}


def test_unresolved_library_fails_naming_wheel_file_and_soname(tmp_path: Path, libs: dict[str, Path]) -> None:
    _wheel(tmp_path, "bad", {"bad/_bad.so": libs["ext-bad.so"]})
    report = closure.check(tmp_path, roots=["bad"])
    assert not report.ok
    assert [(r.obj.wheel, r.obj.member, r.soname) for r in report.unresolved] == [
        ("bad-1.0-py3-none-any.whl", "bad/_bad.so", "libnobody.so")
    ]


def test_a_library_on_the_cann_list_resolves(tmp_path: Path, libs: dict[str, Path]) -> None:
    _wheel(tmp_path, "bad", {"bad/_bad.so": libs["ext-bad.so"]})
    report = closure.check(tmp_path, roots=["bad"], cann={"libnobody.so"})
    assert report.ok
    assert report.cann_sonames() == {"libnobody.so": {"bad"}}


def test_a_gap_in_a_dependency_wheel_fails_the_root(tmp_path: Path, libs: dict[str, Path]) -> None:
    _wheel(tmp_path, "base", {"base/lib/libbase.so": libs["libbase-bad.so"]})
    _wheel(tmp_path, "ext", {"ext/_ext.so": libs["ext-rpath.so"]})
    report = closure.check(tmp_path, roots=["ext"])
    assert [(r.obj.member, r.soname) for r in report.unresolved] == [("base/lib/libbase.so", "libnobody.so")]


def test_wheels_outside_the_closure_are_checked_only_with_all(tmp_path: Path, libs: dict[str, Path]) -> None:
    _wheel(tmp_path, "base", {"base/lib/libbase.so": libs["libbase.so"]})
    _wheel(tmp_path, "ext", {"ext/_ext.so": libs["ext-rpath.so"]})
    _wheel(tmp_path, "bad", {"bad/_bad.so": libs["ext-bad.so"]})
    assert closure.check(tmp_path, roots=["ext"]).ok
    assert not closure.check(tmp_path, every_wheel=True).ok


def test_a_library_found_only_by_name_is_reported_as_such(tmp_path: Path, libs: dict[str, Path]) -> None:
    _wheel(tmp_path, "base", {"base/lib/libbase.so": libs["libbase.so"]})
    _wheel(tmp_path, "ext", {"ext/_ext.so": libs["ext-plain.so"]})
    report = closure.check(tmp_path, roots=["ext"])
    assert report.ok
    (entry,) = [r for r in report.resolutions if r.soname == "libbase.so"]
    assert entry.kind == "wheel"


def test_a_glibc_symbol_version_above_the_ceiling_fails(
    tmp_path: Path, libs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    _wheel(tmp_path, "base", {"base/lib/libbase.so": libs["libbase.so"]})
    assert closure.check(tmp_path, roots=["base"]).ok
    monkeypatch.setitem(closure.SYSTEM_VERSION_CEILINGS, "GLIBC", (2, 0))
    report = closure.check(tmp_path, roots=["base"])
    assert not report.ok
    assert {(obj.member, library) for obj, library, _ in report.version_failures} == {("base/lib/libbase.so", "libc.so.6")}


def test_lock_selects_pinned_wheels_and_fails_on_a_missing_pin(tmp_path: Path, libs: dict[str, Path]) -> None:
    _wheel(tmp_path, "base", {"base/lib/libbase.so": libs["libbase.so"]})
    _wheel(tmp_path, "base", {"base/lib/libbase.so": libs["libbase-bad.so"]}, version="0.9")  # stale, not pinned
    _wheel(tmp_path, "ext", {"ext/_ext.so": libs["ext-rpath.so"]})
    pins = {"base": "1.0", "ext": "1.0"}
    assert closure.check(tmp_path, roots=["ext"], pins=pins).ok
    report = closure.check(tmp_path, roots=["ext"], pins={**pins, "absent-dist": "2.0"})
    assert report.missing_pins == ["absent-dist==2.0"]
    assert not report.ok


def test_cli_exits_1_and_lists_the_unresolved_library(tmp_path: Path, libs: dict[str, Path]) -> None:
    _wheel(tmp_path, "bad", {"bad/_bad.so": libs["ext-bad.so"]})
    empty = tmp_path / "cann.txt"
    empty.write_text("# nothing\n")
    done = subprocess.run(
        [sys.executable, str(REPO / "docker/npu/closure.py"), str(tmp_path), "--root", "bad", "--cann", str(empty)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "UNRESOLVED  bad-1.0-py3-none-any.whl  bad/_bad.so  libnobody.so" in done.stdout


def test_cli_exits_0_when_closed(tmp_path: Path, libs: dict[str, Path]) -> None:
    _wheel(tmp_path, "bad", {"bad/_bad.so": libs["ext-bad.so"]})
    cann = tmp_path / "cann.txt"
    cann.write_text("libnobody.so   toolkit   # stands for a CANN library\n")
    done = subprocess.run(
        [sys.executable, str(REPO / "docker/npu/closure.py"), str(tmp_path), "--root", "bad", "--cann", str(cann)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.rstrip().endswith("closed")


def test_the_cann_list_holds_sonames_only() -> None:
    names = closure.load_cann_list(REPO / "docker/npu/cann-libraries.txt")
    assert names and all(n.startswith("lib") and ".so" in n for n in names)
    assert not names & set(closure.SYSTEM_LIBRARIES)
