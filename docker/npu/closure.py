#!/usr/bin/env python3
"""Shared-library closure check of the npu image's wheels: CANN must be the only gap.

Usage:
    python docker/npu/closure.py WHEEL_DIR [--lock docker/npu/requirements.lock]
        [--root DIST ...] [--all] [--cann docker/npu/cann-libraries.txt]
        [--machine aarch64] [--verbose]

Reads the dynamically linked ELF files (shared libraries such as ``*.so``/``*.so.N`` and
executables such as ray's ``raylet``) inside the wheels of WHEEL_DIR, typically
``pip download --only-binary :all: -r docker/npu/requirements.lock`` (.ci/npu-closure.sh).
It starts from the root distributions (default: torch-npu and vllm-ascend; ``--all``: every
wheel) and follows their DT_NEEDED entries into whichever wheel provides each library
(torch's ``lib/``, auditwheel's ``<dist>.libs/`` folders, ...). Each needed soname must
resolve to one of:

1. ``rpath``:  a file of the wheel set found through the object's RUNPATH/RPATH
   (``$ORIGIN`` resolved in one virtual site-packages holding every wheel);
2. ``system``: a library of the image's Ubuntu 22.04 base (``SYSTEM_LIBRARIES``);
3. ``wheel``:  a file of that name elsewhere in the wheel set, outside the object's own
   search path: the loader finds it only because an earlier import loaded it already
   (``import torch`` before ``import torch_npu``); listed with ``--verbose``;
4. ``cann``:   a soname listed in ``cann-libraries.txt``: CANN's, which no wheel provides.

Every GLIBC/GLIBCXX/CXXABI symbol version asked of a base-system library must also exist
on Ubuntu 22.04 (glibc 2.35, GCC 12's libstdc++). Anything else is a failure, printed as
``UNRESOLVED wheel file soname`` / ``TOO NEW wheel file library version``, and the exit
status is 1. With ``--lock``, only the lock's pins are read, and a pin without its wheel in
WHEEL_DIR is a failure too (``MISSING name==version``). Exit 0: the wheels, the base system
and the listed CANN libraries close the graph. Exit 2: bad input.

Stdlib plus pyelftools (``pip install pyelftools==0.33``); the recipe never imports it.
"""

from __future__ import annotations

import argparse
import dataclasses
import posixpath
import re
import shutil
import sys
import tempfile
import zipfile
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO

from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerNeedSection

HERE = Path(__file__).resolve().parent
DEFAULT_CANN_LIST = HERE / "cann-libraries.txt"
DEFAULT_ROOTS = ("torch-npu", "vllm-ascend")

# Where the image's venv puts every wheel; used only to lay all wheels out in one virtual
# tree, so that $ORIGIN-relative RUNPATHs resolve across wheels (torch_npu -> torch/lib).
SITE_PACKAGES = "/opt/venv/lib/python3.12/site-packages"
PREFIX = "/opt/venv"

# Base-system libraries the npu image can rely on; its base is Ubuntu 22.04
# (quay.io/ascend/cann:*-ubuntu22.04-*), glibc 2.35. Each entry is in a package every
# Ubuntu 22.04 root has (priority "required", or gcc's dependencies, which both the CANN
# base and our framework stage install), and the first ones are on the manylinux policy's
# list of libraries a wheel may assume (PEP 600, auditwheel's policy.json), which is why
# wheels do not bundle them. Only what the check of the npu lock needs is listed; a new
# entry needs the same evidence.
SYSTEM_LIBRARIES: dict[str, str] = {
    # libc6 2.35 (glibc): C library, maths, the loader, and the pre-2.34 split-outs
    # (libdl/libpthread/librt/libutil are empty compatibility stubs since glibc 2.34).
    "libc.so.6": "libc6",
    "libm.so.6": "libc6",
    "libdl.so.2": "libc6",
    "libpthread.so.0": "libc6",
    "librt.so.1": "libc6",
    "libutil.so.1": "libc6",
    "libresolv.so.2": "libc6",
    "ld-linux-aarch64.so.1": "libc6",  # the aarch64 loader
    "ld-linux-x86-64.so.2": "libc6",  # the x86_64 loader (the unit test builds for the host)
    # GCC 12's C++ runtime in 22.04 (apt depends on libstdc++6; libgcc-s1 is required).
    "libstdc++.so.6": "libstdc++6",
    "libgcc_s.so.1": "libgcc-s1",
    # zlib1g (required: dpkg depends on it).
    "libz.so.1": "zlib1g",
    # libgomp1 is not "required", but gcc is in the image (the CANN base installs gcc/g++,
    # our framework stage keeps gcc for Triton): gcc -> libgcc-N-dev -> libgomp1. Only
    # numba's optional OpenMP threading layer (omppool) needs it, by its full file name,
    # which the loader finds in /usr/lib/<triplet>/ (numba falls back to its workqueue).
    "libgomp.so.1.0.0": "libgomp1",
}

