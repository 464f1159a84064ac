"""MemoryStore: a store in a dict, for tests and as a cache."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager

from ..checks import check_instance
from .base import DEFAULT_LOCK_TIMEOUT, Store, poll_acquire

__all__ = ["MemoryStore"]


class MemoryStore(Store):
    """A store in a dict.

    ``data``, if given, is used as the backing mapping (not copied), so two
    MemoryStores may share it -- e.g. a read-only view of a writable one. The
    lock and the claims belong to this object.
    """

    def __init__(
        self,
        data: MutableMapping[str, bytes] | None = None,
        *,
        read_only: bool = False,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    ) -> None:
        super().__init__(read_only=read_only, lock_timeout=lock_timeout)
        self._data: MutableMapping[str, bytes] = {} if data is None else check_instance(
            "data", data, MutableMapping, "a mutable mapping of keys to bytes (a dict) or None")
        self._locked = False
        self._claims: set[str] = set()

    def __repr__(self) -> str:
        return f"MemoryStore(<{len(self._data)} keys>, read_only={self.read_only})"

    async def _get(self, key: str) -> bytes | None:
        return self._data.get(key)

    async def _set(self, key: str, data: memoryview) -> None:
        self._data[key] = bytes(data)

    async def _delete(self, key: str) -> None:
        self._data.pop(key, None)

    async def _exists(self, key: str) -> bool:
        return key in self._data

    async def _list_prefix(self, prefix: str) -> list[str]:
        return [key for key in self._data if key.startswith(prefix)]

    def _try_lock(self) -> bool:
        if self._locked:
            return False
        self._locked = True
        return True

    @asynccontextmanager
    async def _lock(self, timeout: float) -> AsyncIterator[None]:
        await poll_acquire(self._try_lock, timeout, f"memory:{id(self):#x}")
        try:
            yield
        finally:
            self._locked = False

    async def _claim(self, name: str) -> Callable[[], Awaitable[None]]:
        if name in self._claims:
            raise self._claimed(name)
        self._claims.add(name)

        async def release() -> None:
            self._claims.discard(name)

        return release
