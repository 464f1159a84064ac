"""Page pool and sequences: which physical pages hold which tokens.

Pure bookkeeping, no device access. Pages are reference counted so forked
sequences share their common full pages. Invariant: a page shared by two
sequences is always full, so appends never write into a shared page; when a
fork or a pop would break that, the operation returns a page copy for the
cache to perform on every layer.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from .errors import CapacityError, SequenceError

#: A device page copy to perform on every layer: (source page id, destination page id).
PageCopy = tuple[int, int]


@dataclass
class Sequence:
    """One sequence: its length in tokens and the physical page of each logical page."""

    seq_id: int
    length: int = 0
    pages: list[int] = field(default_factory=list)


class PagePool:
    """A fixed set of pages with reference counts; allocates the lowest free ids first (long contiguous runs)."""

    def __init__(self, num_pages: int) -> None:
        self.num_pages = num_pages
        self._refs = [0] * num_pages
        self._free = list(range(num_pages))

    @property
    def num_free(self) -> int:
        """Pages not used by any sequence."""
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        """``n`` free pages (all or nothing)."""
        if n > len(self._free):
            raise CapacityError(f"pages: expected {n} free pages, got {len(self._free)} (the KV cache is full)")
        pages = [heapq.heappop(self._free) for _ in range(n)]
        for page in pages:
            self._refs[page] = 1
        return pages

    def retain(self, pages: list[int]) -> None:
        """Add one reference to each page."""
        for page in pages:
            self._refs[page] += 1

    def release(self, pages: list[int]) -> None:
        """Drop one reference from each page; pages nobody uses become free."""
        for page in pages:
            self._refs[page] -= 1
            if self._refs[page] == 0:
                heapq.heappush(self._free, page)

    def is_shared(self, page: int) -> bool:
        """Whether more than one sequence uses ``page``."""
        return self._refs[page] > 1


class SequenceTable:
    """The sequences of one cache and the pages they hold."""

    def __init__(self, num_pages: int, page_size: int) -> None:
        self.pool = PagePool(num_pages)
        self.page_size = page_size
        self.seqs: dict[int, Sequence] = {}

    def get(self, seq_id: int) -> Sequence:
        """The sequence ``seq_id``; SequenceError if it does not exist."""
        try:
            return self.seqs[seq_id]
        except KeyError:
            raise SequenceError(f"seq_id: expected an existing sequence {sorted(self.seqs)}, got {seq_id}") from None

    def _check_new_id(self, seq_id: int) -> None:
        if isinstance(seq_id, bool) or not isinstance(seq_id, int) or seq_id < 0:
            raise SequenceError(f"seq_id: expected a non-negative integer, got {seq_id!r}")
        if seq_id in self.seqs:
            raise SequenceError(f"seq_id: expected an id not in use, got {seq_id} (already exists)")

    def add(self, seq_id: int) -> Sequence:
        """Create an empty sequence."""
        self._check_new_id(seq_id)
        seq = self.seqs[seq_id] = Sequence(seq_id)
        return seq

    def remove(self, seq_id: int) -> None:
        """Delete a sequence and release its pages."""
        seq = self.get(seq_id)
        self.pool.release(seq.pages)
        del self.seqs[seq_id]

    def clear(self) -> None:
        """Remove every sequence."""
        for seq_id in list(self.seqs):
            self.remove(seq_id)

    def fork(self, parent_id: int, child_id: int, fork_pos: int = -1) -> list[PageCopy]:
        """Create ``child_id`` holding the first ``fork_pos`` tokens of ``parent_id`` (-1: all of them)."""
        parent = self.get(parent_id)
        if fork_pos == -1:
            fork_pos = parent.length
        if isinstance(fork_pos, bool) or not isinstance(fork_pos, int) or not 0 <= fork_pos <= parent.length:
            raise SequenceError(f"fork_pos: expected -1 or 0..{parent.length}, got {fork_pos!r}")
        self._check_new_id(child_id)
        full, partial = divmod(fork_pos, self.page_size)
        pages = parent.pages[:full]
        copies: list[PageCopy] = []
        if partial:
            (fresh,) = self.pool.allocate(1)
            copies.append((parent.pages[full], fresh))
        self.pool.retain(pages)
        self.seqs[child_id] = Sequence(child_id, fork_pos, pages + [dst for _, dst in copies])
        return copies

    def popn(self, seq_id: int, n: int) -> list[PageCopy]:
        """Drop the last ``n`` tokens of a sequence."""
        seq = self.get(seq_id)
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= seq.length:
            raise SequenceError(f"n: expected 0..{seq.length} tokens to pop, got {n!r}")
        new_length = seq.length - n
        keep = -(-new_length // self.page_size)
        self.pool.release(seq.pages[keep:])
        del seq.pages[keep:]
        seq.length = new_length
        copies: list[PageCopy] = []
        if new_length % self.page_size and self.pool.is_shared(seq.pages[-1]):
            (fresh,) = self.pool.allocate(1)
            copies.append((seq.pages[-1], fresh))
            self.pool.release([seq.pages[-1]])
            seq.pages[-1] = fresh
        return copies

    def reserve(self, seq_ids: list[int], lengths: list[int]) -> list[int]:
        """Grow each sequence by its length (all or nothing); the token positions (page * page_size + slot)."""
        seqs = [self.get(s) for s in seq_ids]
        needed = [-(-(seq.length + n) // self.page_size) - len(seq.pages) for seq, n in zip(seqs, lengths)]
        fresh = self.pool.allocate(sum(needed))
        positions: list[int] = []
        for seq, n, k in zip(seqs, lengths, needed):
            seq.pages.extend(fresh[:k])
            del fresh[:k]
            for pos in range(seq.length, seq.length + n):
                page, slot = divmod(pos, self.page_size)
                positions.append(seq.pages[page] * self.page_size + slot)
            seq.length += n
        return positions

    def replace(self, seq_id: int, length: int) -> Sequence:
        """Make ``seq_id`` (new or existing) a sequence of ``length`` tokens on freshly allocated pages."""
        if isinstance(seq_id, bool) or not isinstance(seq_id, int) or seq_id < 0:
            raise SequenceError(f"seq_id: expected a non-negative integer, got {seq_id!r}")
        need = -(-length // self.page_size)
        old = self.seqs.get(seq_id)
        reclaimable = sum(1 for page in old.pages if not self.pool.is_shared(page)) if old else 0
        if need > self.pool.num_free + reclaimable:
            raise CapacityError(f"pages: expected {need} free pages for {length} tokens, "
                                f"got {self.pool.num_free + reclaimable}")
        if old is not None:
            self.remove(seq_id)
        seq = self.seqs[seq_id] = Sequence(seq_id, length, self.pool.allocate(need))
        return seq
