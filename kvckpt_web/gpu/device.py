"""The narrow device interface every backend implements.

Everything above this module (page pool, cache, checkpoint primitives, stores)
talks to WebGPU only through :class:`Device`: create buffers, write small data,
submit a batch of copy / clear / dispatch commands (or encode it now and commit
it later), and read (copied out, or viewed in place until unmapped) or write
mappable staging buffers asynchronously. Where storage buffers are host memory
(``DeviceInfo.maps_storage``), the host may also copy straight out of and into
them. Backends: :mod:`~kvckpt_web.gpu.wgpu_native`
(desktop, wgpu-py) and :mod:`~kvckpt_web.gpu.browser` (Pyodide, ``navigator.gpu``);
:mod:`~kvckpt_web.gpu.open` picks one.
"""

from __future__ import annotations

import asyncio
import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from ..errors import DeviceError

WORKGROUP_SIZE = 256
#: Byte alignment of copy offsets and sizes in WebGPU.
COPY_ALIGN = 4


class Usage(enum.IntFlag):
    """WebGPU buffer usage flags (same bit values as GPUBufferUsage)."""

    MAP_READ = 0x0001
    MAP_WRITE = 0x0002
    COPY_SRC = 0x0004
    COPY_DST = 0x0008
    UNIFORM = 0x0040
    STORAGE = 0x0080


@dataclass(eq=False)
class Buffer:
    """A device buffer: its size, usage and the backend's native handle."""

    size: int
    usage: Usage
    native: Any = field(repr=False)
    label: str = ""


