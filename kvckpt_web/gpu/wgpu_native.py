"""Desktop device backend over wgpu-py (Vulkan, Metal, D3D12; Mesa lavapipe in CI)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import tempfile
from collections.abc import Iterable
from typing import Any, Callable

import numpy

from ..errors import DeviceError
from .device import Buffer, DeviceInfo, Texture, Usage, done, map_window
from .encoding import EncodingDevice, Recorder


def _quiet_runtime_dir() -> None:
    """Give wgpu/Mesa a private XDG_RUNTIME_DIR when none is set (silences a warning)."""
    if not os.environ.get("XDG_RUNTIME_DIR"):
        path = os.path.join(tempfile.gettempdir(), f"kvckpt-xdg-{os.getuid()}")
        os.makedirs(path, mode=0o700, exist_ok=True)
        os.environ["XDG_RUNTIME_DIR"] = path


TEXTURE_COPY_SRC = 0x01  # GPUTextureUsage.COPY_SRC
TEXTURE_COPY_DST = 0x02  # GPUTextureUsage.COPY_DST
TEXTURE_BINDING = 0x04  # GPUTextureUsage.TEXTURE_BINDING
TEXTURE_STORAGE = 0x08  # GPUTextureUsage.STORAGE_BINDING

MAPPABLE_STORAGE = "mappable-primary-buffers"
"""wgpu-native's feature that lets any buffer be mappable; requested on CPU adapters only (see :meth:`WgpuDevice.open`)."""

UPLOAD_STAGING = Usage.MAP_WRITE | Usage.STORAGE
"""Usages telling upload staging (MAP_WRITE alone, mapped again after each submit) from pages that map in place."""

ALIASED_PIECE_BYTES = 1 << 20
"""Piece size of a host copy slowed by 4K aliasing (see :func:`host_copy`)."""

ALIAS_WINDOW = 512
"""Bytes past the source (modulo 4 KiB) within which a destination makes one large host copy slow."""


def host_copy(dst: numpy.ndarray, src: numpy.ndarray) -> None:
    """``dst[:] = src`` for two byte arrays of one length.

    A destination 1-511 bytes past its source modulo 4 KiB (a bytearray, 16 bytes into its page,
    filled from a page-aligned mapping) is copied in pieces of :data:`ALIASED_PIECE_BYTES`: one
    large copy takes glibc's non-temporal loop, whose loads then alias its pending stores (4K
    aliasing).
    """
    size = len(src)
    step = ALIASED_PIECE_BYTES if 0 < (dst.ctypes.data - src.ctypes.data) % 4096 < ALIAS_WINDOW else size
    for at in range(0, size, max(step, 1)):
        numpy.copyto(dst[at:at + step], src[at:at + step])


GIL_FREE_COPY_BYTES = 1 << 20
"""Runs at least this long are copied by numpy, which releases the GIL; shorter ones by a slice, cheaper per call."""


def _copy_run(dst: memoryview, src: memoryview) -> None:
    """``dst[:] = src`` for one run of an in-place copy."""
    if len(src) >= GIL_FREE_COPY_BYTES:
        host_copy(numpy.frombuffer(dst, numpy.uint8), numpy.frombuffer(src, numpy.uint8))
    else:
        dst[:] = src


class _WgpuRecorder(Recorder):
    """A wgpu-py command encoder, and the upload staging buffers its copies read (``finish`` returns both: a
    commit maps them again after the submit)."""

    def __init__(self, encoder: Any) -> None:
        self._encoder = encoder
        self._staged: list[Buffer] = []

    def copy(self, src: Buffer, dst: Buffer, runs: Iterable[tuple[int, int, int]]) -> None:
        copy, src_native, dst_native = self._encoder.copy_buffer_to_buffer, src.native, dst.native
        for src_offset, dst_offset, size in runs:
            copy(src_native, src_offset, dst_native, dst_offset, size)
        if src.usage & UPLOAD_STAGING == Usage.MAP_WRITE and src not in self._staged:
            self._staged.append(src)

    def copy_texture(self, texture: Texture, buffer: Buffer, offset: int) -> None:
        self._encoder.copy_texture_to_buffer({"texture": texture.native},
                                             {"buffer": buffer.native, "offset": offset,
                                              "bytes_per_row": texture.row_pitch, "rows_per_image": texture.height},
                                             (texture.width, texture.height, 1))

    def clear(self, buffer: Buffer, offset: int, size: int) -> None:
        self._encoder.clear_buffer(buffer.native, offset, size)

    def begin_pass(self) -> Any:
        return self._encoder.begin_compute_pass()

    def dispatch(self, compute: Any, pipeline: Any, bind_group: Any, counts: tuple[int, int, int]) -> None:
        compute.set_pipeline(pipeline)
        compute.set_bind_group(0, bind_group)
        compute.dispatch_workgroups(*counts)

    def finish(self) -> tuple[Any, list[Buffer]]:
        return self._encoder.finish(), self._staged


