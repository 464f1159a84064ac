"""What a conversation's checkpoint says about it: the engine's part of a generation's ``app_state``.

A conversation is a checkpoint name. Each of its generations is a generation's ``app_state``
(:mod:`kvckpt_web.generation.app_state`: every token id, the K/V length, the reply being written, its sampler state
and stop rules, the ``replies`` spans of the earlier ones) whose ``extra`` object the engine fills with
:class:`ChatExtra`: the request's messages and settings and the completion's id. :class:`ChatRecord` is one
generation read back, with everything the engine needs to continue it, list it or show its history.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any

from ..errors import FieldError, FormatError
from ..generation.app_state import SavedGeneration, parse_app_state
from .request import ChatRequest, CompletionRequest, Message, check_messages

__all__ = ["EXTRA_FORMAT", "ChatExtra", "ChatRecord", "title_of"]

EXTRA_FORMAT = "kvckpt.chat"
"""The ``kind`` of the engine's ``extra`` object (version 1)."""


@dataclass(frozen=True)
class ChatExtra:
    """The engine's ``extra``: the messages the reply answers (a plain completion's: none, and its raw ``prompt``),
    the request's settings, the completion id."""

    messages: tuple[Message, ...]
    settings: dict[str, Any]
    completion_id: str
    created: int
    prompt: str | None = None
    """A plain completion's raw prompt (None: a chat's reply)."""

    @classmethod
    def of(cls, request: ChatRequest | CompletionRequest, settings: dict[str, Any]) -> "ChatExtra":
        """What a turn's checkpoints record of ``request`` (its ``settings`` as the reply runs them), with a new
        completion id (``chatcmpl-...``, a plain completion's ``cmpl-...``) made now."""
        if isinstance(request, CompletionRequest):
            return cls((), settings, f"cmpl-{secrets.token_hex(12)}", int(time.time()), request.prompt)
        return cls(request.messages, settings, f"chatcmpl-{secrets.token_hex(12)}", int(time.time()))

    def to_json(self) -> dict[str, Any]:
        out = {"kind": EXTRA_FORMAT, "version": 1, "messages": [m.to_json() for m in self.messages],
               "settings": self.settings, "completion_id": self.completion_id, "created": self.created}
        return out if self.prompt is None else {**out, "prompt": self.prompt}

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
        prompt = value.get("prompt")
        try:
            settings = value.get("settings")
            if not isinstance(settings, dict):
                raise FieldError("settings", "a JSON object", type(settings).__name__)
            if prompt is None:
                messages = check_messages(value.get("messages"))
                ChatRequest(messages, **settings)  # the settings a request may have
            else:
                if value.get("messages") != []:
                    raise FieldError("messages", "[] (a plain completion's)", value.get("messages"))
                messages = ()
                CompletionRequest(prompt=prompt, **settings)
        except FieldError as exc:
            raise FormatError(f"app_state.extra.{exc.field}", exc.expected, exc.got) from None
        for key, kind in (("completion_id", str), ("created", int)):
            if not isinstance(value.get(key), kind) or isinstance(value.get(key), bool):
                raise FormatError(f"app_state.extra.{key}", f"a {kind.__name__}", type(value.get(key)).__name__)
        return cls(messages, settings, value["completion_id"], value["created"], prompt)


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
        return title_of(self.chat)


def title_of(chat: ChatExtra) -> str:
    """The first user message (a plain completion's prompt) on one line, shortened to 60 characters."""
    first = chat.prompt if chat.prompt is not None else next((m.content for m in chat.messages if m.role == "user"), "")
    line = " ".join(first.split())
    return line if len(line) <= 60 else line[:57] + "..."
