"""Check an exported Hugging Face checkpoint directory against its model class.

Three sources are compared: the tensors actually present in the safetensors shards
(headers only), the index's weight_map, and the tensors the HF model class expects
for the directory's own config.json (built on the meta device). Optionally a
reference checkpoint (the model the export started from, e.g. MODEL_PATH) tells what
the export dropped: exactly what Megatron-Bridge's strict=True would have refused.

    report = verify_export(Path("/checkpoints/p/e/global_step_20/actor/model/huggingface"))
    print(report.summary()); sys.exit(report.exit_code)
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from recipe.export.expected import ExpectedTensors, ExportCheckError, expected_tensors
from recipe.export.report import ExportReport, ShapeMismatch, Status
from recipe.export.safetensors_header import TensorInfo
from recipe.export.shards import INDEX_NAME, SINGLE_NAME, CheckpointContents, read_checkpoint

__all__ = ["DEFAULT_ALLOWED_PATTERNS", "ExportCheckError", "ExportReport", "verify_export"]

#: Allowed by default: multi-token-prediction layers. HF inference does not use them and
#: Megatron-Bridge omits them when MTP is off in training (Qwen3.5 checkpoints carry `mtp.*`).
DEFAULT_ALLOWED_PATTERNS: tuple[str, ...] = (r"^mtp\.",)

#: Missing tensors that make a checkpoint unusable whatever the user allows.
_CRITICAL_PARTS = re.compile(r"(^|\.)(embed_tokens|embeddings|word_embeddings|wte|lm_head)(\.|$)")
_NORM = re.compile(r"(^|\.)[^.]*norm[^.]*\.(weight|bias)$")
_LAYER = re.compile(r"^(.*?\.(?:layers|blocks|h)\.\d+)\.")


def _first_match(name: str, patterns: Iterable[str]) -> str | None:
    for pattern in patterns:
        if re.search(pattern, name):
            return pattern
    return None


def _loadable(contents: CheckpointContents) -> tuple[dict[str, TensorInfo], list[str], list[str], list[str]]:
    """What a Hugging Face loader would read; plus ghosts, unindexed names and errors.

    With an index, loaders read exactly the index's entries from the files it names;
    without one, only `model.safetensors`.
    """
    errors: list[str] = []
    if contents.index is not None:
        loadable: dict[str, TensorInfo] = {}
        ghosts: list[str] = []
        for name, shard in contents.index.items():
            info = contents.tensors.get(name)
            if info is not None and info.shard == shard:
                loadable[name] = info
            else:
                ghosts.append(name)
        unindexed = [name for name in contents.tensors if name not in contents.index]
        return loadable, sorted(ghosts), sorted(unindexed), errors
    if SINGLE_NAME in contents.shard_names:
        loadable = {n: i for n, i in contents.tensors.items() if i.shard == SINGLE_NAME}
        unindexed = [n for n, i in contents.tensors.items() if i.shard != SINGLE_NAME]
        return loadable, [], sorted(unindexed), errors
    if contents.shard_names:
        errors.append(
            f"no {INDEX_NAME} and no {SINGLE_NAME}: loaders read none of the "
            f"{len(contents.shard_names)} shard file(s) (an export that failed before writing its index?)"
        )
    else:
        errors.append("no safetensors files")
    return {}, [], sorted(contents.tensors), errors


def _critical_missing(missing: Sequence[str], expected_by_layer: dict[str, set[str]]) -> list[str]:
    """Why the missing tensors make the export unusable: embeddings, lm_head, norms, whole layers."""
    reasons = [f"{name}: embedding or output head missing" for name in missing if _CRITICAL_PARTS.search(name)]
    reasons += [f"{name}: norm missing" for name in missing if _NORM.search(name) and not _CRITICAL_PARTS.search(name)]
    missing_set = set(missing)
    for layer, names in sorted(expected_by_layer.items()):
        if names and names <= missing_set:
            reasons.append(f"{layer}: whole layer missing ({len(names)} tensors)")
    return sorted(reasons)


def compare(
    directory: Path,
    expected: ExpectedTensors,
    contents: CheckpointContents,
    allowed_patterns: Sequence[str] = DEFAULT_ALLOWED_PATTERNS,
    reference: CheckpointContents | None = None,
    reference_path: Path | None = None,
) -> ExportReport:
    """The report for `contents` (read from `directory`) against `expected`; pure, no I/O."""
    present, ghosts, unindexed, load_errors = _loadable(contents)
    errors = sorted(contents.errors + load_errors)
    present_shapes = {name: info.shape for name, info in present.items()}

    # Which layout the checkpoint uses for fused parameters decides how a wholly absent one is named.
    fused_seen = any(len(g.layouts) > 1 and all(n in present_shapes for n in g.layouts[1]) for g in expected.groups)
    consumed: set[str] = set()
    missing: list[str] = []
    mismatches: list[ShapeMismatch] = []
    expected_count = 0
    expected_by_layer: dict[str, set[str]] = {}
    for group in expected.groups:
        chosen = next((layout for layout in group.layouts if all(n in present_shapes for n in layout)), None)
        if chosen is None:
            hits = [sum(n in present_shapes for n in layout) for layout in group.layouts]
            if max(hits) > 0:
                chosen = group.layouts[hits.index(max(hits))]
            else:
                chosen = group.layouts[1] if fused_seen and len(group.layouts) > 1 else group.layouts[0]
                if group.optional:
                    continue  # a tied weight may be left out: the loader ties it
        if not group.optional:
            expected_count += len(chosen)
        for name, shape in chosen.items():
            layer = _LAYER.match(name)
            if layer and not group.optional:
                expected_by_layer.setdefault(layer.group(1), set()).add(name)
            if name not in present_shapes:
                missing.append(name)
                continue
            consumed.add(name)
            if present_shapes[name] != shape:
                mismatches.append(ShapeMismatch(name, list(shape), list(present_shapes[name])))
    missing.sort()
    unexpected = sorted(set(present_shapes) - consumed)

    dropped: list[str] = []
    if reference is not None:
        reference_present, _, _, _ = _loadable(reference)
        dropped = sorted(set(reference_present) - set(present_shapes) - set(missing))

    allowed: list[str] = []
    unallowed: list[str] = []

    def triage(names: Iterable[str], class_patterns: Sequence[str], class_reason: str) -> None:
        for name in names:
            pattern = _first_match(name, allowed_patterns)
            if pattern is not None:
                allowed.append(f"{name} (allowed: {pattern})")
                continue
            pattern = _first_match(name, class_patterns)
            if pattern is not None:
                allowed.append(f"{name} ({class_reason}: {pattern})")
                continue
            unallowed.append(name)

    triage(missing, expected.ignore_missing, f"{expected.architecture} ignores it when missing")
    triage(unexpected, expected.ignore_unexpected, f"{expected.architecture} ignores it on load")
    triage(dropped, expected.ignore_unexpected, f"{expected.architecture} ignores it on load")
    triage(unindexed, (), "")

    critical = _critical_missing(missing, expected_by_layer)
    status: Status
    if errors or ghosts or mismatches or critical or unallowed:
        status = "broken"
    elif allowed:
        status = "lenient"
    else:
        status = "complete"
    return ExportReport(
        directory=str(directory),
        status=status,
        architecture=expected.architecture,
        expected_count=expected_count,
        present_count=len(present_shapes),
        missing=missing,
        unexpected=unexpected,
        shape_mismatches=sorted(mismatches, key=lambda m: m.name),
        ghosts=ghosts,
        unindexed=unindexed,
        dropped=dropped,
        allowed=sorted(allowed),
        critical=critical,
        errors=errors,
        reference=str(reference_path) if reference_path is not None else None,
    )


def verify_export(
    directory: Path,
    allowed_missing_patterns: Sequence[str] = DEFAULT_ALLOWED_PATTERNS,
    reference: Path | None = None,
    config_dir: Path | None = None,
) -> ExportReport:
    """Check the HF checkpoint in `directory`; raise ExportCheckError only when it cannot be checked.

    `allowed_missing_patterns` are regular expressions (re.search) for tensors whose
    absence (or presence, or loss against `reference`) the user accepts, e.g. MTP
    layers. The model class comes from `config_dir/config.json`, by default the
    directory's own (verl writes it beside the weights).
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise ExportCheckError(f"{directory}: not a directory")
    for pattern in allowed_missing_patterns:
        try:
            re.compile(pattern)
        except re.error as error:
            raise ExportCheckError(f"allowed pattern {pattern!r}: not a regular expression ({error})") from error
    expected = expected_tensors(Path(config_dir) if config_dir is not None else directory)
    contents = read_checkpoint(directory)
    reference_contents = None
    if reference is not None:
        reference = Path(reference)
        if not reference.is_dir():
            raise ExportCheckError(f"{reference}: reference checkpoint is not a directory")
        reference_contents = read_checkpoint(reference)
    return compare(directory, expected, contents, allowed_missing_patterns, reference_contents, reference)
