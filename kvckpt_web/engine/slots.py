"""The sequences an engine keeps in its cache: whose tokens each holds, which conversation it is, when it was
used last, which to evict when the cache is full, and how a reply's K/V get there.

A :class:`Slot` is one sequence of the paged cache. Its K/V hold ``tokens[:kv_length]``; the tokens after that
are known but pending (the last token a reply picked is never run until the next turn needs it). A slot is
*committed* while the store's newest generation of its conversation holds exactly its state, so evicting it
loses nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..durable.restore import restore
from ..errors import (CapacityError, ConflictError, CorruptionError, FieldError, FormatError, MetadataError,
                      NotFoundError, StoreError, UnusableCheckpointError)
from ..generation.app_state import parse_app_state

if TYPE_CHECKING:
    from ..durable.container import Manifest
    from ..durable.ledger import Ledger
    from ..kv.cache import PagedKVCache
    from ..generation.generator import Generator
    from ..stores.base import Store
    from .record import ChatRecord

__all__ = ["UNUSABLE_KV", "PrefixSource", "Slot", "Slots", "common_prefix"]

UNUSABLE_KV = (CorruptionError, FormatError, MetadataError, NotFoundError, UnusableCheckpointError)
"""What a restore from the store raises when a checkpoint's K/V cannot be used: a chunk or manifest damaged or
missing, another layout, a generation collected since it was found, or one holding other tokens now. The cache
is left as it was."""


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class Slot:
    """One sequence of the cache and what it holds."""

    seq_id: int
    tokens: list[int]
    kv_length: int
    replies: list[tuple[int, int]] = field(default_factory=list)
    """``[start, end)`` of each reply's generated ids in ``tokens``."""
    conversation: str | None = None
    committed: bool = False
    """The store's newest generation of ``conversation`` holds exactly this state (or the engine has no store)."""
    named: bool = False
    """A request named ``conversation``: requests that name none never continue it (:attr:`ChatExtra.named`)."""
    busy: bool = False
    """A reply is being generated in it: it cannot be evicted or continued by another call."""
    used: int = 0
    gen: "Generator | None" = None
    """The generator of its last reply (an interrupted one continues from it)."""


@dataclass(frozen=True)
class PrefixSource:
    """Where the longest reusable prefix of a prompt is: a slot of the cache or a checkpoint in the store."""

    length: int
    slot: Slot | None = None
    record: "ChatRecord | None" = None
    manifest: "tuple[Manifest, bytes] | None" = None
    """``record``'s manifest and its envelope bytes as read (restored from without reading it again), if kept."""


