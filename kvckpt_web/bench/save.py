"""``kvckpt bench save``: durable checkpoints in a FileStore on disk, side by side with raw file I/O of their bytes."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from typing import Any, Awaitable, Callable

from ..durable.container import plan_chunks
from ..durable.keys import CHUNKS
from ..durable.ledger import Ledger
from ..durable.pipeline import IO_CONCURRENCY, run_bounded
from ..durable.restore import restore
from ..durable.save import default_pages_per_chunk, save
from ..gpu.device import Copy, Device, Usage
from ..gpu.open import open_device
from ..gpu.tensors import zeroed
from ..kv.cache import PagedKVCache
from ..stores.file import FileStore
from ..tvm.layout import CacheLimits
from .rows import EXPORT_LAYOUT, EXPORT_TOKENS, HEADER, Probe, Row, emit, expand_paths, load_average

SAVE_APPEND = 64
"""Tokens appended between the full and the incremental save of ``kvckpt bench save``."""

SAVE_FULL_TARGET = 0.8
"""The target for a full save: at least this fraction of a raw write+fsync's speed."""

SAVE_INCREMENTAL_TARGET = 20
"""The target for an incremental save: at most 1/this of the full save's time."""

Times = dict[str, list[float]]
"""Seconds of each timed operation, one entry per measured round (and under "load", the load average after it)."""


def _fill_unique(cache: PagedKVCache, seq: int, tokens: int) -> None:
    """Append ``tokens`` tokens of random K/V (distinct chunks, so content addressing cannot skip any)."""
    lay = cache.layout
    token_bytes = lay.num_kv_heads * lay.head_dim * lay.elem_bytes
    for start in range(0, tokens, cache.limits.prefill_chunk_size):
        n = min(cache.limits.prefill_chunk_size, tokens - start)
        cache.begin_forward([seq], [n])
        for layer in range(lay.num_layers):
            cache.append_kv(layer, os.urandom(n * token_bytes), os.urandom(n * token_bytes))
        cache.end_forward()


async def bench_save(device: Device | None = None, repeats: int = 5, paths: tuple[str, ...] = ("auto",),
                     echo: Callable[[str], None] = print, directory: str | None = None,
                     tokens: int = EXPORT_TOKENS) -> list[Row]:
    """Durable checkpoints of the export bench's sequence (``tokens``; 4096: 256 MiB) in a FileStore on disk.

    Full save vs a raw write + fsync of the same bytes to one file (and the save's chunk files written
    alone, the floor of its file layout, vs the same); an incremental save after +64 tokens vs the full
    save (and its chunk files and manifest written alone, its floor, vs the same); the save of a new
    process, which finds every chunk stored already and reads each back once, vs the full save; restore
    vs a raw read of the same bytes + upload to the GPU.
    """
    device = device or open_device()
    paths = expand_paths(device, paths)
    bench = _SaveBench(device, tokens, tempfile.mkdtemp(prefix="kvckpt-bench-save.", dir=directory))
    rows: list[Row] = []
    verdicts: list[str] = []
    echo(f"adapter: {device.info.adapter} ({device.info.backend}); {tokens} tokens (+{SAVE_APPEND}), 16 layers, "
         f"8 KV heads, head_dim 128, page 16, float16; FileStore in {bench.root}; median of {repeats}\n")
    echo(HEADER)
    try:
        for path in paths:
            verdicts.append(await bench.run_path(path, repeats, rows, echo))
        echo(f"\ntargets: full save >= {SAVE_FULL_TARGET}x raw write+fsync; incremental save <= "
             f"{100 / SAVE_INCREMENTAL_TARGET:g}% of the full save's time (ratio >= {SAVE_INCREMENTAL_TARGET}); "
             "GB/s of an incremental save counts the whole sequence")
        for line in verdicts:
            echo(line)
    finally:
        bench.close()
    return rows


