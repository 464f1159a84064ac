"""The concurrency under saves and restores: bounded jobs, a save's ordered hashing on worker threads, and the
batches of a save mapped from the GPU a few at a time.

Hashing (hashlib releases the GIL) and blocking file I/O run in threads where threads exist, except the
hashing of small saves (:data:`INLINE_HASH_BYTES`); in Pyodide every step runs inline on the event loop and
the same code still works. A chunk's digest can continue from a :class:`HashState` over its first bytes,
which an earlier save kept (:func:`continued_digest`).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import os
import queue
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..threads import IN_BROWSER

if TYPE_CHECKING:
    from ..kv.cache import MappedPages, PagedKVCache

READ_SLOTS = 4
"""Batches a save keeps mapped at once: the next ones are read back while earlier ones are hashed and written."""

HASH_THREADS = max(1, min(8, os.cpu_count() or 1))
"""Threads a save hashes its chunks on (a restore hashes each chunk on the thread that reads it)."""

INLINE_HASH_BYTES = (16 << 20) // HASH_THREADS
"""A save of at most this many bytes hashes on the event loop, where a trip to the hash threads costs more than it saves."""

IO_CONCURRENCY = 16
"""Chunk reads or writes (with their hashing) in flight at once."""

async def run_bounded(jobs: Iterable[Callable[[], Awaitable[None]]], limit: int) -> None:
    """Run the jobs, at most ``limit`` at once; on the first error start no more, wait for those running, re-raise."""
    jobs = iter(jobs)
    errors: list[BaseException] = []

    async def worker() -> None:
        for job in jobs:  # one shared iterator: each job is taken once
            if errors:
                return
            try:
                await job()
            except BaseException as exc:  # noqa: BLE001 - re-raised below, after the others stopped
                errors.append(exc)
                return

    workers = [asyncio.ensure_future(worker()) for _ in range(limit)]
    try:
        await asyncio.wait(workers)
    finally:
        if not all(w.done() for w in workers):  # we were cancelled: start no more jobs, let the running ones end
            errors.append(asyncio.CancelledError())
            await asyncio.wait(workers)  # never leave a write running after the caller has released the store lock
    if errors:  # a failure rather than a cancellation it caused
        raise min(errors, key=lambda e: isinstance(e, asyncio.CancelledError))


@dataclass(frozen=True)
class HashState:
    """SHA-256 over the first ``nbytes`` bytes of a chunk, from which the digest of a later chunk that begins
    with the same bytes continues (a copy of ``state`` is updated, never ``state`` itself)."""

    nbytes: int
    state: Any


def continued_digest(data: memoryview, start: HashState | None = None,
                     keep: int | None = None) -> tuple[str, HashState | None]:
    """The SHA-256 hex digest of ``data``, hashing only what ``start`` (over its first ``start.nbytes``
    bytes) does not cover; and, if ``keep`` is given and not below that, the state over ``data[:keep]``."""
    sha = hashlib.sha256() if start is None else start.state.copy()
    done = 0 if start is None else start.nbytes
    kept = None
    if keep is not None and keep >= done:
        sha.update(data[done:keep])
        kept, done = HashState(keep, sha.copy()), keep
    sha.update(data[done:])
    return sha.hexdigest(), kept


class Hasher:
    """SHA-256 of chunks on the process's :data:`HASH_POOL` (inline where there are no threads)."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._outstanding = 0  # queued items no worker has finished or skipped yet
        self._idle = asyncio.Event()
        self._idle.set()

    def digest(self, data: memoryview, start: HashState | None = None,
               keep: int | None = None) -> "asyncio.Future[tuple[str, HashState | None]]":
        """A future of :func:`continued_digest` of ``data``, which must stay valid until :meth:`close` returns.

        Cancelling the future before a worker reaches it skips the hashing.
        """
        future = self._loop.create_future()
        if IN_BROWSER:
            future.set_result(continued_digest(data, start, keep))
            return future
        self._outstanding += 1
        self._idle.clear()
        HASH_POOL.put((data, start, keep, future, self))
        return future

    def _finished(self, future: "asyncio.Future[Any]", digest: Any, exc: BaseException | None) -> None:
        """Called on the loop once a worker is done with one item."""
        if not future.done():
            if exc is None:
                future.set_result(digest)  # type: ignore[arg-type]
            else:
                future.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
        self._outstanding -= 1
        if not self._outstanding:
            self._idle.set()

    async def close(self) -> None:
        """Wait until no worker reads any data queued here (each item hashed, or skipped if cancelled)."""
        await self._idle.wait()


_HashItem = tuple[memoryview, HashState | None, int | None, "asyncio.Future[tuple[str, HashState | None]]", Hasher]


class HashPool:
    """Threads that hash what :class:`Hasher` objects queue, in the order queued, started on first use.

    Threads are the process's: every save of every store hashes on the one :data:`HASH_POOL`, so
    that two saves at once share the CPUs instead of each starting as many threads as there are CPUs. The
    pool holds no save's or store's state (each item carries the Hasher waiting for it). A forked child,
    which has none of its parent's threads, starts its own on first use.
    """

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._queue: "queue.SimpleQueue[_HashItem] | None" = None
        self._lock = threading.Lock()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=functools.partial(_after_fork, weakref.ref(self)))

    def put(self, item: _HashItem) -> None:
        """Queue ``item`` for the next free thread, starting the threads first if none runs yet."""
        with self._lock:
            if self._queue is None:
                self._queue = queue.SimpleQueue()
                for _ in range(self.threads):
                    threading.Thread(target=_hash_worker, args=(self._queue,), daemon=True, name="kvckpt-hash").start()
            self._queue.put(item)

    def _forget_threads(self) -> None:
        self._queue = None  # a forked child has none of its parent's threads: it starts its own
        self._lock = threading.Lock()  # and a lock another thread held at the fork would never be released