@dataclass(eq=False)
class Texture:
    """A 2-D texture of ``width`` x ``height`` texels, each ``channels`` (1 or 4) 32-bit unsigned integers,
    that kernels read with ``textureLoad`` (``texture_2d<u32>``, or a read-only ``texture_storage_2d``) and may
    write (a write-only ``texture_storage_2d``); ``view`` is the native view they bind.

    Kernels on a CPU adapter fetch texels with vector gathers where storage buffer loads go lane by lane
    (lavapipe: the model's Q4 matrix-vector products ran 4x faster from textures than from storage buffers, and
    faster again read as storage textures, which skip the sampler's work).
    """

    width: int
    height: int
    channels: int
    native: Any = field(repr=False)
    view: Any = field(repr=False)
    label: str = ""

    @property
    def size(self) -> int:
        """Bytes of texel data."""
        return self.width * self.height * self.channels * 4

    @property
    def row_pitch(self) -> int:
        """Bytes between rows of texels copied into a buffer (:class:`TextureCopy`): a row, rounded up to 256."""
        return -(-self.width * self.channels * 4 // 256) * 256


TEXEL_FORMATS = {1: "r32uint", 4: "rgba32uint"}
"""WebGPU texture format of a texture with 1 or 4 channels."""


@dataclass(frozen=True)
class Copy:
    """Copy ``size`` bytes from ``src`` at ``src_offset`` to ``dst`` at ``dst_offset``."""

    src: Buffer
    src_offset: int
    dst: Buffer
    dst_offset: int
    size: int


@dataclass(frozen=True)
class CopyRuns:
    """Many copies from ``src`` to ``dst`` as one command: ``size`` bytes from ``src_offset`` to ``dst_offset``
    for each ``(src_offset, dst_offset, size)`` in ``runs``."""

    src: Buffer
    dst: Buffer
    runs: tuple[tuple[int, int, int], ...]


@dataclass(frozen=True)
class TextureCopy:
    """Copy every texel of ``texture`` into ``buffer`` from ``offset``: row y of texels at ``offset + y *
    texture.row_pitch`` (WebGPU copies texture rows at multiples of 256 bytes)."""

    texture: "Texture"
    buffer: Buffer
    offset: int = 0


@dataclass(frozen=True)
class Clear:
    """Zero ``size`` bytes of ``buffer`` from ``offset``."""

    buffer: Buffer
    offset: int
    size: int


@dataclass(frozen=True)
class Region:
    """``size`` bytes of ``buffer`` from ``offset``: a binding of part of a buffer, or one layer of an arena."""

    buffer: Buffer
    offset: int
    size: int


@dataclass(frozen=True)
class Dispatch:
    """Run ``kernel`` with uniform ``params`` (binding 0) and ``buffers`` (bindings 1..n: whole buffers or
    regions, bound as the shader declares them, storage or uniform; or textures) over either ``invocations``
    threads (workgroups of ``workgroup_size``, the shader's, :data:`WORKGROUP_SIZE` unless given, on a 2-D grid
    that the shader linearises) or exactly ``workgroups`` = (x, y, z) workgroups of the shader's own size.

    Consecutive dispatches of one submit share one compute pass (WebGPU orders their storage accesses).
    With ``keep_bindings`` the device keeps the bind group for the next dispatch of the same kernel,
    parameter slot and bindings (see :meth:`Device.bind_group`): for bindings that live long, as weights do.
    """

    kernel: "Kernel"
    params: bytes
    buffers: tuple[Buffer | Region | Texture, ...]
    invocations: int = 0
    workgroups: tuple[int, int, int] | None = None
    keep_bindings: bool = False
    workgroup_size: int = WORKGROUP_SIZE


Command = Copy | CopyRuns | TextureCopy | Clear | Dispatch


@dataclass(eq=False)
class Kernel:
    """A compiled compute pipeline (cached per device by its WGSL source)."""

    name: str
    native: Any = field(repr=False)


@dataclass(frozen=True)
class DeviceInfo:
    """What the adapter is and what it allows."""

    backend: str
    adapter: str
    is_cpu: bool
    features: frozenset[str]
    max_storage_binding: int
    max_buffer_size: int
    max_workgroups_per_dim: int
    #: minStorageBufferOffsetAlignment: where a storage binding may start.
    storage_offset_alignment: int = 256
    #: maxTextureDimension2D: texels along either side of a texture.
    max_texture_dim: int = 8192
    #: Storage buffers may also be mappable, and mapping one costs no copy (a CPU adapter whose
    #: backend allows mapping any buffer): see :meth:`Device.copy_from_buffer`.
    maps_storage: bool = False


UNIFORM_ALIGN = 256


def uniform_params(commands: list["Command"]) -> tuple[bytes, list[int]]:
    """The uniform parameters of every Dispatch in ``commands`` in one blob, and each one's offset in it
    (multiples of minUniformBufferOffsetAlignment, 256)."""
    blob, offsets = bytearray(), []
    for command in commands:
        if isinstance(command, Dispatch):
            offsets.append(len(blob))
            blob += command.params + bytes(-len(command.params) % UNIFORM_ALIGN)
    return bytes(blob), offsets


def map_window(offset: int, size: int) -> tuple[int, int]:
    """The (offset, size) to map so that bytes ``[offset, offset + size)`` are covered (WebGPU wants map
    offsets in multiples of 8 and sizes in multiples of 4)."""
    start = offset - offset % 8
    return start, -(-(offset + size - start) // 4) * 4


def done(value: Any) -> "asyncio.Future[Any]":
    """A future that already holds ``value`` (what a read of zero bytes returns)."""
    future = asyncio.get_running_loop().create_future()
    future.set_result(value)
    return future


def workgroup_counts(dispatch: Dispatch, max_per_dim: int) -> tuple[int, int, int]:
    """The (x, y, z) workgroup counts to dispatch for ``dispatch``; DeviceError past ``max_per_dim``."""
    if dispatch.workgroups is None:
        return (*grid(dispatch.invocations, max_per_dim, dispatch.workgroup_size), 1)
    if any(not 0 < n <= max_per_dim for n in dispatch.workgroups):
        raise DeviceError(f"dispatch {dispatch.kernel.name}: expected 1..{max_per_dim} workgroups per dimension, "
                          f"got {dispatch.workgroups}")
    return dispatch.workgroups


def grid(invocations: int, max_per_dim: int, size: int = WORKGROUP_SIZE) -> tuple[int, int]:
    """Workgroup counts (x, y) covering ``invocations`` threads in workgroups of ``size``; shaders linearise
    ``x + y * num_workgroups.x``."""
    groups = max(1, -(-invocations // size))
    if groups <= max_per_dim:
        return groups, 1
    y = -(-groups // max_per_dim)
    if y > max_per_dim:
        raise DeviceError(f"dispatch of {invocations} invocations exceeds {max_per_dim}^2 workgroups")
    return -(-groups // y), y


class Device(ABC):
    """A WebGPU device as kvckpt_web uses it."""

    info: DeviceInfo

    def __init__(self) -> None:
        self._kernels: dict[tuple[str, str], Kernel] = {}
        self._bind_groups: dict[tuple[Any, ...], Any] = {}
        #: Per-device memo of measured choices (e.g. the faster page-transfer path).
        self.choices: dict[str, Any] = {}
        self._live: dict[int, int] = {}  # id of each buffer and texture created and not destroyed -> its bytes

    @property
    def live_resources(self) -> int:
        """How many buffers and textures made by :meth:`create_buffer` and :meth:`create_texture` are not yet
        destroyed (what the caller must still :meth:`destroy`; internal parameter buffers are not counted)."""
        return len(self._live)

    @property
    def live_bytes(self) -> int:
        """Bytes of the buffers and textures :attr:`live_resources` counts."""
        return sum(self._live.values())

    def kernel(self, name: str, source: str, entry: str) -> Kernel:
        """The compiled pipeline for ``entry`` of WGSL ``source``; compiled once per device."""
        key = (source, entry)
        if key not in self._kernels:
            self._kernels[key] = Kernel(name=f"{name}.{entry}", native=self._compile(source, entry))
        return self._kernels[key]

    def check_buffer_size(self, size: int, label: str) -> None:
        """Raise :class:`DeviceError` if a buffer of ``size`` bytes cannot exist on this device."""
        if size > self.info.max_buffer_size:
            raise DeviceError(f"buffer {label!r}: expected at most {self.info.max_buffer_size} bytes "
                              f"(adapter maxBufferSize), got {size}")

    def check_binding_size(self, size: int, label: str) -> None:
        """Raise :class:`DeviceError` if ``size`` bytes cannot be bound as one storage buffer on this device."""
        if size > self.info.max_storage_binding:
            raise DeviceError(f"binding {label!r}: expected at most {self.info.max_storage_binding} bytes "
                              f"(adapter maxStorageBufferBindingSize), got {size}")

    def bind_entries(self, params: Any, params_offset: int, dispatch: Dispatch) -> list[dict[str, Any]]:
        """The bind group entries of ``dispatch`` (WebGPU's shape): its uniform parameters at ``params_offset``
        of the native buffer ``params``, then its storage bindings; DeviceError if one cannot be bound."""
        entries = [{"binding": 0, "resource": {"buffer": params, "offset": params_offset,
                                               "size": len(dispatch.params)}}]
        for i, target in enumerate(dispatch.buffers):
            if isinstance(target, Texture):
                entries.append({"binding": i + 1, "resource": target.view})
                continue
            region = target if isinstance(target, Region) else Region(target, 0, target.size)
            self.check_binding_size(region.size, region.buffer.label)
            if region.offset % self.info.storage_offset_alignment:
                raise DeviceError(f"binding {region.buffer.label!r}: expected an offset that is a multiple of "
                                  f"{self.info.storage_offset_alignment}, got {region.offset}")
            entries.append({"binding": i + 1, "resource": {"buffer": region.buffer.native, "offset": region.offset,
                                                           "size": region.size}})
        return entries

    def bind_group(self, params: Any, params_offset: int, dispatch: Dispatch) -> Any:
        """The native bind group of ``dispatch`` with its parameters at ``params_offset`` of the native buffer
        ``params``. With ``dispatch.keep_bindings`` it is made once per (kernel, parameter slot, bindings) and
        kept until :meth:`forget_bind_groups` (which :meth:`destroy` calls): a decode step binds the same
        weights and activations every time, and making a group costs ~0.1 ms. A kept group holds its buffers."""
        if not dispatch.keep_bindings:
            return self._create_bind_group(dispatch.kernel.native, self.bind_entries(params, params_offset, dispatch))
        key = (dispatch.kernel, params_offset, len(dispatch.params), dispatch.buffers)
        group = self._bind_groups.get(key)
        if group is None:
            group = self._bind_groups[key] = self._create_bind_group(
                dispatch.kernel.native, self.bind_entries(params, params_offset, dispatch))
        return group

    def forget_bind_groups(self, resource: "Buffer | Texture | None" = None) -> None:
        """Drop the cached bind groups that bind ``resource`` (all of them when None: the parameters buffer
        was replaced)."""
        if resource is None:
            self._bind_groups.clear()
            return
        self._bind_groups = {key: group for key, group in self._bind_groups.items()
                             if not any(b is resource or getattr(b, "buffer", None) is resource for b in key[3])}

    def create_buffer(self, size: int, usage: Usage, label: str = "") -> Buffer:
        """A zero-filled buffer of ``size`` bytes (rounded up to 4)."""
        size = max(COPY_ALIGN, -(-size // COPY_ALIGN) * COPY_ALIGN)
        self.check_buffer_size(size, label)
        buffer = Buffer(size=size, usage=usage, native=self._create_buffer(size, usage, label), label=label)
        self._live[id(buffer)] = size
        return buffer

    def create_texture(self, width: int, height: int, channels: int, label: str = "") -> Texture:
        """A zero-filled texture that kernels read (see :class:`Texture`); DeviceError past the adapter's limit."""
        if channels not in TEXEL_FORMATS:
            raise DeviceError(f"texture {label!r} channels: expected one of {sorted(TEXEL_FORMATS)}, got {channels}")
        if not (0 < width <= self.info.max_texture_dim and 0 < height <= self.info.max_texture_dim):
            raise DeviceError(f"texture {label!r}: expected 1..{self.info.max_texture_dim} texels a side "
                              f"(adapter maxTextureDimension2D), got {width} x {height}")
        native, view = self._create_texture(width, height, TEXEL_FORMATS[channels], label)
        texture = Texture(width, height, channels, native, view, label)
        self._live[id(texture)] = texture.size
        return texture

    def write_texture(self, texture: Texture, data: bytes | bytearray | memoryview) -> None:
        """Queue a write of every texel of ``texture``: ``data`` holds its rows back to back (ordered before later
        submits)."""
        size = len(memoryview(data).cast("B"))
        if size != texture.size:
            raise DeviceError(f"texture {texture.label!r} data: expected {texture.size} bytes, got {size}")
        self._write_texture(texture, data)

    @abstractmethod
    def _create_texture(self, width: int, height: int, texel_format: str, label: str) -> tuple[Any, Any]:
        """Create the native texture (TEXTURE_BINDING | STORAGE_BINDING | COPY_SRC | COPY_DST) and its view."""

    @abstractmethod
    def _write_texture(self, texture: Texture, data: bytes | bytearray | memoryview) -> None:
        """Queue the write :meth:`write_texture` checked."""

    @abstractmethod
    def _create_bind_group(self, pipeline: Any, entries: list[dict[str, Any]]) -> Any:
        """Create the native bind group of group 0 of ``pipeline``."""

    @abstractmethod
    def _compile(self, source: str, entry: str) -> Any:
        """Compile one compute entry point; raise DeviceError on a shader error."""

    @abstractmethod
    def _create_buffer(self, size: int, usage: Usage, label: str) -> Any:
        """Create the native buffer."""

    def destroy(self, resource: Buffer | Texture) -> None:
        """Release ``resource`` (a buffer or a texture) now, and forget the bind groups that bind it."""
        self.forget_bind_groups(resource)
        self._live.pop(id(resource), None)
        self._destroy(resource)

    @abstractmethod
    def _destroy(self, resource: Buffer | Texture) -> None:
        """Release the native buffer or texture."""

    @abstractmethod
    def write(self, buffer: Buffer, offset: int, data: bytes | bytearray | memoryview) -> None:
        """Queue a write of small ``data`` into a COPY_DST buffer (ordered before later submits)."""

    def submit(self, commands: list[Command]) -> None:
        """Encode ``commands`` in order into one command buffer and submit it."""
        if commands:
            self.commit(self.encode(commands))

    @abstractmethod
    def encode(self, commands: list[Command]) -> Any:
        """Encode non-empty ``commands`` in order into one command buffer, to :meth:`commit` later.

        Commit each encoded buffer before encoding the next (kernel parameters are written at encoding).
        """

    @abstractmethod
    def commit(self, encoded: Any) -> None:
        """Submit a command buffer :meth:`encode` returned."""

    @abstractmethod
    def read(self, buffer: Buffer, offset: int, size: int,
             out: memoryview | None = None) -> "asyncio.Future[memoryview]":
        """Copy ``size`` bytes of a MAP_READ ``buffer`` out (into ``out`` if given); a future of them.

        The map is requested now, so it waits for the work submitted so far and for nothing submitted
        later: commands for the next readback may be committed while this one is in flight.
        """

    @abstractmethod
    def map_read(self, buffer: Buffer, offset: int, size: int) -> "asyncio.Future[memoryview]":
        """Map ``size`` > 0 bytes of a MAP_READ ``buffer``, requested now as :meth:`read` is; a future of a
        read-only view of them.

        The view is valid until :meth:`unmap`; the buffer may not be used by a submit before then.
        """

    @abstractmethod
    def unmap(self, buffer: Buffer) -> None:
        """End the mapping :meth:`map_read` made; its view must no longer be used."""

    @abstractmethod
    async def upload(self, buffer: Buffer, offset: int, chunks: list[bytes | bytearray | memoryview]) -> None:
        """Map a MAP_WRITE ``buffer`` once, copy ``chunks`` in back to back from ``offset`` and unmap it."""

    def copy_from_buffer(self, buffer: Buffer, runs: list[tuple[int, memoryview]]) -> None:
        """Fill each ``view`` of ``runs`` with the bytes of ``buffer`` (MAP_READ, any other usage too) at
        its offset, once the work submitted so far is done: one mapping of the buffer itself, no staging.

        Blocks until then, so no submit can use the buffer while it is mapped. Only where
        ``info.maps_storage``; :class:`DeviceError` elsewhere.
        """
        self._copy_in_place("copy_from_buffer", buffer, runs, write=False)

    def copy_to_buffer(self, buffer: Buffer, runs: list[tuple[int, memoryview]]) -> None:
        """Write each ``view`` of ``runs`` into ``buffer`` (MAP_WRITE, any other usage too) at its offset, after
        the work submitted so far and before any submitted later; as :meth:`copy_from_buffer` does."""
        self._copy_in_place("copy_to_buffer", buffer, runs, write=True)

    def _copy_in_place(self, operation: str, buffer: Buffer, runs: list[tuple[int, memoryview]],
                       write: bool) -> None:
        """What :meth:`copy_from_buffer` and :meth:`copy_to_buffer` do; backends whose storage buffers map in
        place override it (after calling this to refuse a device that does not)."""
        if not self.info.maps_storage:
            raise DeviceError(f"{operation}: expected a device whose storage buffers map in place "
                              f"(info.maps_storage), got {self.info.backend} {self.info.adapter!r}")
        raise DeviceError(f"{operation}: {type(self).__name__} does not map storage buffers in place")
