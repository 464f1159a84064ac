"""A conversation's identity, and the rule that a checkpoint name belongs to one conversation.

A generation records the conversation it belongs to in its ``app_state``: ``"conversation": {"id": ...,
"created_ms": ...}``, a random id of 32 lowercase hex digits made when a new reply starts, and when that was
(Unix time in milliseconds). Every save of that reply carries the same one, resumes included. A writer refuses
a name whose newest readable generation is of another conversation, or of none it can tell
(:func:`check_owner`), so one conversation's retention never drops another's generations.
"""

from __future__ import annotations

import re
import secrets
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from ..durable.catalog import manifest_keys, newest_readable
from ..durable.container import Manifest
from ..errors import ConflictError, FormatError, KVCkptError, is_int
from ..tvm.metadata import parse_metadata

if TYPE_CHECKING:
    from ..stores.base import Store

__all__ = ["Conversation", "check_owner", "conversation_of"]

_ID_RE = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True)
class Conversation:
    """Which conversation a generation belongs to."""

    id: str
    """32 lowercase hex digits, drawn at random when the conversation's first reply started."""
    created_ms: int
    """When that was: Unix time in milliseconds (UTC)."""

    @classmethod
    def new(cls) -> "Conversation":
        """A conversation of its own, starting now."""
        return cls(secrets.token_hex(16), time.time_ns() // 1_000_000)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "created_ms": self.created_ms}

    @classmethod
    def from_json(cls, value: Any, field_name: str = "app_state.conversation") -> "Conversation":
        """The conversation ``value`` (its JSON object) records; FormatError naming the field unless it is one."""
        if not isinstance(value, dict):
            raise FormatError(field_name, "a JSON object", type(value).__name__)
        cid, created = value.get("id"), value.get("created_ms")
        if not isinstance(cid, str) or _ID_RE.fullmatch(cid) is None:
            raise FormatError(f"{field_name}.id", "32 lowercase hex digits", cid)
        if not is_int(created, 0):
            raise FormatError(f"{field_name}.created_ms", "an integer >= 0", created)
        return cls(cid, created)


def conversation_of(app_state: Any) -> Conversation | None:
    """The conversation a checkpoint's ``app_state`` records; None if it records none that can be read."""
    if not isinstance(app_state, dict) or "conversation" not in app_state:
        return None
    try:
        return Conversation.from_json(app_state["conversation"])
    except FormatError:
        return None


async def check_owner(store: "Store", name: str, conversation: Conversation | None) -> None:
    """Refuse to write ``conversation`` under ``name`` in ``store`` (None: a conversation no generation is of yet)
    unless the name holds no generation or its newest readable one is of that conversation.

    Raises :class:`ConflictError` naming the name, what it holds (when that conversation started, its tokens)
    and what to do. Hold the name's claim (:meth:`~kvckpt_web.stores.base.Store.claim`) while checking and
    writing, so the answer stays true.
    """
    keys = await manifest_keys(store, name)
    if not keys:
        return
    manifest = await newest_readable(store, name, keys)
    if manifest is None:
        raise ConflictError(f"name {name!r} in {store.location} holds {len(keys)} generations, none of them readable: "
                            "write under another name, or delete them")
    theirs = conversation_of(manifest.app_state)
    if conversation is not None and theirs is not None and theirs.id == conversation.id:
        return
    count = f"{len(keys)} generation{'s' if len(keys) > 1 else ''}"
    raise ConflictError(f"name {name!r} in {store.location} holds another conversation ({_holding(manifest, theirs)}, "
                        f"{count}): resume it, write under another name, or delete it")


def _holding(manifest: Manifest, conversation: Conversation | None) -> str:
    """What ``manifest``, a name's newest readable generation, holds, for a message."""
    app = manifest.app_state
    tokens = app.get("prompt_tokens"), app.get("generated_tokens")
    if all(isinstance(t, list) for t in tokens):
        count = sum(len(t) for t in tokens)
    else:
        try:
            count = parse_metadata(manifest.tvm_metadata).get("seq_length")
        except KVCkptError:
            count = None
    when = _utc(conversation.created_ms if conversation is not None else manifest.created_ms)
    started = f"started {when}" if conversation is not None else f"saved {when}, no conversation id"
    return f"{started}, {count if is_int(count) else '?'} tokens"


def _utc(ms: int) -> str:
    try:
        return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):  # beyond the years datetime holds
        return f"at Unix time {ms} ms"
