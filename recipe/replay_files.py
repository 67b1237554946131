"""The files `replay` writes, one per reader, each holding exactly what its reader reads back.

- `shell`, for bash and dash (`set -a; . ./replay.sh; set +a`): a plain value (letters, digits and
  `_ . / : , @ % + = -`) is written as it is; any other in single quotes, an embedded quote as `'\\''`.
  Inside single quotes a POSIX shell takes every character literally, a newline included, and
  expands nothing: so every value fits, and none runs, whatever a record holds.
- `env-file`, for `docker run --env-file` and Compose's `env_file:` with `format: raw` (Compose 2.24
  or later): both take the text after the first `=` literally, to the end of the line, quotes and
  `$` included. So a value holding a newline (it would end the line), ending in a carriage return
  (Go's line reader drops it) or longer than MAX_LINE (docker's reader stops at a 64 KiB line)
  cannot be written there: it is left out of that file alone, as a comment line naming the setting.

Neither file is for the other's reader, nor for Compose's default `env_file:` format (the project's
`.env`), which strips quotes and expands `$`. A plain value is the same line in both files.
"""

from __future__ import annotations

import re
from typing import Any

from recipe.export.report import printable

SHELL, ENV_FILE = "shell", "env-file"
FORMATS = (SHELL, ENV_FILE)
#: What each file is for, as its second line says and `replay --help` lists.
READERS = {
    SHELL: "for bash and dash: `set -a; . ./replay.sh; set +a`",
    ENV_FILE: "for `docker run --env-file`, or Compose's `env_file:` with `format: raw`; never for a shell nor .env",
}
#: The longest value written to the env-file, and where a comment is cut: docker's --env-file
#: reader stops at a line of 64 KiB (4,096 characters are at most 16 KiB of UTF-8).
MAX_LINE = 4096
#: Characters no reader treats specially, unquoted: no whitespace, quote, `$` (expanded), `#` (a
#: comment), `~` (bash expands it after `=` and `:`), glob, or control character.
_PLAIN = re.compile(r"[A-Za-z0-9_./:,@%+=\-]*")


class UnwritableRecord(ValueError):
    """A record whose settings are not settings' values (a list, an object): no file is written."""


def setting_text(name: str, value: Any) -> str:
    """The text a reader must get back for a setting's VALUE; raises UnwritableRecord naming the setting."""
    if isinstance(value, bool):
        return "true" if value else "false"  # what pydantic reads back as True, not Python's "True"
    if isinstance(value, (int, float, str)):
        return str(value)
    raise UnwritableRecord(f"{name}: a {type(value).__name__} in the record, not a setting's value")


def shell_line(name: str, text: str) -> str:
    """NAME=text as bash and dash read it back exactly: plain as it is, anything else single-quoted."""
    if _PLAIN.fullmatch(text):
        return f"{name}={text}"  # the same line as the env-file's: no quote for a reader to keep
    return f"{name}='" + text.replace("'", "'\\''") + "'"  # close, an escaped quote, reopen


def env_file_refusal(text: str) -> str | None:
    """Why docker's --env-file and Compose's raw env_file cannot read `text` back (None: they can)."""
    if "\n" in text:
        return "its value holds a newline, which ends a line for docker's and Compose's readers"
    if text.endswith("\r"):
        return "its value ends in a carriage return, which docker's and Compose's line reader drops"
    if len(text) > MAX_LINE:
        return f"its value has {len(text)} characters, more than {MAX_LINE} (docker's reader stops at a 64 KiB line)"
    return None


def setting_line(name: str, value: Any, form: str) -> tuple[str, str | None]:
    """(the line for NAME in the file of FORM, why the value was left out of it or None).

    A value left out is a comment line naming the setting: the file stays one its reader takes,
    and whoever reads it sees what to set by hand (the shell file holds every value).
    """
    text = setting_text(name, value)
    if form == SHELL:
        return shell_line(name, text), None
    why = env_file_refusal(text)
    if why is None:
        return f"{name}={text}", None
    note = f"{name} left out of the env-file: {why}; `replay --format shell` writes it"
    return comment(note), note


def comment(text: str) -> str:
    """One comment line, whatever `text` holds (a newline would start a line of its own), at most MAX_LINE long."""
    shown = printable(text)
    return "# " + (shown if len(shown) <= MAX_LINE else shown[: MAX_LINE - 60] + " ... (cut here: the record holds it all)")
