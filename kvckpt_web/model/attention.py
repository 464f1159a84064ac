"""Attention of a llama-style model over a :class:`~kvckpt_web.cache.PagedKVCache`.

Per layer of a forward pass, two dispatches: :meth:`PagedAttention.rope_append` rotates Q in place and writes
the rotated K and V into the cache pages at the slots ``begin_forward`` reserved (``shaders/model/rope.wgsl``);
:meth:`PagedAttention.attend` then computes causal grouped-query attention of every new token over its
sequence's pages (``shaders/model/paged_attention.wgsl``). Prefill chunks and decode steps are the same call:
a token attends to every earlier token of its sequence and to itself, through its page table.

Q/K/V come in TVM's fused layout: one f32 buffer ``qkv`` of ``[num_tokens, num_qo_heads + 2 * num_kv_heads,
head_dim]``, tokens in the order of :class:`~kvckpt_web.cache.ForwardPass`.
"""

from __future__ import annotations

import math
import struct

from ..cache import ForwardPass, PagedKVCache
from ..device import Buffer, Dispatch, Region, Usage
from ..errors import FieldError, TensorError
from ..shaders import source

#: Largest head_dim the attention kernel holds in registers (``MAX_PAIRS`` pairs in paged_attention.wgsl).
MAX_HEAD_DIM = 128
#: Bytes of one token's record in the ``tokens`` buffer (vec4<u32>: position, slot, page table offset, unused).
TOKEN_RECORD_BYTES = 16


