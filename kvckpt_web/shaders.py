"""The WGSL kernels and the Python side of their bindings.

WGSL sources live in ``shaders/*.wgsl`` (inside the wheel at ``kvckpt_web/shaders``),
one kernel family per file; a model's kernels in ``shaders/model/``. Each function here
builds a :class:`~kvckpt_web.device.Dispatch` whose uniform parameters match the ``Params``
struct of its file.
"""

from __future__ import annotations

import functools
import struct
from importlib import resources
from pathlib import Path

from .device import Buffer, Device, Dispatch, Region
from .errors import DeviceError


@functools.cache
def source(name: str) -> str:
    """The text of ``shaders/<name>.wgsl`` (``name`` may name a subfolder: ``"model/matmul"``), from the
    installed package or the source tree."""
    parts = name.split("/")
    parts[-1] += ".wgsl"
    packaged = resources.files("kvckpt_web").joinpath("shaders", *parts)
    if packaged.is_file():
        return packaged.read_text(encoding="utf-8")
    in_tree = Path(__file__).resolve().parent.parent.joinpath("shaders", *parts)
    if in_tree.is_file():
        return in_tree.read_text(encoding="utf-8")
    raise DeviceError(f"shader {name}.wgsl: expected in the kvckpt_web package or ./shaders, got neither")


def elem_shift(elem_bytes: int) -> int:
    """log2 of elements per u32 word: 1 for 16-bit elements, 0 for 32-bit."""
    return {2: 1, 4: 0}[elem_bytes]


def pack_params(*values: int) -> bytes:
    """Kernel parameters: u32 values, little-endian, in order."""
    return struct.pack(f"<{len(values)}I", *values)


def page_copy(device: Device, entry: str, *, pages: Buffer | Region, page_table: Buffer, dense: Buffer, num_pages: int,
              words_per_page: int, tail_tokens: int, elem_bytes: int, head_dim: int, page_size: int,
              dense_word_offset: int, table_offset: int = 0) -> Dispatch:
    """A ``pack`` or ``scatter`` dispatch of ``page_copy.wgsl`` over ``num_pages`` pages: its vec4 form
    (``pack4``/``scatter4``) where the pages and ``dense_word_offset`` are whole 16-byte units."""
    per_invocation = 4 if words_per_page % 4 == 0 and dense_word_offset % 4 == 0 else 1
    kernel = device.kernel("page_copy", source("page_copy"), entry + ("4" if per_invocation == 4 else ""))
    params = pack_params(num_pages, words_per_page, tail_tokens, elem_shift(elem_bytes), head_dim, page_size,
                     dense_word_offset, table_offset)
    return Dispatch(kernel, params, (pages, page_table, dense), num_pages * words_per_page // per_invocation)


def kv_append(device: Device, *, pages: Buffer | Region, positions: Buffer, kv: Buffer, num_tokens: int, num_kv_heads: int,
              head_dim: int, page_size: int, elem_bytes: int) -> Dispatch:
    """An ``append`` dispatch of ``kv_append.wgsl`` writing ``num_tokens`` K and V rows into ``pages``."""
    kernel = device.kernel("kv_append", source("kv_append"), "append")
    shift = elem_shift(elem_bytes)
    aligned = (head_dim * elem_bytes) % 4 == 0
    units = head_dim >> shift if aligned else head_dim
    params = pack_params(num_tokens, num_kv_heads, head_dim, page_size, shift, int(aligned),
                     num_tokens * num_kv_heads * head_dim, units)
    return Dispatch(kernel, params, (pages, positions, kv), 2 * num_tokens * num_kv_heads * units)
