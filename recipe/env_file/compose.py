"""Docker Compose's reading of a `.env` file: a port of compose-go's dotenv parser (dotenv/parser.go, v2.x, as
Compose v5 ships it), and its `${}` expansion."""

from __future__ import annotations

import re
import unicodedata

from recipe.env_file.reading import Reading, Refused, escaped, expansion

#: Go's unicode.IsSpace, which Compose trims a name and an unquoted value with (Python's isspace also takes \x1c-\x1f).
GO_SPACE = (
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f"
    "\u205f\u3000"
)
#: compose-go dotenv's isSpace: the blanks around a name and before a value (no newline).
_DOTENV_BLANK = "\t\v\f\r \x85\xa0"
_COMPOSE_EXPORT = re.compile(r"export[\t\n\f\r ]+")  # RE2's \s: no \v
_COMPOSE_ESCAPE = re.compile(r"""\\(?:[abcfnrtv$"\\]|0[0-9]{0,3})""")
_COMPOSE_SIMPLE_ESCAPES = {
    "a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\", '"': '"',
}  # fmt: skip
#: compose-go template's pattern: $$, $NAME, ${NAME}, ${NAME:-default} and the like, or an invalid ${.
_COMPOSE_TEMPLATE = re.compile(
    r"\$(?i:(?P<escaped>\$)|(?P<named>[_a-z][_a-z0-9]*)"
    r"|\{(?:(?P<braced>[_a-z][_a-z0-9]*)(?P<operator>:?[-+?].*)?\}|(?P<invalid>)))"
)




def compose_reads(text: str, resume: bool = False) -> Reading:
    """What Compose reads of TEXT (the file, its byte order mark already dropped, as compose-go drops it).

    Compose refuses the whole file at its first error; RESUME reads on from the next line instead (what the
    lines after it say, for judging them too), and keeps the first error.
    """
    reading = Reading()
    at = 0
    while (at := _compose_statement(text, at)) < len(text):
        start = at
        try:
            name, at, inherited = _compose_name(text, at)
            if " " in name:
                raise Refused(start, "a blank inside a name")
            if inherited:  # `NAME` alone: Compose takes NAME from its own environment, as bash leaves it
                continue
            value, at = _compose_value(text, at, start)
        except Refused as refused:
            reading.error = reading.error or refused
            if not resume:
                return reading
            end = text.find("\n", start)
            at = len(text) if end < 0 else end + 1
            continue
        reading.set(name, value, start)
    return reading


def _compose_statement(text: str, at: int) -> int:
    """Where the next statement starts: past blank lines and comments (len(text) at the end)."""
    while True:
        while at < len(text) and text[at] in GO_SPACE:
            at += 1
        if at >= len(text) or text[at] != "#":
            return at
        end = text.find("\n", at)
        if end < 0:
            return len(text)
        at = end


def _compose_name(text: str, at: int) -> tuple[str, int, bool]:
    """The name of the statement at AT, where its value starts, and whether the name stands alone (`NAME`)."""
    start = at
    if _COMPOSE_EXPORT.match(text, at):
        at += len("export")
        while at < len(text) and text[at] in _DOTENV_BLANK:
            at += 1
    if at >= len(text):
        raise Refused(start, "`export` with no name")
    i = at
    while i < len(text):
        char = text[i]
        if char in _DOTENV_BLANK or char in "_.-[]" or unicodedata.category(char)[0] in "LN":
            i += 1
        elif char in "=:\n":
            name, value_at, inherited = text[at:i].rstrip(GO_SPACE), i + 1, char == "\n"
            break
        else:
            raise Refused(start, f"{escaped(char)} in a name")
    else:  # no `=` to the end: Go's loop leaves the name empty and the rest as its value
        name, value_at, inherited = "", at, False
    while value_at < len(text) and text[value_at] in _DOTENV_BLANK:
        value_at += 1
    return name, value_at, inherited


def _compose_value(text: str, at: int, start: int) -> tuple[str | None, int]:
    """The value at AT (None where it expands `${X:-d}` and the like) and where the next statement may start."""
    quote = text[at] if at < len(text) and text[at] in "\"'" else None
    if quote is None:
        end = text.find("\n", at)
        value, after = (text[at:], len(text)) if end < 0 else (text[at:end], end + 1)
        return _compose_expand(value.split(" #", 1)[0].rstrip(GO_SPACE), start), after
    chars: list[str] = []
    escaped = False
    for i in range(at + 1, len(text)):
        char = text[i]
        if char == quote and not escaped:
            value = "".join(chars)
            return (_compose_expand(_compose_escapes(value), start) if quote == '"' else value), i + 1
        if char == "\\" and not escaped:
            escaped = True
            continue
        if escaped and char != quote:
            chars.append("\\")
        escaped = False
        chars.append(char)
    raise Refused(start, "a quote that is not closed")


def _compose_escapes(value: str) -> str:
    """compose-go's expandEscapes: \\n, \\t, ... and \\0NNN in a double-quoted value; `\\$` is a literal $."""

    def unescape(match: re.Match[str]) -> str:
        escape = match.group(0)
        if escape == "\\$":
            return "$$"
        if escape.startswith("\\0"):  # Go's code rewrites \\0NNN as \\NNN, and keeps that text where Go cannot read it
            escape = "\\" + escape[2:]
        body = escape[1:]
        if body in _COMPOSE_SIMPLE_ESCAPES:
            return _COMPOSE_SIMPLE_ESCAPES[body]
        if re.fullmatch("[0-7]{3}", body) and int(body, 8) <= 0xFF:
            return chr(int(body, 8))
        return escape

    return _COMPOSE_ESCAPE.sub(unescape, value)


def _compose_expand(value: str, start: int) -> str | None:
    """VALUE with `$$` a literal $ and each `$X`/`${X}` an expansion; None where it holds `${X:-d}` and the like."""
    followed = True

    def expand(match: re.Match[str]) -> str:
        nonlocal followed
        if match["escaped"] is not None:
            return "$"
        if match["invalid"] is not None:
            raise Refused(start, "a `${` that Compose cannot read (write $$ for a $)")
        if match["operator"] is not None:
            followed = False
        return expansion(match["named"] or match["braced"])

    expanded = _COMPOSE_TEMPLATE.sub(expand, value)
    return expanded if followed else None
