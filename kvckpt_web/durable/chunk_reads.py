"""Reading stored chunks: never more bytes than a chunk's ref says, its size known before anything is allocated
for it, and anything but a stored value where a chunk should be (a FIFO, a device, a socket) is damage of that
chunk, never a hang or an error of the whole operation."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import CorruptionError, FormatError
from .container import ChunkRef, check_chunk_digest, check_chunk_size
from .keys import chunk_digest

if TYPE_CHECKING:
    from ..stores.base import Store

__all__ = ["read_chunk", "read_chunk_into", "stored_size"]


async def _read(store: "Store", key: str, out: memoryview, what: str, digest: bool = False
                  ) -> tuple[int | None, str | None]:
    """:meth:`Store.get_into` (:meth:`Store.get_into_then` with the SHA-256 hex digest of what it read if
    ``digest``); what is no value (a FIFO, a device, ...) is :class:`CorruptionError` of ``what``."""
    try:
        if digest:
            return await store.get_into_then(key, out, chunk_digest)
        return await store.get_into(key, out), None
    except FormatError as exc:
        raise CorruptionError(f"{what}: expected {exc.expected}, got {exc.got}") from None


async def stored_size(store: "Store", key: str) -> int | None:
    """The length of the value under ``key``, none of it read (None: there is none); :class:`CorruptionError`
    naming the key if what is there is no value (a FIFO, a device, ...)."""
    return (await _read(store, key, memoryview(bytearray()), key))[0]  # get_into reads only into a buffer that fits


async def read_chunk_into(store: "Store", ref: ChunkRef, out: memoryview, *, verify: bool = False) -> None:
    """The stored bytes of ``ref`` read into ``out`` (``ref.nbytes`` long), with ``verify`` their SHA-256 checked
    against the ref's on the thread that read them (:meth:`Store.get_into_then`); :class:`CorruptionError`
    naming the chunk if it is missing, of another size (then nothing is read), no value or, verified, other bytes."""
    length, digest = await _read(store, ref.key, out, ref.describe(), verify)
    check_chunk_size(ref, length)
    if verify:
        check_chunk_digest(ref, digest)


async def read_chunk(store: "Store", ref: ChunkRef, *, verify: bool = False) -> memoryview:
    """The stored bytes of ``ref``, in a buffer allocated only once the stored size is the one ``ref`` says,
    verified as :func:`read_chunk_into` verifies them; :class:`CorruptionError` naming the chunk otherwise."""
    check_chunk_size(ref, (await _read(store, ref.key, memoryview(bytearray()), ref.describe()))[0])
    out = memoryview(bytearray(ref.nbytes))
    await read_chunk_into(store, ref, out, verify=verify)
    return out