def rope_inv_freq(head_dim: int, theta: float, scale: float) -> list[float]:
    """RoPE's per-pair angle rate for rope_mode "normal": ``scale / theta ** (2 * i / head_dim)``, i < head_dim / 2
    (TVM's ``rope_freq_default`` with its position scale folded in)."""
    return [scale / theta ** (2 * i / head_dim) for i in range(head_dim // 2)]


class PagedAttention:
    """The RoPE/K-V write and attention dispatches of forward passes over ``cache``.

    The dispatches of a forward read a per-token table and the sequences' page tables that are uploaded when
    the first of them is built after ``begin_forward``; submit them before the next ``begin_forward``.
    """

    def __init__(self, cache: PagedKVCache) -> None:
        lay = cache.layout
        if lay.dtype != "float16":
            raise FieldError("layout.dtype", "'float16' (the attention kernels read and write float16 pages)",
                             lay.dtype)
        if lay.head_dim % 2 or lay.head_dim > MAX_HEAD_DIM:
            raise FieldError("layout.qk_head_dim", f"an even number <= {MAX_HEAD_DIM}", lay.head_dim)
        if lay.num_qo_heads % lay.num_kv_heads:
            raise FieldError("layout.num_qo_heads", f"a multiple of num_kv_heads={lay.num_kv_heads}",
                             lay.num_qo_heads)
        if lay.rope_mode not in ("normal", "none"):
            raise FieldError("layout.rope_mode", "'normal' or 'none' (the K/V write applies RoPE itself)",
                             lay.rope_mode)
        self.cache = cache
        self.layout = lay
        device = cache.device
        rates = rope_inv_freq(lay.head_dim, lay.rotary_theta, lay.rotary_scale) if lay.rope_mode == "normal" \
            else [0.0] * (lay.head_dim // 2)
        self._inv_freq = device.create_buffer(4 * len(rates), Usage.STORAGE | Usage.COPY_DST, "attention.inv_freq")
        device.write(self._inv_freq, 0, struct.pack(f"<{len(rates)}f", *rates))
        limits = cache.limits
        self._tokens = device.create_buffer(TOKEN_RECORD_BYTES * limits.prefill_chunk_size,
                                            Usage.STORAGE | Usage.COPY_DST, "attention.tokens")
        self._page_table = device.create_buffer(4 * limits.reserved_num_seqs * cache.num_total_pages,
                                                Usage.STORAGE | Usage.COPY_DST, "attention.page_table")
        self._uploaded: ForwardPass | None = None

    @property
    def qkv_bytes_per_token(self) -> int:
        """Bytes of one token's row of ``qkv``."""
        lay = self.layout
        return 4 * (lay.num_qo_heads + 2 * lay.num_kv_heads) * lay.head_dim

    @property
    def out_bytes_per_token(self) -> int:
        """Bytes of one token's row of the attention output."""
        return 4 * self.layout.num_qo_heads * self.layout.head_dim

    def close(self) -> None:
        """Release this object's device buffers (the cache stays)."""
        for buf in (self._inv_freq, self._tokens, self._page_table):
            self.cache.device.destroy(buf)

    def _forward(self) -> ForwardPass:
        """The cache's forward pass, its token records and page tables uploaded once."""
        fwd = self.cache.current_forward()
        if fwd is self._uploaded:
            return fwd
        table: list[int] = []
        records: list[int] = []
        token = 0
        for seq_id, length in zip(fwd.seq_ids, fwd.lengths):
            offset = len(table)
            table += self.cache.page_table(seq_id)
            for _ in range(length):
                records += (fwd.positions[token], fwd.slots[token], offset, 0)
                token += 1
        device = self.cache.device
        device.write(self._tokens, 0, struct.pack(f"<{len(records)}I", *records))
        device.write(self._page_table, 0, struct.pack(f"<{len(table)}I", *table))
        self._uploaded = fwd
        return fwd

    def _check_rows(self, name: str, target: Buffer | Region, per_token: int, num_tokens: int) -> None:
        if target.size < per_token * num_tokens:
            raise TensorError(f"{name}.size", f"at least {per_token * num_tokens} bytes ({num_tokens} tokens of "
                                              f"{per_token})", target.size)

    def _layer(self, layer: int) -> Region:
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.layout.num_layers:
            raise TensorError("layer", f"0..{self.layout.num_layers - 1}", layer)
        return self.cache.layers[layer]

    def rope_append(self, layer: int, qkv: Buffer | Region) -> Dispatch:
        """Rotate the Q of ``qkv`` in place and write the rotated K and the V into ``layer``'s pages."""
        fwd = self._forward()
        pages = self._layer(layer)
        self._check_rows("qkv", qkv, self.qkv_bytes_per_token, fwd.num_tokens)
        lay = self.layout
        device = self.cache.device
        kernel = device.kernel("rope", source("model/rope"), "rope_append")
        params = struct.pack("<5I", fwd.num_tokens, lay.num_qo_heads, lay.num_kv_heads, lay.head_dim, lay.page_size)
        heads = lay.num_qo_heads + 2 * lay.num_kv_heads
        return Dispatch(kernel, params, (qkv, pages, self._tokens, self._inv_freq),
                        fwd.num_tokens * heads * (lay.head_dim // 2))

    def attend(self, layer: int, qkv: Buffer | Region, out: Buffer | Region) -> Dispatch:
        """Write into ``out`` (f32 ``[num_tokens, num_qo_heads, head_dim]``) each new token's attention over
        its sequence's K/V in ``layer``'s pages, positions 0 to its own, with the (rotated) Q of ``qkv``."""
        fwd = self._forward()
        pages = self._layer(layer)
        self._check_rows("qkv", qkv, self.qkv_bytes_per_token, fwd.num_tokens)
        self._check_rows("out", out, self.out_bytes_per_token, fwd.num_tokens)
        lay = self.layout
        device = self.cache.device
        kernel = device.kernel("paged_attention", source("model/paged_attention"), "attend")
        params = struct.pack("<5If", fwd.num_tokens, lay.num_qo_heads, lay.num_kv_heads, lay.head_dim,
                             lay.page_size, 1 / math.sqrt(lay.head_dim))
        return Dispatch(kernel, params, (qkv, pages, self._tokens, self._page_table, out),
                        fwd.num_tokens * lay.num_qo_heads)
