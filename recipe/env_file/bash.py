"""bash's reading of a `.env` file (`set -a; . ./.env; set +a`): the part of its grammar a .env file uses."""

from __future__ import annotations

import re
from dataclasses import dataclass

from recipe.env_file.reading import OPEN, SHELL_NAME, NotFollowed, Reading, Unclosed, expansion

#: A run of characters that bash takes as they are in an unquoted word.
_BASH_PLAIN = re.compile(r"""[^ \t\n'"\\$`|&;()<>]+""")
#: Reserved words and builtins that change the shell's variables, its input or its flow: the model stops there.
_BASH_OWN_WORDS = frozenset({
    "if", "then", "else", "elif", "fi", "case", "esac", "for", "select", "while", "until", "do", "done", "in",
    "function", "time", "coproc", "{", "}", "!", "[[", "]]", ".", "source", "eval", "exec", "exit", "return", "set",
    "unset", "declare", "typeset", "local", "readonly", "shift", "read", "mapfile", "readarray", "let", "alias",
    "unalias", "builtin", "command", "enable", "cd", "pushd", "popd", "trap", "shopt", "printf", "wait", "break",
    "continue", "getopts", "hash",
})  # fmt: skip






@dataclass(frozen=True)
class _Word:
    """One word of a command: its pieces (text, quoted), where it starts, and its text after quote removal."""

    pieces: tuple[tuple[str, bool], ...]
    at: int

    @property
    def text(self) -> str:
        return "".join(piece for piece, _ in self.pieces)

    def unquoted_start(self) -> str:
        """The word's text up to its first quoted piece: where bash looks for NAME=."""
        start = []
        for piece, quoted in self.pieces:
            if quoted:
                break
            start.append(piece)
        return "".join(start)


def bash_reads(text: str) -> Reading:
    """What `set -a; . ./.env; set +a` sets of TEXT (the file as it is, a byte order mark included)."""
    reading = Reading()
    at = 0
    while at < len(text):
        start = at
        try:
            # bash parses a whole line (`A=1; B=2`, a quote across lines) before it runs any of its commands.
            commands, at = _bash_line(text, at)
            for words in commands:
                _bash_runs(words, reading)
        except NotFollowed:
            reading.stopped_at = start
            break
        except Unclosed:
            break
    return reading


def _bash_line(text: str, at: int) -> tuple[list[list[_Word]], int]:
    """The simple commands of the line at AT (separated by `;`), and where the next line starts."""
    commands: list[list[_Word]] = [[]]
    while at < len(text):
        char = text[at]
        if char in " \t":
            at += 1
        elif char == "\n":
            return [words for words in commands if words], at + 1
        elif char == ";" and commands[-1] and text[at + 1 : at + 2] != ";":
            commands.append([])
            at += 1
        elif char == "#":  # a comment only where a word would start
            end = text.find("\n", at)
            return [words for words in commands if words], len(text) if end < 0 else end + 1
        elif char in "|&;()<>":
            raise NotFollowed(char)
        elif text.startswith("\\\n", at):
            at += 2
        else:
            word, end = _bash_word(text, at)
            if end <= at:  # never the case; a guard that the check cannot hang plan
                raise NotFollowed(char)
            commands[-1].append(word)
            at = end
    return [words for words in commands if words], at


def _bash_word(text: str, at: int) -> tuple[_Word, int]:
    """The word at AT, with quotes removed and `$X`/`${X}` as expansions, and where it ends."""
    start, pieces = at, []
    while at < len(text):
        char = text[at]
        if char in " \t\n|&;()<>":
            break
        if plain := _BASH_PLAIN.match(text, at):
            pieces.append((plain.group(0), False))
            at = plain.end()
        elif char == "\\":
            if at + 1 >= len(text):
                pieces.append(("\\", False))
            elif text[at + 1] != "\n":  # backslash-newline joins the lines
                pieces.append((text[at + 1], True))
            at += 2
        elif char == "'":
            end = text.find("'", at + 1)
            if end < 0:
                raise Unclosed
            pieces.append((text[at + 1 : end], True))
            at = end + 1
        elif char == '"':
            at = _bash_double_quoted(text, at + 1, pieces)
        elif char == "$":
            at = _bash_dollar(text, at, pieces, quoted=False)
        else:  # a backquote
            raise NotFollowed(char)
    return _Word(tuple(pieces), start), at


