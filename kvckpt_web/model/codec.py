"""The text side of a GGUF chat model as a :class:`~kvckpt_web.model.protocol.TextCodec`.

Prompts are the chat template's rendering of the messages, ending with the opening of the
assistant's turn, encoded by the model's tokenizer with only the template's markers as special
tokens; replies end at the tokenizer's EOS id or at the template's end-of-turn token
(``<|im_end|>`` in ChatML); their text leaves special tokens out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from .chat import TURN_END, ChatTemplate
from .tokenizer import Tokenizer

if TYPE_CHECKING:
    from .gguf import GGUFFile


class ChatCodec:
    """A GGUF model's tokenizer and chat template."""

    def __init__(self, tokenizer: Tokenizer, template: ChatTemplate) -> None:
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
        return cls(Tokenizer.from_gguf(f), ChatTemplate.from_gguf(f))

    def encode_chat(self, messages: Sequence[Mapping[str, str]], *, max_tokens: int | None = None) -> list[int]:
        """The prompt token ids of ``messages``, ready for the assistant's reply: the template's markers are
        special tokens, the messages' text is encoded as text (a ``<|im_end|>`` typed in a message is not the
        end of its turn). A prompt of more than ``max_tokens`` tokens is refused (FieldError naming ``prompt``)
        as :meth:`Tokenizer.encode` does."""
        return self.tokenizer.encode_pieces(self.template.render_pieces(messages, add_generation_prompt=True),
                                            max_tokens=max_tokens, field="prompt")

    def decode(self, tokens: Sequence[int]) -> str:
        """The text of ``tokens`` without special tokens; incomplete UTF-8 at the end decodes to U+FFFD."""
        return self.tokenizer.decode(tokens, skip_special=True)