# The newest symbol version each base-system family has on Ubuntu 22.04: glibc 2.35;
# libstdc++6 from GCC 12 (GLIBCXX_3.4.30, CXXABI_1.3.13).
SYSTEM_VERSION_CEILINGS: dict[str, tuple[int, ...]] = {
    "GLIBC": (2, 35),
    "GLIBCXX": (3, 4, 30),
    "CXXABI": (1, 3, 13),
}

_ELF_MAGIC = b"\x7fELF"
_VERSION = re.compile(r"^([A-Z]+)_(\d+(?:\.\d+)*)$")
_DLOPEN_CANDIDATE = re.compile(rb"lib[A-Za-z0-9_+\-]+\.so(?:\.\d+)*")
# The dynamic tags read, and the attribute pyelftools gives each one's string under.
_STRING_TAGS = {"DT_NEEDED": "needed", "DT_SONAME": "soname", "DT_RUNPATH": "runpath", "DT_RPATH": "rpath"}
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


@dataclasses.dataclass(frozen=True)
class ElfObject:
    """One dynamically linked ELF file (shared library or executable) found in a wheel."""

    wheel: str  # the wheel's file name
    distribution: str  # normalised distribution name (torch-npu)
    path: str  # its installed path in the virtual prefix
    machine: str  # e_machine, e.g. EM_AARCH64
    soname: str | None
    needed: tuple[str, ...]
    search_dirs: tuple[str, ...]  # RUNPATH (or RPATH) entries, $ORIGIN resolved
    version_needs: tuple[tuple[str, str], ...]  # (library, version) from .gnu.version_r
    strings: frozenset[str]  # lib*.so names in the file (possible dlopen targets)

    @property
    def member(self) -> str:
        """The object's path relative to site-packages (how reports name it)."""
        return posixpath.relpath(self.path, SITE_PACKAGES)


@dataclasses.dataclass(frozen=True)
class Resolution:
    """How one DT_NEEDED entry of one object was satisfied (or not)."""

    obj: ElfObject
    soname: str
    kind: str  # rpath | system | wheel | cann | unresolved
    providers: tuple[ElfObject, ...] = ()


@dataclasses.dataclass
class Report:
    """Everything one check found; ``ok`` is the verdict."""

    checked: list[ElfObject]
    resolutions: list[Resolution]
    version_failures: list[tuple[ElfObject, str, str]]  # object, library, version
    machines: dict[str, int]
    max_versions: dict[str, tuple[int, ...]]  # newest base-system version per family
    dlopen_unknown: dict[str, list[ElfObject]]  # lib*.so strings in roots nobody provides
    cann_unused: set[str] = dataclasses.field(default_factory=set)
    missing_pins: list[str] = dataclasses.field(default_factory=list)

    @property
    def unresolved(self) -> list[Resolution]:
        """The DT_NEEDED entries nothing provides."""
        return [r for r in self.resolutions if r.kind == "unresolved"]

    @property
    def ok(self) -> bool:
        """True when every pin has its wheel, every library resolves, no version is too new."""
        return not self.unresolved and not self.version_failures and not self.missing_pins

    def cann_sonames(self) -> dict[str, set[str]]:
        """CANN sonames needed, each with the distributions that need it."""
        found: dict[str, set[str]] = defaultdict(set)
        for r in self.resolutions:
            if r.kind == "cann":
                found[r.soname].add(r.obj.distribution)
        return dict(found)


def normalise(name: str) -> str:
    """PEP 503 name normalisation (torch_npu, Torch.NPU -> torch-npu)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_distribution(wheel: Path) -> str:
    """The normalised distribution name from a wheel's file name."""
    return normalise(wheel.name.split("-", 1)[0])


def wheel_version(wheel: Path) -> str:
    """The version field of a wheel's file name."""
    return wheel.name.split("-")[1]


def install_path(member: str) -> str:
    """Where a wheel member lands in the virtual prefix (handles ``*.data/<scheme>/``)."""
    parts = member.split("/")
    if len(parts) > 2 and parts[0].endswith(".data"):
        scheme, rest = parts[1], "/".join(parts[2:])
        if scheme in ("purelib", "platlib"):
            return posixpath.join(SITE_PACKAGES, rest)
        if scheme == "scripts":
            return posixpath.join(PREFIX, "bin", rest)
        if scheme == "headers":
            return posixpath.join(PREFIX, "include", rest)
        return posixpath.join(PREFIX, rest)  # "data"
    return posixpath.join(SITE_PACKAGES, member)