def _bash_double_quoted(text: str, at: int, pieces: list[tuple[str, bool]]) -> int:
    """Read a double-quoted string from AT (past its opening quote) into PIECES; where it ends."""
    while at < len(text):
        char = text[at]
        if char == '"':
            return at + 1
        if char == "\\" and at + 1 < len(text) and text[at + 1] in '$`"\\\n':
            if text[at + 1] != "\n":
                pieces.append((text[at + 1], True))
            at += 2
        elif char == "$":
            at = _bash_dollar(text, at, pieces, quoted=True)
        elif char == "`":
            raise NotFollowed(char)
        else:
            pieces.append((char, True))
            at += 1
    raise Unclosed


def _bash_dollar(text: str, at: int, pieces: list[tuple[str, bool]], quoted: bool) -> int:
    """Read the `$` at AT: `$X` and `${X}` expand, a `$` before a blank or at the end is itself; others not followed."""
    after = text[at + 1 : at + 2]
    if name := SHELL_NAME.match(text, at + 1):
        pieces.append((expansion(name.group(0)), True))
        return name.end()
    if after == "{":
        end = text.find("}", at + 2)
        if end >= 0 and SHELL_NAME.fullmatch(text, at + 2, end):
            pieces.append((expansion(text[at + 2 : end]), True))
            return end + 1
        raise NotFollowed("${")
    if after and (after.isdigit() or after in "(\"'$?!#*@-{") and not (quoted and after == '"'):
        raise NotFollowed("$" + after)
    pieces.append(("$", quoted))
    return at + 1


def _bash_assignment(word: _Word) -> tuple[str, str | None] | None:
    """NAME and value of a word bash takes as an assignment (None: the value is not followed), else None."""
    match = re.match(r"([A-Za-z_][A-Za-z0-9_]*)(=|\+=|\[)", word.unquoted_start())
    if match is None:
        return None
    if match.group(2) != "=":  # NAME+=, NAME[i]=
        raise NotFollowed(match.group(0))
    # The word without NAME= (in its leading unquoted text): unquoted characters one by one, quoted pieces whole.
    skip, rest = len(match.group(0)), []
    for piece, quoted in word.pieces:
        if quoted:
            rest.append((piece, True))
            continue
        for char in piece:
            if skip:
                skip -= 1
            else:
                rest.append((char, False))
    return match.group(1), _bash_tilde(rest)


def _bash_tilde(chars: list[tuple[str, bool]]) -> str | None:
    """An assignment's value with bash's tilde expansion: `~` at its start or after a `:` is $HOME (None: `~user`)."""
    out, i, at_start = [], 0, True
    while i < len(chars):
        char, quoted = chars[i]
        if at_start and char == "~" and not quoted:
            end = i + 1
            while end < len(chars) and not (chars[end][0] in "/:" and not chars[end][1]):
                end += 1
            if end > i + 1:  # ~user, ~+, ~-
                return None
            out.append(expansion("HOME"))
            i, at_start = end, False
            continue
        out.append(char)
        at_start = char == ":" and not quoted
        i += 1
    return "".join(out)


def _bash_runs(words: list[_Word], reading: Reading) -> None:
    """What bash does with one simple command: assign, export, or run a command (its assignments then lost)."""
    at = words[0].at
    assignments = []
    for word in words:
        assignment = _bash_assignment(word)
        if assignment is None:
            break
        assignments.append(assignment)
    if len(assignments) == len(words):
        for name, value in assignments:
            reading.set(name, value, at)
        return
    command = words[len(assignments)]
    if OPEN in command.text:
        raise NotFollowed("a command from an expansion")
    if command.text == "export":
        if assignments:  # `A=1 export B=2`: A only for export's run (bash outside POSIX mode), B set
            reading.commands[at] = command.text
        refused: list[str] = []
        for number, word in enumerate(words[len(assignments) + 1 :]):
            assignment = _bash_assignment(word)
            if assignment is not None:
                reading.set(*assignment, at)
            elif (word.text.startswith("-") and number == 0) or OPEN in word.text:  # an option: only first
                raise NotFollowed("export's option or expansion")
            elif not SHELL_NAME.fullmatch(word.text):  # a name alone is only exported: its value stays
                refused.append(word.text)
        if refused:
            reading.refused[at] = refused
        return
    if command.text in _BASH_OWN_WORDS:
        raise NotFollowed(command.text)
    reading.commands[at] = command.text  # a command not found, nearly always; the assignments before it are lost
