"""TVM's seven checkpoint primitives, with TVM's names and state machine.

``get_checkpoint_metadata``, ``get_layout_hash``, ``export_page_group``,
``prepare_import``, ``import_page_group``, ``finish_import``, ``get_sequence_length``
behave as in Apache TVM's PagedAttentionKVCache (format_version 1), plus host
helpers that move page groups as bytes. Extensions, which leave the format of a
seq-0 checkpoint unchanged: any sequence id may be checkpointed, and
``prepare_import(..., exclusive=False)`` replaces one sequence instead of clearing
the cache; ``abort_import`` abandons an import.

:class:`CheckpointIO` holds the import state machine of one cache and is given the
cache's parts it works on; :class:`~kvckpt_web.kv.cache.PagedKVCache` owns one and
offers its methods under TVM's names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Sequence as Seq

from ..checks import check_bool, check_int, check_items
from ..errors import CheckpointStateError, SequenceError, TensorError, is_int
from ..gpu.device import Buffer, Device, Region, Usage
from ..gpu.tensors import DeviceArray, as_bytes, span_bytes
from ..tvm.layout import CacheLimits, KVLayout
from ..tvm.metadata import ImportPlan, parse_metadata, validate_import, write_metadata
from .page_groups import PageGroups
from .pool import Sequence, SequenceTable
from .transfer import PageMover

_GROUP_LAYOUT = "(1,num_logical_pages,2,num_kv_heads,page_size,qk_head_dim)"


@dataclass
class Import:
    """A checkpoint import in progress: the sequence it builds and the groups already in."""

    seq_id: int
    seq: Sequence
    exclusive: bool
    imported: list[bool] = field(default_factory=list)


class CheckpointIO:
    """TVM's checkpoint primitives over one cache's pages, and the state of its import.

    It is given what it works on: the cache's layout, limits, device, sequence table, layer regions
    (a list the cache empties when it closes) and page mover; whether the host moves pages through
    mapped page buffers; and the cache's helpers: ``check_open(operation)``, ``forward()`` (the forward
    pass in progress or None), ``buffer(name, size, usage)`` and ``upload_u32(name, values)`` (device
    buffers reused across calls), ``page_path()`` and ``resolve_page_path()`` (the device path in use,
    the second measuring it first where needed) and ``read_pages(seq_id, begin, end, out)``.
    """

    def __init__(self, *, layout: KVLayout, limits: CacheLimits, device: Device, seqs: SequenceTable,
                 layers: list[Region], mover: PageMover, maps_pages: bool, check_open: Callable[[str], None],
                 forward: Callable[[], Any], buffer: Callable[[str, int, Usage], Buffer],
                 upload_u32: Callable[[str, list[int]], Buffer], page_path: Callable[[], str],
                 resolve_page_path: Callable[[], Awaitable[str]],
                 read_pages: Callable[..., Awaitable[PageGroups]]) -> None:
        self.layout, self.limits, self.device, self.seqs = layout, limits, device, seqs
        self.layers, self.mover, self.maps_pages = layers, mover, maps_pages
        self._check_open, self._forward, self._buffer, self._upload_u32 = check_open, forward, buffer, upload_u32
        self._page_path, self._resolve_page_path, self._read_pages = page_path, resolve_page_path, read_pages
        #: The import in progress, if any.
        self.importing: Import | None = None

    # ----- state checks -----------------------------------------------------------------------------

    def _export_seq(self, seq_id: int, operation: str) -> Sequence:
        self._check_open(operation)
        self.layout.check_checkpointable()
        if self.importing is not None:
            raise CheckpointStateError(f"{operation}: checkpoint import must be finished before exporting a "
                                       f"checkpoint (seq_id {self.importing.seq_id} is being imported)")
        if self._forward() is not None:  # some layers may hold the new tokens' K/V and others not yet
            raise CheckpointStateError(f"{operation}: expected no forward pass in progress, got one (seq_ids "
                                       f"{list(self._forward().seq_ids)}); call end_forward first")
        return self.seqs.get(seq_id)

    def _check_group_id(self, group_id: int, operation: str) -> None:
        n = self.layout.num_layers
        if not is_int(group_id, 0, n - 1):
            raise TensorError(f"{operation}.group_id", f"0..{n - 1} (invalid group id; only {n} groups are available)",
                              group_id)

    def _check_group_tensor(self, tensor: DeviceArray, npages: int, operation: str,
                            usage: Usage) -> None:
        lay = self.layout
        where = f"{operation} expects the tensor in layout {_GROUP_LAYOUT}"
        if not isinstance(tensor, DeviceArray):
            raise TensorError(operation, "a DeviceArray", type(tensor).__name__, where)
        if not tensor.buffer.usage & usage:
            got = "|".join(flag.name for flag in Usage if flag & tensor.buffer.usage)
            raise TensorError(f"{operation}.buffer.usage", f"a buffer with {usage.name} usage", got)
        if tensor.dtype != lay.dtype:
            raise TensorError(f"{operation}.dtype", lay.dtype, tensor.dtype, f"{where}; the dtype mismatches")
        shape = lay.group_shape(npages)
        if tuple(tensor.shape) != shape:
            raise TensorError(f"{operation}.shape", shape, tuple(tensor.shape), where)
        if tensor.offset % 4 or tensor.offset + npages * lay.page_bytes > tensor.buffer.size:
            raise TensorError(f"{operation}.offset", f"a multiple of 4 leaving {npages * lay.page_bytes} bytes "
                              f"in a {tensor.buffer.size}-byte buffer", tensor.offset)

    def _import_of(self, seq_id: int, operation: str) -> Import:
        self.layout.check_checkpointable()
        state = self.importing
        if state is None:
            raise CheckpointStateError(f"{operation}: checkpoint import has not been prepared")
        if seq_id != state.seq_id:
            raise SequenceError(f"{operation}.seq_id: expected {state.seq_id} (the sequence being imported), "
                                f"got {seq_id}")
        return state

    # ----- the seven primitives ---------------------------------------------------------------------

    def get_checkpoint_metadata(self, seq_id: int) -> str:
        """The checkpoint metadata JSON of ``seq_id``, byte-identical to TVM's."""
        seq = self._export_seq(seq_id, "get_checkpoint_metadata")
        return write_metadata(self.layout, self.limits, seq_id, seq.length)

    def empty_group(self, num_logical_pages: int) -> DeviceArray:
        """A new device page group tensor for ``num_logical_pages`` pages."""
        check_int("num_logical_pages", num_logical_pages, 0, error=TensorError)
        buf = self.device.create_buffer(num_logical_pages * self.layout.page_bytes,
                                        Usage.STORAGE | Usage.COPY_SRC | Usage.COPY_DST, "kvckpt.group")
        return DeviceArray(buf, self.layout.group_shape(num_logical_pages), self.layout.dtype)

    def export_page_group(self, seq_id: int, group_id: int, dst: DeviceArray) -> None:
        """Pack layer ``group_id`` of ``seq_id`` into ``dst`` (unused tail of the last page zeroed)."""
        seq = self._export_seq(seq_id, "export_page_group")
        self._check_group_id(group_id, "export_page_group")
        self._check_group_tensor(dst, len(seq.pages), "ExportPageGroup", Usage.COPY_DST)
        table = self._upload_u32("table", seq.pages)
        tail = seq.length - (len(seq.pages) - 1) * self.layout.page_size
        self.device.submit(self.mover.pack(self._page_path(), self.layers[group_id], table, seq.pages, tail,
                                           dst.buffer, dst.offset))

    def prepare_import(self, seq_id: int, metadata_json: str | bytes, *, exclusive: bool = True) -> None:
        """Validate ``metadata_json`` fully and reserve pages for it; nothing changes if it is rejected.

        ``exclusive`` (TVM's behaviour) clears every other sequence; ``exclusive=False`` keeps them and
        replaces ``seq_id`` only when ``finish_import`` succeeds.
        """
        plan = self._check_import(seq_id, metadata_json)
        if check_bool("exclusive", exclusive):
            self.seqs.clear()
        pages = self.seqs.pool.allocate(plan.num_logical_pages)
        self.importing = Import(seq_id, Sequence(seq_id, plan.seq_length, pages), exclusive,
                               [False] * self.layout.num_layers)

    def _check_import(self, seq_id: int, metadata_json: str | bytes) -> ImportPlan:
        """Everything :meth:`prepare_import` checks before it changes anything; the import's plan."""
        self._check_open("prepare_import")
        if self.importing is not None:
            raise CheckpointStateError(f"prepare_import: expected no import in progress, got one for seq_id "
                                       f"{self.importing.seq_id}")
        if self._forward() is not None:
            raise CheckpointStateError("prepare_import: expected no forward pass in progress, got one")
        if not is_int(seq_id, 0):
            raise SequenceError(f"prepare_import.seq_id: expected a non-negative integer, got {seq_id!r}")
        return validate_import(metadata_json, self.layout, self.limits, seq_id)

    def import_page_group(self, seq_id: int, group_id: int, src: DeviceArray) -> None:
        """Scatter page group ``group_id`` from ``src`` into the pages reserved by ``prepare_import``."""
        state = self._import_of(seq_id, "import_page_group")
        self._check_group_id(group_id, "import_page_group")
        if state.imported[group_id]:
            raise CheckpointStateError(f"import_page_group: checkpoint group {group_id} was already imported")
        self._check_group_tensor(src, len(state.seq.pages), "ImportPageGroup", Usage.COPY_SRC)
        table = self._upload_u32("table", state.seq.pages)
        self.device.submit(self.mover.scatter(self._page_path(), src.buffer, src.offset, table, state.seq.pages,
                                              self.layers[group_id]))
        state.imported[group_id] = True

    def finish_import(self, seq_id: int) -> None:
        """Complete the import once every group is in; the sequence then exists with its imported length."""
        state = self._import_of(seq_id, "finish_import")
        for group_id, done in enumerate(state.imported):
            if not done:
                raise CheckpointStateError(f"finish_import: checkpoint import is missing group {group_id}")
        if seq_id in self.seqs.seqs:
            self.seqs.remove(seq_id)
        self.seqs.seqs[seq_id] = state.seq
        self.importing = None

    def abort_import(self, seq_id: int) -> None:
        """Abandon an import: release its pages; with ``exclusive=False`` the old ``seq_id`` is kept."""
        state = self._import_of(seq_id, "abort_import")
        self.seqs.pool.release(state.seq.pages)
        self.importing = None

    def get_sequence_length(self, seq_id: int) -> int:
        """Tokens in ``seq_id``; refused while a checkpoint import is in progress."""
        if self.importing is not None:
            raise CheckpointStateError("get_sequence_length: sequence length is unavailable until checkpoint import "
                                       "is finished")
        return self.seqs.get(seq_id).length

    # ----- host helpers -----------------------------------------------------------------------------

    async def export_groups(self, seq_id: int, out: memoryview | None = None) -> PageGroups:
        """Every page group of ``seq_id`` as bytes (TVM's raw little-endian group tensors), in one readback."""
        seq = self._export_seq(seq_id, "export_groups")
        return await self._read_pages(seq_id, 0, len(seq.pages), out)

    async def export_group_bytes(self, seq_id: int, group_id: int) -> bytes:
        """Page group ``group_id`` of ``seq_id`` as bytes."""
        self._check_group_id(group_id, "export_group_bytes")
        return bytes((await self.export_groups(seq_id))[group_id])

    async def import_groups(self, seq_id: int, groups: dict[int, Any] | Seq[Any]) -> None:
        """Import page groups from host bytes (a list of every group, or ``{group_id: bytes}``).

        With the "mapped" transfer the host copies them straight into the mapped page buffers.

        Every group as one :class:`~kvckpt_web.kv.page_groups.PageGroups` (what :meth:`export_groups` returns)
        goes up in one host copy; other groups in steps of ``mover.batch_bytes`` through two staging
        slots, the host filling one while the GPU scatters the other. A scatter that one copy cannot
        carry is submitted in such steps too, each encoded while the GPU runs the one before.
        """
        state = self._import_of(seq_id, "import_groups")
        items = dict(groups) if isinstance(groups, dict) else dict(enumerate(check_items(
            "groups", groups, "page groups (a list of every group, or a dict of group id to bytes)")))
        nbytes = len(state.seq.pages) * self.layout.page_bytes
        views = {}
        for group_id, data in sorted(items.items()):
            self._check_group_id(group_id, "import_groups")
            if state.imported[group_id]:
                raise CheckpointStateError(f"import_groups: checkpoint group {group_id} was already imported")
            views[group_id] = as_bytes(data, f"groups[{group_id}]", self.layout.dtype, nbytes)
        if self.maps_pages:
            layers = [self.layers[g] for g in views]
            for buffer, runs in self.mover.host_runs(layers, state.seq.pages, list(views.values())).items():
                self.device.copy_to_buffer(buffer, runs)
        elif nbytes and views:
            await self._import_staged(state, groups, views, nbytes)
            return
        for group_id in views:
            state.imported[group_id] = True

    async def _import_staged(self, state: Import, groups: Any, views: dict[int, memoryview], nbytes: int) -> None:
        """:meth:`import_groups` of ``views`` (``nbytes`` each) uploaded to staging and scattered by the device."""
        path = await self._resolve_page_path()
        pages = state.seq.pages
        table = self._upload_u32("table", pages)
        per = max(2, self.mover.batch_bytes // nbytes)  # layers per step (at least two, which one copy may carry)
        for k, (step, stride, whole, parts) in enumerate(self._uploads(path, pages, groups, views, nbytes, per)):
            staging = self._buffer(f"write_staging{k % 2}", span_bytes(len(step), nbytes, stride),
                                   Usage.MAP_WRITE | Usage.COPY_SRC)
            await self.device.upload(staging, 0, parts)
            size = len(step) if whole else per
            for first in range(0, len(step), size):
                layers = [self.layers[g] for g in step[first:first + size]]
                self.device.submit(self.mover.scatter_layers(path, staging, table, pages, layers, stride,
                                                             one_copy=whole, src_offset=first * stride))
            for group_id in step:
                state.imported[group_id] = True

    def _uploads(self, path: str, pages: list[int], groups: Any, views: dict[int, memoryview], nbytes: int,
                 per: int) -> list[tuple[list[int], int, bool, list[Any]]]:
        """The steps of a staged import: (group ids, their stride in staging, whether one copy carries them
        all, the host bytes to upload): every group of one ``PageGroups`` in one step, else ``per`` a step."""
        # One copy may carry several layers when no other page of the cache is in use (the bytes
        # between the layers' runs then land in free pages only).
        others_free = self.seqs.pool.num_free == self.seqs.pool.num_pages - len(pages)

        def span(step: list[int]) -> int | None:
            if not others_free or step[-1] - step[0] != len(step) - 1:
                return None
            return self.mover.span_stride(path, [self.layers[g] for g in step], pages)

        ids = list(views)
        if isinstance(groups, PageGroups) and len(ids) == len(self.layers) and groups.stride % 4 == 0:
            return [(ids, groups.stride, span(ids) == groups.stride, [groups.host])]  # copies move whole words
        uploads = []
        for first in range(0, len(ids), per):
            step = ids[first:first + per]
            one = span(step)
            stride = one or nbytes
            gap = bytes(stride - nbytes)
            uploads.append((step, stride, one is not None, [part for g in step for part in (views[g], gap)][:-1]))
        return uploads

    async def load_checkpoint(self, metadata_json: str | bytes, groups: Seq[Any], *,
                              seq_id: int | None = None, exclusive: bool = True) -> None:
        """prepare_import + every group + finish_import; on any error the import is abandoned.

        The metadata, the number of groups and each group's size and dtype are checked before
        prepare_import, so a call rejected for them leaves the cache as it was (with ``exclusive``
        too, which clears the other sequences only once the import starts).
        """
        check_bool("exclusive", exclusive)
        if not isinstance(groups, PageGroups):  # those go up in one host copy: keep them as they are
            groups = check_items("groups", groups, "a list of page groups, one per layer")
        if seq_id is None:
            seq_id = parse_metadata(metadata_json).get("seq_id", 0)
        plan = self._check_import(seq_id, metadata_json)
        if len(groups) != self.layout.num_layers:
            raise TensorError("groups", f"{self.layout.num_layers} page groups", len(groups))
        for group_id, data in enumerate(groups):
            as_bytes(data, f"groups[{group_id}]", self.layout.dtype, plan.num_logical_pages * self.layout.page_bytes)
        self.prepare_import(seq_id, metadata_json, exclusive=exclusive)
        try:
            await self.import_groups(seq_id, groups)
            self.finish_import(seq_id)
        except BaseException:
            if self.importing is not None:
                self.abort_import(seq_id)
            raise
