"""The chat template of a GGUF model: ChatML, rendered in plain Python (Pyodide has no jinja2).

A GGUF's ``tokenizer.chat_template`` is a Jinja template. Rather than interpret Jinja, this module recognises
the ChatML form SmolLM2 ships (optionally with a default system turn put before a first non-system message)
and renders it directly; any other template is refused, and such a model's caller formats its prompt itself.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import FieldError, FormatError

if TYPE_CHECKING:
    from .gguf import GGUFFile

__all__ = ["TEMPLATE_KEY", "TURN_END", "TURN_START", "ChatTemplate"]

TEMPLATE_KEY = "tokenizer.chat_template"
"""The GGUF metadata key holding the Jinja chat template."""

TURN_START, TURN_END = "<|im_start|>", "<|im_end|>"
"""ChatML's markers of a turn: the template's own special tokens."""

_NL = r"(?:\n|\\n)"  # a newline written as itself or as an escape inside a Jinja string literal
_SYSTEM_BLOCK = (r"\{%-? ?if loop\.first and messages\[0\]\['role'\] != 'system' ?-?%\}"
                 r"\{\{ ?'<\|im_start\|>system" + _NL + r"(?P<system>[^'\\]*)<\|im_end\|>" + _NL + r"' ?\}\}"
                 r"\{%-? ?endif ?-?%\}")
_CHATML = re.compile(
    r"\s*\{%-? ?for message in messages ?-?%\}"
    r"(?:" + _SYSTEM_BLOCK + r")?"
    r"\{\{ ?'<\|im_start\|>' \+ message\['role'\] \+ '" + _NL + r"' \+ message\['content'\] \+ "
    r"'<\|im_end\|>(?:' \+ '" + _NL + r"'|" + _NL + r"')"  # "'<|im_end|>' + '\n'" or "'<|im_end|>\n'"
    r" ?\}\}\{%-? ?endfor ?-?%\}"
    r"\{%-? ?if add_generation_prompt ?-?%\}\{\{ ?'<\|im_start\|>assistant" + _NL + r"' ?\}\}\{%-? ?endif ?-?%\}\s*")


@dataclass(frozen=True)
class ChatTemplate:
    """ChatML: ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message.

    ``default_system`` (None: no default) is the system turn put first when the first message is not a
    system message.
    """

    default_system: str | None = None

    @classmethod
    def from_text(cls, template: str) -> ChatTemplate:
        """The ChatML template written as Jinja ``template``; refuses any other template."""
        match = _CHATML.fullmatch(template)
        if match is None:
            got = template if len(template) <= 80 else template[:77] + "..."
            raise FormatError(TEMPLATE_KEY, "a ChatML template (<|im_start|>role ... <|im_end|>)", got,
                              "not supported here: format the prompt yourself and encode it with the tokenizer")
        return cls(match.group("system"))

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> ChatTemplate:
        """The chat template of GGUF file ``f`` (its ``tokenizer.chat_template``)."""
        return cls.from_text(f.field(TEMPLATE_KEY, str))

    def render(self, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = False) -> str:
        """The prompt text of ``messages`` (each with a ``role`` and a ``content`` string).

        ``add_generation_prompt`` ends it with the opening of an assistant turn, for the model to complete.
        """
        return "".join(text for text, _ in self.render_pieces(messages, add_generation_prompt=add_generation_prompt))

    def render_pieces(self, messages: Sequence[Mapping[str, str]], *,
                      add_generation_prompt: bool = False) -> list[tuple[str, bool]]:
        """:meth:`render`'s text as ``(text, is_marker)`` pieces: the markers are the template's own
        ``<|im_start|>`` and ``<|im_end|>``, to be encoded as special tokens; every other piece holds the
        messages' roles and contents (and the template's newlines), to be encoded as plain text even where it
        spells a marker."""
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
            raise FieldError("messages", "a sequence of {'role', 'content'} mappings", type(messages).__name__)
        pieces: list[tuple[str, bool]] = []
        for i, message in enumerate(messages):
            role, content = _role(message, i), _content(message, i)
            if i == 0:
                pieces += self.preamble_pieces(role)
            pieces += self.message_pieces(role, content)
        if add_generation_prompt:
            pieces += self.opening_pieces()
        return pieces

    def preamble_pieces(self, first_role: str) -> list[tuple[str, bool]]:
        """What comes before a first message of role ``first_role``: the default system turn, if the template
        has one and the message is not a system message."""
        if self.default_system is None or first_role == "system":
            return []
        return self.message_pieces("system", self.default_system)

    def message_pieces(self, role: str, content: str) -> list[tuple[str, bool]]:
        """One message's turn as :meth:`render_pieces` pieces."""
        return [(TURN_START, True), (f"{role}\n{content}", False), *self.closing_pieces()]

    def opening_pieces(self) -> list[tuple[str, bool]]:
        """The opening of the assistant's turn, which the model completes."""
        return [(TURN_START, True), ("assistant\n", False)]

    def closing_pieces(self) -> list[tuple[str, bool]]:
        """What closes a turn after its content (a reply's generated end-of-turn token stands for the marker)."""
        return [(TURN_END, True), ("\n", False)]


def _role(message: Mapping[str, str], i: int) -> str:
    if not isinstance(message, Mapping):
        raise FieldError(f"messages[{i}]", "a mapping with 'role' and 'content'", type(message).__name__)
    role = message.get("role")
    if not isinstance(role, str) or not role:
        got = role if isinstance(role, str) else type(role).__name__
        raise FieldError(f"messages[{i}].role", "a non-empty str", got)
    return role


def _content(message: Mapping[str, str], i: int) -> str:
    content = message.get("content")
    if not isinstance(content, str):
        raise FieldError(f"messages[{i}].content", "a str", type(content).__name__)
    return content
