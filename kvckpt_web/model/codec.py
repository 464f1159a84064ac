"""The text side of a GGUF model as a :class:`~kvckpt_web.model.protocol.TextCodec`.

Chat prompts are the chat template's rendering of the messages, ending with the opening of the assistant's
turn, encoded by the model's tokenizer with only the template's markers as special tokens; replies end at the
tokenizer's EOS id or at the template's end-of-turn token (``<|im_end|>`` in ChatML, ``<end_of_turn>`` in Gemma,
``<|eot_id|>`` in Llama 3); their text leaves special tokens out. A model without a chat template (a base model),
or with one of no family rendered here, answers plain completions only: a raw prompt is its text encoded as is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from ..errors import FieldError, FormatError
from .chat_template import FAMILIES, TEMPLATE_KEY, ChatTemplate, Pieces, template_role
from .tokenizer_base import BaseTokenizer
from .tokenizer_kinds import tokenizer_from_gguf

if TYPE_CHECKING:
    from .gguf import GGUFFile

COMPLETION_HINT = "use plain completion: kvckpt generate --raw, POST /v1/completions, engine.completions.create"
"""Where a chat refused on a model that cannot chat sends its caller."""


class ChatCodec:
    """A GGUF model's tokenizer and chat template (``template`` None: the model cannot chat, for ``refusal``: a
    base model, or a template of no family rendered here)."""

    def __init__(self, tokenizer: BaseTokenizer, template: ChatTemplate | None, *, refusal: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.template = template
        self._refusal = refusal or "a base model, without a chat template (tokenizer.chat_template)"
        ends = {tokenizer.eos_id}
        if template is not None:
            turn_end = tokenizer.encode(template.turn_end, add_bos=False)  # a reply ends at the end of its turn
            if len(turn_end) == 1 and turn_end[0] in tokenizer.special_ids:
                ends.add(turn_end[0])
        self.eos_ids = tuple(sorted(ends))

    @classmethod
    def from_gguf(cls, f: "GGUFFile") -> "ChatCodec":
        """The codec stored in GGUF file ``f``; FormatError naming the key if its tokenizer is not supported. A chat
        template of no family rendered here leaves the model to plain completions, as a base model is."""
        try:
            return cls(tokenizer_from_gguf(f), ChatTemplate.from_gguf(f))
        except FormatError as exc:
            if exc.field != TEMPLATE_KEY:
                raise
            return cls(tokenizer_from_gguf(f), None, refusal=f"a chat template of no known family: {exc.got}")

    @property
    def can_chat(self) -> bool:
        """Whether the model has a chat template rendered here (else it answers plain completions only)."""
        return self.template is not None

    def chat_template(self) -> ChatTemplate:
        """The chat template; FieldError naming ``messages``, in one line, if the model has none rendered here."""
        if self.template is None:
            raise FieldError("messages", f"a chat model (a GGUF whose tokenizer.chat_template is {', '.join(FAMILIES)})",
                             self._refusal, COMPLETION_HINT)
        return self.template

    def _encode(self, pieces: Pieces, max_tokens: int | None) -> list[int]:
        return self.tokenizer.encode_pieces(pieces, add_bos=False, max_tokens=max_tokens, field="prompt")

    def preamble(self, first_role: str) -> list[int]:
        """The ids before a first message of role ``first_role``: BOS if the model adds one, and the template's
        default system turn unless the message is a system message."""
        template = self.chat_template()
        bos = [self.tokenizer.bos_id] if self.tokenizer.add_bos else []
        return bos + self._encode(template.preamble_pieces(template_role(first_role)), None)

    def encode_message(self, role: str, content: str, *, previous: str | None = None,
                       max_tokens: int | None = None) -> list[int]:
        """The ids of one message's turn after a message of role ``previous`` (None: the first), its content
        encoded as text (FieldError naming ``prompt`` beyond ``max_tokens``, as :meth:`encode_chat`); a
        ``developer`` message is the template's system turn."""
        previous = None if previous is None else template_role(previous)
        return self._encode(self.chat_template().message_pieces(template_role(role), content, previous), max_tokens)

    def reply_opening(self) -> list[int]:
        """The ids that open the assistant's turn: the model writes its reply after them."""
        return self._encode(self.chat_template().opening_pieces(), None)

    def encode_prefill(self, content: str, *, previous: str | None = None,
                       max_tokens: int | None = None) -> list[int]:
        """The ids of an assistant's turn whose reply goes on from ``content`` (OpenAI-style prefill), after a
        message of role ``previous``: the :meth:`reply_opening` and the content as text, nothing closing it
        (FieldError naming ``prompt`` beyond ``max_tokens``)."""
        previous = None if previous is None else template_role(previous)
        return self._encode(self.chat_template().prefill_pieces(content, previous), max_tokens)

    def reply_closing(self) -> list[int]:
        """The ids that close an assistant turn after its reply's ids (an end-of-turn id it generated left out)."""
        return self._encode(self.chat_template().closing_pieces(), None)

    def encode_chat(self, messages: Sequence[Mapping[str, str]], *, max_tokens: int | None = None) -> list[int]:
        """The prompt token ids of ``messages``, ready for the assistant's reply: the template's markers are
        special tokens, the messages' text is encoded as text (a ``<|im_end|>`` typed in a message is not the
        end of its turn). A prompt of more than ``max_tokens`` tokens is refused (FieldError naming ``prompt``)
        as :meth:`BaseTokenizer.encode` does."""
        pieces = self.chat_template().render_pieces(messages, add_generation_prompt=True)
        return self.tokenizer.encode_pieces(pieces, max_tokens=max_tokens, field="prompt")

    def encode_text(self, text: str, *, max_tokens: int | None = None) -> list[int]:
        """The prompt token ids of the raw ``text`` of a plain completion: BOS if the model adds one, then the text
        as is, special tokens written in it included (as llama.cpp reads a raw prompt). FieldError naming
        ``prompt`` beyond ``max_tokens``."""
        return self.tokenizer.encode_pieces([(text, True)], max_tokens=max_tokens, field="prompt")

    def token_pieces(self) -> list[bytes]:
        """The bytes each token id stands for in a reply's text, empty for a special token."""
        tokenizer = self.tokenizer
        return [b"" if i in tokenizer.special_ids else tokenizer.token_bytes(i) for i in range(tokenizer.vocab_size)]

    def decode(self, tokens: Sequence[int]) -> str:
        """The text of ``tokens`` without special tokens; incomplete UTF-8 at the end decodes to U+FFFD."""
        return self.tokenizer.decode(tokens, skip_special=True)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes token ``token_id`` stands for (a special token: its text in UTF-8)."""
        return self.tokenizer.token_bytes(token_id)