class _SaveBench:
    """The baselines' buffers and files of ``kvckpt bench save``, under the directory ``root``."""

    def __init__(self, device: Device, tokens: int, root: str) -> None:
        lay = EXPORT_LAYOUT
        self.device, self.tokens, self.root = device, tokens, root
        self.nbytes = lay.num_layers * lay.num_logical_pages(tokens) * lay.page_bytes
        self.write_staging = device.create_buffer(self.nbytes, Usage.MAP_WRITE | Usage.COPY_SRC, "bench.write_staging")
        self.contiguous = device.create_buffer(self.nbytes, Usage.COPY_SRC | Usage.COPY_DST, "bench.contiguous")
        self.probe = Probe(device)
        # page-aligned like the save's host buffers, so the floor writes with O_DIRECT as it does
        self.host = zeroed(self.nbytes)
        self.raw_path = os.path.join(root, "raw.bin")
        npages = lay.num_logical_pages(tokens)  # each group's chunks, cut as save() cuts them
        self.chunk_spans = [((g * npages + first) * lay.page_bytes, count * lay.page_bytes)
                            for g in range(lay.num_layers)
                            for first, count in plan_chunks(npages, default_pages_per_chunk(lay.page_bytes))]

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        for buf in (self.write_staging, self.contiguous):
            self.device.destroy(buf)
        self.probe.close()

    def raw_write(self) -> None:
        """The host bytes written to one file and fsynced."""
        fd = os.open(self.raw_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = self.host
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)

    async def raw_read_upload(self) -> None:
        """The file :meth:`raw_write` wrote, read and uploaded to a device buffer."""
        with open(self.raw_path, "rb") as f:
            f.readinto(self.host)
        await self.device.upload(self.write_staging, 0, [self.host])
        self.device.submit([Copy(self.write_staging, 0, self.contiguous, 0, self.nbytes)])
        await self.probe.sync()

    async def write_chunks(self, to: FileStore, spans: list[tuple[int, int]]) -> None:
        """The ``(offset, size)`` spans of the host bytes as chunk files, as a save's batch writes them."""
        host = self.host
        async with to.batch():
            await run_bounded((lambda k=k, at=at, n=n: to.set(f"{CHUNKS}{k:064x}", host[at:at + n])
                               for k, (at, n) in enumerate(spans)), IO_CONCURRENCY)

    async def run_path(self, path: str, repeats: int, rows: list[Row], echo: Callable[[str], None]) -> str:
        """Every row of transfer ``path``, printed as it is added; returns its verdict on the targets."""
        limits = CacheLimits(4, self.tokens + SAVE_APPEND, 2048)
        cache = PagedKVCache(self.device, EXPORT_LAYOUT, limits, transfer=path)
        target = PagedKVCache(self.device, EXPORT_LAYOUT, limits, transfer=path)
        cache.add_sequence(0)
        _fill_unique(cache, 0, self.tokens)
        data = b"".join(await cache.export_groups(0))
        self.host[:] = data
        times: Times = {k: [] for k in ("raw", "floor", "save", "inc", "inc_floor", "reread", "restore", "read",
                                        "load")}
        for i in range(repeats + 1):
            await self._round(i, cache, target, times)
        if bytes(b"".join(await target.export_groups(0))) != data:
            raise AssertionError("bench save: the restored sequence differs from the saved one")
        verdict = _save_rows(f"{cache.host_path()} path", self.nbytes, times, rows, echo)
        cache.close()
        target.close()
        return verdict

    async def _round(self, i: int, cache: PagedKVCache, target: PagedKVCache, times: Times) -> None:
        """Round ``i`` of every measurement (round 0 warms up and is not recorded)."""
        store = FileStore(os.path.join(self.root, f"store{i}"))
        record = i > 0

        async def timed(name: str, fn: Callable[[], Awaitable[Any]]) -> Any:
            start = time.perf_counter()
            result = await fn()
            if record:
                times[name].append(time.perf_counter() - start)
            return result

        await self._full_save(i, cache, store, timed)
        await self._incremental_save(i, cache, store, timed)
        Ledger.of(store).forget()  # what a new process knows: every chunk it finds stored is read back once
        await timed("reread", lambda: save(cache, 0, store, "bench"))
        if 0 in target.sequence_ids():
            target.remove_sequence(0)

        async def load() -> None:  # the new process's generation: the first one's chunks
            await restore(store, "bench", target)
            await self.probe.sync()

        for name, fn in ((("read", self.raw_read_upload), ("restore", load)) if i % 2
                         else (("restore", load), ("read", self.raw_read_upload))):
            await timed(name, fn)
        shutil.rmtree(store.directory)
        os.unlink(self.raw_path)
        if record:
            times["load"].append(load_average())

    async def _full_save(self, i: int, cache: PagedKVCache, store: FileStore, timed: Callable[..., Any]) -> None:
        """A full save, a raw write+fsync and the save's chunk files alone, in an order that rotates with ``i``."""
        floor_store = FileStore(os.path.join(self.root, f"floor{i}"))

        async def full() -> None:
            await save(cache, 0, store, "bench")

        async def raw() -> None:
            await asyncio.to_thread(self.raw_write)

        async def floor() -> None:  # the save's chunk files alone: no GPU, no hashing, no manifest
            await self.write_chunks(floor_store, self.chunk_spans)

        order = [("raw", raw), ("floor", floor), ("save", full)]
        for name, fn in order[i % 3:] + order[:i % 3]:
            await timed(name, fn)
        shutil.rmtree(floor_store.directory)

    async def _incremental_save(self, i: int, cache: PagedKVCache, store: FileStore,
                                timed: Callable[..., Any]) -> None:
        """An incremental save after :data:`SAVE_APPEND` tokens (popped again after), then its files alone."""
        _fill_unique(cache, 0, SAVE_APPEND)
        await self.probe.sync()  # time the save, not the end of the forward pass before it
        result = await timed("inc", lambda: save(cache, 0, store, "bench"))
        cache.popn(0, SAVE_APPEND)
        manifest_bytes = len(await store.get(result.key))
        chunk_bytes = (result.bytes_written - manifest_bytes) // max(1, result.chunks_written)
        inc_store = FileStore(os.path.join(self.root, f"inc{i}"))

        async def inc_floor() -> None:  # the incremental save's files alone, through the same FileStore calls
            await self.write_chunks(inc_store, [(k * chunk_bytes, chunk_bytes) for k in range(result.chunks_written)])
            await inc_store.set("manifest", self.host[:manifest_bytes])

        await timed("inc_floor", inc_floor)
        shutil.rmtree(inc_store.directory)


