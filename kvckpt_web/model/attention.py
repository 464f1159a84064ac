"""Attention of a llama-style model over a :class:`~kvckpt_web.kv.cache.PagedKVCache`.

Per layer of a forward pass, two or three dispatches: :meth:`PagedAttention.rope_append` rotates Q in place and
writes the rotated K and V into the cache pages at the slots ``begin_forward`` reserved
(``shaders/model/rope.wgsl``); :meth:`PagedAttention.attend` then computes causal grouped-query attention of every
new token over its sequence's pages: partial softmax sums over key ranges (``shaders/model/paged_attention.wgsl``),
then their merge in a fixed order (``shaders/model/attention_merge.wgsl``), or where the keys form one range (a
prefill chunk, a decode step at a short context) one dispatch that writes the finished rows. Prefill chunks and
decode steps are the same call: a token attends to every earlier token of its sequence and to itself, through its
page table (in a sliding-window layer to the last ``window`` of them: the pages keep every token's K/V, the older
keys are masked). The dispatches bind the same buffers every time, so the device keeps their bind groups.

How the work is cut (measured on lavapipe, see bench/notes/2026-12-05-model-attention.md): an invocation serves a
tile of up to ``rows_per_tile`` consecutive tokens of one sequence and every query head of one KV head, so each K/V
word it loads serves ``rows_per_tile * group`` rows; each sequence's keys are split into ranges so that its tiles
alone (a decode step: one) make :data:`MIN_INVOCATIONS` invocations (and so that none runs past llvmpipe's loop
budget). The split is a function of the sequence alone, never of the rest of the forward, so a row's sums are the
same bits whether its sequence runs alone or beside others (the batch of a continuous-batching step).

Q/K/V come in TVM's fused layout: one f32 buffer ``qkv`` of ``[num_tokens, num_qo_heads + 2 * num_kv_heads,
head_dim]``, tokens in the order of :class:`~kvckpt_web.kv.cache.ForwardPass`.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence

from ..errors import FieldError, TensorError
from ..gpu.device import Buffer, Dispatch, Kernel, Region, Texture, Usage
from ..gpu.specialize import specialize
from ..gpu.wgsl import source
from ..kv.cache import ForwardPass, PagedKVCache

#: Largest head_dim the attention kernel holds in registers (per invocation, ``rows_per_tile * group`` rows of Q
#: and of the output): Gemma 3's 256.
MAX_HEAD_DIM = 256
#: Heads wider than this take proportionally fewer rows per invocation than :data:`ROW_HEADS` and
#: :data:`MAX_ROW_HEADS` (the registers a row takes grow with head_dim, and the kernel's compile time with them).
WIDE_HEAD_DIM = 128
#: Bytes of one token's record in the ``tokens`` buffer (vec4<u32>: position, slot, page table offset, unused).
TOKEN_RECORD_BYTES = 16
#: Bytes of one tile's record in the ``tiles`` buffer (vec2<u32>: first token, rows).
TILE_RECORD_BYTES = 8
#: llvmpipe (lavapipe) ends a shader invocation's loops once all its loops together have run 65535 iterations
#: (its LP_MAX_TGSI_LOOP_ITERATIONS), silently; the key loop is paged_attention.wgsl's only loop, so a key range
#: is cut below that.
MAX_KEYS_PER_SPLIT = 65535 - 1
#: Query rows (tokens x query heads of one KV head) an invocation serves by default, and at most: more rows share
#: each K/V load but take longer to compile. For 9/3 heads of head_dim 64 on lavapipe, a 1024-token prefill chunk
#: took 304 ms a layer with 12 rows (4 tokens) and 215 ms with 24 (8 tokens), whose kernel took 7 s and 40 s to
#: compile the first time on a machine (Mesa keeps compiled kernels on disk).
ROW_HEADS = 12
MAX_ROW_HEADS = 24
#: Tokens per tile at most.
MAX_ROWS_PER_TILE = 8
#: A sequence's key range is split until its tiles make this many invocations (a decode step: one tile).
MIN_INVOCATIONS = 96
#: ... but no range is cut shorter than this many keys (each split costs a partial record per row and a merge step).
MIN_KEYS_PER_SPLIT = 16
#: Invocations per workgroup of the attention kernels: lavapipe runs each workgroup on one thread, and a decode
#: step has ~100 invocations, a prefill chunk a few hundred, so small workgroups keep every thread busy.
WORKGROUP = 8


def rope_inv_freq(head_dim: int, theta: float, scale: float) -> list[float]:
    """RoPE's per-pair angle rate for rope_mode "normal": ``scale / theta ** (2 * i / head_dim)``, i < head_dim / 2
    (TVM's ``rope_freq_default`` with its position scale folded in)."""
    return [scale / theta ** (2 * i / head_dim) for i in range(head_dim // 2)]


class PagedAttention:
    """The RoPE/K-V write and attention dispatches of forward passes over ``cache``.

    The dispatches of a forward read a per-token table and the sequences' page tables that are uploaded when
    the first of them is built after ``begin_forward``; submit them before the next ``begin_forward``.
    ``rows_per_tile`` (tokens per tile) and ``keys_per_split`` (the longest key range of an invocation) override
    the defaults derived from :data:`ROW_HEADS` (up to :data:`MAX_ROW_HEADS`) and :data:`MIN_INVOCATIONS`;
    results agree within float32 rounding whatever they are. A forward of one token per sequence (a decode
    step) uses one-row tiles; each tile size is a kernel of its own, compiled at its first use.

    A model whose layers differ gives, per layer, ``rope_rates`` (RoPE's ``head_dim / 2`` angle rates; default:
    the layout's :func:`rope_inv_freq` for every layer) and ``windows`` (the keys a query of a sliding-window layer
    sees, itself included; 0: all earlier keys, the default), and ``scale`` the factor of Q.K (default
    1/sqrt(head_dim)).
    """

    def __init__(self, cache: PagedKVCache, *, rows_per_tile: int | None = None,
                 keys_per_split: int | None = None, rope_rates: Sequence[Sequence[float]] | None = None,
                 windows: Sequence[int] | None = None, scale: float | None = None) -> None:
        lay = cache.layout
        if lay.dtype != "float16":
            raise FieldError("layout.dtype", "'float16' (the attention kernels read and write float16 pages)",
                             lay.dtype)
        if lay.head_dim % 8 or lay.head_dim > MAX_HEAD_DIM:
            raise FieldError("layout.qk_head_dim", f"a multiple of 8 <= {MAX_HEAD_DIM}", lay.head_dim)
        if lay.rope_mode not in ("normal", "none"):
            raise FieldError("layout.rope_mode", "'normal' or 'none' (the K/V write applies RoPE itself)",
                             lay.rope_mode)
        group = lay.num_qo_heads // lay.num_kv_heads
        wide = max(1, lay.head_dim // WIDE_HEAD_DIM)
        most_rows = max(1, min(MAX_ROWS_PER_TILE, MAX_ROW_HEADS // wide // group))
        rows = max(1, min(MAX_ROWS_PER_TILE, ROW_HEADS // wide // group)) if rows_per_tile is None else rows_per_tile
        if isinstance(rows, bool) or not isinstance(rows, int) or not 1 <= rows <= most_rows:
            raise FieldError("rows_per_tile", f"1..{most_rows} (at most {MAX_ROWS_PER_TILE} tokens and "
                                              f"{MAX_ROW_HEADS // wide} rows of {group} query heads per KV head)",
                             rows_per_tile)
        if keys_per_split is not None and (isinstance(keys_per_split, bool) or not isinstance(keys_per_split, int)
                                           or not 1 <= keys_per_split <= MAX_KEYS_PER_SPLIT):
            raise FieldError("keys_per_split", f"1..{MAX_KEYS_PER_SPLIT}", keys_per_split)
        half = lay.head_dim // 2
        if rope_rates is None:
            default = rope_inv_freq(lay.head_dim, lay.rotary_theta, lay.rotary_scale) if lay.rope_mode == "normal" \
                else [0.0] * half
            rope_rates = [default] * lay.num_layers
        if len(rope_rates) != lay.num_layers or any(len(rates) != half for rates in rope_rates):
            raise FieldError("rope_rates", f"{lay.num_layers} lists (one per layer) of {half} rates",
                             [len(rates) for rates in rope_rates])
        windows = [0] * lay.num_layers if windows is None else list(windows)
        if len(windows) != lay.num_layers or any(isinstance(w, bool) or not isinstance(w, int) or w < 0
                                                 for w in windows):
            raise FieldError("windows", f"{lay.num_layers} integers >= 0 (one per layer)", windows)
        self.windows = windows
        self.scale = 1 / math.sqrt(lay.head_dim) if scale is None else float(scale)
        self.cache = cache
        self.layout = lay
        self.rows_per_tile = rows
        self._max_keys_per_split = MAX_KEYS_PER_SPLIT if keys_per_split is None else keys_per_split
        self._min_keys_per_split = MIN_KEYS_PER_SPLIT if keys_per_split is None else keys_per_split
        device = cache.device
        rates = [rate for layer in rope_rates for rate in layer]
        self._inv_freq = device.create_buffer(4 * len(rates), Usage.STORAGE | Usage.COPY_DST, "attention.inv_freq")
        device.write(self._inv_freq, 0, struct.pack(f"<{len(rates)}f", *rates))
        limits = cache.limits
        self._tokens = device.create_buffer(TOKEN_RECORD_BYTES * limits.prefill_chunk_size,
                                            Usage.STORAGE | Usage.COPY_DST, "attention.tokens")
        self._page_table = device.create_buffer(4 * limits.reserved_num_seqs * cache.num_total_pages,
                                                Usage.STORAGE | Usage.COPY_DST, "attention.page_table")
        self._tiles = device.create_buffer(TILE_RECORD_BYTES * limits.prefill_chunk_size,
                                           Usage.STORAGE | Usage.COPY_DST, "attention.tiles")
        self._partial: Buffer | None = None  # grown to the largest forward's partial records
        self._uploaded: ForwardPass | None = None
        self._kernels: dict[tuple[str, int], Kernel] = {}  # (kind, tile rows) -> kernel
        self._workgroup = WORKGROUP
        self._num_tiles = 0
        self._tile_rows = 0
        self._num_splits = 0

    @property
    def qkv_bytes_per_token(self) -> int:
        """Bytes of one token's row of ``qkv``."""
        lay = self.layout
        return 4 * (lay.num_qo_heads + 2 * lay.num_kv_heads) * lay.head_dim


    def close(self) -> None:
        """Release this object's device buffers (the cache stays)."""
        for buf in (self._inv_freq, self._tokens, self._page_table, self._tiles, self._partial):
            if buf is not None:
                self.cache.device.destroy(buf)

    def _forward(self) -> ForwardPass:
        """The cache's forward pass, its token records, page tables and tiles uploaded and its key split chosen
        once."""
        fwd = self.cache.current_forward()
        if fwd is self._uploaded:
            return fwd
        table: list[int] = []
        records: list[int] = []
        tiles: list[int] = []
        token = 0
        self._tile_rows = 1 if max(fwd.lengths, default=1) == 1 else self.rows_per_tile
        splits = []
        for seq_id, length in zip(fwd.seq_ids, fwd.lengths):
            offset = len(table)
            table += self.cache.page_table(seq_id)
            for row in range(0, length, self._tile_rows):
                tiles += (token + row, min(self._tile_rows, length - row))
            keys = fwd.positions[token + length - 1] + 1
            keys_per_split = self._split_of(keys, -(-length // self.rows_per_tile))
            splits.append(-(-keys // keys_per_split))
            for _ in range(length):
                records += (fwd.positions[token], fwd.slots[token], offset, keys_per_split)
                token += 1
        device = self.cache.device
        device.write(self._tokens, 0, struct.pack(f"<{len(records)}I", *records))
        device.write(self._page_table, 0, struct.pack(f"<{len(table)}I", *table))
        device.write(self._tiles, 0, struct.pack(f"<{len(tiles)}I", *tiles))
        self._num_tiles = len(tiles) // 2
        self._num_splits = max(splits, default=1)
        need = max(1, fwd.num_tokens) * self.layout.num_qo_heads * self._num_splits * self._record_bytes
        if self._partial is None or self._partial.size < need:
            if self._partial is not None:
                device.destroy(self._partial)
            self._partial = device.create_buffer(need, Usage.STORAGE, "attention.partial")
        self._uploaded = fwd
        return fwd

    def _split_of(self, keys: int, tiles: int) -> int:
        """The keys per split of a sequence's ``keys`` keys, read by ``tiles`` tiles: enough splits that its tiles
        alone make :data:`MIN_INVOCATIONS` invocations. A function of the sequence alone, so that its rows get the
        same bits whatever else the forward runs."""
        wanted_splits = -(-MIN_INVOCATIONS // (tiles * self.layout.num_kv_heads))
        return min(self._max_keys_per_split, max(self._min_keys_per_split, -(-keys // wanted_splits)))

    @property
    def _record_bytes(self) -> int:
        """Bytes of one partial record: head_dim / 4 vec4 of weighted V, one vec4 (maximum, sum of weights)."""
        return 16 * (self.layout.head_dim // 4 + 1)

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
        kernel = device.kernel("rope", source("model", "rope"), "rope_append")
        params = struct.pack("<6I", fwd.num_tokens, lay.num_qo_heads, lay.num_kv_heads, lay.head_dim, lay.page_size,
                             layer * (lay.head_dim // 2))
        heads = lay.num_qo_heads + 2 * lay.num_kv_heads
        return Dispatch(kernel, params, (qkv, pages, self._tokens, self._inv_freq),
                        fwd.num_tokens * heads * (lay.head_dim // 2), keep_bindings=True)

    def attend(self, layer: int, qkv: Buffer | Region, out: Texture) -> list[Dispatch]:
        """The dispatches that write into ``out`` (an activation texture: token t's ``num_qo_heads * head_dim``
        outputs, head after head, in row t) each new token's attention over its sequence's K/V in ``layer``'s
        pages, positions 0 to its own, with the (rotated) Q of ``qkv``: partial sums over key ranges and their
        merge, or where the keys form one range a single dispatch that writes the finished rows (the same bits).
        Submit them in order."""
        fwd = self._forward()
        pages = self._layer(layer)
        self._check_rows("qkv", qkv, self.qkv_bytes_per_token, fwd.num_tokens)
        lay = self.layout
        if out.channels != 4 or out.width * 4 < lay.num_qo_heads * lay.head_dim or out.height < fwd.num_tokens:
            raise TensorError("out: texture", f"{fwd.num_tokens} rows of {lay.num_qo_heads * lay.head_dim} "
                                              "activations", f"{out.width} x {out.height} of {out.channels}")
        splits = self._num_splits
        params = struct.pack("<4I4xIfI", self._num_tiles, lay.num_qo_heads, lay.num_kv_heads, lay.page_size, splits,
                             self.scale, self.windows[layer] or 0xFFFFFFFF)
        invocations = self._num_tiles * lay.num_kv_heads * splits
        tables = (qkv, pages, self._tokens, self._page_table, self._tiles)
        if splits == 1:
            return [Dispatch(self._kernel("attend", self._tile_rows), params, tables + (out,), invocations,
                             keep_bindings=True, workgroup_size=self._workgroup)]
        out_rows = fwd.num_tokens * lay.num_qo_heads
        # the whole partial buffer is bound (not the forward's share of it), so its bind group can be kept
        return [Dispatch(self._kernel("partial", self._tile_rows), params, tables + (self._partial,), invocations,
                         keep_bindings=True, workgroup_size=self._workgroup),
                Dispatch(self._kernel("merge"), struct.pack("<2I4xI", out_rows, lay.num_qo_heads, splits),
                         (self._partial, self._tokens, out), out_rows * lay.head_dim // 4, keep_bindings=True,
                         workgroup_size=self._workgroup)]

    def _kernel(self, kind: str, rows: int = 0) -> Kernel:
        """The kernel ``kind``, specialised once: "partial" (partial sums, tiles of ``rows`` tokens), "attend"
        (the same writing finished rows: one key range), or "merge"."""
        kernel = self._kernels.get((kind, rows))
        if kernel is None:
            lay = self.layout
            device = self.cache.device
            quads = lay.head_dim // 4
            if kind == "merge":
                kernel = device.kernel("attention_merge", specialize(source("model", "attention_merge"),
                                                                     dict(QUADS=quads, WG=self._workgroup)), "merge")
            else:
                group = lay.num_qo_heads // lay.num_kv_heads
                kernel = device.kernel("paged_attention", specialize(source("model", "paged_attention"), dict(
                    QUADS=quads, WORDS=quads // 2, GROUP=group, ROWS=rows, N=rows * group,
                    DIRECT=int(kind == "attend"), WG=self._workgroup)), "attend")
            self._kernels[kind, rows] = kernel
        return kernel
