"""Stores that fail where a test wants: :class:`FullAfter` runs out of space after a number of commits."""

from __future__ import annotations

import errno

from kvckpt_web.stores.memory import MemoryStore


class FullAfter(MemoryStore):
    """A MemoryStore whose manifest writes (commits) fail with ENOSPC after the first ``ok`` of them."""

    def __init__(self, ok: int) -> None:
        super().__init__()
        self.ok = ok

    async def _set(self, key, data):
        if key.startswith("manifests/"):
            if self.ok == 0:
                raise OSError(errno.ENOSPC, "No space left on device")
            self.ok -= 1
        await super()._set(key, data)
