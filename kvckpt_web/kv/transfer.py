"""Moving pages between a layer's page buffer and a dense page group.

Two interchangeable device paths produce the same bytes:

- ``"kernel"``: one ``page_copy.wgsl`` dispatch gathers (pack) or scatters the pages;
- ``"copy"``: one copy command per run of physically consecutive pages; a partial last page is
  copied whole and its unused token slots cleared (they must read as zeros), or, where those slots
  are not whole 32-bit words, packed by a one-page ``pack`` dispatch.

Which is faster depends on the adapter: a discrete GPU prefers one dispatch to thousands of
copies, so :func:`measure_path` times both once per device and page size. A CPU adapter runs
copies as memcpy and emulates kernels (on lavapipe the kernel path measured over 10x slower), so
there the copy path is taken untimed: timing it would JIT-compile the kernel (~0.5 s here).

On a CPU adapter each copy is the host's memcpy, whose speed depends on the copy's size, so there
runs of pages are copied in pieces of at most :data:`CPU_COPY_PIECE_BYTES`.

Where the page buffers are host memory that maps in place (``DeviceInfo.maps_storage``: lavapipe),
a cache may also take the ``"mapped"`` transfer: exports and imports of host bytes copy the runs of
pages straight between the mapped page buffers and the host (:meth:`PageMover.host_runs`), with no
staging buffer and no device copy in between; the device-side primitives use the copy path.
"""

from __future__ import annotations

import time

from ..errors import TensorError
from ..gpu.device import Buffer, Clear, Command, Copy, CopyRuns, Device, Region, Usage
from ..gpu.tensors import span_bytes
from ..tvm.layout import KVLayout
from . import kernels

PATHS = ("kernel", "copy")
"""The device paths: how pages move between page buffers and other device buffers."""

TRANSFERS = PATHS + ("mapped",)
"""What a cache's ``transfer`` may name besides "auto" (see the module's docstring for "mapped")."""

CPU_COPY_PIECE_BYTES = 512 << 10
"""Largest copy of a run of pages on a CPU adapter (whole pages, at least one), a block size glibc copies fastest."""

TRANSFER_BATCH_BYTES = 32 << 20
"""Bytes per step of an export or import, so that the GPU moves one step while the host prepares the next."""


def in_pieces(runs: list[tuple[int, int, int]], piece: int | None) -> list[tuple[int, int, int]]:
    """``(start, first, length)`` runs (as :func:`page_runs` gives them), each cut into runs of at most ``piece``
    (None: left whole)."""
    if piece is None or all(length <= piece for _, _, length in runs):
        return runs
    return [(start + at, first + at, min(piece, length - at)) for start, first, length in runs
            for at in range(0, length, piece)]


def page_runs(page_ids: list[int]) -> list[tuple[int, int, int]]:
    """Runs of consecutive physical pages: (index of the first logical page, first physical page, length)."""
    runs: list[tuple[int, int, int]] = []
    for i, page in enumerate(page_ids):
        if runs and runs[-1][1] + runs[-1][2] == page:
            start, first, length = runs[-1]
            runs[-1] = (start, first, length + 1)
        else:
            runs.append((i, page, 1))
    return runs


