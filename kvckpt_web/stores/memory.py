"""MemoryStore: a store in a dict, for tests and as a cache."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from contextlib import AbstractAsyncContextManager

from ..checks import check_instance
from .base import DEFAULT_LOCK_TIMEOUT, LocalClaims, LocalLock, Store

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
        self._lock_flag = LocalLock(f"memory:{id(self):#x}")
        self._claims = LocalClaims()

    def __repr__(self) -> str:
        return f"MemoryStore(<{len(self._data)} keys>, read_only={self.read_only})"

    @property
    def location(self) -> str:
        return "memory"

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

    def _lock(self, timeout: float) -> AbstractAsyncContextManager[None]:
        return self._lock_flag.hold(timeout)

    async def _claim(self, name: str) -> Callable[[], Awaitable[None]]:
        return self._claims.take(name, self._claimed(name))
