"""Browser device backend: ``navigator.gpu`` through Pyodide's JS FFI.

wgpu-py has no working Pyodide backend, so this module speaks WebGPU directly
through ``js`` / ``pyodide.ffi``. It implements the same narrow
:class:`~kvckpt_web.gpu.device.Device` interface as ``wgpu_native``; everything
above the device layer is shared. Host I/O is async end to end (``mapAsync``),
and no numpy is needed: bytes move between Python buffers and mapped ranges
with ``Uint8Array.assign`` / ``assign_to`` (one copy each way).

WebGPU reports validation errors asynchronously; the device collects them
(``uncapturederror``) and the next :meth:`read` / :meth:`upload` /
:meth:`check_errors` raises them as :class:`~kvckpt_web.errors.DeviceError`.

Open it with ``device = await BrowserDevice.open()`` (or
``await kvckpt_web.open_device_async()``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from ..errors import DeviceError
from .device import Buffer, DeviceInfo, Texture, Usage, done, map_window
from .encoding import EncodingDevice, Recorder

_MAP_READ = 1  # GPUMapMode.READ
_MAP_WRITE = 2  # GPUMapMode.WRITE
_TEXTURE_COPY_SRC = 0x01  # GPUTextureUsage.COPY_SRC
_TEXTURE_COPY_DST = 0x02  # GPUTextureUsage.COPY_DST
_TEXTURE_BINDING = 0x04  # GPUTextureUsage.TEXTURE_BINDING
_TEXTURE_STORAGE = 0x08  # GPUTextureUsage.STORAGE_BINDING


def _ffi() -> tuple[Any, Any, Any]:
    try:
        import js  # type: ignore[import-not-found]
        from pyodide.ffi import JsException, to_js  # type: ignore[import-not-found]
    except ImportError:
        raise DeviceError("the browser backend runs only inside Pyodide (no `js` module here)") from None
    return js, to_js, JsException


def _obj(value: Any) -> Any:
    """A Python dict (nested) as a plain JS object."""
    js, to_js, _ = _ffi()
    return to_js(value, dict_converter=js.Object.fromEntries)


class _BrowserRecorder(Recorder):
    """A ``GPUCommandEncoder`` of the page's device."""

    def __init__(self, encoder: Any) -> None:
        self._encoder = encoder
        self._copy = encoder.copyBufferToBuffer  # one JS attribute lookup per encoder, not per copy

    def copy(self, src: Buffer, dst: Buffer, runs: Iterable[tuple[int, int, int]]) -> None:
        copy, src_native, dst_native = self._copy, src.native, dst.native
        for src_offset, dst_offset, size in runs:
            copy(src_native, src_offset, dst_native, dst_offset, size)

    def copy_texture(self, texture: Texture, buffer: Buffer, offset: int) -> None:
        self._encoder.copyTextureToBuffer(_obj({"texture": texture.native}),
                                          _obj({"buffer": buffer.native, "offset": offset,
                                                "bytesPerRow": texture.row_pitch, "rowsPerImage": texture.height}),
                                          _obj([texture.width, texture.height, 1]))

    def clear(self, buffer: Buffer, offset: int, size: int) -> None:
        self._encoder.clearBuffer(buffer.native, offset, size)

    def begin_pass(self) -> Any:
        return self._encoder.beginComputePass()

    def dispatch(self, compute: Any, pipeline: Any, bind_group: Any, counts: tuple[int, int, int]) -> None:
        compute.setPipeline(pipeline)
        compute.setBindGroup(0, bind_group)
        compute.dispatchWorkgroups(*counts)

    def finish(self) -> Any:
        return self._encoder.finish()


