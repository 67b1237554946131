"""The judgement of a `.env` file: each line as Compose and bash read it, one warning where they part."""

from __future__ import annotations

import bisect
import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from recipe.env_file.bash import bash_reads
from recipe.env_file.compose import compose_reads
from recipe.env_file.reading import OPEN, Reading, escaped
from recipe.redaction import WITHHELD, is_secret_name, redact





def shown_value(name: str, value: str) -> str:
    """VALUE of the variable NAME as a .env warning writes it: bare if plain, else in single quotes with \\r, \\t, \\xNN
    written out; a secret's value (recipe.redaction) never, and a token-shaped word or a URL's password withheld."""
    if is_secret_name(name):
        return WITHHELD
    text = escaped(value)
    return redact(text if re.fullmatch(r"[A-Za-z0-9_./:@%+,=-]+", text) else f"'{text}'")


def _shown_word(name: str, word: str) -> str:
    """A word of the line (what bash runs as a command) as a warning about NAME may show it."""
    text = escaped(word)
    return "a word of the line" if is_secret_name(name) or redact(text) != text else f"`{text}`"


class _Lines:
    """The line an editor shows an offset on: CRLF, CR and LF each end a line."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.ends = [match.end() for match in re.finditer(r"\r\n|\r|\n", text)]
        #: A CR alone ends a line before the last: both readers see the lines as one.
        self.cr_alone = re.search(r"\r(?!\n|$)", text) is not None

    def of(self, at: int) -> int:
        """The line (from 1) that the offset AT of the text is on."""
        return bisect.bisect_right(self.ends, at) + 1

    def raw(self, line: int) -> tuple[str, str]:
        """Line LINE as the file holds it, and its line ending ('' for a last line without one)."""
        start = self.ends[line - 2] if line > 1 else 0
        end = self.ends[line - 1] if line - 1 < len(self.ends) else len(self.text)
        whole = self.text[start:end]
        body = whole.rstrip("\r\n")
        return body, whole[len(body) :]


def _causes(name: str, want: str, line: int, lines: _Lines, bom: bool) -> tuple[list[str], list[str]]:
    """Why the readers part on line LINE, which means NAME=WANT, and what to write instead: (causes, fixes)."""
    body, ending = lines.raw(line)
    causes, fixes = [], []
    if line == 1 and bom:
        causes.append("a UTF-8 byte order mark starts the file")
        fixes.append("save the file as UTF-8 without a BOM")
        body = body.removeprefix("\ufeff")
    if lines.cr_alone:
        causes.append("the file ends its lines with CR alone, and both readers see one long line")
        fixes.append("save the file with LF line endings")
    elif "\r" in ending:
        causes.append("CRLF line endings" if ending == "\r\n" else "a CR ends the line")
        fixes.append("save the file with LF line endings")
    # The value as a fix may write it: bare, or in single quotes (which both readers take as they are).
    literal = want if re.fullmatch(r"[A-Za-z0-9_./:@%+,=-]*", want) else f"'{want}'"
    if is_secret_name(name) or "'" in want or OPEN in want or escaped(want) != want or redact(literal) != literal:
        literal = "value"
    assignment = re.match(rf"[ \t]*(?:export[ \t]+)?{re.escape(name)}([ \t]*)([=:])([ \t]*)(.?)", body)
    if assignment and (assignment.group(1) or assignment.group(3) or assignment.group(2) == ":"):
        causes.append("blanks around `=`" if assignment.group(2) == "=" else "`:` for `=`")
        fixes.append(f"write {name}={literal}")
    elif assignment and assignment.group(4) in ("'", '"'):
        if re.search(r"""['"][^ \t#]""", body[assignment.end() :]):
            causes.append("text after the closing quote")
    elif assignment and "\t#" in body and " #" not in body:
        causes.append("a tab before `#`, where Compose takes the comment into the value")
        fixes.append("write a blank before the `#`")
    elif assignment and re.search(r"[ \t;&|<>()`\\~#]", want):
        causes.append("an unquoted value with a blank or a character the shell reads")
        fixes.append(f"quote the value: {name}={literal}" if literal.startswith("'") else "quote the value")
    if not fixes:
        fixes.append(f"write {name}={literal}")
    return causes, fixes


@dataclass(frozen=True)
class _Told:
    """What one reader did on each line (by the line an editor shows): the command it ran, the names export refused."""

    reader: str
    reading: Reading
    line_of: Callable[[int], int]  # the line of an offset in the text this reader read

    @functools.cached_property
    def commands(self) -> dict[int, str]:
        return {self.line_of(at): word for at, word in self.reading.commands.items()}

    @functools.cached_property
    def refused(self) -> dict[int, list[str]]:
        return {self.line_of(at): words for at, words in self.reading.refused.items()}

    def says(self, name: str, line: int) -> str:
        """`Compose reads TP=4`, `bash runs `TP` as a command and leaves TP unset`, ... of NAME, judged on LINE."""
        found = self.reading.values.get(name)
        value = "" if found is None else f"{name}={shown_value(name, found[1])}"
        elsewhere = "" if found is None or self.line_of(found[0]) == line else f" (line {self.line_of(found[0])})"
        if line in self.commands:
            runs = f"runs {_shown_word(name, self.commands[line])} as a command"
            if found is None:
                return f"{self.reader} {runs} and leaves {name} unset"
            if elsewhere:  # an earlier line's value stays
                return f"{self.reader} {runs} and keeps {value}{elsewhere}"
            return f"{self.reader} reads {value} and {runs}"
        if line in self.refused and found is None:
            shown = ", ".join(_shown_word(name, word) for word in self.refused[line])
            return f"{self.reader}'s `export` takes {shown} for names and leaves {name} unset"
        return f"{self.reader} leaves {name} unset" if found is None else f"{self.reader} reads {value}{elsewhere}"


def _judged(path: str, text: str) -> list[str]:
    """The warnings for a .env file that holds TEXT (bytes that are not UTF-8 as lone surrogates)."""
    bom = text.startswith("\ufeff")
    body = text[1:] if bom else text
    lines = _Lines(text)
    compose = _Told("Compose", compose_reads(body), lambda at: lines.of(at + bom))
    bash = _Told("bash", bash_reads(text), lines.of)
    # What the lines mean: Compose's reading of the file with LF endings, read on past a line it refuses.
    normalized = re.sub(r"\r\n?", "\n", body)
    intent = compose_reads(normalized, resume=True)
    newlines = [match.start() for match in re.finditer("\n", normalized)]
    stop = None if bash.reading.stopped_at is None else lines.of(bash.reading.stopped_at)
    refused_at = None if compose.reading.error is None else compose.line_of(compose.reading.error.at)
    found: dict[int, list[str]] = {}
    if compose.reading.error is not None and refused_at is not None:
        found[refused_at] = [
            f"Compose refuses the whole file at this line ({compose.reading.error.why}): none of its variables "
            f"reaches Compose, while bash reads the lines it can"
        ]
    judged = [(bisect.bisect_left(newlines, at) + 1, name) for name, (at, _) in intent.values.items()]
    if intent.error is None:  # a name only one reader sets, on the line it sets it (not judged past an error)
        for told in (bash, compose):
            judged += [(told.line_of(at), name) for name, (at, _) in told.reading.values.items()
                       if name not in intent.values and name not in intent.unknown]  # fmt: skip
    extras: dict[int, list[str]] = {}
    for line, name in sorted(set(judged)):
        if not name or name in compose.reading.unknown or name in bash.reading.unknown or line == refused_at:
            continue
        if stop is not None and line >= stop:  # bash did something there the model does not follow
            continue
        want = intent.values[name][1] if name in intent.values else None
        said = bash.reading.values.get(name, (0, None))[1]
        if refused_at is None:
            if compose.reading.values.get(name, (0, None))[1] == want and said == want:
                continue
            compose_says = compose.says(name, line)
        elif said == want:
            continue
        else:
            compose_says = f"Compose reads nothing of the file (it stops at line {refused_at})"
        if want is None:  # a name the line does not mean to set: the line's own warning says why
            extras.setdefault(line, []).append(f"{name}: {compose_says}, {bash.says(name, line)}")
            continue
        causes, fixes = _causes(name, want, line, lines, bom)
        why = f" ({'; '.join(causes)})" if causes else ""
        bash_says = bash.says(name, line)
        found.setdefault(line, []).append(f"{name}: {compose_says}, {bash_says}{why}: {' and '.join(fixes)}")
    for line, parts in extras.items():
        found.setdefault(line, []).extend(parts)
    return [f"{path}:{line}: {'; '.join(found[line])}" for line in sorted(found)]


def env_file_problems(path: Path) -> list[str]:
    """Lines of an env file that its two readers, Compose (`.env`) and bash (the README's `set -a; . ./.env`), read
    apart, or that either reads as another name or value than the line says.

    One warning a line, naming the variable and what each reader makes of it, e.g. `TP = 4`: Compose reads TP=4,
    bash runs `TP` as a command and leaves TP unset. A secret's value is never shown. A missing file, a directory,
    a FIFO and a file over 1 MiB are not read; the check never raises.
    """
    try:
        if not path.is_file() or path.stat().st_size > (1 << 20):
            return []
        with path.open("rb") as file:
            data = file.read((1 << 20) + 1)
    except OSError:
        return []
    if len(data) > (1 << 20):  # grew since the stat
        return []
    return _judged(str(path), data.decode("utf-8", errors="surrogateescape"))