def _search_dirs(entries: Iterable[str], origin: str) -> tuple[str, ...]:
    """Split RUNPATH/RPATH values and resolve $ORIGIN against the object's folder."""
    dirs: list[str] = []
    for entry in entries:
        for item in entry.split(":"):
            if item:
                item = item.replace("${ORIGIN}", origin).replace("$ORIGIN", origin)
                dirs.append(posixpath.normpath(item))
    return tuple(dirs)


def _strings(stream: IO[bytes], chunk: int = 1 << 24) -> frozenset[str]:
    """Every lib*.so[.N] byte string in the stream, read in overlapping chunks."""
    found: set[str] = set()
    stream.seek(0)
    tail = b""
    while block := stream.read(chunk):
        data = tail + block
        found.update(m.decode() for m in _DLOPEN_CANDIDATE.findall(data))
        tail = data[-256:]
    return frozenset(found)


def read_elf(stream: IO[bytes], wheel: Path, member: str) -> ElfObject | None:
    """Parse one file; None unless it is ELF with a dynamic section (static, .o: skipped)."""
    stream.seek(0)
    if stream.read(4) != _ELF_MAGIC:
        return None
    stream.seek(0)
    try:
        elf = ELFFile(stream)
        dynamic = elf.get_section_by_name(".dynamic")
        if not isinstance(dynamic, DynamicSection):
            return None
        tags: dict[str, list[str]] = defaultdict(list)
        for tag in dynamic.iter_tags():
            attribute = _STRING_TAGS.get(tag.entry.d_tag)
            if attribute is not None:  # pyelftools sets these string attributes per tag type
                tags[tag.entry.d_tag].append(str(getattr(tag, attribute)))
        version_needs: list[tuple[str, str]] = []
        for section in elf.iter_sections():
            if isinstance(section, GNUVerNeedSection):
                for verneed, auxiliaries in section.iter_versions():
                    version_needs.extend((str(verneed.name), str(aux.name)) for aux in auxiliaries)
        machine = str(elf["e_machine"])
    except ELFError as error:
        raise ValueError(f"{wheel.name}: {member}: unreadable ELF file: {error}") from error
    path = install_path(member)
    # The loader ignores RPATH when RUNPATH is present.
    dirs = _search_dirs(tags["DT_RUNPATH"] or tags["DT_RPATH"], posixpath.dirname(path))
    return ElfObject(
        wheel=wheel.name,
        distribution=wheel_distribution(wheel),
        path=path,
        machine=machine,
        soname=tags["DT_SONAME"][0] if tags["DT_SONAME"] else None,
        needed=tuple(tags["DT_NEEDED"]),
        search_dirs=dirs,
        version_needs=tuple(version_needs),
        strings=_strings(stream),
    )


def scan_wheel(wheel: Path) -> Iterator[ElfObject]:
    """Yield every dynamically linked ELF file in a wheel (ELF ones spilled to a temp file)."""
    with zipfile.ZipFile(wheel) as archive:
        for info in archive.infolist():
            if info.is_dir() or info.file_size < 64:
                continue
            with archive.open(info) as source:
                if source.read(4) != _ELF_MAGIC:
                    continue
            with archive.open(info) as source, tempfile.TemporaryFile() as spill:
                shutil.copyfileobj(source, spill, 1 << 20)
                obj = read_elf(spill, wheel, info.filename)
            if obj is not None:
                yield obj


def load_cann_list(path: Path) -> set[str]:
    """Sonames from cann-libraries.txt: the first word of each non-comment line."""
    names: set[str] = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(line.split()[0])
    return names


def load_pins(lock: Path) -> dict[str, str]:
    """``name==version`` pins of a requirements lock, keyed by normalised name."""
    pins: dict[str, str] = {}
    for line in lock.read_text(encoding="utf-8").splitlines():
        match = _PIN.match(line.strip())
        if match:
            pins[normalise(match.group(1))] = match.group(2)
    return pins


