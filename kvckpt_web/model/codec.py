"""The text side of a GGUF chat model as a :class:`~kvckpt_web.model.protocol.TextCodec`.

Prompts are the chat template's rendering of the messages, ending with the opening of the
assistant's turn, encoded by the model's tokenizer; replies end at the tokenizer's EOS id or at
the template's end-of-turn token (``<|im_end|>`` in ChatML); their text leaves special tokens out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from .chat import ChatTemplate
from .tokenizer import Tokenizer

if TYPE_CHECKING:
    from .gguf import GGUFFile

END_OF_TURN = "<|im_end|>"
"""ChatML's end of a turn: a reply ends there."""


class ChatCodec:
    """A GGUF model's tokenizer and chat template."""

    def __init__(self, tokenizer: Tokenizer, template: ChatTemplate) -> None:
        self.tokenizer = tokenizer
        self.template = template
        turn_end = tokenizer.encode(END_OF_TURN, add_bos=False)
        ends = {tokenizer.eos_id}
        if len(turn_end) == 1 and turn_end[0] in tokenizer.special_ids:
            ends.add(turn_end[0])
        self.eos_ids = tuple(sorted(ends))

    @classmethod
    def from_gguf(cls, f: "GGUFFile") -> "ChatCodec":
        """The codec stored in GGUF file ``f``; FormatError naming the key if its tokenizer or template is not
        supported."""
        return cls(Tokenizer.from_gguf(f), ChatTemplate.from_gguf(f))

    def encode_chat(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """The prompt token ids of ``messages``, ready for the assistant's reply."""
        return self.tokenizer.encode(self.template.render(messages, add_generation_prompt=True))

    def decode(self, tokens: Sequence[int]) -> str:
        """The text of ``tokens`` without special tokens; incomplete UTF-8 at the end decodes to U+FFFD."""
        return self.tokenizer.decode(tokens, skip_special=True)
