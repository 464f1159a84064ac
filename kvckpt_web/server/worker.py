"""The chat engine of ``kvckpt serve --api``, on a thread of its own with an event loop of its own.

GPU work blocks the thread that runs it (on lavapipe a forward is tens of milliseconds of CPU work or more,
and a restore reads and verifies files), so the engine never runs on the server's event loop: that loop goes
on accepting connections and answering ``GET /v1/models``, static files and timeouts while a reply is
generated. Work reaches the engine's loop through :func:`asyncio.run_coroutine_threadsafe`; what it yields
(a streamed reply's chunks, or a result) comes back through a queue on the server's loop.

Requests run concurrently, as many as the engine's cache holds conversations (``EngineConfig.sequences``): the
engine's scheduler decodes every running reply in one forward and prefills a new prompt chunk by chunk between
them. Beyond that, requests wait in arrival order, at most ``queue`` of them (:data:`DEFAULT_QUEUE`); beyond the
queue a request is refused at once with :class:`Busy` (503 with ``Retry-After``), so that the wait a client sees
stays bounded. A client that goes away stops exactly its own reply (its stream is closed after its current
token, saved and resumable); a stopping server interrupts every reply.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from ..checks import check_int
from ..errors import KVCkptError

if TYPE_CHECKING:
    from ..engine import Engine

__all__ = ["DEFAULT_QUEUE", "RETRY_AFTER_S", "Busy", "Continues", "EngineWorker", "Job", "ShuttingDown"]

DEFAULT_QUEUE = 16
"""Requests that may wait for a running one to end, beyond those running (``kvckpt serve --api --queue``)."""
RETRY_AFTER_S = 1
"""The ``Retry-After`` seconds of a request refused because the queue is full."""

Continues = Callable[["Engine"], Awaitable[str | None]]
"""Which conversation a request would go on with if it ran now (None: a new one), asked on the engine's loop."""


class ShuttingDown(KVCkptError):
    """The server is stopping: the request was not run."""


class Busy(KVCkptError):
    """Every sequence of the cache runs a request and the queue is full: the request was not run; try again
    after :attr:`retry_after` seconds."""

    retry_after = RETRY_AFTER_S


class Job:
    """One request's work on the engine thread, as the server's loop sees it: its result (:meth:`result`),
    then, if the work gave an async iterator (a streamed reply), its items (:meth:`items`). ``continues`` says
    which conversation the work would go on with if it ran now (None: none), asked while it waits in the queue."""

    def __init__(self, worker: "EngineWorker", work: Callable[["Engine"], Awaitable[Any]],
                 continues: Continues | None = None) -> None:
        self._worker = worker
        self._work = work
        self._continues = continues
        self._server_loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._cancelled = False  # read and written on the engine's loop only

    async def result(self) -> Any:
        """What the work returned (an async iterator's items then come from :meth:`items`); raises what it
        raised."""
        return self._unpack(await self._queue.get())

    async def items(self) -> AsyncIterator[Any]:
        """The items of the async iterator the work returned, as the engine yields them; raises what
        iterating raised."""
        while (item := await self._queue.get())[0] != "end":
            yield self._unpack(item)

    def cancel(self) -> None:
        """The client went away: a job still queued will not run, a reply being generated stops after its
        current token (it is saved, resumable). Callable from any thread; nothing happens to a finished job."""
        self._worker._call_soon(self._stop)

    @staticmethod
    def _unpack(item: tuple[str, Any]) -> Any:
        kind, value = item
        if kind == "error":
            raise value
        return value

    # ----- on the engine's loop -----------------------------------------------------------------

    def _stop(self) -> None:
        self._cancelled = True  # a reply being streamed stops after its current token (see _run)

    def _put(self, kind: str, value: Any = None) -> None:
        try:
            self._server_loop.call_soon_threadsafe(self._queue.put_nowait, (kind, value))
        except RuntimeError:  # the server's loop is closed: nobody is waiting
            pass

    async def _run(self, engine: "Engine") -> None:
        try:
            value = await self._work(engine)
        except Exception as exc:
            return self._put("error", exc)
        self._put("value", value)
        if not isinstance(value, AsyncIterator):
            return
        try:
            async for item in value:
                self._put("item", item)
                if self._cancelled:  # the client went away: its reply alone stops (saved, resumable)
                    await value.aclose()
                    break
        except Exception as exc:
            return self._put("error", exc)
        self._put("end")


