"""A paged K/V cache in WebGPU storage buffers.

One storage buffer per layer holds ``[num_total_pages, 2, num_kv_heads, page_size,
head_dim]`` elements. Sequences own lists of pages (``pool``); a forward pass
reserves token slots (``begin_forward``), the caller appends each layer's K and V
(``append_kv``, a WGSL kernel) and ends it (``end_forward``); model kernels that write K/V
themselves find the reserved slots in ``current_forward`` and the pages in ``page_table``. TVM's checkpoint
primitives are methods of the cache, carried out by the :class:`~kvckpt_web.kv.checkpoint.CheckpointIO` it owns.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Sequence as Seq

from ..checks import check_each, check_instance, check_int, check_items, check_writable
from ..errors import CapacityError, CheckpointStateError, SequenceError, TensorError, is_int
from ..gpu.device import Buffer, Command, Copy, Device, Usage
from ..gpu.tensors import DeviceArray, HostTensor, as_bytes, span_bytes, zeroed
from ..tvm.layout import CacheLimits, KVLayout
from ..tvm.metadata import layout_from_metadata, limits_from_metadata, parse_metadata
from .arenas import allocate_layers
from .checkpoint import CheckpointIO
from .kernels import kv_append
from .page_groups import MappedPages, PageGroups
from .pool import PageCopy, SequenceState, SequenceTable, check_seq_id
from .transfer import TRANSFERS, PageMover, known_path, measure_path


def check_cache(cache: Any, field: str = "cache") -> "PagedKVCache":
    """``cache`` if it is a :class:`PagedKVCache`, else FieldError naming ``field``."""
    return check_instance(field, cache, PagedKVCache, "a PagedKVCache")


@dataclass(frozen=True)
class ForwardPass:
    """The forward pass in progress (see :meth:`PagedKVCache.current_forward`).

    Its tokens are those of ``seq_ids[0]`` (``lengths[0]`` of them), then those of ``seq_ids[1]``, and so on;
    for each token, ``positions`` holds its index in its sequence and ``slots`` where its K/V go in every
    layer: ``page_id * page_size + slot in page``.
    """

    seq_ids: tuple[int, ...]
    lengths: tuple[int, ...]
    positions: tuple[int, ...]
    slots: tuple[int, ...]

    @property
    def num_tokens(self) -> int:
        """Tokens appended by this forward, over all its sequences."""
        return len(self.slots)


class PagedKVCache:
    """A TVM-compatible paged K/V cache on a :class:`~kvckpt_web.gpu.device.Device`.

    ``transfer`` says how pages move (see :mod:`~kvckpt_web.kv.transfer`): "kernel" or "copy" on the
    device, "mapped" (host exports and imports copy pages in place, on a device whose storage buffers
    map in place; the device moves them by copies), or "auto": "mapped" where the device allows it,
    else the device path measured faster.
    """

    def __init__(self, device: Device, layout: KVLayout, limits: CacheLimits | None = None, *,
                 transfer: str = "auto") -> None:
        check_instance("device", device, Device, "a Device (open_device())")
        check_instance("layout", layout, KVLayout, "a KVLayout")
        if limits is not None:
            check_instance("limits", limits, CacheLimits, "a CacheLimits or None")
        if transfer not in ("auto",) + TRANSFERS:
            raise TensorError("transfer", "'auto', 'kernel', 'copy' or 'mapped'", transfer)
        if transfer == "mapped" and not device.info.maps_storage:
            raise TensorError("transfer", "'auto', 'kernel' or 'copy' on this device ('mapped' needs storage "
                              f"buffers that map in place; {device.info.adapter!r} has none)", transfer)
        self.device = device
        #: Host exports and imports copy pages in place through mapped page buffers (the "mapped" transfer).
        self.maps_pages = transfer == "mapped" or (transfer == "auto" and device.info.maps_storage)
        self.layout = layout
        self.limits = limits or CacheLimits()
        self.num_total_pages = self.limits.num_total_pages(layout.page_size)
        self.transfer = transfer
        self.layers = allocate_layers(device, layout, self.num_total_pages, mappable=self.maps_pages)
        self.seqs = SequenceTable(self.num_total_pages, layout.page_size)
        self.mover = PageMover(device, layout)
        self._forward: ForwardPass | None = None
        self._buffers: dict[str, Buffer] = {}
        self._mapped_slots: set[int] = set()
        self._host_slots: dict[int, memoryview] = {}  # map_pages' buffers where the host copies pages in place
        self._locks: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Lock]] = {}
        self._checkpoint = CheckpointIO(
            layout=layout, limits=self.limits, device=device, seqs=self.seqs, layers=self.layers, mover=self.mover,
            maps_pages=self.maps_pages, check_open=self._check_open, forward=lambda: self._forward,
            buffer=self._buffer, upload_u32=self._upload_u32, page_path=self.page_path,
            resolve_page_path=self._resolve_page_path, read_pages=self.read_pages)

    @classmethod
    def from_metadata(cls, device: Device, metadata_json: str | bytes, *, transfer: str = "auto") -> "PagedKVCache":
        """A new empty cache whose layout and limits are those of the cache that wrote ``metadata_json``."""
        metadata = parse_metadata(metadata_json)
        return cls(device, layout_from_metadata(metadata), limits_from_metadata(metadata), transfer=transfer)

    # ----- buffers reused across calls -------------------------------------------------------------

    def _buffer(self, name: str, size: int, usage: Usage) -> Buffer:
        buf = self._buffers.get(name)
        if buf is None or buf.size < size:
            if buf is not None:
                self.device.destroy(buf)
            buf = self._buffers[name] = self.device.create_buffer(max(size, 256), usage, f"kvckpt.{name}")
        return buf

    def _upload_u32(self, name: str, values: list[int]) -> Buffer:
        buf = self._buffer(name, 4 * len(values), Usage.STORAGE | Usage.COPY_DST)
        if values:
            self.device.write(buf, 0, b"".join(v.to_bytes(4, "little") for v in values))
        return buf

    def page_path(self) -> str:
        """The device path in use: "kernel" or "copy" (with ``transfer="auto"``, chosen per device by
        :func:`~kvckpt_web.kv.transfer.measure_path`, "kernel" until it has measured; "copy" with
        ``transfer="mapped"``)."""
        if self.transfer != "auto":
            return "copy" if self.transfer == "mapped" else self.transfer
        return known_path(self.device, self.layout) or "kernel"

    def host_path(self) -> str:
        """How exports and imports of host bytes move pages: "mapped" where :attr:`maps_pages`, else
        :meth:`page_path`."""
        return "mapped" if self.maps_pages else self.page_path()

    async def _resolve_page_path(self) -> str:
        if self.transfer != "auto":
            return self.page_path()
        return await measure_path(self.device, self.layout)

    def _copy_pages(self, copies: list[PageCopy]) -> None:
        """Copy whole pages on every layer (through scratch: a buffer cannot copy onto itself)."""
        if not copies:
            return
        pb = self.layout.page_bytes
        scratch = self.mover.scratch(pb)
        commands: list[Command] = []
        for layer in self.layers:
            for src, dst in copies:
                commands += [Copy(layer.buffer, layer.offset + src * pb, scratch, 0, pb),
                             Copy(scratch, 0, layer.buffer, layer.offset + dst * pb, pb)]
        self.device.submit(commands)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has released this cache's buffers: it holds nothing and takes nothing more."""
        return not self.layers

    def lock(self, purpose: str = "transfer") -> asyncio.Lock:
        """This cache's lock for ``purpose`` on the running event loop: "transfer" guards the staging buffers
        for one readback or import at a time, "slots" the staging slots of :meth:`map_pages` for one save."""
        loop = asyncio.get_running_loop()
        entry = self._locks.get(purpose)
        if entry is None or entry[0] is not loop:
            entry = self._locks[purpose] = (loop, asyncio.Lock())
        return entry[1]

    def _check_open(self, operation: str) -> None:
        if self.closed:
            raise CheckpointStateError(f"{operation}: expected an open cache, got a closed one (close() was called)")

    def close(self) -> None:
        """Release every device buffer of this cache (its GPU memory, now: a page should close each cache it is
        done with); every later use of it raises CheckpointStateError. Closing again does nothing."""
        for buf in {id(layer.buffer): layer.buffer for layer in self.layers}.values():
            self.device.destroy(buf)
        for buf in self._buffers.values():
            self.device.destroy(buf)
        self.layers.clear()  # the list the checkpoint primitives hold too
        self._buffers, self._host_slots = {}, {}
        self.mover.close()

    # ----- TVM's checkpoint primitives (see :mod:`~kvckpt_web.kv.checkpoint`) -------------------------

    def get_layout_hash(self) -> str:
        """FNV-1a 64 hash of this cache's layout, as 16 hex digits (TVM's ``get_layout_hash``)."""
        return self.layout.layout_hash()

    def get_checkpoint_metadata(self, seq_id: int) -> str:
        """The checkpoint metadata JSON of ``seq_id``, byte-identical to TVM's."""
        return self._checkpoint.get_checkpoint_metadata(seq_id)

    def empty_group(self, num_logical_pages: int) -> DeviceArray:
        """A new device page group tensor for ``num_logical_pages`` pages."""
        return self._checkpoint.empty_group(num_logical_pages)

    def export_page_group(self, seq_id: int, group_id: int, dst: DeviceArray) -> None:
        """Pack layer ``group_id`` of ``seq_id`` into ``dst`` (unused tail of the last page zeroed)."""
        self._checkpoint.export_page_group(seq_id, group_id, dst)

    def prepare_import(self, seq_id: int, metadata_json: str | bytes, *, exclusive: bool = True) -> None:
        """Validate ``metadata_json`` fully and reserve pages for it; nothing changes if it is rejected.

        ``exclusive`` (TVM's behaviour) clears every other sequence; ``exclusive=False`` keeps them and
        replaces ``seq_id`` only when ``finish_import`` succeeds.
        """
        self._checkpoint.prepare_import(seq_id, metadata_json, exclusive=exclusive)

    def import_page_group(self, seq_id: int, group_id: int, src: DeviceArray) -> None:
        """Scatter page group ``group_id`` from ``src`` into the pages reserved by ``prepare_import``."""
        self._checkpoint.import_page_group(seq_id, group_id, src)

    def finish_import(self, seq_id: int) -> None:
        """Complete the import once every group is in; the sequence then exists with its imported length."""
        self._checkpoint.finish_import(seq_id)

    def abort_import(self, seq_id: int) -> None:
        """Abandon an import: release its pages; with ``exclusive=False`` the old ``seq_id`` is kept."""
        self._checkpoint.abort_import(seq_id)

    def get_sequence_length(self, seq_id: int) -> int:
        """Tokens in ``seq_id``; refused while a checkpoint import is in progress."""
        return self._checkpoint.get_sequence_length(seq_id)

    async def export_groups(self, seq_id: int, out: memoryview | None = None) -> PageGroups:
        """Every page group of ``seq_id`` as bytes (TVM's raw little-endian group tensors), in one readback."""
        return await self._checkpoint.export_groups(seq_id, out)

    async def export_group_bytes(self, seq_id: int, group_id: int) -> bytes:
        """Page group ``group_id`` of ``seq_id`` as bytes."""
        return await self._checkpoint.export_group_bytes(seq_id, group_id)

    async def import_groups(self, seq_id: int, groups: dict[int, Any] | Seq[Any]) -> None:
        """Import page groups from host bytes (a list of every group, or ``{group_id: bytes}``); every group
        as one :class:`~kvckpt_web.kv.page_groups.PageGroups` goes up in one host copy."""
        await self._checkpoint.import_groups(seq_id, groups)

    async def import_group_bytes(self, seq_id: int, group_id: int, data: Any) -> None:
        """Import page group ``group_id`` from host bytes."""
        await self._checkpoint.import_groups(seq_id, {group_id: data})

    async def load_checkpoint(self, metadata_json: str | bytes, groups: Seq[Any], *, seq_id: int | None = None,
                              exclusive: bool = True) -> None:
        """prepare_import + every group + finish_import; on any error the import is abandoned and a call
        rejected before prepare_import leaves the cache as it was."""
        await self._checkpoint.load_checkpoint(metadata_json, groups, seq_id=seq_id, exclusive=exclusive)

    # ----- sequences --------------------------------------------------------------------------------

    def _check_editable(self, operation: str) -> None:
        """CheckpointStateError unless the cache is open and no checkpoint import is in progress."""
        self._check_open(operation)
        if self._checkpoint.importing is not None:
            raise CheckpointStateError(f"{operation}: expected no checkpoint import in progress, got an import of "
                                       f"seq_id {self._checkpoint.importing.seq_id} (call finish_import or abort_import first)")

    def add_sequence(self, seq_id: int) -> None:
        """Create an empty sequence ``seq_id``."""
        self._check_editable("add_sequence")
        self.seqs.add(seq_id)

    def remove_sequence(self, seq_id: int) -> None:
        """Delete sequence ``seq_id`` and free its pages."""
        self._check_editable("remove_sequence")
        self.seqs.remove(seq_id)

    def fork_sequence(self, parent_id: int, child_id: int, fork_pos: int = -1) -> None:
        """Create ``child_id`` sharing the first ``fork_pos`` tokens of ``parent_id`` (-1: all)."""
        self._check_editable("fork_sequence")
        self._copy_pages(self.seqs.fork(parent_id, child_id, fork_pos))

    def popn(self, seq_id: int, n: int) -> None:
        """Drop the last ``n`` tokens of ``seq_id``."""
        self._check_editable("popn")
        self._copy_pages(self.seqs.popn(seq_id, n))

    def sequence_ids(self) -> list[int]:
        """Ids of the sequences in the cache, ascending."""
        return sorted(self.seqs.seqs)

    def get_num_available_pages(self) -> int:
        """Pages no sequence uses."""
        return self.seqs.pool.num_free

    def page_table(self, seq_id: int) -> list[int]:
        """The physical page ids of ``seq_id``'s logical pages, in order (token ``t`` is in slot
        ``t % page_size`` of page ``page_table(seq_id)[t // page_size]``); forked sequences share pages."""
        return list(self.seqs.get(seq_id).pages)

    def sequence_state(self, seq_id: int) -> SequenceState:
        """A snapshot of ``seq_id`` for change tracking: which sequence object it is, its length and pop count."""
        return self.seqs.get(seq_id).state()

    def unchanged_prefix(self, seq_id: int, since: SequenceState) -> int:
        """How many leading tokens of ``seq_id`` hold the same K/V as when ``since`` was taken.

        0 if ``seq_id`` is no longer the sequence ``since`` describes (removed and added again, replaced by an
        import); otherwise the lowest length it had since then (popn lowers it, appends never do).
        """
        check_instance("since", since, SequenceState, "a SequenceState (from sequence_state)")
        return self.seqs.get(seq_id).unchanged_prefix(since)

    # ----- forward passes ---------------------------------------------------------------------------

    def begin_forward(self, seq_ids: list[int], append_lengths: list[int]) -> None:
        """Reserve slots for ``append_lengths[i]`` new tokens of each ``seq_ids[i]`` (all or nothing)."""
        self._check_open("begin_forward")
        if self._checkpoint.importing is not None:
            raise CheckpointStateError("begin_forward: cannot begin a forward pass before checkpoint import is "
                                       f"finished (seq_id {self._checkpoint.importing.seq_id} is being imported)")
        if self._forward is not None:
            raise CheckpointStateError("begin_forward: expected no forward pass in progress, got one "
                                       f"(seq_ids {list(self._forward.seq_ids)}); call end_forward first")
        seq_ids = check_each("seq_ids", seq_ids, "a list of sequence ids", check_seq_id)
        lengths = check_items("append_lengths", append_lengths, "a list of token counts, one per seq_id")
        if len(seq_ids) != len(lengths):
            raise SequenceError(f"append_lengths: expected {len(seq_ids)} entries (one per seq_id), got {len(lengths)}")
        if len(set(seq_ids)) != len(seq_ids):
            raise SequenceError(f"seq_ids: expected distinct ids, got {seq_ids}")
        if len(seq_ids) > self.limits.reserved_num_seqs:
            raise CapacityError(f"seq_ids: expected at most reserved_num_seqs={self.limits.reserved_num_seqs} "
                                f"sequences per forward, got {len(seq_ids)}")
        for i, n in enumerate(lengths):
            if not is_int(n, 1):
                raise SequenceError(f"append_lengths[{i}]: expected a positive integer, got {n!r}")
        total = sum(lengths)
        if total > self.limits.prefill_chunk_size:
            raise CapacityError(f"append_lengths: expected at most prefill_chunk_size={self.limits.prefill_chunk_size} "
                                f"tokens per forward, got {total}")
        starts = [self.seqs.get(s).length for s in seq_ids]
        slots = self.seqs.reserve(seq_ids, lengths)
        self._upload_u32("slots", slots)
        self._forward = ForwardPass(tuple(seq_ids), tuple(lengths),
                                    tuple(p for start, n in zip(starts, lengths) for p in range(start, start + n)),
                                    tuple(slots))

    def current_forward(self) -> ForwardPass:
        """The forward pass in progress; CheckpointStateError if none is."""
        if self._forward is None:
            raise CheckpointStateError("current_forward: expected a forward pass in progress (call begin_forward), "
                                       "got none")
        return self._forward

    def append_kv(self, layer: int, k: Any, v: Any) -> None:
        """Write layer ``layer``'s K and V, each ``(num_tokens, num_kv_heads, head_dim)``, for the current forward."""
        fwd = self._forward
        if fwd is None:
            raise CheckpointStateError("append_kv: expected a forward pass in progress (call begin_forward), got none")
        lay = self.layout
        if not is_int(layer, 0, lay.num_layers - 1):
            raise TensorError("layer", f"0..{lay.num_layers - 1}", layer)
        nbytes = fwd.num_tokens * lay.num_kv_heads * lay.head_dim * lay.elem_bytes
        k_bytes = as_bytes(k, "k", lay.dtype, nbytes)
        v_bytes = as_bytes(v, "v", lay.dtype, nbytes)
        kv = self._buffer("kv_in", 2 * nbytes, Usage.STORAGE | Usage.COPY_DST)
        if nbytes % 4:  # an odd count of 16-bit elements: WebGPU writes whole words, so write K and V in one go
            self.device.write(kv, 0, bytes(k_bytes) + bytes(v_bytes))
        else:
            self.device.write(kv, 0, k_bytes)
            self.device.write(kv, nbytes, v_bytes)
        self.device.submit([kv_append(self.device, pages=self.layers[layer], positions=self._buffers["slots"],
                                      kv=kv, num_tokens=fwd.num_tokens, num_kv_heads=lay.num_kv_heads,
                                      head_dim=lay.head_dim, page_size=lay.page_size, elem_bytes=lay.elem_bytes)])

    def end_forward(self) -> None:
        """Finish the current forward pass."""
        if self._forward is None:
            raise CheckpointStateError("end_forward: expected a forward pass in progress, got none")
        self._forward = None

    # ----- reading K/V back -------------------------------------------------------------------------

    def _page_range(self, seq_id: int, page_begin: int, page_end: int | None) -> tuple[list[int], int]:
        seq = self.seqs.get(seq_id)
        npages = len(seq.pages)
        check_int("page_begin", page_begin, error=TensorError)
        page_end = npages if page_end is None else check_int("page_end", page_end, error=TensorError)
        if not 0 <= page_begin <= page_end <= npages:
            raise TensorError("page range", f"0 <= page_begin <= page_end <= {npages}", (page_begin, page_end))
        tail = seq.length - (page_end - 1) * self.layout.page_size if page_end == npages else self.layout.page_size
        return seq.pages[page_begin:page_end], tail

    def host_nbytes(self, seq_id: int, page_begin: int = 0, page_end: int | None = None) -> int:
        """Size of an ``out`` buffer that lets :meth:`read_pages` move every layer in one copy when it can."""
        ids, _ = self._page_range(seq_id, page_begin, page_end)
        group = len(ids) * self.layout.page_bytes
        stride = self.mover.span_stride("copy", self.layers, ids) or group
        return span_bytes(len(self.layers), group, stride)

    def host_groups(self, num_logical_pages: int) -> PageGroups:
        """Zeroed host page groups of ``num_logical_pages`` pages, to fill and pass to :meth:`import_groups`;
        spaced like the layers where one copy may then carry them all."""
        self._check_open("host_groups")
        group = check_int("num_logical_pages", num_logical_pages, 0, error=TensorError) * self.layout.page_bytes
        return PageGroups.zeros(len(self.layers), group, self.mover.layer_stride(self.layers, group) or group)

    async def _pack_pages(self, ids: list[int], tail: int, staging_name: str, stride: int | None = None
                          ) -> tuple[Buffer, int, int]:
        """Submit the packing of pages ``ids`` of every layer into a staging buffer: (buffer, bytes, layer stride).

        Unless one copy moves every layer, layers go in submits of ``mover.batch_bytes``, each encoded
        while the GPU packs the one before.
        """
        path = await self._resolve_page_path()
        group = len(ids) * self.layout.page_bytes
        if stride is None:
            stride = self.mover.span_stride(path, self.layers, ids) or group
        total = span_bytes(len(self.layers), group, stride)
        staging = self._buffer(staging_name, total, Usage.MAP_READ | Usage.COPY_DST)
        if total:
            table = self._upload_u32("table", ids)
            per = max(1, self.mover.batch_bytes // group) if stride == group else len(self.layers)
            for first in range(0, len(self.layers), per):
                self.device.submit(self.mover.pack_layers(path, self.layers[first:first + per], table, ids, tail,
                                                          staging, stride, first * stride))
        return staging, total, stride

    async def read_pages(self, seq_id: int, page_begin: int = 0, page_end: int | None = None,
                         out: memoryview | None = None) -> PageGroups:
        """Logical pages ``[page_begin, page_end)`` of every layer, densely, unused tail zeroed: one view per layer.

        The views share one host buffer (``out`` if given: at least ``num_layers`` groups, or
        :meth:`host_nbytes` to allow the one-copy path); bytes between them are zero. Every layer is
        packed into one staging buffer that comes back in one host copy: on this project's CPU adapter one
        large copy outran copies in steps overlapped with the packing (they compete for memory bandwidth).
        """
        self._check_open("read_pages")
        if out is not None:
            check_writable("out", out, error=TensorError)
        ids, tail = self._page_range(seq_id, page_begin, page_end)
        if self.maps_pages:
            return self._read_mapped(ids, tail, out)
        path = await self._resolve_page_path()
        group = len(ids) * self.layout.page_bytes
        layers = len(self.layers)
        stride = self.mover.span_stride(path, self.layers, ids) or group
        if out is not None and len(out) < span_bytes(layers, group, stride):
            stride = group
            if len(out) < layers * group:
                raise TensorError("out.nbytes", f"at least {layers * group}", len(out))
        staging, total, stride = await self._pack_pages(ids, tail, "read_staging", stride)
        host = zeroed(total) if out is None else out
        if total:
            await self.device.read(staging, 0, total, host)
        return PageGroups(host, group, layers, stride)

    def _read_mapped(self, ids: list[int], tail: int, out: memoryview | None) -> PageGroups:
        """:meth:`read_pages` of pages ``ids`` copied by the host from the mapped page buffers."""
        pb, layers = self.layout.page_bytes, len(self.layers)
        group = len(ids) * pb
        if out is not None and len(out) < layers * group:
            raise TensorError("out.nbytes", f"at least {layers * group}", len(out))
        groups = PageGroups(zeroed(layers * group) if out is None else out, group, layers)
        for buffer, runs in self.mover.host_runs(self.layers, ids, list(groups)).items():
            self.device.copy_from_buffer(buffer, runs)
        slots = self.mover.tail_slots(tail)
        if ids and slots:
            zeros = bytes(slots[0][1])
            for view in groups:
                for offset, size in slots:
                    view[group - pb + offset:group - pb + offset + size] = zeros
        return groups

    async def map_pages(self, seq_id: int, page_begin: int = 0, page_end: int | None = None, *,
                        slot: int = 0) -> MappedPages:
        """Like :meth:`read_pages`, into a buffer of ``slot`` that is reused: a mapped staging buffer, or where
        :attr:`maps_pages`, a host buffer the pages are copied into in place (no device work to wait for).

        The views are valid until :meth:`MappedPages.release`; a slot serves one mapping at a time.
        """
        if not is_int(slot, 0):
            raise TensorError("map_pages.slot", "a non-negative integer", slot)
        if slot in self._mapped_slots:
            raise CheckpointStateError(f"map_pages: staging slot {slot} is still mapped; release its MappedPages "
                                       "first or use another slot")
        ids, tail = self._page_range(seq_id, page_begin, page_end)
        group = len(ids) * self.layout.page_bytes
        if self.maps_pages:
            nbytes = len(self.layers) * group
            host = self._host_slots.get(slot)
            if host is None or len(host) < nbytes:
                host = self._host_slots[slot] = zeroed(nbytes)
            groups = self._read_mapped(ids, tail, host)
            self._mapped_slots.add(slot)
            return MappedPages(list(groups), lambda: self._mapped_slots.discard(slot))
        staging, total, stride = await self._pack_pages(ids, tail, f"map_staging{slot}")
        if not total:
            return MappedPages([memoryview(b"")] * len(self.layers), None)
        self._mapped_slots.add(slot)
        try:
            view = await self.device.map_read(staging, 0, total)
        except BaseException:
            self._mapped_slots.discard(slot)
            raise

        def unmap() -> None:
            self.device.unmap(staging)
            self._mapped_slots.discard(slot)

        return MappedPages([view[g * stride:g * stride + group] for g in range(len(self.layers))], unmap)

    async def debug_get_kv(self, seq_id: int, start: int, end: int) -> tuple[HostTensor, HostTensor]:
        """K and V of tokens ``[start, end)``: two ``(num_layers, n, num_kv_heads, head_dim)`` tensors."""
        seq = self.seqs.get(seq_id)
        check_int("start", start, error=TensorError)
        check_int("end", end, error=TensorError)
        if not 0 <= start <= end <= seq.length:
            raise TensorError("token range", f"0 <= start <= end <= {seq.length}", (start, end))
        lay = self.layout
        p = lay.page_size
        first = start // p
        groups = await self.read_pages(seq_id, first, -(-end // p))
        row = lay.head_dim * lay.elem_bytes
        k, v = bytearray(), bytearray()
        for group in groups:
            for pos in range(start, end):
                page, slot = divmod(pos - first * p, p)
                for which, out in ((0, k), (1, v)):
                    for head in range(lay.num_kv_heads):
                        offset = page * lay.page_bytes + (((which * lay.num_kv_heads) + head) * p + slot) * row
                        out += group[offset:offset + row]
        shape = (lay.num_layers, end - start, lay.num_kv_heads, lay.head_dim)
        return HostTensor(bytes(k), shape, lay.dtype), HostTensor(bytes(v), shape, lay.dtype)