class BrowserDevice(EncodingDevice):
    """A :class:`~kvckpt_web.gpu.device.Device` on the page's (or worker's) ``navigator.gpu``."""

    def __init__(self, adapter: Any, device: Any) -> None:
        super().__init__()
        js, _, _ = _ffi()
        self._js = js
        self._device = device
        self._queue = device.queue
        self._errors: list[str] = []
        self._params: Any = None
        self._params_size = 0
        limits = device.limits
        info = getattr(adapter, "info", None)
        name = ""
        if info is not None:
            name = " ".join(str(getattr(info, k, "") or "") for k in ("vendor", "architecture", "description")).strip()
        fallback = bool(getattr(adapter, "isFallbackAdapter", False)) or bool(getattr(info, "isFallbackAdapter", False))
        self.info = DeviceInfo(
            backend="browser/webgpu",
            adapter=name or "navigator.gpu",
            is_cpu=fallback,
            features=frozenset(str(f) for f in device.features),
            max_storage_binding=int(limits.maxStorageBufferBindingSize),
            max_buffer_size=int(limits.maxBufferSize),
            max_workgroups_per_dim=int(limits.maxComputeWorkgroupsPerDimension),
            storage_offset_alignment=int(limits.minStorageBufferOffsetAlignment),
            max_texture_dim=int(limits.maxTextureDimension2D),
        )
        from pyodide.ffi import create_proxy  # type: ignore[import-not-found]

        self._on_error = create_proxy(lambda event: self._errors.append(str(event.error.message)))
        device.addEventListener("uncapturederror", self._on_error)

    @classmethod
    async def open(cls, power_preference: str = "high-performance") -> "BrowserDevice":
        """Request an adapter and a device with the adapter's largest buffer limits; DeviceError if none."""
        js, _, JsException = _ffi()
        gpu = getattr(js.navigator, "gpu", None)
        if gpu is None:
            raise DeviceError("no WebGPU in this browser (navigator.gpu is undefined; a secure context and, in "
                              "headless Chromium, --enable-unsafe-webgpu are needed)")
        try:
            adapter = await gpu.requestAdapter(_obj({"powerPreference": power_preference}))
        except JsException as exc:
            raise DeviceError(f"no WebGPU adapter available: {exc}") from None
        if adapter is None:
            raise DeviceError("no WebGPU adapter available (navigator.gpu.requestAdapter returned null)")
        limits = {name: int(getattr(adapter.limits, name)) for name in ("maxStorageBufferBindingSize", "maxBufferSize")}
        try:
            device = await adapter.requestDevice(_obj({"requiredLimits": limits}))
        except JsException as exc:
            raise DeviceError(f"WebGPU requestDevice failed: {exc}") from None
        return cls(adapter, device)

    # ----- errors -------------------------------------------------------------------------------------

    def check_errors(self) -> None:
        """Raise DeviceError for WebGPU validation errors reported since the last check."""
        if self._errors:
            errors, self._errors = self._errors, []
            raise DeviceError(f"WebGPU reported {len(errors)} error(s): " + "; ".join(errors[:3]))

    # ----- Device interface ---------------------------------------------------------------------------

    def _compile(self, source: str, entry: str) -> Any:
        _, _, JsException = _ffi()
        try:
            module = self._device.createShaderModule(_obj({"code": source}))
            return self._device.createComputePipeline(
                _obj({"layout": "auto", "compute": {"module": module, "entryPoint": entry}}))
        except JsException as exc:
            raise DeviceError(f"WGSL compile of entry {entry!r} failed: {exc}") from None

    def _create_buffer(self, size: int, usage: Usage, label: str) -> Any:
        _, _, JsException = _ffi()
        try:
            return self._device.createBuffer(_obj({"size": size, "usage": int(usage), "label": label}))
        except JsException as exc:
            raise DeviceError(f"buffer {label!r} of {size} bytes: {exc}") from None

    def _create_texture(self, width: int, height: int, texel_format: str, label: str) -> tuple[Any, Any]:
        _, _, JsException = _ffi()
        try:
            texture = self._device.createTexture(_obj({"size": [width, height, 1], "format": texel_format,
                                                       "usage": _TEXTURE_BINDING | _TEXTURE_STORAGE | _TEXTURE_COPY_SRC | _TEXTURE_COPY_DST, "label": label}))
        except JsException as exc:
            raise DeviceError(f"texture {label!r} of {width} x {height}: {exc}") from None
        return texture, texture.createView()

    def _write_texture(self, texture: Texture, data: bytes | bytearray | memoryview) -> None:
        self._queue.writeTexture(_obj({"texture": texture.native}), self._u8(data),
                                 _obj({"bytesPerRow": texture.width * texture.channels * 4,
                                       "rowsPerImage": texture.height}), _obj([texture.width, texture.height, 1]))

    def _destroy(self, resource: Buffer | Texture) -> None:
        resource.native.destroy()

    def _u8(self, data: bytes | bytearray | memoryview) -> Any:
        view = memoryview(data).cast("B")
        arr = self._js.Uint8Array.new(len(view))
        if len(view):
            arr.assign(view)
        return arr

    def write(self, buffer: Buffer, offset: int, data: bytes | bytearray | memoryview) -> None:
        arr = self._u8(data)
        self._queue.writeBuffer(buffer.native, offset, arr, 0, arr.length)

    def _upload_params(self, blob: bytes) -> Any:
        if self._params is None or self._params_size < len(blob):
            if self._params is not None:
                self._params.destroy()
                self.forget_bind_groups()
            self._params_size = max(len(blob), 4096)
            self._params = self._device.createBuffer(_obj({"size": self._params_size, "usage": int(
                Usage.UNIFORM | Usage.COPY_DST), "label": "kvckpt.params"}))
        arr = self._u8(blob)
        # queue writes are ordered before the next submit, so one params buffer serves every commit
        self._queue.writeBuffer(self._params, 0, arr, 0, arr.length)
        return self._params

    def _recorder(self) -> Recorder:
        return _BrowserRecorder(self._device.createCommandEncoder())

    def _create_bind_group(self, pipeline: Any, entries: list[dict[str, Any]]) -> Any:
        return self._device.createBindGroup(_obj({"layout": pipeline.getBindGroupLayout(0), "entries": entries}))

    def commit(self, encoded: Any) -> None:
        self._queue.submit(self._js.Array.of(encoded))

    def _map(self, buffer: Buffer, mode: int, offset: int, size: int) -> Any:
        """Request a map of ``size`` > 0 bytes at ``offset`` now (the window WebGPU allows around them); a
        coroutine that waits for it and returns exactly those bytes (a Uint8Array over the mapped range)."""
        _, _, JsException = _ffi()
        self.check_errors()
        mapped_offset, mapped_size = map_window(offset, size)
        promise = buffer.native.mapAsync(mode, mapped_offset, mapped_size)

        async def mapped() -> Any:
            try:
                await promise
            except JsException as exc:
                self.check_errors()
                raise DeviceError(f"mapAsync of buffer {buffer.label!r} failed: {exc}") from None
            start = offset - mapped_offset
            return self._js.Uint8Array.new(buffer.native.getMappedRange(mapped_offset, mapped_size)).subarray(
                start, start + size)

        return mapped()

    def read(self, buffer: Buffer, offset: int, size: int,
             out: memoryview | None = None) -> "asyncio.Future[memoryview]":
        if size == 0:
            self.check_errors()
            return done(memoryview(bytearray(0)) if out is None else out[:0])
        mapping = self._map(buffer, _MAP_READ, offset, size)

        async def copy_out() -> memoryview:
            mapped = await mapping
            try:
                target = memoryview(bytearray(size)) if out is None else out
                mapped.assign_to(memoryview(target).cast("B")[:size])
            finally:
                buffer.native.unmap()
            self.check_errors()
            return target[:size]

        return asyncio.ensure_future(copy_out())

    def map_read(self, buffer: Buffer, offset: int, size: int) -> "asyncio.Future[memoryview]":
        mapping = self._map(buffer, _MAP_READ, offset, size)

        async def view() -> memoryview:
            return memoryview((await mapping).to_bytes())  # Python cannot see JS memory: a copy

        return asyncio.ensure_future(view())

    def unmap(self, buffer: Buffer) -> None:
        buffer.native.unmap()

    async def upload(self, buffer: Buffer, offset: int, chunks: list[bytes | bytearray | memoryview]) -> None:
        self.check_errors()
        views = [memoryview(c).cast("B") for c in chunks]
        size = sum(len(v) for v in views)
        if size == 0:
            return
        mapped = await self._map(buffer, _MAP_WRITE, offset, size)
        try:
            pos = 0
            for view in views:
                if len(view):
                    mapped.subarray(pos, pos + len(view)).assign(view)
                pos += len(view)
        finally:
            buffer.native.unmap()
