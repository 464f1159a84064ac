"""A MemoryStore that counts the calls made to it, by method and key: what the tests pin the number of store
round trips with (on S3 each one is a request)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

from kvckpt_web import MemoryStore

_T = TypeVar("_T")


def count(calls: Counter[tuple[str, str]], method: str, prefix: str = "") -> int:
    """How many of ``calls`` (:attr:`CountingStore.calls`) were of ``method`` with a key (or listed prefix) that starts
    with ``prefix``."""
    return sum(n for (m, key), n in calls.items() if m == method and key.startswith(prefix))


class CountingStore(MemoryStore):
    """A :class:`MemoryStore` recording each ``get``/``get_into``/``exists``/``list_prefix``/``set``/
    ``set_if_absent``/``delete`` as ``(method, key or prefix)`` in :attr:`calls`, and in :attr:`before_write` the
    calls made before the first write since the last :meth:`reset` (None until one)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: Counter[tuple[str, str]] = Counter()
        self.before_write: Counter[tuple[str, str]] | None = None

    def reset(self) -> None:
        self.calls.clear()
        self.before_write = None

    def _writing(self) -> None:
        if self.before_write is None:
            self.before_write = self.calls.copy()

    async def get(self, key: str, *, max_bytes: int | None = None) -> bytes | None:
        self.calls["get", key] += 1
        return await super().get(key, max_bytes=max_bytes)

    async def get_into(self, key: str, out: memoryview) -> int | None:
        self.calls["get", key] += 1
        return await super().get_into(key, out)

    async def get_into_then(self, key: str, out: memoryview, then: Callable[[memoryview], _T]
                            ) -> tuple[int | None, _T | None]:
        self.calls["get", key] += 1
        return await super().get_into_then(key, out, then)

    async def exists(self, key: str) -> bool:
        self.calls["exists", key] += 1
        return await super().exists(key)

    async def list_prefix(self, prefix: str) -> list[str]:
        self.calls["list", prefix] += 1
        return await super().list_prefix(prefix)

    async def set(self, key: str, data: bytes | bytearray | memoryview) -> None:
        self._writing()
        self.calls["set", key] += 1
        await super().set(key, data)

    async def set_if_absent(self, key: str, data: bytes | bytearray | memoryview) -> bool:
        self._writing()
        self.calls["set", key] += 1
        return await super().set_if_absent(key, data)

    async def delete(self, key: str) -> None:
        self._writing()
        self.calls["delete", key] += 1
        await super().delete(key)
