"""The WGSL loader: kernel sources live in ``shaders/<area>/<name>.wgsl`` (inside the wheel at
``kvckpt_web/shaders``), one kernel family per file."""

from __future__ import annotations

import functools
import hashlib
import struct
from importlib import resources
from pathlib import Path

from ..errors import DeviceError


def _area(area: str):
    """The directory of ``shaders/<area>``: in the installed package, else in the source tree."""
    packaged = resources.files("kvckpt_web").joinpath("shaders", area)
    return packaged if packaged.is_dir() else Path(__file__).resolve().parents[2] / "shaders" / area


@functools.cache
def source(area: str, name: str) -> str:
    """The text of ``shaders/<area>/<name>.wgsl``, from the installed package or the source tree."""
    path = _area(area).joinpath(f"{name}.wgsl")
    if path.is_file():
        return path.read_text(encoding="utf-8")
    raise DeviceError(f"shader {area}/{name}.wgsl: expected in the kvckpt_web package or ./shaders, got neither")


@functools.cache
def digest(*areas: str) -> str:
    """SHA-256 (hex) of every kernel of ``shaders/<area>`` for each area: names and texts, in name order. Code
    whose results these kernels decide (K/V written by a model) is scoped by it."""
    h = hashlib.sha256()
    for area in areas:
        for entry in sorted(_area(area).iterdir(), key=lambda e: e.name):
            if entry.name.endswith(".wgsl"):
                h.update(f"{area}/{entry.name}\0".encode())
                h.update(source(area, entry.name[:-5]).encode())
    return h.hexdigest()


def pack_params(*values: int) -> bytes:
    """Kernel parameters: u32 values, little-endian, in order (a kernel's ``Params`` struct of u32 fields)."""
    return struct.pack(f"<{len(values)}I", *values)