def select_wheels(wheel_dir: Path, pins: dict[str, str] | None) -> tuple[list[Path], list[str]]:
    """The wheels to read (all, or one per pin) and the pins with no wheel in WHEEL_DIR."""
    wheels = sorted(wheel_dir.glob("*.whl"))
    if not wheels:
        raise ValueError(f"no wheels in {wheel_dir}")
    if pins is None:
        return wheels, []
    chosen = [w for w in wheels if pins.get(wheel_distribution(w)) == wheel_version(w)]
    present = {wheel_distribution(w) for w in chosen}
    missing = [f"{name}=={version}" for name, version in sorted(pins.items()) if name not in present]
    return chosen, missing


def _unversioned(soname: str) -> str:
    """'libfoo.so' from 'libfoo.so.1.2' (how dlopen candidates are compared)."""
    return re.sub(r"\.so(\.\d+)*$", ".so", soname)


def _version_tuple(version: str) -> tuple[str, tuple[int, ...]] | None:
    """('GLIBC', (2, 35)) from 'GLIBC_2.35'; None for other version names."""
    match = _VERSION.match(version)
    if match is None:
        return None
    return match.group(1), tuple(int(p) for p in match.group(2).split("."))


def _resolve(
    obj: ElfObject,
    soname: str,
    by_path: dict[str, ElfObject],
    by_name: dict[str, list[ElfObject]],
    cann: set[str],
) -> Resolution:
    """Resolve one DT_NEEDED entry in the order the module docstring gives."""
    for folder in obj.search_dirs:
        hit = by_path.get(posixpath.join(folder, soname))
        if hit is not None:
            return Resolution(obj, soname, "rpath", (hit,))
    # The base system before other wheels: a wheel's private copy of libz or of the
    # loader (torchvision.libs/ld-linux-aarch64.<hash>.so.1) serves only its own RUNPATH.
    if soname in SYSTEM_LIBRARIES:
        return Resolution(obj, soname, "system")
    if soname in by_name:
        return Resolution(obj, soname, "wheel", tuple(by_name[soname]))
    if soname in cann:
        return Resolution(obj, soname, "cann")
    return Resolution(obj, soname, "unresolved")


def check(
    wheel_dir: Path,
    roots: Sequence[str] = DEFAULT_ROOTS,
    cann: set[str] | None = None,
    every_wheel: bool = False,
    machine: str | None = None,
    pins: dict[str, str] | None = None,
) -> Report:
    """Resolve the DT_NEEDED closure of ROOTS (or of every wheel) in WHEEL_DIR."""
    cann = set() if cann is None else cann
    wheels, missing_pins = select_wheels(wheel_dir, pins)
    wanted_roots = {normalise(r) for r in roots}
    absent = sorted(wanted_roots - {wheel_distribution(w) for w in wheels})
    if absent and not every_wheel:
        raise ValueError(f"no wheel for root distribution(s): {', '.join(absent)}")

    objects = [obj for wheel in wheels for obj in scan_wheel(wheel)]
    by_path = {o.path: o for o in objects}
    by_name: dict[str, list[ElfObject]] = defaultdict(list)
    for o in objects:
        by_name[posixpath.basename(o.path)].append(o)
        if o.soname and o.soname != posixpath.basename(o.path):
            by_name[o.soname].append(o)

    queue = [o for o in objects if every_wheel or o.distribution in wanted_roots]
    seen: set[str] = set()
    checked: list[ElfObject] = []
    resolutions: list[Resolution] = []
    version_failures: list[tuple[ElfObject, str, str]] = []
    max_versions: dict[str, tuple[int, ...]] = {}
    machines: dict[str, int] = defaultdict(int)
    while queue:
        obj = queue.pop()
        if obj.path in seen:
            continue
        seen.add(obj.path)
        checked.append(obj)
        machines[obj.machine] += 1
        for soname in obj.needed:
            resolution = _resolve(obj, soname, by_path, by_name, cann)
            resolutions.append(resolution)
            queue.extend(resolution.providers)
        for library, version in obj.version_needs:
            parsed = _version_tuple(version)
            if parsed is None or library not in SYSTEM_LIBRARIES:
                continue
            family, numbers = parsed
            max_versions[family] = max(max_versions.get(family, ()), numbers)
            ceiling = SYSTEM_VERSION_CEILINGS.get(family)
            if ceiling is not None and numbers > ceiling:
                version_failures.append((obj, library, version))
    if machine is not None:
        wrong = sorted(m for m in machines if m != f"EM_{machine.upper()}")
        if wrong:
            raise ValueError(f"objects for {wrong}, expected EM_{machine.upper()}")

    provided = {_unversioned(n) for n in (*by_name, *SYSTEM_LIBRARIES, *cann)}
    dlopen_unknown: dict[str, list[ElfObject]] = defaultdict(list)
    for obj in (o for o in checked if o.distribution in wanted_roots):
        for name in obj.strings:
            if _unversioned(name) not in provided:
                dlopen_unknown[name].append(obj)
    return Report(
        checked=sorted(checked, key=lambda o: (o.wheel, o.path)),
        resolutions=resolutions,
        version_failures=version_failures,
        machines=dict(machines),
        max_versions=max_versions,
        dlopen_unknown=dict(dlopen_unknown),
        cann_unused=cann - {r.soname for r in resolutions if r.kind == "cann"},
        missing_pins=missing_pins,
    )


