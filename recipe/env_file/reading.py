"""What a reader of a `.env` file makes of it, shared by the two models (recipe.env_file.compose, .bash).

The README names two readers of `.env`: Docker Compose (compose-go's dotenv reader, in Compose v2 and v5) and
bash (`set -a; . ./.env; set +a`). They part on blanks around `=`, CRLF and CR line endings, a byte order mark,
a blank or `;` inside an unquoted value, a backslash, `~`, a `#` after a tab, and text after a closing quote.
Each reader is modelled on the text the file holds (bytes that are not UTF-8 kept as lone surrogates, as both
readers keep them); a line is judged only where both models follow it, so a shell construct the bash model
does not follow ($(...), `|`, `if`, `${X:-d}`, ...) leaves that line, and bash's later lines, without a warning.
tests/unit/test_env_file_readers.py holds the models to the real `docker-compose config` and the real bash.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field

#: Around a variable's name where a reader expands it (`$X`, `${X}`): both expand it from the same environment,
#: so an expansion compares as its name, and a message shows it as ${X}. Private-use characters: no .env holds them.
OPEN, CLOSE = "\ue000", "\ue001"
#: A shell variable's name.
SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Refused(Exception):
    """Compose refuses the whole file: where (an offset in the text it read) and why."""

    def __init__(self, at: int, why: str) -> None:
        super().__init__(why)
        self.at, self.why = at, why


class NotFollowed(Exception):
    """The reader does something here that the model does not follow (bash: `$(...)`, `if`; Compose: `${X:-d}`)."""


class Unclosed(Exception):
    """bash meets the end of the file inside a quote: it stops reading the file there."""


@dataclass
class Reading:
    """What one reader makes of a file: each name's value and the offset (in the text it read) of the line setting it."""

    values: dict[str, tuple[int, str]] = field(default_factory=dict)
    #: Names set by something the model does not follow: never judged.
    unknown: set[str] = field(default_factory=set)
    #: bash: the offset of each line it runs as a command, and the command's word.
    commands: dict[int, str] = field(default_factory=dict)
    #: bash: the offset of each `export` line, and the words export refuses as names (`=`, `4` of `export TP = 4`).
    refused: dict[int, list[str]] = field(default_factory=dict)
    #: bash: from this offset on, the model does not follow the file.
    stopped_at: int | None = None
    #: Compose: where, and why, it refuses the whole file.
    error: Refused | None = None

    def set(self, name: str, value: str | None, at: int) -> None:
        """NAME takes VALUE (None: a value the model does not follow) on the line at offset AT."""
        if value is None:
            self.values.pop(name, None)
            self.unknown.add(name)
        else:
            self.values[name] = (at, value)
            self.unknown.discard(name)


def expansion(name: str) -> str:
    return f"{OPEN}{name}{CLOSE}"

def escaped(text: str) -> str:
    """TEXT with what a terminal would hide written out: \\r, \\t, \\n, \\xNN for a byte that is not UTF-8, \\uFEFF."""
    out = []
    for char in text:
        if char == OPEN:
            out.append("${")
        elif char == CLOSE:
            out.append("}")
        elif char in "\r\t\n":
            out.append({"\r": "\\r", "\t": "\\t", "\n": "\\n"}[char])
        elif "\udc80" <= char <= "\udcff":
            out.append(f"\\x{ord(char) - 0xDC00:02x}")
        elif char != " " and unicodedata.category(char)[0] in "CZ":
            out.append(f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")
        else:
            out.append(char)
    return "".join(out)
