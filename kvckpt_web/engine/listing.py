"""How an engine lists its conversations: :class:`ConversationInfo`, made from a checkpoint's record or,
without a store, from a slot's generator."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import KVCkptError
from .record import ChatExtra, ChatRecord, title_of
from .request import Message
from .slots import Slot

__all__ = ["ConversationInfo", "describe"]


@dataclass(frozen=True)
class ConversationInfo:
    """A conversation as lists and histories show it."""

    name: str
    title: str = ""
    messages: tuple[Message, ...] = ()
    """Its messages, the last reply (as far as it was written) included when this model wrote it."""
    tokens: int = 0
    updated_ms: int | None = None
    finished: bool = True
    finish_reason: str | None = None
    same_model: bool = True
    settings: dict[str, Any] = field(default_factory=dict)
    """The last request's settings (temperature, seed, max_tokens, ...)."""
    error: str | None = None
    """Why its newest checkpoint cannot be read, if it cannot."""
    prompt: str | None = None
    """A plain completion's raw prompt (its :attr:`messages` are then only the completion so far, as the
    assistant's); None for a chat."""

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "title": self.title, "messages": [m.to_json() for m in self.messages],
                "tokens": self.tokens, "updated_ms": self.updated_ms, "finished": self.finished,
                "finish_reason": self.finish_reason, "same_model": self.same_model, "settings": self.settings,
                "error": self.error, "prompt": self.prompt}


def describe(name: str, record: ChatRecord | None, identity: str, reply_text: Callable[[list[int]], str],
             slot: Slot | None = None) -> ConversationInfo:
    """The info of conversation ``name`` from its newest ``record`` (None: unreadable, or no store and then
    from ``slot``'s generator); ``reply_text`` decodes this model's reply ids."""
    if record is None and slot is not None and slot.gen is not None:
        gen = slot.gen
        try:
            chat = ChatExtra.from_json(gen.extra)
        except KVCkptError as exc:
            return ConversationInfo(name, error=str(exc))
        messages = _with_reply(chat.messages, reply_text(gen.generated_tokens) if gen.generated_tokens else None)
        return ConversationInfo(name, title_of(chat), messages, len(gen.tokens), None,
                                gen.finish_reason is not None, gen.finish_reason, True, chat.settings,
                                prompt=chat.prompt)
    if record is None:
        return ConversationInfo(name, error="its newest checkpoint cannot be read as a chat conversation")
    same = record.saved.model == identity
    messages = _with_reply(record.chat.messages, reply_text(record.saved.generated)
                           if same and record.saved.generated else None)
    return ConversationInfo(name, record.title, messages, len(record.tokens), record.created_ms, record.finished,
                            record.saved.finish_reason, same, record.chat.settings, prompt=record.chat.prompt)


def _with_reply(messages: tuple[Message, ...], reply: str | None) -> tuple[Message, ...]:
    """``messages`` and the ``reply`` to them (None: none yet): a last assistant message (a prefill) continued by
    it, else a message of its own."""
    if reply is None:
        return messages
    if messages and messages[-1].role == "assistant":
        return (*messages[:-1], Message("assistant", messages[-1].content + reply))
    return (*messages, Message("assistant", reply))
