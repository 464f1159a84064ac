"""The cache's page buffers: every layer's pages, packed into as few buffers ("arenas") as the adapter allows."""

from __future__ import annotations

from ..gpu.device import Buffer, Clear, Device, Region, Usage
from ..gpu.tensors import span_bytes
from ..tvm.layout import KVLayout


def allocate_layers(device: Device, layout: KVLayout, num_pages: int, *, mappable: bool) -> list[Region]:
    """One region of ``num_pages`` pages per layer, packed into as few buffers as the adapter allows.

    Layers sit ``stride`` bytes apart (the layer size rounded up to the storage offset alignment), so
    the same run of pages in consecutive layers can move in one copy. The arenas are cleared on the
    device's queue at once, where wgpu would zero each at its first use: a restore into a new cache
    then reads and verifies its checkpoint while the queue clears, instead of waiting for it at import.
    ``mappable`` arenas also map for reading and writing (the "mapped" transfer).
    """
    info = device.info
    size = num_pages * layout.page_bytes
    device.check_binding_size(size, "kv layer")
    align = info.storage_offset_alignment
    stride = -(-size // align) * align
    per_arena = max(1, min(layout.num_layers, info.max_buffer_size // stride))
    usage = Usage.STORAGE | Usage.COPY_SRC | Usage.COPY_DST
    if mappable:
        usage |= Usage.MAP_READ | Usage.MAP_WRITE
    layers: list[Region] = []
    arenas: list[Buffer] = []
    for first in range(0, layout.num_layers, per_arena):
        count = min(per_arena, layout.num_layers - first)
        arenas.append(device.create_buffer(span_bytes(count, size, stride), usage,
                                           f"kv.layers{first}-{first + count - 1}"))
        layers += [Region(arenas[-1], i * stride, size) for i in range(count)]
    device.submit([Clear(arena, 0, arena.size) for arena in arenas])
    return layers
