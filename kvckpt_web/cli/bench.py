"""``kvckpt bench``: checkpoint throughput measured side by side with raw transfers of the same bytes.

Every number is a ratio against a baseline measured in the same run on the same
adapter, interleaved with it, so machine noise hits both alike.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from ..durable.container import plan_chunks
from ..durable.memo import forget
from ..durable.pipeline import IO_CONCURRENCY, run_bounded
from ..durable.restore import restore
from ..durable.save import default_pages_per_chunk, save
from ..errors import FieldError
from ..gpu.device import Copy, CopyRuns, Device, Usage
from ..gpu.open import open_device
from ..gpu.tensors import zeroed
from ..kv.cache import PagedKVCache
from ..stores.file import FileStore
from ..tvm.layout import CacheLimits, KVLayout
from .soak import run_soak

EXPORT_LAYOUT = KVLayout(page_size=16, num_layers=16, num_qo_heads=32, num_kv_heads=8, qk_head_dim=128,
                         dtype="float16")
EXPORT_TOKENS = 4096
TABLES = {
    "contiguous": "one sequence in an empty cache: one run of pages",
    "interleaved": "two sequences appended in turns, a page at a time: placement gives each its own run",
    "scattered": "every other page held by short sequences: each of the sequence's pages stands alone",
}
"""The page tables ``kvckpt bench export`` measures, and how each is made."""

ALL_PATHS = "all"
"""A ``paths`` entry naming every transfer the device offers: kernel, copy, and mapped where storage maps in place."""


def expand_paths(device: Device, paths: tuple[str, ...]) -> tuple[str, ...]:
    """``paths`` with :data:`ALL_PATHS` replaced by the transfers ``device`` offers."""
    offered = ("kernel", "copy") + (("mapped",) if device.info.maps_storage else ())
    return tuple(dict.fromkeys(q for p in paths for q in (offered if p == ALL_PATHS else (p,))))


@dataclass(frozen=True)
class Row:
    """One benchmark line: an operation's median time, its baseline's, and the ratio of each round."""

    name: str
    nbytes: int
    seconds: float
    baseline: str
    baseline_seconds: float
    round_ratios: tuple[float, ...] = ()
    """Baseline time / operation time of each round, both timed back to back in that round."""

    @classmethod
    def of_rounds(cls, name: str, nbytes: int, times: list[float], baseline: str,
                  baseline_times: list[float]) -> "Row":
        """The row of paired rounds: ``times[i]`` and ``baseline_times[i]`` were measured together."""
        if not times or len(times) != len(baseline_times):
            raise FieldError(f"{name}: rounds timed (operation, baseline)", "the same number, at least 1",
                             (len(times), len(baseline_times)))
        return cls(name, nbytes, statistics.median(times), baseline, statistics.median(baseline_times),
                   tuple(b / t for t, b in zip(times, baseline_times)))

    @property
    def ratio(self) -> float:
        """Throughput relative to the baseline (1.0 = as fast as the raw transfer), of the medians."""
        return self.baseline_seconds / self.seconds

    def verdict(self, target: float) -> str:
        """The ratio to three decimals and whether it reaches ``target``, judged on the unrounded ratio (a
        ratio of 0.796 prints as 0.80 in :meth:`format` and misses a target of 0.8)."""
        return f"{self.ratio:.3f}, target >= {target:g}: {'met' if self.ratio >= target else 'not met'}"

    def format(self) -> str:
        """A table row; the ratio is followed by the range of the rounds' ratios when there are several."""
        gbs = lambda s: self.nbytes / s / 1e9  # noqa: E731
        spread = (f" ({min(self.round_ratios):.2f}-{max(self.round_ratios):.2f})"
                  if len(self.round_ratios) > 1 else "")
        return (f"| {self.name} | {self.nbytes / 2**20:.0f} MiB | {self.seconds * 1e3:.1f} ms ({gbs(self.seconds):.2f} GB/s)"
                f" | {self.baseline} {self.baseline_seconds * 1e3:.1f} ms ({gbs(self.baseline_seconds):.2f} GB/s)"
                f" | {self.ratio:.2f}{spread} |")


