"""Which distributions the trainer needs importable on a device, and the module that proves each imports.

`doctor` imports each in a probe process: what `run` checks (recipe.run.preflight's
TRAINER_MODULES), what the trainer imports though no dependency declares it, and every
requirement of the installed verl's `verl-core` extra, named by the distribution's own metadata
(its top-level modules), never guessed from its name alone.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from importlib.util import find_spec

from recipe.doctor import facts
from recipe.run.preflight import TRAINER_MODULES, TRAINER_SUPPORT_MODULES

#: verl-core lists its own test tooling; a training image runs no pytest (tests/unit/test_locks.py).
TEST_TOOLING = frozenset({"pytest", "pytest-asyncio", "pytest-rerunfailures"})
#: Per-device exclusions from verl-core, each explained in docker/<device>/excludes.txt.
DEVICE_EXCLUSIONS = {"gpu": frozenset(), "npu": frozenset({"torchcodec"})}
#: Also imported by the trainer's start path on that device, beside what `run` checks.
DOCTOR_MODULES = {
    "gpu": {"torch": "torch", "megatron.core": "megatron-core", "fla": "flash-linear-attention"},
    "npu": {"torch": "torch", "megatron.core": "megatron-core"},
}
#: Top-level names that wheels ship by mistake (TransferQueue ships `recipe`, `tests`, `scripts`).
NOT_MODULES = frozenset({"tests", "test", "scripts", "docs", "examples", "benchmarks", "tutorial", "recipe"})

def normalize(name: str) -> str:
    """PEP 503 name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _squash(name: str) -> str:
    return re.sub(r"[-_.]+", "", name).lower()


@dataclass
class ImportTarget:
    """A distribution the trainer needs and the modules that prove it imports."""

    distribution: str
    modules: list[str]
    version: str | None
    why: str

    @property
    def name(self) -> str:
        return f"import:{self.distribution}"


def verl_core_requirements() -> list[str] | None:
    """Names in the installed verl's `verl-core` extra; None when verl is not installed."""
    try:
        requires = metadata.requires("verl") or []
    except metadata.PackageNotFoundError:
        return None
    names = []
    for requirement in requires:
        name, _, marker = requirement.partition(";")
        if re.search(r"""extra\s*==\s*["']verl-core["']""", marker):
            names.append(re.split(r"[\s<>=!~\[(]", name.strip(), maxsplit=1)[0])
    return names


def _modules_of(distribution: str, tops: Mapping[str, list[str]]) -> list[str]:
    """The module(s) to import for an installed distribution, from its own metadata."""
    candidates = [t for t in tops.get(normalize(distribution), []) if t.isidentifier() and not t.startswith("_")]
    named = [t for t in candidates if _squash(t) == _squash(distribution)]
    if named:
        return named[:1]
    usable = sorted({t for t in candidates if t not in NOT_MODULES and find_spec(t) is not None})
    return usable or [distribution.replace("-", "_").lower()]


def import_targets(device: str) -> tuple[list[ImportTarget], list[str]]:
    """What the trainer needs on DEVICE, deduplicated by distribution; and notes for the report."""
    explicit: dict[str, tuple[str, list[str], str]] = {}
    for source, mapping in (
        ("run checks it", TRAINER_MODULES[device]),
        ("the trainer imports it, declared by no dependency", TRAINER_SUPPORT_MODULES),
        ("the trainer imports it", DOCTOR_MODULES[device]),
    ):
        for module, distribution in mapping.items():
            key = normalize(distribution)
            if key not in explicit:
                explicit[key] = (distribution, [module], source)
            elif module not in explicit[key][1]:
                explicit[key][1].append(module)
    notes = []
    core = verl_core_requirements()
    tops: dict[str, list[str]] = {}
    if core is None:
        notes.append("verl is not installed: its verl-core requirements cannot be read")
        core = []
    else:
        for top, distributions in metadata.packages_distributions().items():
            for distribution in distributions:
                tops.setdefault(normalize(distribution), []).append(top)
    skipped = {normalize(n) for n in TEST_TOOLING | DEVICE_EXCLUSIONS[device]}
    targets: dict[str, ImportTarget] = {}
    for key, (distribution, modules, why) in explicit.items():
        targets[key] = ImportTarget(distribution, modules, facts.distribution_version(distribution), why)
    for distribution in core:
        key = normalize(distribution)
        if key in targets or key in skipped:
            continue
        version = facts.distribution_version(distribution)
        modules = _modules_of(distribution, tops) if version is not None else [distribution.replace("-", "_")]
        targets[key] = ImportTarget(distribution, modules, version, "verl's verl-core extra")
    for target in targets.values():
        if target.version is not None:
            try:  # the distribution's own spelling (qwen_vl_utils -> qwen-vl-utils)
                target.distribution = metadata.distribution(target.distribution).metadata["Name"] or target.distribution
            except metadata.PackageNotFoundError:
                pass
    return sorted(targets.values(), key=lambda t: t.distribution.lower()), notes
