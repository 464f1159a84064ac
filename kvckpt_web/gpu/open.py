"""Backend choice: open the WebGPU device of this platform (wgpu-py on desktop, navigator.gpu in Pyodide).

The backends are imported only when chosen: wgpu-py does not exist in Pyodide, and the browser
backend needs Pyodide's ``js`` module.
"""

from __future__ import annotations

import sys

from ..errors import DeviceError
from .device import Device


def open_device(backend: str = "auto") -> Device:
    """Open the WebGPU device of ``backend`` ("auto", "wgpu" or "browser"); DeviceError if none is usable."""
    if backend == "auto":
        backend = "browser" if sys.platform == "emscripten" else "wgpu"
    if backend == "wgpu":
        from .wgpu_native import WgpuDevice

        return WgpuDevice.open()
    if backend == "browser":
        raise DeviceError("the browser backend opens asynchronously: use `await open_device_async()` "
                          "or `await BrowserDevice.open()`")
    raise DeviceError(f"backend: expected 'auto', 'wgpu' or 'browser', got {backend!r}")


async def open_device_async(backend: str = "auto") -> Device:
    """Like :func:`open_device`, but also opens the browser backend (``navigator.gpu`` in Pyodide)."""
    if backend == "auto":
        backend = "browser" if sys.platform == "emscripten" else "wgpu"
    if backend == "browser":
        from .browser import BrowserDevice

        return await BrowserDevice.open()
    return open_device(backend)
