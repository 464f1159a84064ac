"""A request's messages as prompt token ids, with the engine's own replies put back as the ids it generated (or a
plain completion's raw text as its ids).

Re-tokenizing a reply's text need not give the ids the model generated (a word split otherwise, a space
merged), and then the K/V cached for the conversation no longer match its prompt. So where an assistant
message is a reply the engine wrote after exactly the tokens before it (found by :data:`KnownReply`), its
generated ids stand in place of its text; other messages are encoded turn by turn, their text as text.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import ContextFullError, FieldError
from .request import Message

if TYPE_CHECKING:
    from ..model.codec import ChatCodec
    from ..model.protocol import TextCodec

__all__ = ["KnownReply", "Prompt", "build_prompt", "raw_prompt"]

KnownReply = Callable[[list[int], str], Awaitable["tuple[list[int], int] | None"]]
"""``known(prefix, text)``: the ids of an assistant's turn the engine wrote right after the token ids ``prefix`` whose
text is ``text``, and how many of them lead its generated ids (a prefill the reply continued; 0 for a whole reply),
or None."""


@dataclass(frozen=True)
class Prompt:
    """The prompt ids of a request and where its earlier replies' generated ids are in them."""

    tokens: list[int]
    replies: list[tuple[int, int]]
    """``[start, end)`` of each recognised reply's generated ids (an end-of-turn id it generated included)."""


async def build_prompt(codec: "ChatCodec", messages: Sequence[Message], known: KnownReply,
                       max_tokens: int | None = None) -> Prompt:
    """The prompt of ``messages`` (checked already), ending with the opening of the assistant's turn, or, where the
    last message is the assistant's, with that turn left open after its text, for the reply to continue it.

    With ``max_tokens``, a prompt longer than that is refused (FieldError naming ``prompt``) as soon as encoding
    shows it, without encoding the rest: a huge message costs no more than the context it cannot fit in.
    """
    tokens = codec.preamble(messages[0].role)
    replies: list[tuple[int, int]] = []
    closing = len(codec.reply_opening())
    previous = None
    prefill = messages[-1] if messages[-1].role == "assistant" else None
    for message in messages[:-1] if prefill is not None else messages:
        if message.role == "assistant":
            opening = tokens + codec.reply_opening()
            found = await known(opening, message.content)
            # a prefill before the generated ids is text: an end of turn among them is another turn's
            if found is not None and not any(t in codec.eos_ids for t in found[0][:found[1]]):
                ids, prefilled = found
                ended = bool(ids) and ids[-1] in codec.eos_ids
                tokens = opening + ids[:len(ids) - ended] + codec.reply_closing()
                replies.append((len(opening) + prefilled, len(opening) + len(ids)))
                previous = message.role
                continue
        room = None if max_tokens is None else max(0, max_tokens - len(tokens) - closing)
        tokens += codec.encode_message(message.role, message.content, previous=previous, max_tokens=room)
        previous = message.role
    if prefill is None:
        tokens += codec.reply_opening()
    else:
        room = None if max_tokens is None else max(0, max_tokens - len(tokens))
        tokens += codec.encode_prefill(prefill.content, previous=previous, max_tokens=room)
    if max_tokens is not None and len(tokens) > max_tokens:
        raise FieldError("prompt", f"at most {max_tokens} tokens", f"{len(tokens)} tokens")
    return Prompt(tokens, replies)


def raw_prompt(codec: "TextCodec", text: str, context: int) -> Prompt:
    """The prompt of a plain completion: its raw ``text`` encoded as is (the model's BOS first if it adds one).
    ContextFullError naming ``prompt`` if it leaves no room in ``context`` for a token of reply; FieldError if it
    comes to no token at all."""
    try:
        tokens = codec.encode_text(text, max_tokens=context - 1)
    except FieldError as exc:
        raise ContextFullError("prompt", f"a prompt of at most {context - 1} tokens (the context is {context} "
                               "tokens, and the completion needs at least one)", exc.got) from None
    if not tokens:
        raise FieldError("prompt", "a text of at least one token (this model adds no BOS)", text)
    return Prompt(tokens, [])
