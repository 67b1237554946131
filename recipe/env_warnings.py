"""What the environment says that no setting reads: names a slip away from one that is read.

A setting the recipe reads is checked by its validator (recipe.settings). A variable that is
almost a setting's name (TPP), or almost the name of a variable a library of the images reads
(WANDB_PROJET), is read by nobody and ignored without a word. `plan` and `run` print one warning for each,
and go on. `.env` lines that its two readers read apart: recipe.env_file.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence

from recipe.env_names import known_names, readers
from recipe.near_miss import one_slip_from
from recipe.settings import Settings

#: Prefixes of other programs' variables whose names we do not list (recipe.env_names lists RAY_, HF_,
#: WANDB_, VLLM_, NCCL_ and HCCL_): never a typo of ours, though some are close to a setting's name.
FOREIGN_PREFIXES = (
    "GLOO_", "TORCH_", "PYTORCH_", "CUDA_", "NVIDIA_", "NVTE_", "ASCEND_",
    "ATB_", "ASDOPS_", "KUBERNETES_", "HYDRA_", "HUGGING", "TRANSFORMERS_", "TOKENIZERS_",
    "OMP_", "MKL_", "PYTHON", "PIP_", "LC_", "XDG_", "DOCKER_", "COMPOSE_", "TINI_", "RECIPE_", "GRPO_",
    "HOST_",  # compose.yaml's own (HOST_CHECKPOINTS_DIR, ...), when .env is sourced on the host
)  # fmt: skip
#: Other programs' variables without such a prefix (DEVICE_ID: Ascend's launch scripts).
FOREIGN_NAMES = frozenset({"DEVICE_ID", "RANK_ID", "RANK_SIZE"})
#: How close a name must be to a setting's to be called a typo of it (difflib's ratio).
TYPO_CUTOFF = 0.8
#: The same inside a library's family of names (RAY_, HF_, WANDB_, VLLM_, NCCL_, HCCL_), which is crowded:
#: measured over recipe/env_names.json, 0.92 still names the meant variable for 98 % of one-letter slips,
#: and calls 6 % of the real names a typo when each is left out of the list in turn (11 % at 0.9).
FAMILY_TYPO_CUTOFF = 0.92


#: Letters at the end of a name that a slip in its prefix leaves as they are (HCL_EXEC_TIMEOUT).
TAIL = 4


def _closest(variable: str, candidates: list[str], cutoff: float) -> list[str]:
    """difflib's closest match of at least CUTOFF, among the candidates whose length allows that ratio.

    The ratio is at most 2·min/(sum of the lengths): the others are skipped before difflib's own,
    slower, filters.
    """
    n = len(variable)
    possible = [c for c in candidates if 2 * min(len(c), n) >= cutoff * (len(c) + n) - 1e-9]
    return difflib.get_close_matches(variable, possible, 1, cutoff)


def near_miss_warnings(environ: Mapping[str, str]) -> list[str]:
    """`TPP is not a setting; did you mean TP?` for each variable named almost like one that is read.

    Such a variable is otherwise ignored without a word. A name of a library's family (WANDB_PROJET)
    is compared with the names that library really reads (recipe.env_names) and with our settings
    of that family (HF_TOKEN); other names only with our settings. Names of other programs'
    prefixes, the usual environment (PATH, HOME, ...) and names that are not upper case never warn.
    """
    names = sorted(name.upper() for name in Settings.model_fields)
    by_ending: dict[str, list[str]] = {}
    for name in sorted(name for family_names in known_names().values() for name in family_names):
        by_ending.setdefault(name[-TAIL:], []).append(name)
    warnings = []
    for variable in sorted(environ):
        if variable in names or variable in FOREIGN_NAMES or not re.fullmatch(r"[A-Z][A-Z0-9_]*", variable):
            continue
        family = next((prefix for prefix in known_names() if variable.startswith(prefix)), None)
        if family is not None:
            if variable in known_names()[family]:
                continue
            ours = [name for name in names if name.startswith(family)]
            candidates = [*ours, *sorted(known_names()[family])]
            # Short names (HF_TOKNE: 0.875 of HF_TOKEN) fall under the ratio; one slip names them (recipe.near_miss),
            # and so does a name cut short of the only one it begins (VLLM_USE_V2 of VLLM_USE_V2_MODEL_RUNNER).
            longer = [name for name in candidates if name.startswith(variable + "_")]
            slip = one_slip_from(variable, candidates) or (longer[0] if len(longer) == 1 else None)
            close = [slip] if slip else _closest(variable, candidates, FAMILY_TYPO_CUTOFF)
        elif variable.startswith(FOREIGN_PREFIXES):
            continue
        else:
            # A slip in the prefix itself (HCL_EXEC_TIMEOUT) leaves the family, and the name's end intact.
            close = _closest(variable, names, TYPO_CUTOFF) or _closest(
                variable, by_ending.get(variable[-TAIL:], []), FAMILY_TYPO_CUTOFF
            )
        if close and close[0] in names:
            warnings.append(f"{variable} is not a setting (ignored); did you mean {close[0]}?")
        elif close:
            libraries = readers(close[0])
            warnings.append(
                f"{variable} is read by no library of the images (ignored); did you mean {close[0]}, which "
                f"{', '.join(libraries)} {'reads' if len(libraries) == 1 else 'read'}?"
            )
    return warnings


def allow_drift_warnings(fields: Sequence[str], known: Sequence[str]) -> list[str]:
    """`ALLOW_DRIFT names TRAIN_FILE; did you mean TRAIN_FILES?` for a field close to, but not, one that can drift."""
    return [
        f"ALLOW_DRIFT names {field}, which is no field a record compares; did you mean {close[0]}?"
        for field in fields
        if field not in known and (close := difflib.get_close_matches(field, known, n=1, cutoff=TYPO_CUTOFF))
    ]
