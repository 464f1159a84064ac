"""Continuing a conversation on another device: an engine's conversation pushed to a remote store (the store
``kvckpt serve --store`` serves, through :class:`~kvckpt_web.stores.http.HTTPStore`; object storage; a directory)
and pulled from one into another engine's store.

Both copy the conversation's newest committed generation with :func:`~kvckpt_web.durable.sync.sync`: only the
chunks the other side lacks move, the manifest after its chunks, the prefix index records after the manifest.
Nothing is overwritten: a copy whose tokens went apart from the other side's (both devices went on with the
conversation, each its own way) is kept there beside it under a name of its own, ``<name>.apart-<id>``, which
the result's ``kept_apart`` gives.
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

    A copy that went apart from the one ``remote`` holds is kept there beside it under a name of its own
    (``kept_apart``). NotFoundError if the engine's store holds no conversation ``name``; ConflictError (nothing
    copied) if ``remote``'s copy goes on from this one (another device continued it: pull that).
    """
    return await _copied(_store_of(engine), check_store(remote, "remote"), name)


async def pull(engine: "Engine", name: str, remote: "Store") -> SyncResult:
    """Copy conversation ``name``'s newest committed generation from ``remote`` into ``engine``'s store; what moved.

    The remote's copy, if it went apart from the one the engine's store holds, is kept beside it under a name of
    its own (``kept_apart``). NotFoundError if ``remote`` holds no conversation ``name``; ConflictError (nothing
    copied) if the engine's copy goes on from the remote's, or the engine holds the conversation (a slot of it:
    its claim).
    """
    return await _copied(check_store(remote, "remote"), _store_of(engine), name)
