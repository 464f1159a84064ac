"""The one owner of an engine's cache: every forward, import and eviction runs while holding its
:class:`CacheLock`, so no two of them interleave on the GPU (a restore's import never meets a generation's
forward half-way, as it could when an upload yields to the event loop, as the browser's does). An autosave the
scheduler started runs beside the steps that follow (it reads only its own sequence, which sits out until it is
committed); every other holder waits until no such save runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

__all__ = ["CacheLock"]


class CacheLock:
    """Lets the cache work of any number of tasks hold the cache one at a time, in the order they asked (FIFO)."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._saves = 0
        self._no_saves = asyncio.Event()
        self._no_saves.set()
        self.holds = 0
        """Holds taken so far."""

    @property
    def busy(self) -> bool:
        """Whether the cache is held now."""
        return self._lock.locked()

    @asynccontextmanager
    async def hold(self, *, beside_saves: bool = False) -> AsyncIterator[None]:
        """Hold the cache for one piece of work (a forward step, a restore, an eviction); unless ``beside_saves``
        (a step of the replies not saving), only once no save started by :meth:`save_started` runs."""
        async with self._lock:
            if not beside_saves:
                await self._no_saves.wait()
            self.holds += 1
            yield

    def save_started(self) -> None:
        """A save of one sequence goes on after the hold that started it ends (until :meth:`save_ended`)."""
        self._saves += 1
        self._no_saves.clear()

    def save_ended(self) -> None:
        """A save :meth:`save_started` announced is committed or failed."""
        self._saves -= 1
        if not self._saves:
            self._no_saves.set()
