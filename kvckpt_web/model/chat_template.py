"""The chat template of a GGUF model, rendered in plain Python (Pyodide has no jinja2).

A GGUF's ``tokenizer.chat_template`` is a Jinja template. Rather than interpret Jinja, this module recognises the
family a template belongs to by the markers it writes and renders that family directly: ChatML (SmolLM2, Qwen2,
Qwen2.5: ``<|im_start|>role ... <|im_end|>``, with the default system turn the template may put first), Qwen3
(ChatML whose earlier replies lose their ``<think>`` block), Gemma (``<start_of_turn>user ... <end_of_turn>``, the
system message put at the start of the first user turn) and Llama 3 (``<|start_header_id|>role<|end_header_id|>``,
from 3.1 on with its dated system header). Any other template is refused, naming it. Every family renders through
one interface (:class:`ChatTemplate`): the pieces before the first message, each message's turn, the opening of
the assistant's turn and what closes it. A template is of a family when it writes the family's markers and opens the
assistant's turn as the family does; Qwen3 is told from ChatML by its rule for earlier replies' thinking. A BOS the
template writes (``{{ bos_token }}``) is left to the tokenizer, which adds it where the GGUF says
(``tokenizer.ggml.add_bos_token``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from ..errors import FieldError, FormatError

if TYPE_CHECKING:
    from .gguf import GGUFFile

__all__ = ["FAMILIES", "ROLE_ALIASES", "TEMPLATE_KEY", "ChatML", "ChatTemplate", "Gemma", "Llama3", "Qwen3",
           "template_role"]

TEMPLATE_KEY = "tokenizer.chat_template"
"""The GGUF metadata key holding the Jinja chat template."""

ROLE_ALIASES = {"developer": "system"}
"""Roles every family renders as another: OpenAI's ``developer`` (its newer name for ``system``) is the template's
system turn."""

Pieces = list[tuple[str, bool]]
"""Text as ``(text, is_marker)`` pieces: markers are the template's own special tokens; every other piece is
encoded as plain text even where it spells a marker."""

_NL = r"(?:\n|\\n)"  # a newline written as itself or as an escape inside a Jinja string literal
_DEFAULT_SYSTEM = re.compile(r"<\|im_start\|>system" + _NL + r"((?:[^'\"\\<]|\\n)+)<\|im_end\|>")
# The opening of the assistant's turn each family writes, as a whole string literal of the template: a template
# that opens it otherwise (e.g. with a "<think>" the model is to continue) is of no family here.
_GEMMA_OPENING = re.compile(r"['\"]<start_of_turn>model" + _NL + r"['\"]")
_LLAMA3_OPENING = re.compile(r"['\"]<\|start_header_id\|>assistant<\|end_header_id\|>" + _NL * 2 + r"['\"]")
_CHATML_OPENING = re.compile(r"['\"]<\|im_start\|>assistant" + _NL + r"['\"]")


class ChatTemplate:
    """A chat template family's rendering: :meth:`render` and :meth:`render_pieces` of whole conversations, made
    of :meth:`preamble_pieces`, :meth:`message_pieces` (each message knowing the role before it),
    :meth:`opening_pieces` and :meth:`closing_pieces`, which the engine also encodes turn by turn."""

    family: ClassVar[str]
    """The family's name, as messages say it."""
    turn_end: ClassVar[str]
    """The marker that ends a turn: a reply ends where the model writes it."""

    @classmethod
    def from_text(cls, template: str) -> ChatTemplate:
        """The renderer of the Jinja ``template``'s family, recognised by the markers it writes; FormatError naming
        the template (a short excerpt) if it is of no family here."""
        if "<start_of_turn>" in template and "<end_of_turn>" in template and _GEMMA_OPENING.search(template):
            return Gemma(system_turn="System role not supported" not in template)
        if "<|start_header_id|>" in template and "<|eot_id|>" in template and _LLAMA3_OPENING.search(template):
            return Llama3(dated="Cutting Knowledge Date" in template)
        if "<|im_start|>" in template and "<|im_end|>" in template and _CHATML_OPENING.search(template):
            if "<think>" not in template:
                match = _DEFAULT_SYSTEM.search(template)
                return ChatML(match.group(1).replace("\\n", "\n") if match else None)
            if "last_query_index" in template:  # Qwen3's handling of earlier replies' thinking
                return Qwen3()
        got = " ".join(template.split())
        raise FormatError(TEMPLATE_KEY, f"a chat template of a known family ({', '.join(FAMILIES)})",
                          got if len(got) <= 80 else got[:77] + "...",
                          "not supported here: use plain completion with a prompt you format yourself")

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> ChatTemplate | None:
        """The chat template of GGUF file ``f`` (its ``tokenizer.chat_template``); None for a model without one
        (a base model)."""
        if TEMPLATE_KEY not in f.metadata:
            return None
        return cls.from_text(f.field(TEMPLATE_KEY, str))

    def render(self, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = False) -> str:
        """The prompt text of ``messages`` (each with a ``role`` and a ``content`` string).

        ``add_generation_prompt`` ends it with the opening of an assistant turn, for the model to complete.
        """
        return "".join(text for text, _ in self.render_pieces(messages, add_generation_prompt=add_generation_prompt))

    def render_pieces(self, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = False) -> Pieces:
        """:meth:`render`'s text as ``(text, is_marker)`` pieces: the markers are the template's own special
        tokens; every other piece holds the messages' roles and contents (and the template's own text), to be
        encoded as plain text even where it spells a marker."""
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
            raise FieldError("messages", "a sequence of {'role', 'content'} mappings", type(messages).__name__)
        pieces: Pieces = []
        previous = None
        for i, message in enumerate(messages):
            role, content = template_role(_role(message, i)), _content(message, i)
            if i == 0:
                pieces += self.preamble_pieces(role)
            pieces += self.message_pieces(role, content, previous)
            previous = role
        if add_generation_prompt:
            pieces += self.opening_pieces()
        return pieces

    def preamble_pieces(self, first_role: str) -> Pieces:
        """What comes before a first message of role ``first_role`` (a default system turn, or nothing)."""
        return []

    def message_pieces(self, role: str, content: str, previous: str | None) -> Pieces:
        """One message's turn, after a message of role ``previous`` (None: it is the first); FieldError naming
        ``messages`` if the family's template refuses that order of roles."""
        raise NotImplementedError

    def opening_pieces(self) -> Pieces:
        """The opening of the assistant's turn, which the model completes."""
        raise NotImplementedError

    def prefill_pieces(self, content: str, previous: str | None) -> Pieces:
        """An assistant's turn that the model continues (OpenAI-style prefill): the opening of the turn and
        ``content`` as it is (not trimmed), nothing closing it; FieldError naming ``messages`` where the family's
        template refuses an assistant message after one of role ``previous``."""
        self.message_pieces("assistant", content, previous)  # the family's rule on the order of roles
        return [*self.opening_pieces(), (content, False)]

    def closing_pieces(self) -> Pieces:
        """What closes a turn after its content (a reply's generated end-of-turn token stands for the marker)."""
        return [(self.turn_end, True), ("\n", False)]


