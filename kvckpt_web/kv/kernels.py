"""The page kernels and the Python side of their bindings.

Their WGSL lives in ``shaders/kv/*.wgsl``, one kernel family per file. Each function here builds a
:class:`~kvckpt_web.gpu.device.Dispatch` whose uniform parameters match the ``Params`` struct of its file.
"""

from __future__ import annotations

from ..gpu.device import Buffer, Device, Dispatch, Region
from ..gpu.wgsl import pack_params, source


def elem_shift(elem_bytes: int) -> int:
    """log2 of elements per u32 word: 1 for 16-bit elements, 0 for 32-bit."""
    return {2: 1, 4: 0}[elem_bytes]


def page_copy(device: Device, entry: str, *, pages: Buffer | Region, page_table: Buffer, dense: Buffer, num_pages: int,
              words_per_page: int, tail_tokens: int, elem_bytes: int, head_dim: int, page_size: int,
              dense_word_offset: int, table_offset: int = 0) -> Dispatch:
    """A ``pack`` or ``scatter`` dispatch of ``page_copy.wgsl`` over ``num_pages`` pages: its vec4 form
    (``pack4``/``scatter4``) where the pages and ``dense_word_offset`` are whole 16-byte units."""
    per_invocation = 4 if words_per_page % 4 == 0 and dense_word_offset % 4 == 0 else 1
    kernel = device.kernel("page_copy", source("kv", "page_copy"), entry + ("4" if per_invocation == 4 else ""))
    params = pack_params(num_pages, words_per_page, tail_tokens, elem_shift(elem_bytes), head_dim, page_size,
                     dense_word_offset, table_offset)
    return Dispatch(kernel, params, (pages, page_table, dense), num_pages * words_per_page // per_invocation)


def kv_append(device: Device, *, pages: Buffer | Region, positions: Buffer, kv: Buffer, num_tokens: int, num_kv_heads: int,
              head_dim: int, page_size: int, elem_bytes: int) -> Dispatch:
    """An ``append`` dispatch of ``kv_append.wgsl`` writing ``num_tokens`` K and V rows into ``pages``."""
    kernel = device.kernel("kv_append", source("kv", "kv_append"), "append")
    shift = elem_shift(elem_bytes)
    aligned = (head_dim * elem_bytes) % 4 == 0
    units = head_dim >> shift if aligned else head_dim
    params = pack_params(num_tokens, num_kv_heads, head_dim, page_size, shift, int(aligned),
                     num_tokens * num_kv_heads * head_dim, units)
    return Dispatch(kernel, params, (pages, positions, kv), 2 * num_tokens * num_kv_heads * units)
