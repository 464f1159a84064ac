"""Test helpers: small layouts, device buffer I/O, :class:`KVModel` (a cache with a numpy model of its K/V), and
what an error names (:func:`names_field`).

:class:`KVModel` drives a :class:`PagedKVCache` together with the K/V each of its
sequences should hold, so tests can compare what the cache returns with what was
put in. K/V are random *bit patterns* (NaNs and infinities included): the cache
must move bytes, never interpret values. Fixtures live in ``conftest.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

import numpy as np

from kvckpt_web import CacheLimits, DeviceArray, FieldError, KVCkptError, KVLayout, PagedKVCache
from kvckpt_web.gpu.device import Copy, Device, Usage

T = TypeVar("T")

#: Small layout used unless a test needs another: 4-token pages, 2 layers, GQA 4/2, head_dim 8.
SMALL_LAYOUT = dict(page_size=4, num_layers=2, num_qo_heads=4, num_kv_heads=2, qk_head_dim=8,
                    dtype="float16", rope_mode="none")
#: 64 tokens -> 17 pages.
SMALL_LIMITS = dict(reserved_num_seqs=4, max_total_seq_len=64, prefill_chunk_size=64)

#: Unsigned integer type holding the bits of each cache dtype.
BITS = {"float16": np.uint16, "bfloat16": np.uint16, "float32": np.uint32}


def run(coro: Awaitable[T]) -> T:
    """Run one coroutine to completion."""
    return asyncio.run(coro)  # type: ignore[arg-type]


def names_field(exc: KVCkptError, field: str) -> bool:
    """Whether ``exc`` names ``field``: as its ``field`` (a FieldError), else at the start of its message (the
    errors that carry no field, such as SequenceError)."""
    if isinstance(exc, FieldError):
        return exc.field == field
    return str(exc).startswith(f"{field}: ")


def small_layout(**overrides: Any) -> KVLayout:
    """The small test layout with ``overrides`` applied."""
    return KVLayout(**{**SMALL_LAYOUT, **overrides})


def small_limits(**overrides: Any) -> CacheLimits:
    """The small test limits with ``overrides`` applied."""
    return CacheLimits(**{**SMALL_LIMITS, **overrides})


# ----- device buffers <-> host ---------------------------------------------------------------------


async def read_device_array(device: Device, array: DeviceArray) -> bytes:
    """The bytes of a device array (copied through a MAP_READ staging buffer)."""
    nbytes = int(np.prod(array.shape)) * np.dtype(BITS[array.dtype]).itemsize
    if nbytes == 0:
        return b""
    staging = device.create_buffer(nbytes, Usage.MAP_READ | Usage.COPY_DST, "test.staging")
    try:
        device.submit([Copy(array.buffer, array.offset, staging, 0, nbytes)])
        return bytes(await device.read(staging, 0, nbytes))
    finally:
        device.destroy(staging)


def device_array_from(cache: PagedKVCache, data: bytes, num_pages: int) -> DeviceArray:
    """A page-group device array for ``num_pages`` pages holding ``data``."""
    array = cache.empty_group(num_pages)
    if data:
        cache.device.write(array.buffer, array.offset, data)
    return array


async def read_layer_page(cache: PagedKVCache, layer: int, page: int) -> bytes:
    """The raw bytes of physical page ``page`` of ``layer`` (stale data included)."""
    pb = cache.layout.page_bytes
    staging = cache.device.create_buffer(pb, Usage.MAP_READ | Usage.COPY_DST, "test.page")
    try:
        region = cache.layers[layer]
        cache.device.submit([Copy(region.buffer, region.offset + page * pb, staging, 0, pb)])
        return bytes(await cache.device.read(staging, 0, pb))
    finally:
        cache.device.destroy(staging)


# ----- a cache and what it should hold --------------------------------------------------------------


class KVModel:
    """A cache driven together with a numpy reference of every sequence's K and V.

    ``ref[seq] = (k, v)``, each ``(num_layers, length, num_kv_heads, head_dim)`` of the
    dtype's bit type (uint16 / uint32).
    """

    def __init__(self, cache: PagedKVCache, seed: int = 0) -> None:
        self.cache = cache
        self.layout = cache.layout
        self.bits = BITS[cache.layout.dtype]
        self.rng = np.random.default_rng(seed)
        self.ref: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    # -- data ------------------------------------------------------------------------------------

    def random_kv(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Random K and V bit patterns for ``n`` tokens: ``(num_layers, n, H, D)`` each."""
        lay = self.layout
        shape = (lay.num_layers, n, lay.num_kv_heads, lay.head_dim)
        info = np.iinfo(self.bits)
        return tuple(self.rng.integers(0, info.max, size=shape, dtype=self.bits, endpoint=True) for _ in "kv")

    def as_input(self, bits: np.ndarray) -> Any:
        """``bits`` as append_kv input: a numpy array of the cache dtype, or raw bytes for bfloat16."""
        bits = np.ascontiguousarray(bits)
        if self.layout.dtype == "bfloat16":  # numpy has no bfloat16: hand over the bytes
            return memoryview(bits).cast("B")
        return bits.view(self.layout.dtype)

    def empty(self) -> tuple[np.ndarray, np.ndarray]:
        lay = self.layout
        shape = (lay.num_layers, 0, lay.num_kv_heads, lay.head_dim)
        return np.zeros(shape, self.bits), np.zeros(shape, self.bits)

    # -- operations on cache and model together -----------------------------------------------------

    def add(self, seq_id: int, n: int = 0) -> None:
        """Add a sequence and append ``n`` random tokens to it."""
        self.cache.add_sequence(seq_id)
        self.ref[seq_id] = self.empty()
        if n:
            self.append({seq_id: n})

    def append(self, lengths: dict[int, int], kv: dict[int, tuple[np.ndarray, np.ndarray]] | None = None) -> dict:
        """One forward pass appending ``lengths[seq]`` tokens to each seq (random K/V unless ``kv`` gives them)."""
        kv = dict(kv or {})
        for seq, n in lengths.items():
            kv.setdefault(seq, self.random_kv(n))
        ids = list(lengths)
        self.cache.begin_forward(ids, [lengths[s] for s in ids])
        for layer in range(self.layout.num_layers):
            k = np.concatenate([kv[s][0][layer] for s in ids])
            v = np.concatenate([kv[s][1][layer] for s in ids])
            self.cache.append_kv(layer, self.as_input(k), self.as_input(v))
        self.cache.end_forward()
        for s in ids:
            k0, v0 = self.ref[s]
            self.ref[s] = (np.concatenate([k0, kv[s][0]], axis=1), np.concatenate([v0, kv[s][1]], axis=1))
        return kv

    def fork(self, parent: int, child: int, pos: int = -1) -> None:
        self.cache.fork_sequence(parent, child, pos)
        n = self.ref[parent][0].shape[1] if pos == -1 else pos
        self.ref[child] = tuple(a[:, :n].copy() for a in self.ref[parent])

    def popn(self, seq: int, n: int) -> None:
        self.cache.popn(seq, n)
        keep = self.ref[seq][0].shape[1] - n
        self.ref[seq] = tuple(a[:, :keep].copy() for a in self.ref[seq])

    def remove(self, seq: int) -> None:
        self.cache.remove_sequence(seq)
        del self.ref[seq]

    # -- expectations ------------------------------------------------------------------------------

    def length(self, seq: int) -> int:
        return self.ref[seq][0].shape[1]

    def expected_group(self, seq: int, group: int) -> bytes:
        """Page group ``group`` of ``seq`` as TVM lays it out, unused tail of the last page zero."""
        lay = self.layout
        k, v = self.ref[seq]
        n = k.shape[1]
        pages = lay.num_logical_pages(n)
        out = np.zeros((1, pages, 2, lay.num_kv_heads, lay.page_size, lay.head_dim), self.bits)
        for which, src in enumerate((k, v)):
            padded = np.zeros((pages * lay.page_size, lay.num_kv_heads, lay.head_dim), self.bits)
            padded[:n] = src[group]
            paged = padded.reshape(pages, lay.page_size, lay.num_kv_heads, lay.head_dim)
            out[0, :, which] = paged.transpose(0, 2, 1, 3)  # (page, slot, head, dim) -> (page, head, slot, dim)
        return out.tobytes()

    def expected_groups(self, seq: int) -> list[bytes]:
        return [self.expected_group(seq, g) for g in range(self.layout.num_layers)]

    async def stored_kv(self, seq: int, start: int = 0, end: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """What ``debug_get_kv`` returns, as bit arrays."""
        end = self.length(seq) if end is None else end
        k, v = await self.cache.debug_get_kv(seq, start, end)
        return (np.frombuffer(k.data, self.bits).reshape(k.shape), np.frombuffer(v.data, self.bits).reshape(v.shape))

    def assert_holds(self, seq: int) -> None:
        """The cache holds exactly the reference K/V and length of ``seq``."""
        assert self.cache.get_sequence_length(seq) == self.length(seq)
        k, v = run(self.stored_kv(seq))
        np.testing.assert_array_equal(k, self.ref[seq][0])
        np.testing.assert_array_equal(v, self.ref[seq][1])

    def export(self, seq: int) -> list[bytes]:
        """Every page group of ``seq`` as bytes (host helper)."""
        return [bytes(g) for g in run(self.cache.export_groups(seq))]
