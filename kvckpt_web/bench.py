"""``kvckpt bench``: checkpoint throughput measured side by side with raw transfers of the same bytes.

Every number is a ratio against a baseline measured in the same run on the same
adapter, interleaved with it, so machine noise hits both alike.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

from .cache import PagedKVCache
from .device import Copy, Device, Usage, open_device
from .layout import CacheLimits, KVLayout

EXPORT_LAYOUT = KVLayout(page_size=16, num_layers=16, num_qo_heads=32, num_kv_heads=8, qk_head_dim=128,
                         dtype="float16")
EXPORT_TOKENS = 4096


@dataclass(frozen=True)
class Row:
    """One benchmark line: an operation, its median time, and its baseline's."""

    name: str
    nbytes: int
    seconds: float
    baseline: str
    baseline_seconds: float

    @property
    def ratio(self) -> float:
        """Throughput relative to the baseline (1.0 = as fast as the raw transfer)."""
        return self.baseline_seconds / self.seconds

    def format(self) -> str:
        """A table row."""
        gbs = lambda s: self.nbytes / s / 1e9  # noqa: E731
        return (f"| {self.name} | {self.nbytes / 2**20:.0f} MiB | {self.seconds * 1e3:.1f} ms ({gbs(self.seconds):.2f} GB/s)"
                f" | {self.baseline} {self.baseline_seconds * 1e3:.1f} ms ({gbs(self.baseline_seconds):.2f} GB/s)"
                f" | {self.ratio:.2f} |")


HEADER = "| operation | bytes | time (median) | baseline, same run | ratio |\n|---|---|---|---|---|"


async def _median_pair(op: Callable[[], Awaitable[None]], base: Callable[[], Awaitable[None]],
                       repeats: int) -> tuple[float, float]:
    """Median seconds of ``op`` and ``base``, run alternately after one warm-up each."""
    times: tuple[list[float], list[float]] = ([], [])
    for i in range(repeats + 1):
        for fn, bucket in ((op, times[0]), (base, times[1])) if i % 2 else ((base, times[1]), (op, times[0])):
            start = time.perf_counter()
            await fn()
            if i:
                bucket.append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


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


async def _sync(device: Device, probe) -> None:
    """Wait until the device has finished all submitted work."""
    device.submit([Copy(probe[0], 0, probe[1], 0, 4)])
    await device.read(probe[1], 0, 4)


async def bench_export(device: Device | None = None, repeats: int = 5, paths: tuple[str, ...] = ("auto",),
                       echo: Callable[[str], None] = print) -> list[Row]:
    """Export and import of a 4096-token, 256 MiB sequence vs raw readback / upload of one contiguous buffer."""
    device = device or open_device()
    lay = EXPORT_LAYOUT
    nbytes = lay.num_layers * lay.num_logical_pages(EXPORT_TOKENS) * lay.page_bytes
    contiguous = device.create_buffer(nbytes, Usage.COPY_SRC | Usage.COPY_DST, "bench.contiguous")
    read_staging = device.create_buffer(nbytes, Usage.MAP_READ | Usage.COPY_DST, "bench.read_staging")
    write_staging = device.create_buffer(nbytes, Usage.MAP_WRITE | Usage.COPY_SRC, "bench.write_staging")
    probe = (device.create_buffer(4, Usage.COPY_SRC, "bench.probe"),
             device.create_buffer(4, Usage.MAP_READ | Usage.COPY_DST, "bench.probe_read"))
    host = memoryview(bytearray(nbytes))
    source = bytes(range(256)) * (nbytes // 256)

    async def raw_readback() -> None:
        device.submit([Copy(contiguous, 0, read_staging, 0, nbytes)])
        await device.read(read_staging, 0, nbytes, host)

    async def raw_upload() -> None:
        await device.upload(write_staging, 0, [source])
        device.submit([Copy(write_staging, 0, contiguous, 0, nbytes)])
        await _sync(device, probe)

    layer_bytes = nbytes // lay.num_layers

    async def raw_readback_per_layer() -> None:
        device.submit([Copy(contiguous, g * layer_bytes, read_staging, g * layer_bytes, layer_bytes)
                       for g in range(lay.num_layers)])
        await device.read(read_staging, 0, nbytes, host)

    async def raw_upload_per_layer() -> None:
        await device.upload(write_staging, 0, [source])
        device.submit([Copy(write_staging, g * layer_bytes, contiguous, g * layer_bytes, layer_bytes)
                       for g in range(lay.num_layers)])
        await _sync(device, probe)

    await raw_upload()  # never-written memory reads as the shared zero page: fill it so the baseline is honest
    rows: list[Row] = []
    echo(f"adapter: {device.info.adapter} ({device.info.backend}); {EXPORT_TOKENS} tokens, 16 layers, 8 KV heads, "
         f"head_dim 128, page 16, float16; median of {repeats}\n")
    echo(HEADER)
    # What the adapter charges for moving the same bytes in one copy per layer instead of one copy in all:
    # a floor for any per-layer cache layout, ours and TVM's alike.
    t_split, t_one = await _median_pair(raw_readback_per_layer, raw_readback, repeats)
    rows.append(Row("raw readback, one copy per layer (adapter floor)", nbytes, t_split, "raw readback", t_one))
    echo(rows[-1].format())
    t_split, t_one = await _median_pair(raw_upload_per_layer, raw_upload, repeats)
    rows.append(Row("raw upload, one copy per layer (adapter floor)", nbytes, t_split, "raw upload", t_one))
    echo(rows[-1].format())
    for table in ("contiguous", "fragmented"):
        seqs = [0, 1] if table == "fragmented" else [0]
        limits = CacheLimits(4, EXPORT_TOKENS * len(seqs), 2048)
        for path in paths:
            cache = PagedKVCache(device, lay, limits, transfer=path)
            for seq in seqs:
                cache.add_sequence(seq)
            _fill(cache, seqs, EXPORT_TOKENS, interleave=table == "fragmented")
            metadata = cache.get_checkpoint_metadata(0)
            groups = [bytes(g) for g in await cache.export_groups(0)]
            chosen = cache.page_path()
            target = PagedKVCache(device, lay, limits, transfer=path)

            async def export() -> None:
                await cache.export_groups(0, out=host)

            async def import_() -> None:
                target.prepare_import(0, metadata)
                await target.import_groups(0, groups)
                target.finish_import(0)
                await _sync(device, probe)

            label = f"{table} page table, {chosen} path"
            t_exp, t_read = await _median_pair(export, raw_readback, repeats)
            rows.append(Row(f"export ({label})", nbytes, t_exp, "raw readback", t_read))
            echo(rows[-1].format())
            t_imp, t_up = await _median_pair(import_, raw_upload, repeats)
            rows.append(Row(f"import ({label})", nbytes, t_imp, "raw upload", t_up))
            echo(rows[-1].format())
            cache.close()
            target.close()
    for buf in (contiguous, read_staging, write_staging) + probe:
        device.destroy(buf)
    return rows


BENCHES = {"export": bench_export}


def run(names: list[str], repeats: int, paths: tuple[str, ...], echo: Callable[[str], None] = print) -> None:
    """Run the named benchmarks and print their tables."""
    for name in names:
        echo(f"## kvckpt bench {name}\n")
        asyncio.run(BENCHES[name](repeats=repeats, paths=paths, echo=echo))