class Slots:
    """The slots of one cache: at most ``capacity`` sequences, evicted least recently used, whose K/V come from
    a slot itself, a fork of another, or a prefix restored from ``store`` (with ``ledger``) of a checkpoint of
    ``model`` (an identity)."""

    def __init__(self, cache: "PagedKVCache", capacity: int, model: str, store: "Store | None" = None,
                 ledger: "Ledger | None" = None) -> None:
        self.cache = cache
        self.model = model
        self.capacity = capacity
        self.page_size = cache.layout.page_size
        self.store = store
        self.ledger = ledger
        self._slots: dict[int, Slot] = {}
        self._clock = 0

    def __iter__(self) -> Iterator[Slot]:
        return iter(sorted(self._slots.values(), key=lambda s: s.seq_id))

    def __len__(self) -> int:
        return len(self._slots)

    def touch(self, slot: Slot) -> None:
        """Mark ``slot`` as just used."""
        self._clock += 1
        slot.used = self._clock

    def add(self, slot: Slot) -> Slot:
        self._slots[slot.seq_id] = slot
        self.touch(slot)
        return slot

    def remove(self, slot: Slot) -> None:
        self._slots.pop(slot.seq_id, None)

    def free_seq_id(self) -> int | None:
        """A sequence id no slot uses, or None when all ``capacity`` are taken."""
        return next((i for i in range(self.capacity) if i not in self._slots), None)

    def of_conversation(self, name: str) -> Slot | None:
        return next((s for s in self._slots.values() if s.conversation == name), None)

    def best_prefix(self, tokens: Sequence[int]) -> tuple[Slot | None, int]:
        """The slot whose K/V share the longest prefix with ``tokens``, and its length (ties: the most
        recently used)."""
        best, best_n = None, 0
        for slot in sorted(self._slots.values(), key=lambda s: -s.used):
            n = common_prefix(slot.tokens[:slot.kv_length], tokens)
            if n > best_n:
                best, best_n = slot, n
        return best, best_n

    def eviction_order(self) -> list[Slot]:
        """Slots that may be evicted (not busy), least recently used first."""
        return sorted((s for s in self._slots.values() if not s.busy), key=lambda s: s.used)

    async def place(self, name: str, source: PrefixSource, tokens: int) -> Slot:
        """A slot for conversation ``name`` whose sequence holds the ``source.length`` tokens to reuse, with
        room for ``tokens`` in all; the K/V come from the slot itself, a fork of another, or the store. Raises one
        of :data:`UNUSABLE_KV` if the store's cannot be used (see :meth:`_restore_prefix`): no slot is added
        (``name``'s own is gone)."""
        own = self.of_conversation(name)
        if own is not None and own.busy:
            raise ConflictError(f"conversation {name!r}: a reply is being generated in it; wait for it or interrupt it")
        n = source.length
        if own is not None and own.gen is not None:
            await own.gen.close()  # an unfinished reply of it gives way to this turn, which claims the name
        if own is not None and source.slot is own:
            await self.reserve(tokens - n, keep=(own,))
            self.cache.popn(own.seq_id, own.kv_length - n)
            if n == 0:
                self.cache.remove_sequence(own.seq_id)
            own.kv_length, own.tokens = n, own.tokens[:n]
            return own
        if own is not None:
            await self.drop(own)  # this turn supersedes what it held
        keep = (source.slot,) if source.slot is not None else ()
        seq_id = await self.free_sequence(keep)
        await self.reserve(tokens - n, keep=keep)
        if source.slot is not None:
            self.cache.fork_sequence(source.slot.seq_id, seq_id, n)
        elif source.record is not None:
            await self._restore_prefix(source.record, source.manifest, seq_id, n)
        return self.add(Slot(seq_id, [], n, conversation=name))

    async def _restore_prefix(self, record: "ChatRecord", manifest: "tuple[Manifest, bytes] | None", seq_id: int,
                              n: int) -> None:
        """Restore the first ``n`` tokens of ``record``'s checkpoint (from ``manifest``, its manifest as read, if
        given) as ``seq_id``, or raise one of :data:`UNUSABLE_KV` with nothing restored: NotFoundError when the
        checkpoint under its name and generation is gone, UnusableCheckpointError when it holds no K/V of this
        model for ``record``'s first ``n`` tokens (as read from the manifest restored: another process may have
        deleted the conversation and written another under the same name and generation since ``record`` was
        read; chunks are read by their SHA-256, so the K/V are ``manifest``'s)."""
        where = f"checkpoint {record.name!r} generation {record.generation}"
        try:
            result = await restore(self.store, record.name, self.cache, seq_id=seq_id, generation=record.generation,
                                   length=n, ledger=self.ledger, manifest=manifest)
        except FieldError as exc:
            if exc.field != "length":
                raise
            raise UnusableCheckpointError("length", f"{where}: expected at least {n} tokens, got fewer (it was "
                                          "written anew since it was indexed)") from None
        try:
            saved = parse_app_state(result.app_state)
        except FormatError:
            saved = None
        if saved is None:
            reason, got = "corrupt", "no app_state that can be read"
        elif saved.model != self.model:
            reason, got = "model", f"model {saved.model[:16]}..."
        elif saved.kv_length < n or (saved.prompt + saved.generated)[:n] != record.tokens[:n]:
            reason, got = "length", "other tokens (it was written anew since it was indexed)"
        else:
            return
        self.cache.remove_sequence(seq_id)
        raise UnusableCheckpointError(reason, f"{where}: expected the K/V of this model for the prompt's first {n} "
                                      f"tokens, got {got}")

    async def free_sequence(self, keep: tuple[Slot, ...]) -> int:
        """A sequence id no slot uses, evicting the least recently used idle slot (not one in ``keep``) if none is."""
        seq_id = self.free_seq_id()
        while seq_id is None:
            await self._evict_one(keep, "a free sequence")
            seq_id = self.free_seq_id()
        return seq_id

    async def reserve(self, tokens: int, keep: tuple[Slot, ...]) -> None:
        """Evict idle slots (not those in ``keep``) until ``tokens`` more tokens fit in free pages."""
        while self.cache.get_num_available_pages() * self.page_size < tokens:
            await self._evict_one(keep, f"room for {tokens} tokens")

    async def _evict_one(self, keep: tuple[Slot, ...], wanted: str) -> None:
        """Drop the least recently used idle slot not in ``keep`` whose state is in the store: committed, or an
        unfinished reply saved now (one whose save had failed); CapacityError (saying ``wanted``) if there is none."""
        for slot in self.eviction_order():
            if slot not in keep and (slot.committed or await _saved_now(slot)):
                await self.drop(slot)
                return
        raise CapacityError(f"cache: expected {wanted} after evicting idle conversations, got none evictable "
                            f"({len(self)} in the cache, busy or not yet saved)")

    async def drop(self, slot: Slot) -> None:
        """Take ``slot`` out of the cache (its generator, if one is open, lets go of the name)."""
        if slot.gen is not None:
            await slot.gen.close()
        if slot.seq_id in self.cache.sequence_ids():
            self.cache.remove_sequence(slot.seq_id)
        self.remove(slot)


async def _saved_now(slot: Slot) -> bool:
    """Save the unfinished reply ``slot`` holds (its generator still open, its state not in the store): whether it
    is committed now."""
    gen = slot.gen
    if gen is None or gen.closed or gen.failed or gen.finished:
        return False
    try:
        await gen.save()
    except (StoreError, OSError):
        return False
    slot.committed = True
    return True
