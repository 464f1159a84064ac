"""The chat engine of ``kvckpt serve --api``, on a thread of its own with an event loop of its own.

GPU work blocks the thread that runs it (on lavapipe a forward is tens of milliseconds of CPU work or more,
and a restore reads and verifies files), so the engine never runs on the server's event loop: that loop goes
on accepting connections and answering ``GET /v1/models``, static files and timeouts while a reply is
generated. Work reaches the engine's loop through :func:`asyncio.run_coroutine_threadsafe`; what it yields
(a streamed reply's chunks, or a result) comes back through a queue on the server's loop.

Requests run one at a time, whole, in the order they arrived (:class:`asyncio.Lock` is FIFO), although the
engine's cache lock would let replies take turns token by token (as llama.cpp's slots do): on one GPU, or on
two CPU cores, interleaved replies each run at a fraction of the speed and none finishes sooner; a request
waits for the previous one instead of racing it for cache room it may evict (``cached_tokens`` then says
what a lone request gets); and :meth:`Job.cancel` can stop exactly its own reply with
:meth:`~kvckpt_web.engine.Engine.interrupt`, which stops every reply running. WebLLM serves one request at
a time too.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from ..errors import KVCkptError

if TYPE_CHECKING:
    from ..engine import Engine

__all__ = ["EngineWorker", "Job", "ShuttingDown"]


class ShuttingDown(KVCkptError):
    """The server is stopping: the request was not run."""


class Job:
    """One request's work on the engine thread, as the server's loop sees it: its result (:meth:`result`),
    then, if the work gave an async iterator (a streamed reply), its items (:meth:`items`)."""

    def __init__(self, worker: "EngineWorker", work: Callable[["Engine"], Awaitable[Any]]) -> None:
        self._worker = worker
        self._work = work
        self._server_loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._cancelled = False  # read and written on the engine's loop only
        self._running = False

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
        self._cancelled = True
        if self._running:
            self._worker.engine.interrupt()  # one request runs at a time: it is this one's reply

    def _put(self, kind: str, value: Any = None) -> None:
        try:
            self._server_loop.call_soon_threadsafe(self._queue.put_nowait, (kind, value))
        except RuntimeError:  # the server's loop is closed: nobody is waiting
            pass

    async def _run(self, engine: "Engine") -> None:
        self._running = True
        try:
            try:
                value = await self._work(engine)
            except Exception as exc:
                return self._put("error", exc)
            self._put("value", value)
            if not isinstance(value, AsyncIterator):
                return
            if self._cancelled:  # cancelled while its reply was being placed: stop it at its first token
                engine.interrupt()
            try:
                async for item in value:
                    self._put("item", item)
            except Exception as exc:
                return self._put("error", exc)
            self._put("end")
        finally:
            self._running = False


class EngineWorker:
    """An engine built and run on a daemon thread; :meth:`submit` gives it work from the server's loop."""

    def __init__(self, build: Callable[[], "Engine"]) -> None:
        """Start the thread and build the engine there with ``build`` (opening the device, loading the model);
        raises what ``build`` raised."""
        self._loop = asyncio.new_event_loop()
        self._turn: asyncio.Lock | None = None
        self._closing = False
        self.queued = 0
        """Requests waiting for the one being answered to end."""
        built: Future[Engine] = Future()
        self._thread = threading.Thread(target=self._main, args=(build, built), daemon=True, name="kvckpt-engine")
        self._thread.start()
        self.engine: Engine = built.result()

    def _main(self, build: Callable[[], "Engine"], built: "Future[Engine]") -> None:
        asyncio.set_event_loop(self._loop)
        try:
            engine = build()
            self._turn = asyncio.Lock()
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

    def submit(self, work: Callable[["Engine"], Awaitable[Any]]) -> Job:
        """Queue ``work(engine)`` behind the requests before it (called on the server's loop)."""
        job = Job(self, work)
        asyncio.run_coroutine_threadsafe(self._serve(job), self._loop)
        return job

    async def _serve(self, job: Job) -> None:
        self.queued += 1
        async with self._turn:
            self.queued -= 1
            if self._closing:
                return job._put("error", ShuttingDown("serve: the server is stopping; the request was not run"))
            if job._cancelled:
                return job._put("error", KVCkptError("serve: the client went away before its request ran"))
            await job._run(self.engine)

    def stop(self) -> None:
        """Stop the reply being generated after its current token (it is saved, resumable) and refuse every
        request from now on (those queued too). Callable from any thread, and from a signal handler."""
        self._call_soon(self._stop)

    def _stop(self) -> None:
        self._closing = True
        self.engine.interrupt()

    def close(self) -> None:
        """:meth:`stop`, then close the engine (its cache's GPU memory) and end the thread. Call it from another
        thread than the engine's."""
        if not self._thread.is_alive():
            return

        async def close() -> None:
            self._stop()
            async with self._turn:
                await self.engine.close()

        try:
            asyncio.run_coroutine_threadsafe(close(), self._loop).result()
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