def render(report: Report, verbose: bool = False) -> str:
    """Human-readable summary; failures as 'UNRESOLVED wheel file soname' lines."""
    lines: list[str] = []
    wheels = sorted({o.wheel for o in report.checked})
    counts: dict[str, int] = defaultdict(int)
    for r in report.resolutions:
        counts[r.kind] += 1
    lines.append(
        f"checked {len(report.checked)} dynamically linked ELF files in {len(wheels)} wheels; "
        f"{len(report.resolutions)} DT_NEEDED entries: "
        + ", ".join(f"{k} {counts[k]}" for k in ("rpath", "system", "wheel", "cann", "unresolved"))
    )
    lines.append("machines: " + ", ".join(f"{m} {n}" for m, n in sorted(report.machines.items())))
    system = sorted({r.soname for r in report.resolutions if r.kind == "system"})
    lines.append("base-system libraries used: " + " ".join(system))
    lines.append(
        "newest base-system symbol versions needed: "
        + ", ".join(f"{f}_{'.'.join(map(str, v))}" for f, v in sorted(report.max_versions.items()))
    )
    cann = report.cann_sonames()
    lines.append(f"CANN libraries needed ({len(cann)}):")
    lines.extend(f"  {s}  <- {', '.join(sorted(cann[s]))}" for s in sorted(cann))
    if report.cann_unused:
        lines.append("listed as CANN but needed by nothing checked: " + " ".join(sorted(report.cann_unused)))
    if verbose:
        lines.append("wheels: " + " ".join(wheels))
        lines.append("found only by name (relies on an earlier import having loaded it):")
        for r in sorted(
            (r for r in report.resolutions if r.kind == "wheel"), key=lambda r: (r.obj.wheel, r.obj.member)
        ):
            where = ", ".join(sorted({p.distribution for p in r.providers}))
            lines.append(f"  {r.obj.distribution}  {r.obj.member}  {r.soname}  <- {where}")
        lines.append("lib*.so strings in the roots that nothing provides (possible dlopen targets, not failures):")
        for name in sorted(report.dlopen_unknown):
            users = sorted({o.distribution for o in report.dlopen_unknown[name]})
            lines.append(f"  {name}  in {', '.join(users)}")
    lines.extend(f"MISSING  {pin}" for pin in report.missing_pins)
    for obj, library, version in report.version_failures:
        lines.append(f"TOO NEW  {obj.wheel}  {obj.member}  {library} {version}")
    for r in sorted(report.unresolved, key=lambda r: (r.obj.wheel, r.obj.member, r.soname)):
        lines.append(f"UNRESOLVED  {r.obj.wheel}  {r.obj.member}  {r.soname}")
    lines.append("closed" if report.ok else "NOT closed")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point: 0 when the closure is complete, 1 when not, 2 on bad input."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("wheel_dir", type=Path)
    parser.add_argument("--lock", type=Path, help="read only this lock's pins; a pin without a wheel fails")
    parser.add_argument(
        "--root",
        action="append",
        dest="roots",
        help=f"distribution the closure starts from (repeatable; default: {' '.join(DEFAULT_ROOTS)})",
    )
    parser.add_argument("--all", action="store_true", help="start from every wheel's ELF files")
    parser.add_argument("--cann", type=Path, default=DEFAULT_CANN_LIST, help="the CANN soname list")
    parser.add_argument("--machine", help="expected ELF machine, e.g. aarch64 (EM_AARCH64)")
    parser.add_argument("--verbose", "-v", action="store_true")
    args = parser.parse_args(argv)
    try:
        report = check(
            args.wheel_dir,
            roots=args.roots or DEFAULT_ROOTS,
            cann=load_cann_list(args.cann),
            every_wheel=args.all,
            machine=args.machine,
            pins=load_pins(args.lock) if args.lock else None,
        )
    except (OSError, ValueError, zipfile.BadZipFile) as error:
        print(f"closure: {error}", file=sys.stderr)
        return 2
    print(render(report, verbose=args.verbose))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
