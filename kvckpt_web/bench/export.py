"""``kvckpt bench export``: export and import of a sequence side by side with a raw readback / upload of its bytes."""

from __future__ import annotations

from typing import Any, Awaitable, Callable

from ..gpu.device import Copy, CopyRuns, Device, Usage
from ..gpu.open import open_device
from ..gpu.tensors import zeroed
from ..kv.cache import PagedKVCache
from ..kv.scatter import scatter_free_pages
from ..tvm.layout import CacheLimits
from .rows import EXPORT_LAYOUT, EXPORT_TOKENS, HEADER, Probe, Row, emit, expand_paths, paired_rounds

TABLES = {
    "contiguous": "one sequence in an empty cache: one run of pages",
    "interleaved": "two sequences appended in turns, a page at a time: placement gives each its own run",
    "scattered": "every other page held by short sequences: each of the sequence's pages stands alone",
}
"""The page tables ``kvckpt bench export`` measures, and how each is made."""


class RawTransfers:
    """The baselines: ``nbytes`` read back from, or uploaded to, one device buffer through staging."""

    def __init__(self, device: Device, nbytes: int) -> None:
        self.device, self.nbytes = device, nbytes
        self.contiguous = device.create_buffer(nbytes, Usage.COPY_SRC | Usage.COPY_DST, "bench.contiguous")
        self.read_staging = device.create_buffer(nbytes, Usage.MAP_READ | Usage.COPY_DST, "bench.read_staging")
        self.write_staging = device.create_buffer(nbytes, Usage.MAP_WRITE | Usage.COPY_SRC, "bench.write_staging")
        self.probe = Probe(device)
        self.host = zeroed(nbytes)  # page-aligned, as the staging maps are: the fastest host copy (wgpu_native.host_copy)
        self.source = bytes(range(256)) * (nbytes // 256)

    async def readback(self) -> None:
        self.device.submit([Copy(self.contiguous, 0, self.read_staging, 0, self.nbytes)])
        await self.device.read(self.read_staging, 0, self.nbytes, self.host)

    async def upload(self) -> None:
        await self.device.upload(self.write_staging, 0, [self.source])
        self.device.submit([Copy(self.write_staging, 0, self.contiguous, 0, self.nbytes)])
        await self.probe.sync()

    def _pieces(self, piece: int) -> CopyRuns:
        """Copies of ``piece`` bytes covering the contiguous buffer, each to the same offset in the read
        staging (an upload runs the same copies from the write staging into the contiguous buffer)."""
        return CopyRuns(self.contiguous, self.read_staging,
                        tuple((at, at, piece) for at in range(0, self.nbytes, piece)))

    def readback_in(self, piece: int) -> Callable[[], Awaitable[None]]:
        async def readback() -> None:
            self.device.submit([self._pieces(piece)])
            await self.device.read(self.read_staging, 0, self.nbytes, self.host)
        return readback

    def upload_in(self, piece: int) -> Callable[[], Awaitable[None]]:
        async def upload() -> None:
            await self.device.upload(self.write_staging, 0, [self.source])
            self.device.submit([CopyRuns(self.write_staging, self.contiguous, self._pieces(piece).runs)])
            await self.probe.sync()
        return upload

    def close(self) -> None:
        for buf in (self.contiguous, self.read_staging, self.write_staging):
            self.device.destroy(buf)
        self.probe.close()


async def bench_export(device: Device | None = None, repeats: int = 5, paths: tuple[str, ...] = ("auto",),
                       echo: Callable[[str], None] = print, tokens: int = EXPORT_TOKENS) -> list[Row]:
    """Export and import of a sequence of ``tokens`` (4096: 256 MiB) vs raw readback / upload of one buffer."""
    device = device or open_device()
    paths = expand_paths(device, paths)
    lay = EXPORT_LAYOUT
    raw = RawTransfers(device, lay.num_layers * lay.num_logical_pages(tokens) * lay.page_bytes)
    await raw.upload()  # never-written memory reads as the shared zero page: fill it so the baseline is honest
    rows: list[Row] = []
    echo(f"adapter: {device.info.adapter} ({device.info.backend}); {tokens} tokens, 16 layers, 8 KV heads, "
         f"head_dim 128, page 16, float16; median of {repeats}")
    echo("page tables: " + "; ".join(f"{name}: {how}" for name, how in TABLES.items()) + "\n")
    echo(HEADER)
    await _split_copy_floors(raw, repeats, rows, echo)
    if "mapped" in paths:
        await _mapped_floors(raw, repeats, rows, echo)
    for table in TABLES:
        limits = CacheLimits(4, tokens * (1 if table == "contiguous" else 2), 2048)
        for path in paths:
            await _table_rows(raw, table, limits, path, tokens, repeats, rows, echo)
    raw.close()
    return rows


async def _split_copy_floors(raw: RawTransfers, repeats: int, rows: list[Row], echo: Callable[[str], None]) -> None:
    """What the adapter charges for moving the same bytes in one copy per layer, or per page, instead of one
    copy in all: the floor of any per-layer cache layout (ours and TVM's alike), and of a scattered table."""
    lay = EXPORT_LAYOUT
    for piece, what in ((raw.nbytes // lay.num_layers, "layer (adapter floor)"),
                        (lay.page_bytes, "page (floor of a scattered table)")):
        for name, split, whole in (("raw readback", raw.readback_in, raw.readback),
                                   ("raw upload", raw.upload_in, raw.upload)):
            t_split, t_one, loads = await paired_rounds(split(piece), whole, repeats)
            emit(rows, Row.of_rounds(f"{name}, one copy per {what}", raw.nbytes, t_split, name, t_one, loads), echo)


async def _mapped_floors(raw: RawTransfers, repeats: int, rows: list[Row], echo: Callable[[str], None]) -> None:
    """The same buffer, mapped in place: what the mapped path's host copies can reach."""
    device = raw.device
    in_place = device.create_buffer(raw.nbytes, Usage.STORAGE | Usage.COPY_SRC | Usage.COPY_DST | Usage.MAP_READ
                                    | Usage.MAP_WRITE, "bench.in_place")

    async def read_in_place() -> None:
        device.copy_from_buffer(in_place, [(0, raw.host)])

    async def write_in_place() -> None:
        device.copy_to_buffer(in_place, [(0, memoryview(raw.source))])

    await write_in_place()
    for name, op, base in (("raw readback", read_in_place, raw.readback), ("raw upload", write_in_place, raw.upload)):
        t_op, t_base, loads = await paired_rounds(op, base, repeats)
        emit(rows, Row.of_rounds(f"{name}, mapped in place (floor of the mapped path)", raw.nbytes, t_op, name,
                                 t_base, loads), echo)
    device.destroy(in_place)


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


def _build(device: Device, table: str, limits: CacheLimits, path: str, tokens: int, fill: bool) -> PagedKVCache:
    """A cache holding the page table ``table``; sequence 0 holds ``tokens`` if ``fill``, else its pages
    are free for an import."""
    cache = PagedKVCache(device, EXPORT_LAYOUT, limits, transfer=path)
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


async def _table_rows(raw: RawTransfers, table: str, limits: CacheLimits, path: str, tokens: int, repeats: int,
                      rows: list[Row], echo: Callable[[str], None]) -> None:
    """Export, and import from one host buffer and from one buffer per group, of page table ``table``."""
    cache = _build(raw.device, table, limits, path, tokens, fill=True)
    metadata = cache.get_checkpoint_metadata(0)
    groups = await cache.export_groups(0)  # one host buffer, as an export leaves it
    separate = [bytes(g) for g in groups]
    chosen = cache.host_path()
    target = _build(raw.device, table, limits, path, tokens, fill=False)  # the import gets sequence 0's pages
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
            await raw.probe.sync()
        return import_

    label = f"{table} page table, {chosen} path"
    t_exp, t_read, loads = await paired_rounds(export, raw.readback, repeats)
    emit(rows, Row.of_rounds(f"export ({label})", raw.nbytes, t_exp, "raw readback", t_read, loads), echo)
    for what, host_groups in (("", groups), (", one buffer per group", separate)):
        t_imp, t_up, loads = await paired_rounds(import_from(host_groups), raw.upload, repeats)
        emit(rows, Row.of_rounds(f"import ({label}{what})", raw.nbytes, t_imp, "raw upload", t_up, loads), echo)
    cache.close()
    target.close()