HEADER = ("| operation | bytes | time (median) | baseline, same run | ratio (range over rounds) |\n"
          "|---|---|---|---|---|")


async def _paired_rounds(op: Callable[[], Awaitable[None]], base: Callable[[], Awaitable[None]],
                         repeats: int) -> tuple[list[float], list[float]]:
    """Seconds of ``op`` and ``base`` in each of ``repeats`` rounds, after one warm-up round; within a
    round both run back to back, in an order that alternates from round to round."""
    times: tuple[list[float], list[float]] = ([], [])
    for i in range(repeats + 1):
        for fn, bucket in ((op, times[0]), (base, times[1])) if i % 2 else ((base, times[1]), (op, times[0])):
            start = time.perf_counter()
            await fn()
            if i:
                bucket.append(time.perf_counter() - start)
    return times


def _fill(cache: PagedKVCache, seq_ids: list[int], tokens: int, interleave: bool) -> None:
    """Append ``tokens`` tokens of constant K/V to each sequence; interleaved sequences get alternating pages."""
    lay = cache.layout
    step = lay.page_size if interleave else cache.limits.prefill_chunk_size
    chunk = bytes(range(256)) * (step * lay.num_kv_heads * lay.head_dim * lay.elem_bytes // 256 + 1)
    for start in range(0, tokens, step):
        n = min(step, tokens - start)
        for seq in seq_ids:
            cache.begin_forward([seq], [n])
            data = memoryview(chunk)[:n * lay.num_kv_heads * lay.head_dim * lay.elem_bytes]
            for layer in range(lay.num_layers):
                cache.append_kv(layer, data, data)
            cache.end_forward()


def scatter_free_pages(cache: PagedKVCache, first_id: int) -> None:
    """Hold every other free page with a one-token sequence (ids from ``first_id``), so that the pages a
    sequence gets from now on all stand apart: the worst page table, as many short sequences leave it."""
    ids = list(range(first_id, first_id + cache.get_num_available_pages()))
    batch = min(cache.limits.reserved_num_seqs, cache.limits.prefill_chunk_size)
    for at in range(0, len(ids), batch):
        step = ids[at:at + batch]
        for seq in step:
            cache.add_sequence(seq)
        cache.begin_forward(step, [1] * len(step))  # a page each; their K/V are never read
        cache.end_forward()
    for seq in ids:
        if cache.seqs.get(seq).pages[0] % 2:
            cache.remove_sequence(seq)


async def _sync(device: Device, probe) -> None:
    """Wait until the device has finished all submitted work."""
    device.submit([Copy(probe[0], 0, probe[1], 0, 4)])
    await device.read(probe[1], 0, 4)


async def bench_export(device: Device | None = None, repeats: int = 5, paths: tuple[str, ...] = ("auto",),
                       echo: Callable[[str], None] = print, tokens: int = EXPORT_TOKENS) -> list[Row]:
    """Export and import of a sequence of ``tokens`` (4096: 256 MiB) vs raw readback / upload of one buffer."""
    device = device or open_device()
    paths = expand_paths(device, paths)
    lay = EXPORT_LAYOUT
    nbytes = lay.num_layers * lay.num_logical_pages(tokens) * lay.page_bytes
    contiguous = device.create_buffer(nbytes, Usage.COPY_SRC | Usage.COPY_DST, "bench.contiguous")
    read_staging = device.create_buffer(nbytes, Usage.MAP_READ | Usage.COPY_DST, "bench.read_staging")
    write_staging = device.create_buffer(nbytes, Usage.MAP_WRITE | Usage.COPY_SRC, "bench.write_staging")
    probe = (device.create_buffer(4, Usage.COPY_SRC, "bench.probe"),
             device.create_buffer(4, Usage.MAP_READ | Usage.COPY_DST, "bench.probe_read"))
    host = zeroed(nbytes)  # page-aligned, as the staging maps are: the fastest host copy (wgpu_native.host_copy)
    source = bytes(range(256)) * (nbytes // 256)

    async def raw_readback() -> None:
        device.submit([Copy(contiguous, 0, read_staging, 0, nbytes)])
        await device.read(read_staging, 0, nbytes, host)

    async def raw_upload() -> None:
        await device.upload(write_staging, 0, [source])
        device.submit([Copy(write_staging, 0, contiguous, 0, nbytes)])
        await _sync(device, probe)

    def pieces(piece: int) -> CopyRuns:
        """Copies of ``piece`` bytes covering the contiguous buffer, each to the same offset in the read
        staging (an upload runs the same copies from the write staging into the contiguous buffer)."""
        return CopyRuns(contiguous, read_staging, tuple((at, at, piece) for at in range(0, nbytes, piece)))

    def raw_readback_in(piece: int) -> Callable[[], Awaitable[None]]:
        async def readback() -> None:
            device.submit([pieces(piece)])
            await device.read(read_staging, 0, nbytes, host)
        return readback

    def raw_upload_in(piece: int) -> Callable[[], Awaitable[None]]:
        async def upload() -> None:
            await device.upload(write_staging, 0, [source])
            device.submit([CopyRuns(write_staging, contiguous, pieces(piece).runs)])
            await _sync(device, probe)
        return upload

    await raw_upload()  # never-written memory reads as the shared zero page: fill it so the baseline is honest
    rows: list[Row] = []
    echo(f"adapter: {device.info.adapter} ({device.info.backend}); {tokens} tokens, 16 layers, 8 KV heads, "
         f"head_dim 128, page 16, float16; median of {repeats}")
    echo("page tables: " + "; ".join(f"{name}: {how}" for name, how in TABLES.items()) + "\n")
    echo(HEADER)
    # What the adapter charges for moving the same bytes in one copy per layer, or per page, instead of one
    # copy in all: the floor of any per-layer cache layout (ours and TVM's alike), and of a scattered table.
    for piece, what in ((nbytes // lay.num_layers, "layer (adapter floor)"),
                        (lay.page_bytes, "page (floor of a scattered table)")):
        for name, split, whole in (("raw readback", raw_readback_in, raw_readback), ("raw upload", raw_upload_in,
                                                                                        raw_upload)):
            t_split, t_one = await _paired_rounds(split(piece), whole, repeats)
            rows.append(Row.of_rounds(f"{name}, one copy per {what}", nbytes, t_split, name, t_one))
            echo(rows[-1].format())
    if "mapped" in paths:  # the same buffer, mapped in place: what the mapped path's host copies can reach
        in_place = device.create_buffer(nbytes, Usage.STORAGE | Usage.COPY_SRC | Usage.COPY_DST | Usage.MAP_READ
                                        | Usage.MAP_WRITE, "bench.in_place")

        async def read_in_place() -> None:
            device.copy_from_buffer(in_place, [(0, host)])

        async def write_in_place() -> None:
            device.copy_to_buffer(in_place, [(0, memoryview(source))])

        await write_in_place()
        for name, op, base in (("raw readback", read_in_place, raw_readback), ("raw upload", write_in_place,
                                                                                raw_upload)):
            t_op, t_base = await _paired_rounds(op, base, repeats)
            rows.append(Row.of_rounds(f"{name}, mapped in place (floor of the mapped path)", nbytes, t_op, name,
                                      t_base))
            echo(rows[-1].format())
        device.destroy(in_place)

    def build(table: str, limits: CacheLimits, path: str, fill: bool) -> PagedKVCache:
        """A cache holding the page table ``table``; sequence 0 holds ``tokens`` if ``fill``, else its pages
        are free for an import."""
        cache = PagedKVCache(device, lay, limits, transfer=path)
        if table == "scattered":
            scatter_free_pages(cache, first_id=2)
        if table == "interleaved":
            cache.add_sequence(0)
            cache.add_sequence(1)
            _fill(cache, [0, 1], tokens, interleave=True)
            if not fill:
                cache.remove_sequence(0)
        elif fill:
            cache.add_sequence(0)
            _fill(cache, [0], tokens, interleave=False)
        return cache

    for table in TABLES:
        limits = CacheLimits(4, tokens * (1 if table == "contiguous" else 2), 2048)
        for path in paths:
            cache = build(table, limits, path, fill=True)
            metadata = cache.get_checkpoint_metadata(0)
            groups = await cache.export_groups(0)  # one host buffer, as an export leaves it
            separate = [bytes(g) for g in groups]
            chosen = cache.host_path()
            target = build(table, limits, path, fill=False)  # the import gets the pages sequence 0 had

            export_host = zeroed(cache.host_nbytes(0))

            async def export() -> None:
                await cache.export_groups(0, out=export_host)

            def import_from(host_groups: Any) -> Callable[[], Awaitable[None]]:
                async def import_() -> None:
                    if 0 in target.sequence_ids():
                        target.remove_sequence(0)
                    target.prepare_import(0, metadata, exclusive=False)
                    await target.import_groups(0, host_groups)
                    target.finish_import(0)
                    await _sync(device, probe)
                return import_

            label = f"{table} page table, {chosen} path"
            t_exp, t_read = await _paired_rounds(export, raw_readback, repeats)
            rows.append(Row.of_rounds(f"export ({label})", nbytes, t_exp, "raw readback", t_read))
            echo(rows[-1].format())
            for what, host_groups in (("", groups), (", one buffer per group", separate)):
                t_imp, t_up = await _paired_rounds(import_from(host_groups), raw_upload, repeats)
                rows.append(Row.of_rounds(f"import ({label}{what})", nbytes, t_imp, "raw upload", t_up))
                echo(rows[-1].format())
            cache.close()
            target.close()
    for buf in (contiguous, read_staging, write_staging) + probe:
        device.destroy(buf)
    return rows


SAVE_APPEND = 64
"""Tokens appended between the full and the incremental save of ``kvckpt bench save``."""

SAVE_FULL_TARGET = 0.8
"""Issue 3's target for a full save: at least this fraction of a raw write+fsync's speed."""

SAVE_INCREMENTAL_TARGET = 20
"""Issue 3's target for an incremental save: at most 1/this of the full save's time."""


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
    lay = EXPORT_LAYOUT
    nbytes = lay.num_layers * lay.num_logical_pages(tokens) * lay.page_bytes
    write_staging = device.create_buffer(nbytes, Usage.MAP_WRITE | Usage.COPY_SRC, "bench.write_staging")
    contiguous = device.create_buffer(nbytes, Usage.COPY_SRC | Usage.COPY_DST, "bench.contiguous")
    probe = (device.create_buffer(4, Usage.COPY_SRC, "bench.probe"),
             device.create_buffer(4, Usage.MAP_READ | Usage.COPY_DST, "bench.probe_read"))
    host = zeroed(nbytes)  # page-aligned like the save's host buffers, so the floor writes with O_DIRECT as it does
    root = tempfile.mkdtemp(prefix="kvckpt-bench-save.", dir=directory)
    raw_path = os.path.join(root, "raw.bin")
    rows: list[Row] = []
    verdicts: list[str] = []
    echo(f"adapter: {device.info.adapter} ({device.info.backend}); {tokens} tokens (+{SAVE_APPEND}), 16 layers, "
         f"8 KV heads, head_dim 128, page 16, float16; FileStore in {root}; median of {repeats}\n")
    echo(HEADER)
    try:
        for path in paths:
            limits = CacheLimits(4, tokens + SAVE_APPEND, 2048)
            cache = PagedKVCache(device, lay, limits, transfer=path)
            target = PagedKVCache(device, lay, limits, transfer=path)
            cache.add_sequence(0)
            _fill_unique(cache, 0, tokens)
            data = b"".join(await cache.export_groups(0))
            host[:] = data
            times: dict[str, list[float]] = {k: [] for k in ("raw", "floor", "save", "inc", "inc_floor", "reread",
                                                              "restore", "read")}
            npages = lay.num_logical_pages(tokens)  # each group's chunks, cut as save() cuts them
            chunk_spans = [((g * npages + first) * lay.page_bytes, count * lay.page_bytes) for g in range(lay.num_layers)
                           for first, count in plan_chunks(npages, default_pages_per_chunk(lay.page_bytes))]

            def raw_write() -> None:
                fd = os.open(raw_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                try:
                    view = host
                    while view:
                        view = view[os.write(fd, view):]
                    os.fsync(fd)
                finally:
                    os.close(fd)

            async def raw_read_upload() -> None:
                with open(raw_path, "rb") as f:
                    f.readinto(host)
                await device.upload(write_staging, 0, [host])
                device.submit([Copy(write_staging, 0, contiguous, 0, nbytes)])
                await _sync(device, probe)

            async def write_chunks(to: FileStore, spans: list[tuple[int, int]]) -> None:
                """The ``(offset, size)`` spans of ``host`` as chunk files, as a save's batch writes them."""
                async with to.batch():
                    await run_bounded((lambda k=k, at=at, n=n: to.set(f"chunks/{k}", host[at:at + n])
                                       for k, (at, n) in enumerate(spans)), IO_CONCURRENCY)

            async def timed(name: str, fn: Callable[[], Awaitable[Any]], record: bool) -> Any:
                start = time.perf_counter()
                result = await fn()
                if record:
                    times[name].append(time.perf_counter() - start)
                return result

            for i in range(repeats + 1):
                store = FileStore(os.path.join(root, f"store{i}"))
                floor_store = FileStore(os.path.join(root, f"floor{i}"))
                record = i > 0  # the first round warms up

                async def full() -> None:
                    await save(cache, 0, store, "bench")

                async def raw() -> None:
                    await asyncio.to_thread(raw_write)

                async def floor() -> None:  # the save's chunk files alone: no GPU, no hashing, no manifest
                    await write_chunks(floor_store, chunk_spans)

                order = [("raw", raw), ("floor", floor), ("save", full)]
                for name, fn in order[i % 3:] + order[:i % 3]:
                    await timed(name, fn, record)
                shutil.rmtree(floor_store.directory)
                _fill_unique(cache, 0, SAVE_APPEND)
                await _sync(device, probe)  # time the save, not the end of the forward pass before it
                result = await timed("inc", lambda: save(cache, 0, store, "bench"), record)
                cache.popn(0, SAVE_APPEND)
                manifest_bytes = len(await store.get(result.key))
                chunk_bytes = (result.bytes_written - manifest_bytes) // max(1, result.chunks_written)
                inc_store = FileStore(os.path.join(root, f"inc{i}"))

                async def inc_floor() -> None:  # the incremental save's files alone, through the same FileStore calls
                    await write_chunks(inc_store, [(k * chunk_bytes, chunk_bytes)
                                                   for k in range(result.chunks_written)])
                    await inc_store.set("manifest", host[:manifest_bytes])

                await timed("inc_floor", inc_floor, record)
                shutil.rmtree(inc_store.directory)
                forget(store)  # what a new process knows: every chunk it finds stored is read back once
                await timed("reread", lambda: save(cache, 0, store, "bench"), record)
                if 0 in target.sequence_ids():
                    target.remove_sequence(0)

                async def load() -> None:  # the new process's generation: the first one's chunks
                    await restore(store, "bench", target)
                    await _sync(device, probe)

                for name, fn in ((("read", raw_read_upload), ("restore", load)) if i % 2
                                 else (("restore", load), ("read", raw_read_upload))):
                    await timed(name, fn, record)
                shutil.rmtree(store.directory)
                os.unlink(raw_path)
            if bytes(b"".join(await target.export_groups(0))) != data:
                raise AssertionError("bench save: the restored sequence differs from the saved one")
            label = f"{cache.host_path()} path"
            rows.append(Row.of_rounds("chunk files alone, one FileStore set each (store floor)", nbytes,
                                      times["floor"], "raw write+fsync", times["raw"]))
            echo(rows[-1].format())
            full = Row.of_rounds(f"save, full, to disk ({label})", nbytes, times["save"], "raw write+fsync",
                                 times["raw"])
            rows.append(full)
            echo(full.format())
            incremental = Row.of_rounds(f"save, incremental +{SAVE_APPEND} tokens ({label})", nbytes, times["inc"],
                                        "full save", times["save"])
            rows.append(incremental)
            echo(incremental.format())
            rows.append(Row.of_rounds(f"its files alone, FileStore sets as the incremental save makes them "
                                      f"(incremental floor)", nbytes, times["inc_floor"], "full save", times["save"]))
            echo(rows[-1].format())
            rows.append(Row.of_rounds(f"save of a new process, every chunk stored already and read back ({label})",
                                      nbytes, times["reread"], "full save", times["save"]))
            echo(rows[-1].format())
            rows.append(Row.of_rounds(f"restore from disk ({label})", nbytes, times["restore"], "raw read+upload",
                                      times["read"]))
            echo(rows[-1].format())
            verdicts.append(f"{label}: full save vs raw write+fsync {full.verdict(SAVE_FULL_TARGET)}; "
                            f"incremental save vs full save {incremental.verdict(SAVE_INCREMENTAL_TARGET)}")
            cache.close()
            target.close()
        echo(f"\ntargets: full save >= {SAVE_FULL_TARGET}x raw write+fsync; incremental save <= "
             f"{100 / SAVE_INCREMENTAL_TARGET:g}% of the full save's time (ratio >= {SAVE_INCREMENTAL_TARGET}); "
             "GB/s of an incremental save counts the whole sequence")
        for line in verdicts:
            echo(line)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        for buf in (write_staging, contiguous) + probe:
            device.destroy(buf)
    return rows


async def bench_soak(device: Device | None = None, repeats: int = 0, paths: tuple[str, ...] = (),
                     echo: Callable[[str], None] = print, trials: int = 200) -> list[Row]:
    """kill -9 trials of processes that are saving (see :mod:`kvckpt_web.cli.soak`); raises if any trial failed."""
    started = time.perf_counter()
    result = await run_soak(trials, device=device, echo=lambda line: print(line, file=sys.stderr, flush=True))
    echo(f"{result.trials} trials in {time.perf_counter() - started:.0f} s: worker killed while saving "
         f"{result.kills['killed']}, save finished first {result.kills['completed']}; restored the previous "
         f"generation {result.restored[2]}, the new one {result.restored[3]}; failures {len(result.failures)}")
    for failure in result.failures:
        echo(f"FAILED: {failure}")
    if result.failures:
        raise AssertionError(f"soak: {len(result.failures)} of {result.trials} trials failed")
    return []


BENCHES = {"export": bench_export, "save": bench_save, "soak": bench_soak}


def run(names: list[str], repeats: int, paths: tuple[str, ...], echo: Callable[[str], None] = print, *,
        trials: int = 200) -> None:
    """Run the named benchmarks and print their tables (``trials``: of the soak benchmark)."""
    for name in names:
        echo(f"## kvckpt bench {name}\n")
        extra = {"trials": trials} if name == "soak" else {}
        asyncio.run(BENCHES[name](repeats=repeats, paths=paths, echo=echo, **extra))