@dataclass(frozen=True)
class ChatML(ChatTemplate):
    """ChatML: ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message (SmolLM2, Qwen2, Qwen2.5).

    ``default_system`` (None: no default) is the system turn put first when the first message is not a system
    message.
    """

    default_system: str | None = None
    family: ClassVar[str] = "ChatML"
    turn_end: ClassVar[str] = "<|im_end|>"

    def preamble_pieces(self, first_role: str) -> Pieces:
        if self.default_system is None or first_role == "system":
            return []
        return self.message_pieces("system", self.default_system, None)

    def message_pieces(self, role: str, content: str, previous: str | None) -> Pieces:
        return [("<|im_start|>", True), (f"{role}\n{content}", False), *self.closing_pieces()]

    def opening_pieces(self) -> Pieces:
        return [("<|im_start|>", True), ("assistant\n", False)]


@dataclass(frozen=True)
class Qwen3(ChatML):
    """Qwen3's ChatML: no default system turn, and an earlier reply keeps only what follows its ``</think>``
    (the template renders a reply's thinking only after the last user message, where the engine never has one)."""

    family: ClassVar[str] = "Qwen3"

    def message_pieces(self, role: str, content: str, previous: str | None) -> Pieces:
        if role == "assistant" and "</think>" in content:
            content = content.split("</think>")[-1].lstrip("\n")
        return super().message_pieces(role, content, previous)


