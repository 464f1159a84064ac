"""What a conversation's checkpoint says about it: the engine's part of a generation's ``app_state``.

A conversation is a checkpoint name. Each of its generations is a generation's ``app_state``
(:mod:`kvckpt_web.generation.app_state`: every token id, the K/V length, the reply being written, its sampler state
and stop rules, the ``replies`` spans of the earlier ones) whose ``extra`` object the engine fills with
:class:`ChatExtra`: the request's messages and settings and the completion's id. :class:`ChatRecord` is one
generation read back, with everything the engine needs to continue it, list it or show its history.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import FieldError, FormatError
from ..generation.app_state import SavedGeneration, parse_app_state
from .request import ChatRequest, Message, check_messages

__all__ = ["EXTRA_FORMAT", "ChatExtra", "ChatRecord", "title_of"]

EXTRA_FORMAT = "kvckpt.chat"
"""The ``kind`` of the engine's ``extra`` object (version 1)."""


@dataclass(frozen=True)
class ChatExtra:
    """The engine's ``extra``: the messages the reply answers, the request's settings, the completion id."""

    messages: tuple[Message, ...]
    settings: dict[str, Any]
    completion_id: str
    created: int

    def to_json(self) -> dict[str, Any]:
        return {"kind": EXTRA_FORMAT, "version": 1, "messages": [m.to_json() for m in self.messages],
                "settings": self.settings, "completion_id": self.completion_id, "created": self.created}

    @property
    def named(self) -> bool:
        """Whether the request named its conversation (``settings.conversation``; the engine chose a name for one
        that gave none): a request that names none is never saved into a conversation another request named."""
        return self.settings.get("conversation") is not None

    @classmethod
    def from_json(cls, value: Any) -> "ChatExtra":
        """The ``extra`` of a chat generation; FormatError naming the field if it is not one."""
        if not isinstance(value, dict) or value.get("kind") != EXTRA_FORMAT:
            raise FormatError("app_state.extra.kind", repr(EXTRA_FORMAT),
                              value.get("kind") if isinstance(value, dict) else type(value).__name__,
                              "the checkpoint was not written by the chat engine")
        if value.get("version") != 1:
            raise FormatError("app_state.extra.version", 1, value.get("version"))
        try:
            messages = check_messages(value.get("messages"))
            settings = value.get("settings")
            if not isinstance(settings, dict):
                raise FieldError("settings", "a JSON object", type(settings).__name__)
            ChatRequest(messages, **settings)  # the settings a request may have
        except FieldError as exc:
            raise FormatError(f"app_state.extra.{exc.field}", exc.expected, exc.got) from None
        for key, kind in (("completion_id", str), ("created", int)):
            if not isinstance(value.get(key), kind) or isinstance(value.get(key), bool):
                raise FormatError(f"app_state.extra.{key}", f"a {kind.__name__}", type(value.get(key)).__name__)
        return cls(messages, settings, value["completion_id"], value["created"])


@dataclass(frozen=True)
class ChatRecord:
    """One saved generation of a conversation."""

    name: str
    generation: int
    created_ms: int | None
    saved: SavedGeneration
    chat: ChatExtra

    @classmethod
    def from_app_state(cls, name: str, generation: int, created_ms: int | None, app_state: Any) -> "ChatRecord":
        """The record of ``app_state`` (FormatError naming the field if it is not a chat generation's)."""
        saved = parse_app_state(app_state)
        return cls(name, generation, created_ms, saved, ChatExtra.from_json(saved.extra))

    @property
    def tokens(self) -> list[int]:
        """Every token of the conversation: the prompt and the reply so far (its last one pending)."""
        return self.saved.prompt + self.saved.generated

    @property
    def replies(self) -> list[tuple[int, int]]:
        """Spans of every reply's generated ids in :attr:`tokens`, this generation's reply last."""
        start = len(self.saved.prompt)
        current = [(start, start + len(self.saved.generated))] if self.saved.generated else []
        return self.saved.replies + current

    @property
    def finished(self) -> bool:
        """Whether the reply ended (an unfinished one was cut by a crash or stopped, and can be resumed)."""
        return self.saved.finish_reason is not None

    @property
    def title(self) -> str:
        """How lists name the conversation (see :func:`title_of`)."""
        return title_of(self.chat.messages)


def title_of(messages: tuple[Message, ...]) -> str:
    """The first user message on one line, shortened to 60 characters."""
    first = next((m.content for m in messages if m.role == "user"), "")
    line = " ".join(first.split())
    return line if len(line) <= 60 else line[:57] + "..."
