"""Page pool and sequences: which physical pages hold which tokens.

Pure bookkeeping, no device access. Pages are reference counted so forked
sequences share their common full pages. Invariant: a page shared by two
sequences is always full, so appends never write into a shared page; when a
fork or a pop would break that, the operation returns a page copy for the
cache to perform on every layer.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field
from typing import Any

from ..checks import type_name
from ..errors import CapacityError, SequenceError, is_int

#: A device page copy to perform on every layer: (source page id, destination page id).
PageCopy = tuple[int, int]


#: Source of :attr:`Sequence.uid`: unique among every Sequence object of this process.
_next_uid = itertools.count(1).__next__


@dataclass(frozen=True)
class SequenceState:
    """What a sequence was at one moment, for change tracking (see :meth:`Sequence.unchanged_prefix`).

    ``uid`` identifies the Sequence object (a new one for every add, fork and
    import, so an id that was removed and added again is another sequence);
    ``pops`` counts its ``popn`` calls so far.
    """

    seq_id: int
    uid: int
    length: int
    pops: int


@dataclass
class Sequence:
    """One sequence: its length in tokens and the physical page of each logical page.

    ``uid`` and the pop history exist so a checkpoint writer can tell which
    tokens changed since it last saw the sequence; they never affect equality.
    """

    seq_id: int
    length: int = 0
    pages: list[int] = field(default_factory=list)
    uid: int = field(default_factory=_next_uid, compare=False)
    pops: int = field(default=0, compare=False)
    # (pop number, length popped to), lengths strictly increasing: a pop to a length <= an earlier entry's
    # makes that entry irrelevant for every query, so the list stays at most `length` entries long.
    _floors: list[tuple[int, int]] = field(default_factory=list, compare=False, repr=False)

    def state(self) -> SequenceState:
        """This sequence's :class:`SequenceState` now."""
        return SequenceState(self.seq_id, self.uid, self.length, self.pops)

    def record_pop(self) -> None:
        """Note that the sequence was just popped to its current ``length``."""
        self.pops += 1
        while self._floors and self._floors[-1][1] >= self.length:
            self._floors.pop()
        self._floors.append((self.pops, self.length))

    def unchanged_prefix(self, since: SequenceState) -> int:
        """How many leading tokens hold the same K/V now as at ``since`` (0 if ``since`` is another sequence)."""
        if since.uid != self.uid:
            return 0
        low = min(since.length, self.length)
        i = bisect.bisect_right(self._floors, (since.pops, float("inf")))  # first pop after `since`
        if i < len(self._floors):
            low = min(low, self._floors[i][1])
        return low