class WgpuDevice(EncodingDevice):
    """A :class:`~kvckpt_web.gpu.device.Device` on a wgpu-py adapter.

    wgpu-native resolves a map once every submission made before the request is done, so each map is
    requested as early as it can be, and waited for with ``sync_wait`` (in a worker thread for reads,
    inline for uploads): wgpu-py's awaitable map polls with growing sleeps, which adds milliseconds per
    map. Read maps are requested on the caller's thread and always waited for while its event loop runs;
    upload maps, which can outlive that loop, from a helper thread without one (wgpu-py binds a promise
    to the running loop). An upload buffer's map is requested at the first submit after its last reader
    (so several submits may read what one upload wrote), or by the upload itself if none came.
    """

    def __init__(self, adapter: Any, device: Any) -> None:
        super().__init__()
        self._device = device
        self._premapped: dict[Any, Any] = {}  # upload staging buffer -> its pending WRITE map
        self._unmapped: list[Buffer] = []  # upload staging the last submit read: mapped again at the next one
        self._unsubmitted_writes = False  # queue writes made since the last submit
        self._params: Any = None  # the kernel parameters' uniform buffer (see _upload_params)
        self._helper = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kvckpt-wgpu-map")
        limits = device.limits
        adapter_info = adapter.info
        self.info = DeviceInfo(
            backend="wgpu/" + str(adapter_info.get("backend_type", "")),
            adapter=str(adapter_info.get("device", "")) or str(adapter_info.get("description", "")),
            is_cpu=adapter_info.get("adapter_type") == "CPU",
            features=frozenset(device.features),
            max_storage_binding=int(limits["max-storage-buffer-binding-size"]),
            max_buffer_size=int(limits["max-buffer-size"]),
            max_workgroups_per_dim=int(limits["max-compute-workgroups-per-dimension"]),
            storage_offset_alignment=int(limits["min-storage-buffer-offset-alignment"]),
            max_texture_dim=int(limits["max-texture-dimension-2d"]),
            maps_storage=MAPPABLE_STORAGE in device.features,
        )

    @classmethod
    def open(cls, power_preference: str = "high-performance") -> "WgpuDevice":
        """Open the best adapter wgpu-py finds, with the adapter's largest buffer limits.

        On a CPU adapter (lavapipe), whose buffers are all host memory, storage buffers are made mappable
        where wgpu-native allows it, so the host can copy pages in place (``info.maps_storage``). A GPU
        would have to place such buffers in host-visible memory, which its kernels read slowly.
        """
        _quiet_runtime_dir()
        try:
            import wgpu
        except ImportError as exc:
            raise DeviceError(f"the desktop backend needs wgpu-py: {exc}") from None
        try:
            adapter = wgpu.gpu.request_adapter_sync(power_preference=power_preference)
        except Exception as exc:  # wgpu raises plain RuntimeError when no adapter exists
            raise DeviceError(f"no WebGPU adapter available: {exc}") from None
        if adapter is None:
            raise DeviceError("no WebGPU adapter available")
        wanted = ("max-storage-buffer-binding-size", "max-buffer-size")
        limits = {name: adapter.limits[name] for name in wanted}
        from wgpu.backends.wgpu_native import GPUBuffer

        # writing in place needs wgpu-py's experimental writable view of a mapping (see _copy_in_place)
        features = [MAPPABLE_STORAGE] if (adapter.info.get("adapter_type") == "CPU"
                                          and MAPPABLE_STORAGE in adapter.features
                                          and hasattr(GPUBuffer, "_experimental_get_mapped_range")) else []
        return cls(adapter, adapter.request_device_sync(required_features=features, required_limits=limits))

    def _compile(self, source: str, entry: str) -> Any:
        try:
            module = self._device.create_shader_module(code=source)
            return self._device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": entry})
        except Exception as exc:
            raise DeviceError(f"WGSL compile of entry {entry!r} failed: {exc}") from None

    def _create_buffer(self, size: int, usage: Usage, label: str) -> Any:
        return self._device.create_buffer(size=size, usage=int(usage), label=label)

    def _create_texture(self, width: int, height: int, texel_format: str, label: str) -> tuple[Any, Any]:
        texture = self._device.create_texture(size=(width, height, 1), format=texel_format, label=label,
                                              usage=TEXTURE_BINDING | TEXTURE_STORAGE | TEXTURE_COPY_SRC | TEXTURE_COPY_DST)
        return texture, texture.create_view()

    def _write_texture(self, texture: Texture, data: bytes | bytearray | memoryview) -> None:
        self._device.queue.write_texture({"texture": texture.native}, data,
                                         {"bytes_per_row": texture.width * texture.channels * 4,
                                          "rows_per_image": texture.height}, (texture.width, texture.height, 1))
        self._unsubmitted_writes = True

    def _destroy(self, buffer: Buffer | Texture) -> None:
        if isinstance(buffer, Texture):
            buffer.native.destroy()
            return
        self._unmapped = [b for b in self._unmapped if b is not buffer]
        premapped = self._premapped.pop(buffer.native, None)
        if premapped is not None:  # let the map finish: wgpu-py reports an aborted one from its callback
            try:
                premapped.sync_wait()
                buffer.native.unmap()
            except RuntimeError:
                pass  # the buffer goes anyway
        buffer.native.destroy()

    def write(self, buffer: Buffer, offset: int, data: bytes | bytearray | memoryview) -> None:
        self._device.queue.write_buffer(buffer.native, offset, data)
        self._unsubmitted_writes = True

    def _upload_params(self, blob: bytes) -> Any:
        if self._params is None or self._params.size < len(blob):
            if self._params is not None:
                self._params.destroy()
                self.forget_bind_groups()
            self._params = self._device.create_buffer(size=max(len(blob), 4096), label="kvckpt.params",
                                                      usage=int(Usage.UNIFORM | Usage.COPY_DST))
        self._device.queue.write_buffer(self._params, 0, blob)
        self._unsubmitted_writes = True
        return self._params

    def _recorder(self) -> Recorder:
        return _WgpuRecorder(self._device.create_command_encoder())

    def _create_bind_group(self, pipeline: Any, entries: list[dict[str, Any]]) -> Any:
        return self._device.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=entries)

    def commit(self, encoded: tuple[Any, list[Buffer]]) -> None:
        command_buffer, staged = encoded
        for b in staged:
            if b.native in self._premapped:  # wgpu-native would abort the process on this submit
                raise DeviceError(f"submit: upload buffer {b.label!r} is being mapped for its next upload; "
                                  "upload into it again before submitting commands that read it")
        # Upload staging that earlier submits read and this one does not is mapped again now, before this
        # submit: a request made after it would wait for it too. Staging this submit reads waits for the next.
        again = [b for b in self._unmapped if b not in staged]
        if again:
            self._premapped.update(self._helper.submit(
                lambda: {b.native: b.native.map_async("WRITE", 0, b.size) for b in again}).result())
        self._unmapped = list(staged)
        self._device.queue.submit([command_buffer])
        self._unsubmitted_writes = False

    def _request_read(self, buffer: Buffer, offset: int, size: int) -> tuple[Any, int, int]:
        """Request a READ map now: (wgpu-py promise, mapped offset, mapped size)."""
        mapped_offset, mapped_size = map_window(offset, size)
        # wgpu-py's plain "READ" first submits an empty command buffer, to flush queue writes that no submit
        # has carried yet; on lavapipe a submit waits for the one before it, so skip that when there are none.
        mode = "READ" if self._unsubmitted_writes else "READ_NOSYNC"
        promise = buffer.native.map_async(mode, mapped_offset, mapped_size)
        self._unsubmitted_writes = False
        return promise, mapped_offset, mapped_size

    def _request_view(self, buffer: Buffer, offset: int, size: int) -> Callable[[], memoryview]:
        """Request a READ map of ``size`` bytes at ``offset`` now; a blocking call that waits for it and
        returns a view of exactly those bytes."""
        promise, mapped_offset, mapped_size = self._request_read(buffer, offset, size)

        def view() -> memoryview:
            try:
                promise.sync_wait()
            except RuntimeError as exc:
                raise DeviceError(f"mapping buffer {buffer.label!r} for reading failed: {exc}") from None
            start = offset - mapped_offset
            return buffer.native.read_mapped(mapped_offset, mapped_size, copy=False).cast("B")[start:start + size]

        return view

    def read(self, buffer: Buffer, offset: int, size: int,
             out: memoryview | None = None) -> "asyncio.Future[memoryview]":
        if size == 0:
            return done(memoryview(bytearray(0)) if out is None else out[:0])
        view = self._request_view(buffer, offset, size)
        target = memoryview(bytearray(size)) if out is None else out
        dst = memoryview(target).cast("B")[:size]

        def copy_out() -> memoryview:  # on a worker thread: numpy copies without holding the GIL
            src = view()
            try:
                host_copy(numpy.frombuffer(dst, numpy.uint8), numpy.frombuffer(src, numpy.uint8))
            finally:
                buffer.native.unmap()
            return target[:size]

        return asyncio.get_running_loop().run_in_executor(None, copy_out)

    def map_read(self, buffer: Buffer, offset: int, size: int) -> "asyncio.Future[memoryview]":
        return asyncio.get_running_loop().run_in_executor(None, self._request_view(buffer, offset, size))

    def unmap(self, buffer: Buffer) -> None:
        buffer.native.unmap()

    def _copy_in_place(self, operation: str, buffer: Buffer, runs: list[tuple[int, memoryview]],
                       write: bool) -> None:
        if not self.info.maps_storage:
            super()._copy_in_place(operation, buffer, runs, write)
        runs = [(offset, view) for offset, view in runs if len(view)]
        if not runs:
            return
        low = min(offset for offset, _ in runs)
        start, size = map_window(low, max(offset + len(view) for offset, view in runs) - low)
        if self._unsubmitted_writes:  # queue writes come first, as they would before a submit
            self._device.queue.submit([])
            self._unsubmitted_writes = False
        native = buffer.native
        try:
            native.map_async("WRITE" if write else "READ_NOSYNC", start, size).sync_wait()
        except RuntimeError as exc:
            raise DeviceError(f"{operation}: mapping buffer {buffer.label!r} in place failed: {exc}") from None
        try:
            if write:
                # wgpu-py's one writable view of a mapping; write_mapped costs ~5 us a call, 20 ms for 4,096 pages
                mapped = native._experimental_get_mapped_range(start, size)
                for offset, view in runs:
                    _copy_run(mapped[offset - start:offset - start + len(view)], view)
                mapped.release()
            else:
                mapped = native.read_mapped(start, size, copy=False).cast("B")
                for offset, view in runs:
                    _copy_run(view, mapped[offset - start:offset - start + len(view)])
        finally:
            native.unmap()

    async def upload(self, buffer: Buffer, offset: int, chunks: list[bytes | bytearray | memoryview]) -> None:
        views = [memoryview(c).cast("B") for c in chunks]
        size = sum(len(v) for v in views)
        self._unmapped = [b for b in self._unmapped if b is not buffer]
        premapped = self._premapped.pop(buffer.native, None)
        if premapped is not None:
            try:
                premapped.sync_wait()  # the whole buffer, mapped once the GPU had read it
            except RuntimeError as exc:
                raise DeviceError(f"mapping upload buffer {buffer.label!r} failed: {exc}") from None
        elif size == 0:
            return
        else:
            buffer.native.map_sync("WRITE", *map_window(offset, size))
        try:
            for view in views:
                if len(view):
                    buffer.native.write_mapped(view, offset)
                    offset += len(view)
        finally:
            buffer.native.unmap()
