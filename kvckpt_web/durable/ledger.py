"""What this process knows of the checkpoints in one store, held by whoever works on that store.

A :class:`Ledger` remembers the last generation of each name it saved or restored (so the next save writes
only the chunks whose pages changed), the chunks whose stored bytes it has seen to be right (so a save reuses
them without reading them; one found damaged or deleted is no longer trusted), and the chunk keys of the
manifests it decoded lately (so retention and gc decode each manifest once). Every call of the durable layer
that uses such knowledge takes a ``ledger=``; the engine holds one per store. Without one, a call uses the
store object's own ledger (:meth:`Ledger.of`), which lives and dies with that store object. A new ledger knows
nothing, as a new process does: its first save of a name reads every page, and it reads back once each
stored chunk it reuses.
"""

from __future__ import annotations

import hashlib
import weakref
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import FieldError, KVCkptError
from ..stores.base import check_store
from .catalog import decode_at
from .container import ChunkRef, Manifest
from .pipeline import HashState

if TYPE_CHECKING:
    from ..kv.pool import SequenceState
    from ..stores.base import Store

__all__ = ["REFS_KEPT", "Ledger", "Saved", "ledger_for"]

REFS_KEPT = 64
"""Decoded manifests whose chunk keys a ledger keeps (the most recently used)."""

_OWN = "_kvckpt_ledger"
"""The attribute of a store object that holds its own ledger (:meth:`Ledger.of`)."""


@dataclass(frozen=True)
class Saved:
    """A generation of one name a ledger saved or restored last, and what the next save reuses of it."""

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
    conversation: Any = None
    """The ``conversation`` its ``app_state`` records (FORMAT.md section 4), None if it records none."""


class Ledger:
    """What this process knows of the checkpoints in ``store`` (see the module's docstring)."""

    def __init__(self, store: "Store") -> None:
        check_store(store)
        self._store = weakref.ref(store)  # the store object's own ledger must not keep it alive
        self._saved: dict[str, Saved] = {}
        self._trusted: set[str] = set()
        self._refs: OrderedDict[bytes, frozenset[str]] = OrderedDict()

    @classmethod
    def of(cls, store: "Store") -> "Ledger":
        """The store object's own ledger, made on first use; it lives as long as the store object does."""
        check_store(store)
        own = getattr(store, _OWN, None)
        if own is None:
            own = cls(store)
            setattr(store, _OWN, own)
        return own

    def __repr__(self) -> str:
        return f"Ledger({self._store()!r}: {len(self._saved)} names, {len(self._trusted)} trusted chunks)"

    def is_of(self, store: "Store") -> bool:
        """Whether this is a ledger of ``store`` (that store object, not another one on the same storage)."""
        return self._store() is store

    # -- the last generation of each name --------------------------------------------------------------------

    def last_saved(self, name: str) -> Saved | None:
        """What this ledger last saved or restored of ``name``; None if nothing (or forgotten)."""
        return self._saved.get(name)

    def remember(self, envelope: bytes, manifest: Manifest, state: "SequenceState",
                 tails: dict[int, tuple[int, HashState]] | None = None) -> None:
        """Record ``manifest`` (committed as ``envelope``) as the last generation of its name saved or restored,
        with the sequence state it holds and the hash states of its last chunks (a save's)."""
        chunk_keys = frozenset(manifest.chunk_keys())
        self._keep_refs(hashlib.sha256(envelope).digest(), chunk_keys)
        self._saved[manifest.name] = Saved(manifest.key, envelope, state, manifest.page_bytes,
                                           manifest.pages_per_chunk, manifest.chunks, chunk_keys, tails or {},
                                           manifest.app_state.get("conversation"))

    def forget(self, name: str | None = None) -> None:
        """Forget the last generation of ``name`` (the next save of it reads every page) or, with None,
        everything: the ledger is then as a new process's."""
        if name is None:
            self._saved.clear()
            self._trusted.clear()
            self._refs.clear()
        else:
            self._saved.pop(name, None)

    # -- chunks whose stored bytes are known to be right -------------------------------------------------------

    @property
    def trusted(self) -> frozenset[str]:
        """The chunk keys whose stored bytes this ledger wrote, or read back and found to be right."""
        return frozenset(self._trusted)

    def trusts(self, key: str) -> bool:
        """Whether the stored bytes of chunk ``key`` are known to be right (a save reuses it unread)."""
        return key in self._trusted

    def trusts_all(self, keys: Iterable[str]) -> bool:
        """Whether every chunk of ``keys`` is trusted."""
        return all(key in self._trusted for key in keys)

    def trust(self, keys: Iterable[str]) -> None:
        """Chunks written, or read back and found to be the bytes their names say."""
        self._trusted.update(keys)

    def distrust(self, keys: Iterable[str]) -> None:
        """Chunks found damaged, or deleted: a later save reads them (or writes them) again."""
        self._trusted.difference_update(keys)

    # -- decoded manifests -----------------------------------------------------------------------------------------

    def manifest_refs(self, key: str, data: bytes | None) -> frozenset[str] | None:
        """The chunk keys of the manifest ``data`` stored under ``key``; None if it is missing or damaged.
        Remembered by the SHA-256 of ``data``, so never stale."""
        if data is None:
            return None
        digest = hashlib.sha256(data).digest()
        refs = self._refs.get(digest)
        if refs is not None:
            self._refs.move_to_end(digest)
            return refs
        try:
            refs = frozenset(decode_at(key, data).chunk_keys())
        except KVCkptError:
            return None
        self._keep_refs(digest, refs)
        return refs

    def _keep_refs(self, digest: bytes, chunk_keys: frozenset[str]) -> None:
        self._refs[digest] = chunk_keys
        while len(self._refs) > REFS_KEPT:
            self._refs.popitem(last=False)


def ledger_for(store: "Store", ledger: Ledger | None, field: str = "ledger") -> Ledger:
    """``ledger`` if it is a ledger of ``store`` (else FieldError naming ``field``); with None, the store object's
    own. FieldError first if ``store`` is no store."""
    check_store(store)
    if ledger is None:
        return Ledger.of(store)
    if not isinstance(ledger, Ledger):
        raise FieldError(field, "a Ledger or None", type(ledger).__name__)
    if not ledger.is_of(store):
        raise FieldError(field, f"a Ledger of {store!r}", repr(ledger))
    return ledger