class PagePool:
    """A fixed set of pages with reference counts, placed so that each sequence's pages form long runs.

    An allocation continues after a given page while the pages there are free. The rest goes into the
    largest free runs: a run that follows a page in use is entered past its middle (when the pages
    wanted fit there), leaving its first half to whoever grows out of that page. So sequences appended
    in turns each keep one run instead of taking every other page, and an export or import of a
    sequence moves few large copies instead of one per page.
    """

    def __init__(self, num_pages: int) -> None:
        self.num_pages = num_pages
        self._refs = [0] * num_pages
        self._starts = [0] if num_pages else []  # sorted first pages of the maximal free runs
        self._ends = {0: num_pages} if num_pages else {}  # first page of a free run -> one past its last
        self._num_free = num_pages

    @property
    def num_free(self) -> int:
        """Pages not used by any sequence."""
        return self._num_free

    def check_free(self, n: int) -> None:
        """CapacityError unless ``n`` pages are free."""
        if n > self._num_free:
            raise CapacityError(f"pages: expected {n} free pages, got {self._num_free} (the KV cache is full)")

    def allocate(self, n: int, after: int | None = None) -> list[int]:
        """``n`` free pages (all or nothing), starting right after page ``after`` where those are free."""
        self.check_free(n)
        pages: list[int] = []
        if after is not None and (run := self._run_at(after + 1)) is not None:
            pages += self._take(after + 1, min(n, run - after - 1))
        if len(pages) < n:
            runs = sorted(((self._ends[s] - s, s) for s in self._starts), key=lambda r: (-r[0], r[1]))
            for length, start in runs:  # largest first, the lowest page first among equals
                want = n - len(pages)
                if length >= want:
                    offset = min(length // 2, length - want) if start else 0  # start > 0: a page in use before
                    pages += self._take(start + offset, want)
                    break
                pages += self._take(start, length)
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
                self._free(page)

    def is_shared(self, page: int) -> bool:
        """Whether more than one sequence uses ``page``."""
        return self._refs[page] > 1

    def _run_at(self, page: int) -> int | None:
        """One past the last page of the free run holding ``page``, or None if ``page`` is not free."""
        i = bisect.bisect_right(self._starts, page) - 1
        if i < 0 or page >= self._ends[self._starts[i]]:
            return None
        return self._ends[self._starts[i]]

    def _take(self, first: int, count: int) -> list[int]:
        """Pages ``first .. first + count - 1``, all inside one free run, taken out of it."""
        i = bisect.bisect_right(self._starts, first) - 1
        start = self._starts[i]
        end = self._ends[start]
        if first == start:
            del self._starts[i], self._ends[start]
        else:
            self._ends[start] = first
            i += 1
        if first + count < end:
            self._starts.insert(i, first + count)
            self._ends[first + count] = end
        self._num_free -= count
        return list(range(first, first + count))

    def _free(self, page: int) -> None:
        """Return ``page`` to the free runs, merging it with its neighbours."""
        i = bisect.bisect_left(self._starts, page)
        end = page + 1
        if i < len(self._starts) and self._starts[i] == end:
            end = self._ends.pop(end)
            del self._starts[i]
        if i and self._ends[self._starts[i - 1]] == page:
            self._ends[self._starts[i - 1]] = end
        else:
            self._starts.insert(i, page)
            self._ends[page] = end
        self._num_free += 1


def check_seq_id(field: str, seq_id: Any) -> int:
    """``seq_id`` if it can name a sequence (an integer >= 0), else SequenceError naming ``field``."""
    if not is_int(seq_id, 0):
        raise SequenceError(f"{field}: expected a non-negative integer, got "
                            f"{seq_id if is_int(seq_id) else repr(type_name(seq_id))}")
    return seq_id


class SequenceTable:
    """The sequences of one cache and the pages they hold."""

    def __init__(self, num_pages: int, page_size: int) -> None:
        self.pool = PagePool(num_pages)
        self.page_size = page_size
        self.seqs: dict[int, Sequence] = {}

    def get(self, seq_id: int) -> Sequence:
        """The sequence ``seq_id``; SequenceError if it does not exist."""
        check_seq_id("seq_id", seq_id)
        try:
            return self.seqs[seq_id]
        except KeyError:
            raise SequenceError(f"seq_id: expected an existing sequence {sorted(self.seqs)}, got {seq_id}") from None

    def _check_new_id(self, seq_id: int) -> None:
        check_seq_id("seq_id", seq_id)
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
        if not is_int(fork_pos, 0, parent.length):
            raise SequenceError(f"fork_pos: expected -1 or 0..{parent.length}, got {fork_pos!r}")
        self._check_new_id(child_id)
        full, partial = divmod(fork_pos, self.page_size)
        pages = parent.pages[:full]
        copies: list[PageCopy] = []
        if partial:
            (fresh,) = self.pool.allocate(1, after=pages[-1] if pages else None)
            copies.append((parent.pages[full], fresh))
        self.pool.retain(pages)
        self.seqs[child_id] = Sequence(child_id, fork_pos, pages + [dst for _, dst in copies])
        return copies

    def popn(self, seq_id: int, n: int) -> list[PageCopy]:
        """Drop the last ``n`` tokens of a sequence."""
        seq = self.get(seq_id)
        if not is_int(n, 0, seq.length):
            raise SequenceError(f"n: expected 0..{seq.length} tokens to pop, got {n!r}")
        new_length = seq.length - n
        keep = -(-new_length // self.page_size)
        if new_length % self.page_size and self.pool.is_shared(seq.pages[keep - 1]):  # a copy will be needed:
            freed = sum(1 for page in seq.pages[keep:] if not self.pool.is_shared(page))  # check before changing
            if self.pool.num_free + freed < 1:
                raise CapacityError(f"pages: expected 1 free page to unshare the last page of seq_id {seq_id}, "
                                    "got 0 (the KV cache is full)")
        self.pool.release(seq.pages[keep:])
        del seq.pages[keep:]
        seq.length = new_length
        if n:
            seq.record_pop()
        copies: list[PageCopy] = []
        if new_length % self.page_size and self.pool.is_shared(seq.pages[-1]):
            (fresh,) = self.pool.allocate(1, after=seq.pages[-2] if len(seq.pages) > 1 else None)
            copies.append((seq.pages[-1], fresh))
            self.pool.release([seq.pages[-1]])
            seq.pages[-1] = fresh
        return copies

    def reserve(self, seq_ids: list[int], lengths: list[int]) -> list[int]:
        """Grow each sequence by its length (all or nothing); the token positions (page * page_size + slot)."""
        seqs = [self.get(s) for s in seq_ids]
        needed = [-(-(seq.length + n) // self.page_size) - len(seq.pages) for seq, n in zip(seqs, lengths)]
        self.pool.check_free(sum(needed))
        positions: list[int] = []
        for seq, n, k in zip(seqs, lengths, needed):
            seq.pages.extend(self.pool.allocate(k, after=seq.pages[-1] if seq.pages else None))
            for pos in range(seq.length, seq.length + n):
                page, slot = divmod(pos, self.page_size)
                positions.append(seq.pages[page] * self.page_size + slot)
            seq.length += n
        return positions

    def replace(self, seq_id: int, length: int) -> Sequence:
        """Make ``seq_id`` (new or existing) a sequence of ``length`` tokens on freshly allocated pages."""
        check_seq_id("seq_id", seq_id)
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
