"""The text side of a GGUF chat model as a :class:`~kvckpt_web.model.protocol.TextCodec`.

Prompts are the chat template's turns, ending with the opening of the assistant's turn. Only the template's
own markers (``<|im_start|>``, ``<|im_end|>``) become special tokens: a message's text is encoded as text,
so a user who types ``<|im_end|>`` gets those characters, not the control token. Encoding turn by turn gives
the ids of the whole rendered prompt (special tokens split the text, so each turn's text is tokenized alone
either way), which lets a caller put a reply's generated ids back in place of its text. Replies end at the
tokenizer's EOS id or at the template's end-of-turn token; their text leaves special tokens out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from ..errors import FormatError
from .chat import END, START, ChatTemplate
from .tokenizer import Tokenizer

if TYPE_CHECKING:
    from .gguf import GGUFFile

END_OF_TURN = END
"""ChatML's end of a turn: a reply ends there."""


class ChatCodec:
    """A GGUF model's tokenizer and chat template."""

    def __init__(self, tokenizer: Tokenizer, template: ChatTemplate) -> None:
        self.tokenizer = tokenizer
        self.template = template
        self._start, self._end = (self._marker(m) for m in (START, END))
        self.eos_ids = tuple(sorted({tokenizer.eos_id, self._end}))

    def _marker(self, text: str) -> int:
        ids = self.tokenizer.encode(text, add_bos=False)
        if len(ids) != 1 or ids[0] not in self.tokenizer.special_ids:
            raise FormatError("tokenizer.ggml.tokens", f"a special token {text!r} (the chat template's marker)",
                              f"{len(ids)} tokens")
        return ids[0]

    def _text(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, parse_special=False, add_bos=False)

    @classmethod
    def from_gguf(cls, f: "GGUFFile") -> "ChatCodec":
        """The codec stored in GGUF file ``f``; FormatError naming the key if its tokenizer or template is not
        supported."""
        return cls(Tokenizer.from_gguf(f), ChatTemplate.from_gguf(f))

    def preamble(self, first_role: str) -> list[int]:
        """What comes before the first message: BOS if the model adds one, and the template's default system
        turn when the first message (of role ``first_role``) is not a system message."""
        ids = [self.tokenizer.bos_id] if self.tokenizer.add_bos else []
        if first_role != "system" and self.template.default_system is not None:
            ids += self.turn("system", self.template.default_system)
        return ids

    def turn(self, role: str, content: str) -> list[int]:
        """The ids of one message's turn (``content`` encoded as text)."""
        return [self._start, *self._text(f"{role}\n{content}"), self._end, *self._text("\n")]

    def reply_opening(self) -> list[int]:
        """The ids that open the assistant's turn: the model writes its reply after them."""
        return [self._start, *self._text("assistant\n")]

    def reply_closing(self) -> list[int]:
        """The ids that close an assistant turn after its reply's ids (an end-of-turn id it generated left out)."""
        return [self._end, *self._text("\n")]

    def encode_chat(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """The prompt token ids of ``messages`` (``{"role", "content"}``), ready for the assistant's reply."""
        self.template.render(messages)  # checks the messages' shape, naming a bad field
        ids = self.preamble(messages[0]["role"]) if messages else []
        for message in messages:
            ids += self.turn(message["role"], message["content"])
        return ids + self.reply_opening()

    def decode(self, tokens: Sequence[int]) -> str:
        """The text of ``tokens`` without special tokens; incomplete UTF-8 at the end decodes to U+FFFD."""
        return self.tokenizer.decode(tokens, skip_special=True)
