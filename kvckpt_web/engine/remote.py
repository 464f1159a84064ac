"""Continuing a conversation on another device: an engine's conversation pushed to a remote store (the store
``kvckpt serve --store`` serves, through :class:`~kvckpt_web.stores.http.HTTPStore`; object storage; a directory)
and pulled from one into another engine's store.

Both copy the conversation's newest committed generation with :func:`~kvckpt_web.durable.sync.sync`: only the
chunks the other side lacks move, the manifest after its chunks, the prefix index records after the manifest.
After a pull, the engine's next request that continues the conversation's messages restores its K/V from the
store (its prefix index is read again at each request) instead of computing them, and gives the tokens an
uninterrupted run gives; a conversation of another model is refused there, as any is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..durable.results import SyncResult
from ..durable.sync import sync
from ..errors import ConflictError, FieldError
from ..stores.base import check_store

if TYPE_CHECKING:
    from ..stores.base import Store
    from .engine import Engine

__all__ = ["pull", "push"]


def _store_of(engine: "Engine") -> "Store":
    from .engine import Engine

    if not isinstance(engine, Engine):
        raise FieldError("engine", "an Engine", type(engine).__name__)
    if engine.store is None:
        raise FieldError("engine.store", "a store the engine saves its conversations in", "none")
    return engine.store


async def _copied(src: "Store", dst: "Store", name: str) -> SyncResult:
    result = await sync(src, dst, names=[name])
    if result.conflicts:
        raise ConflictError(f"conversation {result.conflicts[0]}")
    return result


async def push(engine: "Engine", name: str, remote: "Store") -> SyncResult:
    """Copy conversation ``name``'s newest committed generation from ``engine``'s store to ``remote``; what moved.

    NotFoundError if the engine's store holds no conversation ``name``; ConflictError (nothing overwritten) if
    ``remote`` holds a newer generation of it, another one under the same number, or one the two went apart
    from (another device continued it: pull that first, or start a new conversation).
    """
    return await _copied(_store_of(engine), check_store(remote, "remote"), name)


async def pull(engine: "Engine", name: str, remote: "Store") -> SyncResult:
    """Copy conversation ``name``'s newest committed generation from ``remote`` into ``engine``'s store; what moved.

    NotFoundError if ``remote`` holds no conversation ``name``; ConflictError (nothing overwritten) if the
    engine's store holds a newer or diverging generation of it, or the engine holds the conversation (a slot of
    it: its claim).
    """
    return await _copied(check_store(remote, "remote"), _store_of(engine), name)
