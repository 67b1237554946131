"""Every variable a message of the recipe tells the user to set is one that something reads (issue 43).

A refusal's way out must work when followed literally: "set tracking_uri" named no variable that anything read, and
"ALLOW_DRIFT=DP" no variable a user sets. Each string of recipe/ is scanned (as Python parses it: adjacent literals
joined, f-strings' literal parts) for `set NAME` and `NAME=`; each NAME must be a setting of the recipe or a name one
of the images' libraries reads (recipe/env_names.json, read out of the libraries themselves).
"""

from __future__ import annotations

import re

from recipe.env_names import known_names
from recipe.settings import Settings
from tests.support.recipe_strings import RECIPE, recipe_strings

#: `set NAME`, `set the environment variable NAME`, or `NAME=` not inside a longer word, a path, a key or `${...}`.
_NAMED = re.compile(
    r"\bset (?:the environment variable )?(?P<set>[A-Z][A-Z0-9_]+)\b|(?<![A-Za-z0-9_.$/{-])(?P<assign>[A-Z][A-Z0-9_]+)="
)
#: Words in that form that name no variable, and why.
NOT_VARIABLES = {
    "NAME": "the placeholder of `NAME=value` in docstrings and messages about env files",
    "RECORD": "replay's positional argument, named in its refusals as `RECORD=path`, as a setting would be",
    "DP": "plan's layout line shows the derived data-parallel size as DP=N beside TP=... ; no way out names it (a "
    "drift names the setting that moved it: test_provenance_drift)",
}


def named_variables(text: str) -> set[str]:
    """The variable names `text` tells a reader to set."""
    return {match.group("set") or match.group("assign") for match in _NAMED.finditer(text)}


def _named_in_recipe() -> dict[str, str]:
    """name -> a module that names it."""
    found: dict[str, str] = {}
    for path, text in recipe_strings():
        for name in named_variables(text):
            found.setdefault(name, str(path.relative_to(RECIPE.parent)))
    return found


#: Variables verl 0.9.1 reads outside the families recipe.env_names lists; the recipe sets each for the trainer
#: (recipe.launch.runtime_environment), and a user's value wins.
READ_BY_VERL = {
    "TENSORBOARD_DIR": "verl/utils/tracking.py, _TensorboardAdapter",
    "VERL_FILE_LOGGER_PATH": "verl/utils/tracking.py, FileLogger",
}


def _read_by_something() -> set[str]:
    return {name.upper() for name in Settings.model_fields} | set().union(*known_names().values()) | set(READ_BY_VERL)


def test_the_scan_sees_the_forms_messages_use() -> None:
    assert named_variables("set HF_ENDPOINT to reach a mirror") == {"HF_ENDPOINT"}
    assert named_variables("TP=3: must divide 32; or accept it with ALLOW_DRIFT=SEED") == {"TP", "ALLOW_DRIFT"}
    assert named_variables("set the environment variable tracking_uri") == set()  # lower case: no variable at all
    assert named_variables("data.train_files=x, ${oc.env:DB_URL}, /a/B=1, --X=1, MAX_LEN=") == {"MAX_LEN"}
    found = _named_in_recipe()
    assert {"HF_ENDPOINT", "TP", "ALLOW_DRIFT", "RAY_AUTH_TOKEN", "WANDB_API_KEY"} <= set(found), sorted(found)


def test_every_variable_a_message_names_is_read_by_something() -> None:
    known = _read_by_something()
    unread = {name: where for name, where in _named_in_recipe().items() if name not in known and name not in NOT_VARIABLES}
    assert unread == {}


def test_a_name_nothing_reads_is_caught() -> None:
    """What the check is for: the typo'd or invented name in a message (here, as the old drift advice wrote it)."""
    known = _read_by_something()
    assert {"HF_ENDPIONT", "DP", "TRACKING_URI"} - known == {"HF_ENDPIONT", "DP", "TRACKING_URI"}
    message = "set HF_ENDPIONT to reach a mirror, or set TRACKING_URI"
    assert sorted(name for name in named_variables(message) if name not in known) == ["HF_ENDPIONT", "TRACKING_URI"]
