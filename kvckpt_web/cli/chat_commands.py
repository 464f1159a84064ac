"""What a line typed into ``kvckpt chat`` asks for: a message to send, or a slash command and its argument.

A line that does not start with ``/`` is a message (``//`` sends a message that starts with ``/``). Commands:
``/new [NAME]``, ``/list``, ``/open NAME|N``, ``/regen``, ``/edit [N] [TEXT]``, ``/system [TEXT]``,
``/continue``, ``/help``, ``/exit``. A command given an argument it does not take, or missing one it needs,
is a :class:`FieldError` naming the command; an unknown command is ``Command("unknown", word)``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..durable.keys import validate_name
from ..errors import FieldError

__all__ = ["COMMANDS", "HELP", "Command", "parse_line"]

COMMANDS = {
    "new": "[NAME]", "list": "", "open": "NAME|N", "regen": "", "edit": "[N] [TEXT]", "system": "[TEXT]",
    "continue": "", "help": "", "exit": "",
}
"""Each command and the argument it takes (as the help shows it)."""

HELP = ("commands: " + ", ".join(f"/{name} {arg}".rstrip() for name, arg in COMMANDS.items())
        + " (Ctrl-C stops a reply; //text sends text that starts with /)")
"""The one line of help."""


@dataclass(frozen=True)
class Command:
    """One line of input: ``name`` is a command's (``"say"`` for a message, ``"empty"`` for a blank line,
    ``"unknown"`` for a command that does not exist), ``text`` its text argument, ``number`` its number
    argument (``/open N``, ``/edit N``)."""

    name: str
    text: str = ""
    number: int | None = None


def _number(word: str) -> int | None:
    return int(word) if word.isascii() and word.isdigit() else None


def parse_line(line: str) -> Command:
    """The command ``line`` (as typed, without its newline) gives."""
    if not line.strip():
        return Command("empty")
    if not line.startswith("/"):
        return Command("say", line)
    if line.startswith("//"):
        return Command("say", line[1:])
    word, _, rest = line[1:].partition(" ")
    rest = rest.strip()
    if word not in COMMANDS:
        return Command("unknown", word)
    field = f"/{word}"
    if word in ("list", "regen", "continue", "help", "exit"):
        if rest:
            raise FieldError(field, "no argument", rest)
        return Command(word)
    if word == "new":
        return Command(word, validate_name(rest, field) if rest else "")
    if word == "open":
        if not rest:
            raise FieldError(field, "a conversation name or a number from /list", "nothing")
        number = _number(rest)
        return Command(word, "" if number is not None else validate_name(rest, field), number)
    if word == "edit":
        first, _, text = rest.partition(" ")
        number = _number(first)
        if number is None:
            return Command(word, rest)
        if number < 1:
            raise FieldError(field, "a message number >= 1 (1: your first message)", number)
        return Command(word, text.strip(), number)
    return Command(word, rest)  # system