@dataclass(frozen=True)
class Gemma(ChatTemplate):
    """Gemma's turns: ``<start_of_turn>user\\n{content}<end_of_turn>\\n``, the assistant's role written ``model``,
    contents trimmed; roles alternate from a user message on, and a first system message opens the first user
    turn (``{system}\\n\\n``). ``system_turn`` False (Gemma 2's template) refuses a system message."""

    system_turn: bool = True
    family: ClassVar[str] = "Gemma"
    turn_end: ClassVar[str] = "<end_of_turn>"

    def message_pieces(self, role: str, content: str, previous: str | None) -> Pieces:
        if role == "system" and previous is None and self.system_turn:
            return [("<start_of_turn>", True), (f"user\n{content}\n\n", False)]
        expected = "assistant" if previous == "user" else "user"
        if role != expected:
            order = "after a first system message, " if self.system_turn else ""
            raise FieldError("messages", f"roles alternating user/assistant/user/... {order}as Gemma's template "
                             f"requires", f"{role!r} after {previous!r}" if previous else f"{role!r} first")
        if previous == "system":
            return [(content.strip(), False), *self.closing_pieces()]
        return [("<start_of_turn>", True), (f"{'model' if role == 'assistant' else role}\n{content.strip()}", False),
                *self.closing_pieces()]

    def opening_pieces(self) -> Pieces:
        return [("<start_of_turn>", True), ("model\n", False)]


@dataclass(frozen=True)
class Llama3(ChatTemplate):
    """Llama 3's turns: ``<|start_header_id|>{role}<|end_header_id|>\\n\\n{content}<|eot_id|>``, contents trimmed.
    ``dated`` (Llama 3.1 and later) opens with a system turn whose header gives the knowledge cutoff and the date
    (``date``: the template's own default, so that a conversation's prompt, and the K/V saved of it, does not
    change from one day to the next), the system message, if first, after it."""

    dated: bool = False
    date: str = "26 Jul 2024"
    family: ClassVar[str] = "Llama 3"
    turn_end: ClassVar[str] = "<|eot_id|>"

    def _header(self) -> str:
        return f"Cutting Knowledge Date: December 2023\nToday Date: {self.date}\n\n"

    def preamble_pieces(self, first_role: str) -> Pieces:
        if not self.dated or first_role == "system":
            return []
        return [*self._opening("system"), (self._header(), False), *self.closing_pieces()]

    def message_pieces(self, role: str, content: str, previous: str | None) -> Pieces:
        header = self._header() if self.dated and role == "system" and previous is None else ""
        return [*self._opening(role), (header + content.strip(), False), *self.closing_pieces()]

    def _opening(self, role: str) -> Pieces:
        return [("<|start_header_id|>", True), (role, False), ("<|end_header_id|>", True), ("\n\n", False)]

    def opening_pieces(self) -> Pieces:
        return self._opening("assistant")

    def closing_pieces(self) -> Pieces:
        return [(self.turn_end, True)]


FAMILIES = ("ChatML", "Qwen3", "Gemma", "Llama 3")
"""The template families rendered here."""


def template_role(role: str) -> str:
    """The role a family's template renders ``role`` as (see :data:`ROLE_ALIASES`)."""
    return ROLE_ALIASES.get(role, role)


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
