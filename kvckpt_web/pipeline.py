"""The concurrency under saves and restores: bounded jobs, ordered hashing on worker threads, and the
batches of a save mapped from the GPU a few at a time.

Hashing (hashlib releases the GIL) and blocking file I/O run in threads where threads exist; in
Pyodide every step runs inline on the event loop and the same code still works.
"""

from __future__ import annotations

import asyncio
import os
import queue
import sys
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from .container import chunk_digest

if TYPE_CHECKING:
    from .cache import MappedPages, PagedKVCache

READ_SLOTS = 4
"""Batches a save keeps mapped at once: the next ones are read back while earlier ones are hashed and written."""

HASH_THREADS = max(1, min(8, os.cpu_count() or 1))
"""Threads a save or restore hashes its chunks on."""

_IN_BROWSER = sys.platform == "emscripten"

_CACHE_LOCKS: "weakref.WeakKeyDictionary[Any, dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Lock]]]" = \
    weakref.WeakKeyDictionary()


def cache_lock(cache: "PagedKVCache", purpose: str = "transfer") -> asyncio.Lock:
    """One lock per cache, purpose and event loop: "transfer" guards the cache's staging buffers for one
    readback or import at a time; "slots" guards the staging slots a save maps for one save at a time."""
    loop = asyncio.get_running_loop()
    locks = _CACHE_LOCKS.setdefault(cache, {})
    entry = locks.get(purpose)
    if entry is None or entry[0] is not loop:
        entry = locks[purpose] = (loop, asyncio.Lock())
    return entry[1]


async def offload(fn: Callable[..., Any], *args: Any) -> Any:
    """Run CPU-heavy ``fn`` (hashing, which releases the GIL) in a worker thread where threads exist."""
    if _IN_BROWSER:
        return fn(*args)
    return await asyncio.to_thread(fn, *args)


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


class Hasher:
    """SHA-256 of chunks, in order, on :data:`HASH_THREADS` worker threads (inline where there are none)."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: "queue.SimpleQueue[tuple[memoryview, asyncio.Future[str]] | None]" = queue.SimpleQueue()
        self._threads = [] if _IN_BROWSER else [threading.Thread(target=self._work, daemon=True, name="kvckpt-hash")
                                                for _ in range(HASH_THREADS)]
        for thread in self._threads:
            thread.start()

    def digest(self, data: memoryview) -> "asyncio.Future[str]":
        """A future of the hex digest of ``data``, which must stay valid until the future is done."""
        future = self._loop.create_future()
        if self._threads:
            self._queue.put((data, future))
        else:
            future.set_result(chunk_digest(data))
        return future

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            data, future = item
            if future.cancelled():  # the save was abandoned
                continue
            try:
                self._loop.call_soon_threadsafe(_resolve, future, chunk_digest(data))
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting chunk
                self._loop.call_soon_threadsafe(_fail, future, exc)

    async def close(self) -> None:
        """Stop the threads once the queued chunks are hashed (or skipped, if their futures were cancelled)."""
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            await asyncio.to_thread(thread.join)


class MappedBatches:
    """The changed pages of a save, mapped from the GPU batch by batch and hashed chunk by chunk.

    Batches (whole chunk columns) are mapped in :data:`READ_SLOTS` staging slots, so later batches
    are read back while earlier ones are written; the chunks of each mapped batch are queued, in
    order, to a :class:`Hasher`, and every chunk's digest is handed over as soon as it exists.
    Batch ``b + READ_SLOTS`` is mapped once every chunk of batch ``b`` is :meth:`done`.
    """

    def __init__(self, cache: "PagedKVCache", seq_id: int, plan: list[tuple[int, int]],
                 batches: list[list[int]]) -> None:
        self._cache, self._seq_id, self._plan, self._batches = cache, seq_id, plan, batches
        self._groups = cache.layout.num_layers
        self._page_bytes = cache.layout.page_bytes
        self._unfinished = [len(batch) * self._groups for batch in batches]
        self._slot_free = [asyncio.Event() for _ in batches]
        self._hasher = Hasher()
        self._closed = False
        self._reads = [asyncio.ensure_future(self._read(b)) for b in range(len(batches))]

    def _view(self, mapped: "MappedPages", b: int, i: int, g: int) -> memoryview:
        first, count = self._plan[i]
        base = self._plan[self._batches[b][0]][0]
        return mapped.groups[g][(first - base) * self._page_bytes:(first - base + count) * self._page_bytes]

    async def _read(self, b: int) -> "tuple[MappedPages, dict[tuple[int, int], asyncio.Future[str]]] | None":
        if b >= READ_SLOTS:
            await self._slot_free[b - READ_SLOTS].wait()
        if self._closed:
            return None
        plan, batch = self._plan, self._batches[b]
        first, end = plan[batch[0]][0], plan[batch[-1]][0] + plan[batch[-1]][1]
        async with cache_lock(self._cache):
            mapped = await self._cache.map_pages(self._seq_id, first, end, slot=b % READ_SLOTS)
        digests = {(i, g): self._hasher.digest(self._view(mapped, b, i, g)) for i in batch for g in range(self._groups)}
        return mapped, digests

    async def chunk(self, b: int, i: int, g: int) -> tuple[memoryview, str]:
        """Chunk ``i`` of group ``g`` (in batch ``b``) in mapped memory, and its digest."""
        result = await self._reads[b]
        if result is None:
            raise asyncio.CancelledError()
        mapped, digests = result
        return self._view(mapped, b, i, g), await digests[i, g]

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
            for future in digests.values():
                future.cancel()  # not hashed yet: skipped
        await self._hasher.close()  # no thread reads mapped memory after this
        for mapped, _ in batches:
            mapped.release()


def _resolve(future: "asyncio.Future[str]", value: str) -> None:
    if not future.done():
        future.set_result(value)


def _fail(future: "asyncio.Future[str]", exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
