"""The environment variables that the recipe's libraries read, by family: what a typo is compared with.

`WANDB_PROJET` is a typo of wandb's `WANDB_PROJECT`, and wandb ignores it without a word; so do Ray,
huggingface_hub, vLLM, NCCL and HCCL with theirs. The near-miss check (recipe.env_warnings) can only say
"did you mean" when it knows the names each library really reads. They are read out of the
libraries themselves, never typed by hand: every string literal of a family's form in their Python
sources, and every NUL-terminated C string of that form in their shared libraries (NCCL's
parameters, torch_npu's HCCL options).

recipe/env_names.json holds them for the pinned version of each library of both images:

    python -m recipe.env_names write                # scan what is installed here
    python -m recipe.env_names write ARCHIVE...     # scan these wheels or sdists instead
    python -m recipe.env_names check                # exit 1 if what is installed here reads other names

Each entry is one distribution at one version (`vllm==0.24.0` for gpu, `vllm==0.23.0` for npu);
`write` adds or replaces the entries it scans and keeps the others. The gpu entries were written
inside the gpu image, the npu ones from the npu lock's files (.ci/npu-closure.sh's cache). The
image suite runs `check` in each image.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from functools import cache
from importlib import metadata
from pathlib import Path

#: Each family (a name prefix) and the distributions whose files are scanned for it.
FAMILIES: dict[str, tuple[str, ...]] = {
    "RAY_": ("ray",),
    "HF_": ("huggingface_hub", "transformers", "datasets", "accelerate"),
    "WANDB_": ("wandb",),
    "VLLM_": ("vllm", "vllm_ascend"),
    # NCCL reads its parameters as "NCCL_" + name, a literal the compiler joins into one C string.
    "NCCL_": ("nvidia_nccl_cu13",),
    # CANN's libhccl is not a wheel: what torch_npu and vllm-ascend pass on or read themselves.
    "HCCL_": ("torch_npu", "vllm_ascend"),
}
TABLE = Path(__file__).with_name("env_names.json")
#: A scanned file's size limit: the largest shared library of these wheels is about 600 MB.
MAX_FILE_BYTES = 2 << 30


def _normalise(distribution: str) -> str:
    """PyPI's name rule (PEP 503) with underscores, as wheel file names write it."""
    return re.sub(r"[-_.]+", "_", distribution).lower()


def _patterns(prefixes: list[str]) -> tuple[re.Pattern[bytes], re.Pattern[bytes]]:
    """(quoted literal in Python source, NUL-terminated C string) of any of these prefixes."""
    names = b"|".join(re.escape(prefix.encode()) for prefix in prefixes)
    name = rb"((?:" + names + rb")[A-Z0-9_]*[A-Z0-9])"
    return re.compile(rb"[\"']" + name + rb"[\"']"), re.compile(rb"(?<=\x00)" + name + rb"(?=\x00)")


def _is_scanned(path: str) -> bool:
    return path.endswith(".py") or bool(re.search(r"\.so(\.[0-9]+)*$", path))


def names_in(files: Iterator[tuple[str, bytes]], prefixes: list[str]) -> dict[str, list[str]]:
    """Every name of these prefixes that the files (path, content) hold, sorted, by prefix."""
    in_source, in_binary = _patterns(prefixes)
    found: set[str] = set()
    for path, content in files:
        pattern = in_source if path.endswith(".py") else in_binary
        found.update(match.decode() for match in pattern.findall(content))
    return {prefix: sorted(name for name in found if name.startswith(prefix)) for prefix in prefixes}


def _families_of(distribution: str) -> list[str]:
    return [prefix for prefix, owners in FAMILIES.items() if distribution in owners]


def _installed_files(distribution: metadata.Distribution) -> Iterator[tuple[str, bytes]]:
    for file in distribution.files or []:
        path = str(file)
        if _is_scanned(path):
            located = Path(str(file.locate()))
            if located.is_file() and located.stat().st_size <= MAX_FILE_BYTES:
                yield path, located.read_bytes()