class PageMover:
    """Builds the commands that pack pages into, or scatter pages from, dense page groups."""

    def __init__(self, device: Device, layout: KVLayout) -> None:
        self.device = device
        self.layout = layout
        self.page_bytes = layout.page_bytes
        #: Bytes per step of an export or import (see :data:`TRANSFER_BATCH_BYTES`).
        self.batch_bytes = TRANSFER_BATCH_BYTES
        #: Pages per copy of a run on a CPU adapter (see :data:`CPU_COPY_PIECE_BYTES`); None: whole runs.
        self.copy_piece_pages = max(1, CPU_COPY_PIECE_BYTES // self.page_bytes) if device.info.is_cpu else None
        self._scratch: Buffer | None = None

    def scratch(self, size: int) -> Buffer:
        """A reusable storage buffer of at least ``size`` bytes."""
        if self._scratch is None or self._scratch.size < size:
            if self._scratch is not None:
                self.device.destroy(self._scratch)
            self._scratch = self.device.create_buffer(size, Usage.STORAGE | Usage.COPY_SRC | Usage.COPY_DST,
                                                      "kvckpt.scratch")
        return self._scratch

    def _pack_dispatch(self, entry: str, layer: Region, table: Buffer, dense: Buffer, dense_offset: int,
                       num_pages: int, table_offset: int, tail_tokens: int) -> Command:
        lay = self.layout
        return kernels.page_copy(self.device, entry, pages=layer, page_table=table, dense=dense,
                                 num_pages=num_pages, words_per_page=self.page_bytes // 4, tail_tokens=tail_tokens,
                                 elem_bytes=lay.elem_bytes, head_dim=lay.head_dim, page_size=lay.page_size,
                                 dense_word_offset=dense_offset // 4, table_offset=table_offset)

    def _via_storage(self, dst: Buffer, dst_offset: int, size: int, fill) -> list[Command]:
        """Commands that let ``fill(buffer, offset)`` write ``size`` bytes destined for ``dst`` at ``dst_offset``."""
        if dst.usage & Usage.STORAGE:
            return [fill(dst, dst_offset)]
        scratch = self.scratch(size)
        return [fill(scratch, 0), Copy(scratch, 0, dst, dst_offset, size)]

    def tail_slots(self, tail_tokens: int) -> list[tuple[int, int]]:
        """(offset in a page, bytes) of each run of token slots from ``tail_tokens`` on, one per K or V head."""
        lay = self.layout
        row = lay.head_dim * lay.elem_bytes
        start, size = tail_tokens * row, (lay.page_size - tail_tokens) * row
        return [(block * lay.page_size * row + start, size) for block in range(2 * lay.num_kv_heads)] if size else []

    def _tail_ranges(self, tail_tokens: int) -> list[tuple[int, int]] | None:
        """:meth:`tail_slots`, or None unless every run is whole 32-bit words (what a clear writes)."""
        slots = self.tail_slots(tail_tokens)
        return None if any(offset % 4 or size % 4 for offset, size in slots) else slots

    def host_runs(self, layers: list[Region], page_ids: list[int],
                  groups: list[memoryview]) -> dict[Buffer, list[tuple[int, memoryview]]]:
        """For the ``"mapped"`` transfer: (offset in the page buffer, view of the group) of each run of the
        pages ``page_ids`` of layer g and its dense group ``groups[g]``, by page buffer (pieces as copies)."""
        pb = self.page_bytes
        runs = in_pieces(page_runs(page_ids), self.copy_piece_pages)
        by_buffer: dict[Buffer, list[tuple[int, memoryview]]] = {}
        for layer, group in zip(layers, groups):
            by_buffer.setdefault(layer.buffer, []).extend(
                (layer.offset + first * pb, group[start * pb:(start + length) * pb]) for start, first, length in runs)
        return by_buffer

    def copied_pages(self, num_pages: int, tail_tokens: int) -> int:
        """How many of ``num_pages`` pages the copy path copies whole: all of them, unless the last is
        partial and its unused slots cannot be cleared (then a ``pack`` dispatch writes that page)."""
        if tail_tokens == self.layout.page_size or self._tail_ranges(tail_tokens) is not None:
            return num_pages
        return num_pages - 1

    def _finish_tail(self, copied: bool, layer: Region, table: Buffer, index: int, tail_tokens: int, dst: Buffer,
                     dst_offset: int) -> list[Command]:
        """Commands leaving logical page ``index`` (the last, partial one) at ``dst_offset`` with its unused
        slots zeroed: clears over the copied page, or (not ``copied``) a ``pack`` dispatch of it."""
        if copied:
            return [Clear(dst, dst_offset + offset, size) for offset, size in self._tail_ranges(tail_tokens) or ()]
        return self._via_storage(dst, dst_offset, self.page_bytes, lambda buf, off: self._pack_dispatch(
            "pack", layer, table, buf, off, 1, index, tail_tokens))

    def pack(self, path: str, layer: Region, table: Buffer, page_ids: list[int], tail_tokens: int,
             dst: Buffer, dst_offset: int, runs: list[tuple[int, int, int]] | None = None) -> list[Command]:
        """Commands writing the pages ``page_ids`` of ``layer`` densely into ``dst`` at ``dst_offset``.

        ``table`` holds ``page_ids`` on the device; ``tail_tokens`` is how many token slots of the last
        page are valid (the rest is written as zeros). ``runs``: the :func:`page_runs` of the
        :meth:`copied_pages` among ``page_ids``, where the caller has them already.
        """
        n, pb = len(page_ids), self.page_bytes
        if n == 0:
            return []
        if path == "kernel":
            return self._via_storage(dst, dst_offset, n * pb, lambda buf, off: self._pack_dispatch(
                "pack", layer, table, buf, off, n, 0, tail_tokens))
        full = n if tail_tokens == self.layout.page_size else n - 1
        copied = self.copied_pages(n, tail_tokens)
        if runs is None:
            runs = page_runs(page_ids[:copied])
        commands: list[Command] = [self._copy_runs(layer.buffer, layer.offset, dst, dst_offset, runs, swap=False)]
        if full < n:
            commands += self._finish_tail(copied == n, layer, table, full, tail_tokens, dst, dst_offset + full * pb)
        return commands

    def _copy_runs(self, pages: Buffer, pages_offset: int, dense: Buffer, dense_offset: int,
                   runs: list[tuple[int, int, int]], swap: bool) -> CopyRuns:
        """One command copying page ``runs`` from pages to dense (pack) or, with ``swap``, back (scatter), each
        run in pieces of at most :attr:`copy_piece_pages`."""
        pb = self.page_bytes
        runs = in_pieces(runs, self.copy_piece_pages)
        if swap:
            return CopyRuns(dense, pages, tuple((dense_offset + start * pb, pages_offset + first * pb, length * pb)
                                                for start, first, length in runs))
        return CopyRuns(pages, dense, tuple((pages_offset + first * pb, dense_offset + start * pb, length * pb)
                                            for start, first, length in runs))

    def span_stride(self, path: str, layers: list[Region], page_ids: list[int]) -> int | None:
        """The distance between layers when one copy can carry every layer's pages, else None.

        That needs the copy path, one physical run of pages and a :meth:`layer_stride`.
        """
        if path != "copy" or not page_ids or len(page_runs(page_ids)) != 1:
            return None
        return self.layer_stride(layers, len(page_ids) * self.page_bytes)

    @staticmethod
    def layer_stride(layers: list[Region], group_bytes: int) -> int | None:
        """The distance between layers if one copy may carry a run of ``group_bytes`` from each, else None:
        at least two layers, evenly spaced in one buffer, and at most 1/8 more bytes moved than the pages."""
        if len(layers) < 2:
            return None
        stride = layers[1].offset - layers[0].offset
        if any(b.buffer is not layers[0].buffer or b.offset - a.offset != stride for a, b in zip(layers, layers[1:])):
            return None
        return stride if 0 <= stride - group_bytes and (stride - group_bytes) * 8 <= group_bytes else None

    def pack_layers(self, path: str, layers: list[Region], table: Buffer, page_ids: list[int], tail_tokens: int,
                    dst: Buffer, stride: int, dst_offset: int = 0) -> list[Command]:
        """Commands packing the pages of every layer into ``dst``, layer g's group at ``dst_offset + g * stride``.

        With the ``stride`` that :meth:`span_stride` returned, one copy moves all layers and the bytes
        between groups are cleared; otherwise ``stride`` is the group size and each layer is packed alone.
        """
        n, pb = len(page_ids), self.page_bytes
        if n == 0:
            return []
        full = n if tail_tokens == self.layout.page_size else n - 1
        copied = self.copied_pages(n, tail_tokens)
        if stride != self.span_stride(path, layers, page_ids):
            runs = page_runs(page_ids[:copied])
            commands: list[Command] = []
            for g, layer in enumerate(layers):
                commands += self.pack(path, layer, table, page_ids, tail_tokens, dst, dst_offset + g * stride, runs)
            return commands
        span = span_bytes(len(layers), copied * pb, stride)
        commands = [Copy(layers[0].buffer, layers[0].offset + page_ids[0] * pb, dst, dst_offset, span)] if span else []
        for g, layer in enumerate(layers):
            at = dst_offset + g * stride
            if full < n:
                commands += self._finish_tail(copied == n, layer, table, full, tail_tokens, dst, at + full * pb)
            if g + 1 < len(layers) and stride > n * pb:  # other sequences' pages: never let them out
                commands.append(Clear(dst, at + n * pb, stride - n * pb))
        return commands

    def scatter(self, path: str, src: Buffer, src_offset: int, table: Buffer, page_ids: list[int],
                layer: Region, runs: list[tuple[int, int, int]] | None = None) -> list[Command]:
        """Commands writing the dense pages in ``src`` at ``src_offset`` into ``layer`` at ``page_ids`` (whole
        pages); ``runs``: their :func:`page_runs`, where the caller has them already."""
        n, pb = len(page_ids), self.page_bytes
        if n == 0:
            return []
        if path == "copy":
            runs = page_runs(page_ids) if runs is None else runs
            return [self._copy_runs(layer.buffer, layer.offset, src, src_offset, runs, swap=True)]
        commands: list[Command] = []
        if not src.usage & Usage.STORAGE:
            scratch = self.scratch(n * pb)
            commands.append(Copy(src, src_offset, scratch, 0, n * pb))
            src, src_offset = scratch, 0
        commands.append(self._pack_dispatch("scatter", layer, table, src, src_offset, n, 0, self.layout.page_size))
        return commands

    def scatter_layers(self, path: str, src: Buffer, table: Buffer, page_ids: list[int], layers: list[Region],
                       stride: int, one_copy: bool = False, src_offset: int = 0) -> list[Command]:
        """Commands scattering layer g's group, at ``src_offset + g * stride`` in ``src``, into each layer's pages.

        ``one_copy`` (only with the ``stride`` that :meth:`span_stride` returned, and only when the pages
        between the runs are free: the bytes between the groups land there) moves all layers in one copy.
        """
        n, pb = len(page_ids), self.page_bytes
        if n == 0:
            return []
        if one_copy:
            if stride != self.span_stride(path, layers, page_ids):
                raise TensorError("scatter_layers.stride", self.span_stride(path, layers, page_ids), stride,
                                  "one copy needs the layers' own stride")
            span = span_bytes(len(layers), n * pb, stride)
            return [Copy(src, src_offset, layers[0].buffer, layers[0].offset + page_ids[0] * pb, span)]
        runs = page_runs(page_ids)
        commands: list[Command] = []
        for g, layer in enumerate(layers):
            commands += self.scatter(path, src, src_offset + g * stride, table, page_ids, layer, runs)
        return commands

    def close(self) -> None:
        """Release the scratch buffer."""
        if self._scratch is not None:
            self.device.destroy(self._scratch)
            self._scratch = None


def known_path(device: Device, layout: KVLayout) -> str | None:
    """The path :func:`measure_path` gives without timing anything: "copy" on a CPU adapter, or what it
    measured for ``layout``'s pages on ``device`` before; None if it has to time them."""
    return "copy" if device.info.is_cpu else device.choices.get(f"page_transfer/{layout.page_bytes}")


async def measure_path(device: Device, layout: KVLayout, num_pages: int = 64, repeats: int = 3) -> str:
    """The faster path for ``layout``'s pages on ``device``, remembered per device: "copy" on a CPU
    adapter, else whichever of both, timed on a fragmented page table, ran faster."""
    known = known_path(device, layout)
    if known is not None:
        return known
    key = f"page_transfer/{layout.page_bytes}"
    mover = PageMover(device, layout)
    pb = layout.page_bytes
    num_pages = max(2, min(num_pages, device.info.max_storage_binding // pb))
    layer_buffer = device.create_buffer(num_pages * pb, Usage.STORAGE | Usage.COPY_SRC | Usage.COPY_DST, "probe.layer")
    layer = Region(layer_buffer, 0, layer_buffer.size)
    table = device.create_buffer(num_pages * 4, Usage.STORAGE | Usage.COPY_DST, "probe.table")
    staging = device.create_buffer(num_pages * pb, Usage.MAP_READ | Usage.COPY_DST, "probe.staging")
    page_ids = list(range(num_pages))[::-2] + list(range(num_pages))[-2::-2]  # no two neighbours adjacent
    device.write(table, 0, b"".join(p.to_bytes(4, "little") for p in page_ids))
    best: dict[str, float] = {}
    try:
        for path in PATHS:
            times = []
            for _ in range(repeats + 1):  # the first run compiles the pipeline
                start = time.perf_counter()
                device.submit(mover.pack(path, layer, table, page_ids, max(1, layout.page_size - 1), staging, 0))
                await device.read(staging, 0, 4)
                times.append(time.perf_counter() - start)
            best[path] = min(times[1:])
    finally:
        for buf in (layer_buffer, table, staging):
            device.destroy(buf)
        mover.close()
    choice = min(best, key=best.get)
    device.choices[key] = choice
    return choice
