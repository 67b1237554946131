"""Before the trainer starts: would data.max_prompt_length drop training rows? verl 0.9.1 drops them without a word.

`prepare-data` counts every prompt in tokens with the model's processor, text and images
(recipe.data.prompt_lengths), and writes the sorted lengths into the manifest.json beside the
parquet files. `run` reads them back here, as hostile input: a manifest that is missing, not
JSON, not for this very file (its sha256) or not a list of lengths is no answer, said in one
line at INFO, never a failure: the count is advice, the data were already checked.
"""

from __future__ import annotations

import os
from pathlib import Path

from recipe.data.prepare import MANIFEST_NAME
from recipe.data.prompt_lengths import KEEP_SHARE, PromptLengths, RowLength
from recipe.digests import sha256_file
from recipe.hydra_text import override_hint
from recipe.read_back import FileRefused, read_json

#: Warn when the limit drops more than this share of the training rows.
DROP_WARN_SHARE = 0.01
#: A manifest larger than this is not prepare-data's (2 million rows of lengths are about 16 MB).
MAX_MANIFEST_BYTES = 64 << 20


def recorded_lengths(train_file: Path) -> PromptLengths | str:
    """The training prompts' lengths that prepare-data recorded for exactly this file, or why there are none."""
    manifest = train_file.parent / MANIFEST_NAME
    if not os.path.lexists(manifest):
        return f"no {MANIFEST_NAME} beside {train_file} (prepare-data writes one)"
    try:
        record = read_json(manifest, MAX_MANIFEST_BYTES)
    except FileRefused as refused:  # a FIFO, a folder, too large, not JSON, nested too deep (recipe.read_back)
        return f"{manifest}: unreadable ({str(refused).removeprefix(f'{manifest}: ')})"
    record = record if isinstance(record, dict) else {}
    files = record.get("files") if isinstance(record.get("files"), dict) else {}
    split = next((name for name, entry in files.items()
                  if isinstance(entry, dict) and entry.get("file") == train_file.name), None)  # fmt: skip
    if split is None:
        return f"{manifest}: names no file {train_file.name}"
    counted = record.get("prompt_tokens")
    if isinstance(counted, str):
        return f"prepare-data did not count the prompts ({counted})"
    ours = counted.get(split) if isinstance(counted, dict) else None
    lengths = ours.get("tokens") if isinstance(ours, dict) else None
    if not isinstance(lengths, list) or not all(type(n) is int and 0 <= n < 2**31 for n in lengths):
        return f"{manifest}: prompt_tokens.{split}.tokens is not a list of token counts"
    recorded_sha = files[split].get("sha256")
    if not isinstance(recorded_sha, str):  # missing, not wrong: nothing ties the lengths to this very file
        return f"{manifest}: files.{split} names no sha256 of {train_file.name}: run prepare-data again"
    try:
        if sha256_file(train_file) != recorded_sha:
            return f"{manifest} describes another {train_file.name} (its sha256 differs): run prepare-data again"
    except (FileRefused, OSError) as error:
        return f"{train_file}: cannot be hashed ({type(error).__name__})"
    return PromptLengths.of(RowLength(n, 0) for n in lengths)


def prompt_budget_warning(lengths: PromptLengths, max_prompt_length: int) -> str | None:
    """One line when `max_prompt_length` drops more than DROP_WARN_SHARE of the rows, naming the length that keeps
    KEEP_SHARE; None otherwise."""
    rows = len(lengths.tokens)
    dropped = lengths.dropped_by(max_prompt_length)
    if not rows or dropped <= DROP_WARN_SHARE * rows:
        return None
    keep = lengths.percentile(KEEP_SHARE)
    return (
        f"data.max_prompt_length={max_prompt_length}: verl will drop {dropped} of the {rows} training rows "
        f"({100 * dropped / rows:.1f} %) as too long, without a word (their prompts, counted with their images by "
        f"prepare-data, are longer); {keep} keeps {100 * KEEP_SHARE:g} %: {override_hint(f'data.max_prompt_length={keep}')}; "
        "plan shows what it costs in memory"
    )
