"""The one owner of an engine's cache: every forward, import and save readback runs while holding its
:class:`CacheLock`, so no two of them interleave on the GPU (a restore's import never meets a generation's
forward half-way, as it could when an upload yields to the event loop, as the browser's does).
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
        self.holds = 0
        """Holds taken so far."""

    @property
    def busy(self) -> bool:
        """Whether the cache is held now."""
        return self._lock.locked()

    @asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        """Hold the cache for one piece of work (a forward step, a restore, an eviction)."""
        async with self._lock:
            self.holds += 1
            yield