def _save_rows(label: str, nbytes: int, times: Times, rows: list[Row], echo: Callable[[str], None]) -> str:
    """The rows of one transfer path's measurements; returns its verdict on the targets."""
    emit(rows, Row.of_rounds("chunk files alone, one FileStore set each (store floor)", nbytes, times["floor"],
                             "raw write+fsync", times["raw"], times["load"]), echo)
    full = emit(rows, Row.of_rounds(f"save, full, to disk ({label})", nbytes, times["save"], "raw write+fsync",
                                    times["raw"], times["load"]), echo)
    incremental = emit(rows, Row.of_rounds(f"save, incremental +{SAVE_APPEND} tokens ({label})", nbytes,
                                           times["inc"], "full save", times["save"], times["load"]), echo)
    emit(rows, Row.of_rounds("its files alone, FileStore sets as the incremental save makes them "
                             "(incremental floor)", nbytes, times["inc_floor"], "full save", times["save"],
                             times["load"]), echo)
    emit(rows, Row.of_rounds(f"save of a new process, every chunk stored already and read back ({label})",
                             nbytes, times["reread"], "full save", times["save"], times["load"]), echo)
    emit(rows, Row.of_rounds(f"restore from disk ({label})", nbytes, times["restore"], "raw read+upload",
                             times["read"], times["load"]), echo)
    return (f"{label}: full save vs raw write+fsync {full.verdict(SAVE_FULL_TARGET)}; "
            f"incremental save vs full save {incremental.verdict(SAVE_INCREMENTAL_TARGET)}")