class EngineWorker:
    """An engine built and run on a daemon thread; :meth:`submit` gives it work from the server's loop, run as the
    module says: up to the cache's sequences at once, then ``queue`` waiting (:data:`DEFAULT_QUEUE`)."""

    def __init__(self, build: Callable[[], "Engine"], *, queue: int = DEFAULT_QUEUE) -> None:
        """Start the thread and build the engine there with ``build`` (opening the device, loading the model);
        raises what ``build`` raised."""
        self.queue = check_int("queue", queue, 0)
        self._loop = asyncio.new_event_loop()
        self._slots: asyncio.Semaphore | None = None
        self._serving: set[asyncio.Future[None]] = set()  # on the engine's loop
        self._waiting: set[Job] = set()  # jobs queued and not started, on the engine's loop
        self._closing = False
        self._admitted = 0  # requests submitted and not ended, under _count
        self._count = threading.Lock()
        built: Future[Engine] = Future()
        self._thread = threading.Thread(target=self._main, args=(build, built), daemon=True, name="kvckpt-engine")
        self._thread.start()
        self.engine: Engine = built.result()
        self.concurrent = self.engine.config.sequences
        """Requests that run at once: one a sequence of the cache."""

    @property
    def queued(self) -> int:
        """Requests waiting for a running one to end."""
        with self._count:
            return max(0, self._admitted - self.concurrent)

    def _main(self, build: Callable[[], "Engine"], built: "Future[Engine]") -> None:
        asyncio.set_event_loop(self._loop)
        try:
            engine = build()
            self._slots = asyncio.Semaphore(engine.config.sequences)
        except BaseException as exc:
            built.set_exception(exc)
            self._loop.close()
            return
        built.set_result(engine)
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    def _call_soon(self, callback: Callable[[], None]) -> None:
        try:
            self._loop.call_soon_threadsafe(callback)
        except RuntimeError:  # the engine's loop is closed: nothing runs any more
            pass

    def submit(self, work: Callable[["Engine"], Awaitable[Any]], *, continues: Continues | None = None) -> Job:
        """Queue ``work(engine)`` behind the requests before it (called on the server's loop), ``continues`` saying
        which conversation it goes on with (see :meth:`waiting_conversations`); :class:`Busy` if the queue is
        full."""
        with self._count:
            if self._admitted >= self.concurrent + self.queue:
                raise Busy(f"serve: expected a free place among {self.concurrent} running and {self.queue} queued "
                           f"requests, got none; try again in {RETRY_AFTER_S} s")
            self._admitted += 1
        job = Job(self, work, continues)
        asyncio.run_coroutine_threadsafe(self._serve(job), self._loop)
        return job

    async def _serve(self, job: Job) -> None:
        task = asyncio.current_task()
        self._serving.add(task)
        self._waiting.add(job)
        try:
            async with self._slots:
                self._waiting.discard(job)
                if self._closing:
                    return job._put("error", ShuttingDown("serve: the server is stopping; the request was not run"))
                if job._cancelled:
                    return job._put("error", KVCkptError("serve: the client went away before its request ran"))
                await job._run(self.engine)
        finally:
            self._waiting.discard(job)
            self._serving.discard(task)
            with self._count:
                self._admitted -= 1

    async def waiting_conversations(self) -> set[str]:
        """The conversations the requests queued and not started would go on with if they ran now (called on the
        engine's loop)."""
        names = set()
        for job in list(self._waiting):
            if job._continues is not None and (name := await job._continues(self.engine)) is not None:
                names.add(name)
        return names

    def stop(self) -> None:
        """Stop every reply being generated after its current token (each is saved, resumable) and refuse every
        request from now on (those queued too). Callable from any thread, and from a signal handler."""
        self._call_soon(self._stop)

    def _stop(self) -> None:
        self._closing = True
        self.engine.interrupt()

    def close(self) -> None:
        """:meth:`stop`, then close the engine (its cache's GPU memory) once every request ended, and end the
        thread. Call it from another thread than the engine's."""
        if not self._thread.is_alive():
            return

        async def close() -> None:
            self._stop()
            while self._serving:
                await asyncio.gather(*self._serving, return_exceptions=True)
            await self.engine.close()

        try:
            asyncio.run_coroutine_threadsafe(close(), self._loop).result()
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
