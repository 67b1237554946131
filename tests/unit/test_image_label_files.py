"""Each image stage writes for `doctor` the same labels its LABEL instruction sets.

A container has no Docker API, so the stages also print their labels into
/etc/grpo-recipe/labels.d/<stage>.labels (recipe/doctor/facts.py). This reads both from the
Dockerfiles, stage by stage, so that a label added to one place and not the other fails here,
before an image is built (tests/images/common/test_doctor.py checks the built image).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from .envtools import REPO

DOCKERFILES = sorted(REPO.glob("docker/**/Dockerfile"))
#: The labels doctor compares (recipe/doctor/checks.py: check_labels).
COMPARED = re.compile(r"io\.grpo-recipe\.[\w.-]+|org\.opencontainers\.image\.version")


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    joined = re.sub(r"\\\n(?:\s*#[^\n]*\n)*", " ", text)
    result = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            result.append((word.upper(), rest.strip()))
    return result


def _stages(path: Path) -> list[tuple[dict[str, str], dict[str, str]]]:
    """Per stage: the compared labels of its LABEL instructions, and those it writes to labels.d."""
    stages: list[tuple[dict[str, str], dict[str, str]]] = []
    for word, rest in _instructions(path.read_text()):
        if word == "FROM":
            stages.append(({}, {}))
        elif word == "LABEL" and stages:
            for pair in shlex.split(rest):
                key, _, value = pair.partition("=")
                if COMPARED.fullmatch(key):
                    stages[-1][0][key] = value
        elif word == "RUN" and "labels.d/" in rest and stages:
            for token in shlex.split(rest, posix=True):
                key, sep, value = token.partition("=")
                if sep and COMPARED.fullmatch(key):
                    stages[-1][1][key] = value
    return stages


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_each_stage_writes_the_labels_it_sets(dockerfile: Path) -> None:
    stages = _stages(dockerfile)
    assert stages, f"{dockerfile}: no stage found"
    labelled = [s for s in stages if s[0]]
    assert labelled, f"{dockerfile}: no stage sets a compared label"
    for set_by_label, written in labelled:
        assert written == set_by_label


def test_a_label_missing_from_the_file_is_seen(tmp_path: Path) -> None:
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(
        'FROM x\nLABEL io.grpo-recipe.torch.version="${T}" \\\n      io.grpo-recipe.framework="full"\n'
        "RUN install -d /etc/grpo-recipe/labels.d \\\n"
        " && printf '%s\\n' \"io.grpo-recipe.framework=full\" > /etc/grpo-recipe/labels.d/f.labels\n"
    )
    [(set_by_label, written)] = _stages(dockerfile)
    assert set_by_label != written
    assert set_by_label["io.grpo-recipe.torch.version"] == "${T}"
