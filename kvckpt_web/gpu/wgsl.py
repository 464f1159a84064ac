"""The WGSL loader: kernel sources live in ``shaders/<area>/<name>.wgsl`` (inside the wheel at
``kvckpt_web/shaders``), one kernel family per file."""

from __future__ import annotations

import functools
import struct
from importlib import resources
from pathlib import Path

from ..errors import DeviceError


@functools.cache
def source(area: str, name: str) -> str:
    """The text of ``shaders/<area>/<name>.wgsl``, from the installed package or the source tree."""
    packaged = resources.files("kvckpt_web").joinpath("shaders", area, f"{name}.wgsl")
    if packaged.is_file():
        return packaged.read_text(encoding="utf-8")
    in_tree = Path(__file__).resolve().parents[2] / "shaders" / area / f"{name}.wgsl"
    if in_tree.is_file():
        return in_tree.read_text(encoding="utf-8")
    raise DeviceError(f"shader {area}/{name}.wgsl: expected in the kvckpt_web package or ./shaders, got neither")


def pack_params(*values: int) -> bytes:
    """Kernel parameters: u32 values, little-endian, in order (a kernel's ``Params`` struct of u32 fields)."""
    return struct.pack(f"<{len(values)}I", *values)
