"""The text side of a GGUF chat model as a :class:`~kvckpt_web.model.protocol.TextCodec`.

Prompts are the chat template's rendering of the messages, ending with the opening of the
assistant's turn, encoded by the model's tokenizer with only the template's markers as special
tokens; replies end at the tokenizer's EOS id or at the template's end-of-turn token
(``<|im_end|>`` in ChatML); their text leaves special tokens out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from .chat_template import TURN_END, ChatTemplate
from .tokenizer_base import BaseTokenizer
from .tokenizer_kinds import tokenizer_from_gguf

if TYPE_CHECKING:
    from .gguf import GGUFFile


class ChatCodec:
    """A GGUF model's tokenizer and chat template."""

    def __init__(self, tokenizer: BaseTokenizer, template: ChatTemplate) -> None:
        self.tokenizer = tokenizer
        self.template = template
        turn_end = tokenizer.encode(TURN_END, add_bos=False)  # a reply ends at the end of its turn
        ends = {tokenizer.eos_id}
        if len(turn_end) == 1 and turn_end[0] in tokenizer.special_ids:
            ends.add(turn_end[0])
        self.eos_ids = tuple(sorted(ends))

    @classmethod
    def from_gguf(cls, f: "GGUFFile") -> "ChatCodec":
        """The codec stored in GGUF file ``f``; FormatError naming the key if its tokenizer or template is not
        supported."""
        return cls(tokenizer_from_gguf(f), ChatTemplate.from_gguf(f))

    def _encode(self, pieces: list[tuple[str, bool]], max_tokens: int | None) -> list[int]:
        return self.tokenizer.encode_pieces(pieces, add_bos=False, max_tokens=max_tokens, field="prompt")

    def preamble(self, first_role: str) -> list[int]:
        """The ids before a first message of role ``first_role``: BOS if the model adds one, and the template's
        default system turn unless the message is a system message."""
        bos = [self.tokenizer.bos_id] if self.tokenizer.add_bos else []
        return bos + self._encode(self.template.preamble_pieces(first_role), None)

    def encode_message(self, role: str, content: str, *, max_tokens: int | None = None) -> list[int]:
        """The ids of one message's turn, its content encoded as text (FieldError naming ``prompt`` beyond
        ``max_tokens``, as :meth:`encode_chat`)."""
        return self._encode(self.template.message_pieces(role, content), max_tokens)

    def reply_opening(self) -> list[int]:
        """The ids that open the assistant's turn: the model writes its reply after them."""
        return self._encode(self.template.opening_pieces(), None)

    def reply_closing(self) -> list[int]:
        """The ids that close an assistant turn after its reply's ids (an end-of-turn id it generated left out)."""
        return self._encode(self.template.closing_pieces(), None)

    def encode_chat(self, messages: Sequence[Mapping[str, str]], *, max_tokens: int | None = None) -> list[int]:
        """The prompt token ids of ``messages``, ready for the assistant's reply: the template's markers are
        special tokens, the messages' text is encoded as text (a ``<|im_end|>`` typed in a message is not the
        end of its turn). A prompt of more than ``max_tokens`` tokens is refused (FieldError naming ``prompt``)
        as :meth:`BaseTokenizer.encode` does."""
        return self.tokenizer.encode_pieces(self.template.render_pieces(messages, add_generation_prompt=True),
                                            max_tokens=max_tokens, field="prompt")

    def decode(self, tokens: Sequence[int]) -> str:
        """The text of ``tokens`` without special tokens; incomplete UTF-8 at the end decodes to U+FFFD."""
        return self.tokenizer.decode(tokens, skip_special=True)
