"""What this process remembers of its saves and restores, per store object: the last generation of each
name it saved or restored (so the next save writes only the chunks whose pages changed), and the chunks
whose stored bytes it has seen to be right (so a save reuses them without reading them).

Both are keyed by the store object (weakly): another object on the same storage starts with nothing.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .catalog import remember_refs
from .container import ChunkRef, Manifest
from .pipeline import HashState

if TYPE_CHECKING:
    from ..kv.pool import SequenceState
    from ..stores.base import Store

__all__ = ["Saved", "forget", "last_saved", "remember", "trusted_chunks"]


@dataclass(frozen=True)
class Saved:
    """A generation of one name this process saved or restored last, and what the next save reuses of it."""

    key: str
    envelope: bytes
    state: "SequenceState"
    page_bytes: int
    pages_per_chunk: int
    chunks: tuple[tuple[ChunkRef, ...], ...]
    chunk_keys: frozenset[str]
    tails: dict[int, tuple[int, HashState]]
    """Per group, the chunk a save hashed last and the SHA-256 state over its full pages (immutable once
    full), from which the next save's digest of that chunk, grown by new pages, continues."""


_MEMORY: "weakref.WeakKeyDictionary[Store, dict[str, Saved]]" = weakref.WeakKeyDictionary()
"""Per store object and name, what this process saved or restored last."""

_TRUSTED: "weakref.WeakKeyDictionary[Store, set[str]]" = weakref.WeakKeyDictionary()
"""Per store object, chunk keys whose stored bytes this process wrote, or read back and found to be the bytes
their name says: a save reuses them without reading them (damage to them after that goes unseen until a
restore or verify reads them)."""


def forget(store: "Store", name: str | None = None) -> None:
    """Drop what this process remembers of its saves to ``store`` (one name or all): the next save reads every
    page; with all names, it also reads back every chunk already stored that it reuses, once."""
    if name is None:
        _MEMORY.pop(store, None)
        _TRUSTED.pop(store, None)
    else:
        _MEMORY.get(store, {}).pop(name, None)


def trusted_chunks(store: "Store") -> set[str]:
    """The chunk keys of ``store`` whose stored bytes this process has seen to be right (a live set)."""
    return _TRUSTED.setdefault(store, set())


def remember(store: "Store", envelope: bytes, manifest: Manifest, state: "SequenceState",
             tails: dict[int, tuple[int, HashState]] | None = None) -> None:
    """Record ``manifest`` (committed as ``envelope``) as what this process last saved or restored of its
    name, with the sequence state it holds and the hash states of its last chunks (a save's)."""
    chunk_keys = frozenset(manifest.chunk_keys())
    remember_refs(envelope, chunk_keys)
    _MEMORY.setdefault(store, {})[manifest.name] = Saved(manifest.key, envelope, state, manifest.page_bytes,
                                                         manifest.pages_per_chunk, manifest.chunks, chunk_keys,
                                                         tails or {})


def last_saved(store: "Store", name: str) -> Saved | None:
    """What this process last saved or restored of ``name`` with ``store``; None if nothing (or forgotten)."""
    return _MEMORY.get(store, {}).get(name)

