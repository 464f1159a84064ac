"""The sequences an engine keeps in its cache: whose tokens each holds, which conversation it is, when it was
used last, and which to evict when the cache is full.

A :class:`Slot` is one sequence of the paged cache. Its K/V hold ``tokens[:kv_length]``; the tokens after that
are known but pending (the last token a reply picked is never run until the next turn needs it). A slot is
*committed* while the store's newest generation of its conversation holds exactly its state, so evicting it
loses nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..model.generator import Generator

__all__ = ["Slot", "Slots", "common_prefix"]


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
    busy: bool = False
    """A reply is being generated in it: it cannot be evicted or continued by another call."""
    used: int = 0
    gen: "Generator | None" = None
    """The generator of its last reply (an interrupted one continues from it)."""


class Slots:
    """The slots of one cache: at most ``capacity`` sequences, evicted least recently used."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
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