def _archive_files(path: Path) -> Iterator[tuple[str, bytes]]:
    if path.name.endswith(".whl"):
        with zipfile.ZipFile(path) as wheel:
            for member in wheel.infolist():
                if _is_scanned(member.filename) and member.file_size <= MAX_FILE_BYTES:
                    yield member.filename, wheel.read(member)
        return
    # An sdist also holds tests, benchmarks and examples: only its package is what gets installed.
    package = re.compile(rf"[^/]+/(src/)?{_normalise(path.name.split('-')[0])}/")
    with tarfile.open(path) as sdist:
        for entry in sdist:
            if entry.isfile() and package.match(entry.name) and _is_scanned(entry.name) and entry.size <= MAX_FILE_BYTES:
                yield entry.name, sdist.extractfile(entry).read()  # type: ignore[union-attr]


def scan_installed() -> dict[str, dict[str, list[str]]]:
    """{"name==version": {prefix: [names]}} for each family's owner installed in this environment."""
    table = {}
    for distribution in sorted({owner for owners in FAMILIES.values() for owner in owners}):
        try:
            installed = metadata.distribution(distribution)
        except metadata.PackageNotFoundError:
            continue
        table[f"{distribution}=={installed.version}"] = names_in(_installed_files(installed), _families_of(distribution))
    return table


def scan_archive(path: Path) -> tuple[str, dict[str, list[str]]]:
    """("name==version", {prefix: [names]}) of a wheel or sdist (.tar.gz) of a family's owner."""
    match = re.fullmatch(r"([^-]+)-([^-]+?)(-.*\.whl|\.tar\.gz)", path.name)
    if match is None:
        raise SystemExit(f"error: {path.name}: neither a wheel nor an sdist (NAME-VERSION.tar.gz)")
    distribution, version = _normalise(match.group(1)), match.group(2)
    prefixes = _families_of(distribution)
    if not prefixes:
        raise SystemExit(f"error: {path.name}: {distribution} owns no family ({', '.join(FAMILIES)})")
    return f"{distribution}=={version}", names_in(_archive_files(path), prefixes)


@cache
def _table() -> dict[str, dict[str, list[str]]]:
    return json.loads(TABLE.read_text(encoding="utf-8"))


@cache
def known_names() -> dict[str, frozenset[str]]:
    """Each family's names, over every entry of recipe/env_names.json (both images)."""
    known: dict[str, set[str]] = {prefix: set() for prefix in FAMILIES}
    for entry in _table().values():
        for prefix, names in entry.items():
            known[prefix].update(names)
    return {prefix: frozenset(names) for prefix, names in known.items()}


def readers(name: str) -> list[str]:
    """The distributions of recipe/env_names.json that read the variable NAME (without versions)."""
    return sorted({key.split("==")[0] for key, entry in _table().items() if any(name in names for names in entry.values())})


def differences(recorded: dict[str, dict[str, list[str]]], installed: dict[str, dict[str, list[str]]]) -> list[str]:
    """One line for each installed distribution that the table lacks, or that reads other names."""
    problems = []
    for key, entry in installed.items():
        stored = recorded.get(key)
        if stored is None:
            problems.append(f"{key} is installed, {TABLE.name} has no entry for it")
            continue
        for prefix, names in entry.items():
            extra, gone = sorted(set(names) - set(stored.get(prefix, []))), sorted(set(stored.get(prefix, [])) - set(names))
            if extra or gone:
                problems.append(f"{key} {prefix}*: reads {extra} too, not {gone}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recipe.env_names", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    write = commands.add_parser("write", help=f"scan what is installed here (or only ARCHIVE...), update {TABLE.name}")
    write.add_argument("archives", nargs="*", type=Path, metavar="ARCHIVE")
    commands.add_parser("check", help=f"exit 1 if what is installed here reads other names than {TABLE.name} says")
    args = parser.parse_args(argv)
    recorded = json.loads(TABLE.read_text(encoding="utf-8")) if TABLE.exists() else {}
    installed = {} if getattr(args, "archives", None) else scan_installed()
    if args.command == "check":
        problems = differences(recorded, installed)
        for problem in problems:
            print(f"env_names: {problem}", file=sys.stderr)
        print(f"env_names: {len(installed)} distributions checked, {len(problems)} differ")
        return 1 if problems else 0
    recorded.update(dict(scan_archive(archive) for archive in args.archives) if args.archives else installed)
    TABLE.write_text(json.dumps(dict(sorted(recorded.items())), indent=1) + "\n", encoding="utf-8")
    for key, entry in sorted(recorded.items()):
        print(f"{key}: " + ", ".join(f"{len(names)} {prefix}*" for prefix, names in entry.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