def _after_fork(pool: "weakref.ref[HashPool]") -> None:
    alive = pool()
    if alive is not None:
        alive._forget_threads()


HASH_POOL = HashPool(HASH_THREADS)
"""The process's hashing threads (see :class:`HashPool`)."""


def _hash_worker(work: "queue.SimpleQueue[_HashItem]") -> None:
    while True:
        data, start, keep, future, hasher = work.get()
        digest, exc = None, None
        if not future.cancelled():  # a save that was abandoned
            try:
                digest = continued_digest(data, start, keep)
            except BaseException as error:  # noqa: BLE001 - handed to the waiting chunk
                exc = error
        del data
        try:
            hasher._loop.call_soon_threadsafe(hasher._finished, future, digest, exc)
        except RuntimeError:  # that event loop is closed: nobody waits for this item any more
            pass


class MappedBatches:
    """The changed pages of a save, mapped from the GPU batch by batch and hashed chunk by chunk.

    Batches (whole chunk columns) are mapped in :data:`READ_SLOTS` staging slots, so later batches
    are read back while earlier ones are written; the chunks of each mapped batch are queued, in
    order, to a :class:`Hasher`, and every chunk's digest is handed over as soon as it exists. A save
    of at most :data:`INLINE_HASH_BYTES` hashes each chunk when it is asked for instead.
    Batch ``b + READ_SLOTS`` is mapped once every chunk of batch ``b`` is :meth:`done`.

    The digest of chunk ``(i, g)`` continues ``starts[i, g]`` where given (a state over its first bytes,
    which must hold the same bytes), and where ``keeps[i, g]`` is given, the state over that many of its
    bytes lands in :attr:`kept` as ``kept[g] = (i, state)``.
    """

    def __init__(self, cache: "PagedKVCache", seq_id: int, plan: list[tuple[int, int]], batches: list[list[int]],
                 starts: dict[tuple[int, int], HashState] | None = None,
                 keeps: dict[tuple[int, int], int] | None = None) -> None:
        self._cache, self._seq_id, self._plan, self._batches = cache, seq_id, plan, batches
        self._starts, self._keeps = starts or {}, keeps or {}
        self.kept: dict[int, tuple[int, HashState]] = {}
        self._groups = cache.layout.num_layers
        self._page_bytes = cache.layout.page_bytes
        self._unfinished = [len(batch) * self._groups for batch in batches]
        self._slot_free = [asyncio.Event() for _ in batches]
        self._hasher = Hasher()
        total = sum(plan[i][1] for batch in batches for i in batch) * self._groups * self._page_bytes
        self._inline = total <= INLINE_HASH_BYTES
        self._closed = False
        self._reads = [asyncio.ensure_future(self._read(b)) for b in range(len(batches))]

    def _view(self, mapped: "MappedPages", b: int, i: int, g: int) -> memoryview:
        first, count = self._plan[i]
        base = self._plan[self._batches[b][0]][0]
        return mapped.groups[g][(first - base) * self._page_bytes:(first - base + count) * self._page_bytes]

    async def _read(self, b: int) -> "tuple[MappedPages, dict[tuple[int, int], asyncio.Future[Any]] | None] | None":
        if b >= READ_SLOTS:
            await self._slot_free[b - READ_SLOTS].wait()
        if self._closed:
            return None
        plan, batch = self._plan, self._batches[b]
        first, end = plan[batch[0]][0], plan[batch[-1]][0] + plan[batch[-1]][1]
        async with self._cache.lock():
            mapped = await self._cache.map_pages(self._seq_id, first, end, slot=b % READ_SLOTS)
        if self._inline:
            return mapped, None
        digests = {(i, g): self._hasher.digest(self._view(mapped, b, i, g), self._starts.get((i, g)),
                                               self._keeps.get((i, g)))
                   for i in batch for g in range(self._groups)}
        return mapped, digests

    async def chunk(self, b: int, i: int, g: int) -> tuple[memoryview, str]:
        """Chunk ``i`` of group ``g`` (in batch ``b``) in mapped memory, and its digest."""
        result = await self._reads[b]
        if result is None:
            raise asyncio.CancelledError()
        mapped, digests = result
        view = self._view(mapped, b, i, g)
        if digests is None:
            digest, kept = continued_digest(view, self._starts.get((i, g)), self._keeps.get((i, g)))
        else:
            digest, kept = await digests[i, g]
        if kept is not None:
            self.kept[g] = (i, kept)
        return view, digest

    def done(self, b: int) -> None:
        """One chunk of batch ``b`` is stored; the last one unmaps the batch and frees its slot."""
        self._unfinished[b] -= 1
        if not self._unfinished[b]:
            self._reads[b].result()[0].release()
            self._slot_free[b].set()

    def stop(self) -> None:
        """Map no more batches; chunks of batches not mapped yet raise CancelledError."""
        self._closed = True
        for event in self._slot_free:
            event.set()

    async def close(self) -> None:
        """:meth:`stop`; wait for mapping and hashing in flight, then unmap every batch still mapped."""
        self.stop()
        if self._reads:
            await asyncio.wait(self._reads)
        batches = [task.result() for task in self._reads
                   if not task.cancelled() and task.exception() is None and task.result() is not None]
        for _, digests in batches:
            for future in (digests or {}).values():
                future.cancel()  # not hashed yet: skipped
        await self._hasher.close()  # no thread reads mapped memory after this
        for mapped, _ in batches:
            mapped.release()
