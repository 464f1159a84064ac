"""What a server keeps of the conversations nobody named: an :class:`UnnamedRetention` policy (a time to live and a
bound on their bytes in the store), what it decides for each conversation (:func:`judge`, each a
:class:`Retained`), and its deletions (:func:`enforce`).

A request that names no ``conversation`` is saved under a name the engine chose (``chat-...``,
``completion-...``): stateless clients would fill the store forever. The policy deletes those, oldest first, once
they were last written more than ``ttl_s`` seconds ago, and then while together they hold more than
``max_bytes`` bytes of the store (each chunk counted once, a chunk they share with others too). It never deletes a
conversation a request named, one whose newest checkpoint cannot be read as a chat, one a reply is being
generated in, or one a request waiting in the queue goes on with; a deletion is :meth:`Engine.delete_each`'s, so
chunks other conversations still use stay.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..checks import check_int, check_seconds
from ..durable.catalog import decode_at, list_names, manifest_keys
from ..durable.container import MAX_MANIFEST_BYTES
from ..errors import KVCkptError

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["DEFAULT_UNNAMED_CHECK_EVERY_S", "DEFAULT_UNNAMED_MAX_BYTES", "DEFAULT_UNNAMED_TTL_S", "Retained",
           "UnnamedRetention", "enforce", "judge"]

DEFAULT_UNNAMED_TTL_S = 86400.0
"""Seconds an unnamed conversation is kept after it was last written (a day)."""
DEFAULT_UNNAMED_MAX_BYTES = 1 << 30
"""Bytes of the store the unnamed conversations may hold together (1 GiB)."""
DEFAULT_UNNAMED_CHECK_EVERY_S = 60.0
"""Seconds a server waits after enforcing the policy before a reply's end enforces it again (a minute)."""


@dataclass(frozen=True)
class UnnamedRetention:
    """How long (``ttl_s`` seconds since it was last written) and within how many bytes of the store together
    (``max_bytes``) conversations nobody named are kept; a server enforces it when it starts and then at the end of
    a reply at least ``check_every_s`` seconds after it last did (each enforcement reads every manifest)."""

    ttl_s: float = DEFAULT_UNNAMED_TTL_S
    max_bytes: int = DEFAULT_UNNAMED_MAX_BYTES
    check_every_s: float = DEFAULT_UNNAMED_CHECK_EVERY_S

    def __post_init__(self) -> None:
        object.__setattr__(self, "ttl_s", check_seconds("ttl_s", self.ttl_s))
        check_int("max_bytes", self.max_bytes, 0)
        object.__setattr__(self, "check_every_s", check_seconds("check_every_s", self.check_every_s))

    def to_json(self) -> dict[str, Any]:
        return {"ttl_s": self.ttl_s, "max_bytes": self.max_bytes, "check_every_s": self.check_every_s}


@dataclass(frozen=True)
class Retained:
    """One conversation of the store as the policy sees it: whether it stays, and why."""

    name: str
    named: bool
    updated_ms: int | None
    """When its newest checkpoint was written (None: it cannot be read)."""
    bytes: int
    """Bytes its checkpoints hold in the store (chunks it shares with others counted here too)."""
    keep: bool
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "named": self.named, "updated_ms": self.updated_ms, "bytes": self.bytes,
                "keep": self.keep, "reason": self.reason}


@dataclass
class _Seen:
    """A conversation as read from the store: its record's facts and the bytes of each key it uses."""

    name: str
    named: bool | None
    """None: its newest checkpoint cannot be read as a chat."""
    updated_ms: int | None
    keys: dict[str, int]


async def _seen(engine: "Engine", name: str) -> _Seen:
    store = engine.store
    keys: dict[str, int] = {}
    listed = await manifest_keys(store, name)
    for _, _, key in listed:
        try:
            data = await store.get(key, max_bytes=MAX_MANIFEST_BYTES)
            keys[key] = len(data)
            keys.update((ref.key, ref.nbytes) for ref in decode_at(key, data).chunk_refs())
        except KVCkptError:
            continue
    record = await engine.sources.record(name, listed[-1][1]) if listed else None  # the newest, listed once
    if record is None:
        return _Seen(name, None, None, keys)
    return _Seen(name, record.chat.named, record.created_ms, keys)


async def judge(engine: "Engine", policy: UnnamedRetention, now: float, waiting: Collection[str] = ()
                ) -> list[Retained]:
    """What ``policy`` keeps and deletes of ``engine``'s store at ``now`` (seconds since the epoch), every
    conversation of it, the oldest first; nothing without a store. ``waiting``: the conversations requests
    queued and not started go on with, kept as those a reply is being generated in are."""
    if engine.store is None:
        return []
    seen = [await _seen(engine, name) for name in await list_names(engine.store)]
    seen.sort(key=lambda s: (s.updated_ms is None, s.updated_ms or 0, s.name))
    out: dict[str, Retained] = {}
    held: dict[str, int] = {}  # key -> bytes, of the unnamed conversations kept so far
    uses: dict[str, int] = {}  # key -> how many of them use it
    candidates: list[_Seen] = []
    for s in seen:
        size = sum(s.keys.values())
        slot = engine.slots.of_conversation(s.name)
        if s.named is None:
            out[s.name] = Retained(s.name, False, None, size, True, "its newest checkpoint cannot be read as a chat")
            continue
        if s.named:
            out[s.name] = Retained(s.name, True, s.updated_ms, size, True, "a request named it")
            continue
        if slot is not None and slot.busy:
            out[s.name] = Retained(s.name, False, s.updated_ms, size, True, "a reply is being generated in it")
        elif s.name in waiting:
            out[s.name] = Retained(s.name, False, s.updated_ms, size, True,
                                   "a request waiting in the queue continues it")
        elif s.updated_ms is not None and now - s.updated_ms / 1000 > policy.ttl_s:
            out[s.name] = Retained(s.name, False, s.updated_ms, size, False,
                                   f"unnamed, last written more than {policy.ttl_s:g} s ago")
            continue
        else:
            candidates.append(s)
        for key, nbytes in s.keys.items():
            held[key] = nbytes
            uses[key] = uses.get(key, 0) + 1
    total = sum(held.values())
    for s in candidates:
        size = sum(s.keys.values())
        if total <= policy.max_bytes:
            out[s.name] = Retained(s.name, False, s.updated_ms, size, True,
                                   f"unnamed, within {policy.ttl_s:g} s and {policy.max_bytes} bytes")
            continue
        out[s.name] = Retained(s.name, False, s.updated_ms, size, False,
                               f"unnamed, the oldest while the unnamed hold {total} bytes, over {policy.max_bytes}")
        for key in s.keys:
            uses[key] -= 1
            if not uses[key]:
                total -= held.pop(key)
    return [out[s.name] for s in seen]


async def enforce(engine: "Engine", policy: UnnamedRetention, now: float, waiting: Collection[str] = ()
                  ) -> list[Retained]:
    """Delete what ``policy`` does not keep of ``engine``'s store at ``now`` (seconds since the epoch; ``waiting``
    as :func:`judge`'s) with
    :meth:`Engine.delete_each` (their manifests, then one pass over the store's chunks); what it judged. One another
    writer holds, or that is gone already, is left."""
    judged = await judge(engine, policy, now, waiting)
    await engine.delete_each([retained.name for retained in judged if not retained.keep])
    return judged
