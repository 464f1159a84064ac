"""Reading stored chunks: never more bytes than a chunk's ref says, its size known before anything is allocated
for it, and anything but a stored value where a chunk should be (a FIFO, a device, a socket) is damage of that
chunk, never a hang or an error of the whole operation."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from ..errors import CorruptionError, FormatError
from .container import ChunkRef, check_chunk_size

if TYPE_CHECKING:
    from ..stores.base import Store

__all__ = ["read_chunk", "read_chunk_into", "stored_size"]

_T = TypeVar("_T")


async def _length(store: "Store", key: str, out: memoryview, what: str) -> int | None:
    """:meth:`Store.get_into`; what is no value (a FIFO, a device, ...) is :class:`CorruptionError` of ``what``."""
    return (await _read_then(store, key, out, what, None))[0]


async def _read_then(store: "Store", key: str, out: memoryview, what: str,
                     then: Callable[[memoryview], _T] | None) -> tuple[int | None, _T | None]:
    """:meth:`Store.get_into_then` (:meth:`Store.get_into` without ``then``), what is no value being
    :class:`CorruptionError` of ``what``."""
    try:
        if then is None:
            return await store.get_into(key, out), None
        return await store.get_into_then(key, out, then)
    except FormatError as exc:
        raise CorruptionError(f"{what}: expected {exc.expected}, got {exc.got}") from None


async def stored_size(store: "Store", key: str) -> int | None:
    """The length of the value under ``key``, none of it read (None: there is none); :class:`CorruptionError`
    naming the key if what is there is no value (a FIFO, a device, ...)."""
    return await _length(store, key, memoryview(bytearray()), key)  # get_into reads only into a buffer that fits


async def read_chunk_into(store: "Store", ref: ChunkRef, out: memoryview,
                          then: Callable[[memoryview], _T] | None = None) -> _T | None:
    """The stored bytes of ``ref`` read into ``out`` (``ref.nbytes`` long), and what ``then(out)`` returns
    (run where the store read them, see :meth:`Store.get_into_then`); :class:`CorruptionError` naming the
    chunk if it is missing, of another size (then nothing is read) or no value."""
    length, result = await _read_then(store, ref.key, out, ref.describe(), then)
    check_chunk_size(ref, length)
    return result


async def read_chunk(store: "Store", ref: ChunkRef) -> memoryview:
    """The stored bytes of ``ref``, in a buffer allocated only once the stored size is the one ``ref`` says;
    :class:`CorruptionError` naming the chunk otherwise (as :func:`read_chunk_into`)."""
    check_chunk_size(ref, await _length(store, ref.key, memoryview(bytearray()), ref.describe()))
    out = memoryview(bytearray(ref.nbytes))
    await read_chunk_into(store, ref, out)
    return out
