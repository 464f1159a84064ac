"""Reference harness around Apache TVM's real ``PagedAttentionKVCache`` on CPU.

The harness builds the cache through ``vm.builtin.paged_attention_kv_cache_create``
with TVM's own TIR kernels compiled for ``llvm``, so K/V data genuinely lives in
TVM's paged storage and every checkpoint call runs TVM's C++ implementation.
It exists so tests can check wire compatibility (metadata JSON, layout hash,
page-group bytes) against the upstream runtime.

What ends up stored when appending (``TVMCache.append``):

* V is stored exactly as given, in every RoPE mode.
* K is stored exactly as given with ``rope_mode`` NONE (0) or INLINE (2).
* With ``rope_mode`` NORMAL (1) TVM rotates K before storing it: the stored
  row at sequence position ``p`` is ``rope_reference(k, p)`` (Llama-style
  "rotate half" RoPE over the full head dimension, frequency
  ``p * rotary_scale / rotary_theta ** (2i / head_dim)``, computed in float32 and
  cast to the cache dtype). ``rope_reference`` reproduces it up to last-bit
  rounding of ``sin``/``cos``.

``debug_get_kv`` always returns what is actually stored.

Limitations inherited from TVM 0.27: checkpoint functions only accept sequence
id 0; ``prepare_import`` clears the *whole* cache (every sequence) before
restoring sequence 0; one forward pass may append at most
``prefill_chunk_size`` tokens in total and hold at most ``reserved_num_seqs``
sequences.
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any, Callable, Union

import numpy as np

ROPE_NONE = 0
ROPE_NORMAL = 1
ROPE_INLINE = 2

#: Seconds spent compiling each distinct kernel, keyed like the kernel cache.
COMPILE_SECONDS: dict[tuple, float] = {}

ArrayLike = Any
KVPair = tuple[ArrayLike, ArrayLike]
KVBatch = Union[Mapping[int, KVPair], Sequence[KVPair]]


def tvm_available() -> bool:
    """Return True when Apache TVM (with its Python frontend) can be imported."""
    try:
        import tvm  # noqa: F401
        import tvm_ffi  # noqa: F401
    except ImportError:
        return False
    return True


# --------------------------------------------------------------------------- kernels


def _kernel_factories() -> dict[str, Callable[..., Any]]:
    """Map kernel names to the TVM factory producing their TIR PrimFunc."""
    from tvm.relax.frontend.nn.llm import kv_cache as kvc
    from tvm.relax.frontend.nn.llm.position_embedding import llama_rope_with_position_map

    return {
        # (num_kv_heads, head_dim, dtype, page_size)
        "transpose_append": lambda h, d, dt, p: kvc._kv_cache_transpose_append(h, d, dt, p),
        # (num_layers, num_kv_heads, head_dim, dtype)
        "debug_get_kv": lambda n, h, d, dt: kvc._kv_cache_debug_get_kv(n, h, d, dt),
        # (num_kv_heads, page_size, head_dim, dtype)
        "copy_single_page": lambda h, p, d, dt: kvc._copy_single_page_cpu(h, p, d, dt),
        # (num_kv_heads, head_dim, dtype, page_size)
        "compact_copy": lambda h, d, dt, p: kvc._compact_kv_copy_cpu(h, d, dt, p),
        # (rotary_theta, rotary_scale, head_dim, num_qo_heads, num_kv_heads, dtype)
        "split_rotary": lambda th, sc, d, hq, h, dt: llama_rope_with_position_map(
            th, sc, d, hq, h, dt, {}
        ),
        # (dtype,)
        "merge_state": lambda dt: kvc._merge_state_inplace_cpu(dt),
        # (num_kv_heads, num_qo_heads, head_dim, dtype, page_size)
        "prefill_paged": lambda h, hq, d, dt, p: kvc._attention_prefill_cpu(
            h, hq, d, dt, False, {}, p
        ),
        "decode_paged": lambda h, hq, d, dt, p: kvc._attention_decode_cpu(
            h, hq, d, dt, False, {}, p
        ),
        # (num_kv_heads, num_qo_heads, head_dim, dtype)
        "prefill_ragged": lambda h, hq, d, dt: kvc._attention_prefill_ragged_cpu(
            h, hq, d, d, dt, {}
        ),
    }


@functools.lru_cache(maxsize=None)
def compiled_kernel(name: str, *params: Any) -> Any:
    """Compile (once per process) one of TVM's CPU cache kernels; return its function."""
    import tvm

    start = time.perf_counter()
    prim_func = _kernel_factories()[name](*params)
    module = tvm.tirx.build(prim_func, target="llvm")
    COMPILE_SECONDS[(name, *params)] = time.perf_counter() - start
    return module[module.entry_name]


# --------------------------------------------------------------------------- RoPE reference


def rope_reference(
    x: ArrayLike,
    positions: ArrayLike,
    *,
    rotary_scale: float = 1.0,
    rotary_theta: float = 10000.0,
) -> np.ndarray:
    """Rotate ``x`` (…, n, num_heads, head_dim) like TVM's NORMAL-mode K rotation.

    ``positions`` gives the sequence position of each of the ``n`` rows. The
    result keeps ``x``'s dtype; arithmetic is float32 as in TVM's kernel.
    """
    x = np.asarray(x)
    head_dim = x.shape[-1]
    half = head_dim // 2
    pos = np.asarray(positions, dtype=np.int32).astype(np.float32) * np.float32(rotary_scale)
    d = np.arange(head_dim)
    exponent = ((d * 2) % head_dim).astype(np.float32) / np.float32(head_dim)
    inv = np.power(np.float32(rotary_theta), exponent, dtype=np.float32)
    freq = (pos[:, None] / inv[None, :]).astype(np.float32)  # (n, head_dim)
    cos = np.cos(freq)[:, None, :]
    sin = np.sin(freq)[:, None, :]
    xf = x.astype(np.float32)
    rotated = np.concatenate([-xf[..., half:], xf[..., :half]], axis=-1)
    return (cos * xf + sin * rotated).astype(x.dtype)


# --------------------------------------------------------------------------- cache


class TVMCache:
    """One TVM ``PagedAttentionKVCache`` (MHA/GQA, CPU) holding real K/V data.

    Layers are addressed locally (0 … num_layers-1) in every array and page
    group; TVM's global layer ids are ``layer_begin + local``. Raw TVM errors
    (``tvm.error.InternalError``) propagate unchanged.
    """

    def __init__(
        self,
        *,
        page_size: int,
        num_layers: int,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: str = "float16",
        layer_begin: int = 0,
        rope_mode: int = ROPE_NORMAL,
        rotary_scale: float = 1.0,
        rotary_theta: float = 10000.0,
        reserved_num_seqs: int = 4,
        max_total_seq_len: int = 512,
        prefill_chunk_size: int = 128,
    ) -> None:
        import tvm
        import tvm_ffi

        self._tvm = tvm
        self._tvm_ffi = tvm_ffi
        self.page_size = int(page_size)
        self.num_layers = int(num_layers)
        self.layer_begin = int(layer_begin)
        self.layer_end = self.layer_begin + self.num_layers
        self.num_qo_heads = int(num_qo_heads)
        self.num_kv_heads = int(num_kv_heads)
        self.head_dim = int(head_dim)
        self.dtype = str(dtype)
        self.np_dtype = np.dtype(self.dtype).newbyteorder("<")
        self.rope_mode = int(rope_mode)
        self.rotary_scale = float(rotary_scale)
        self.rotary_theta = float(rotary_theta)
        self.reserved_num_seqs = int(reserved_num_seqs)
        self.max_total_seq_len = int(max_total_seq_len)
        self.prefill_chunk_size = int(prefill_chunk_size)
        self.num_total_pages = -(-self.max_total_seq_len // self.page_size) + 1
        self._device = tvm.cpu()
        self._import_num_pages: int | None = None

        h, hq, d, dt, p = self.num_kv_heads, self.num_qo_heads, self.head_dim, self.dtype, self.page_size
        k = compiled_kernel
        # attn_kinds is indexed by *global* layer id inside TVM, so it covers [0, layer_end).
        attn_kinds = tvm_ffi.Shape([0] * self.layer_end)  # 0 == AttnKind.MHA
        self._obj = tvm.get_global_func("vm.builtin.paged_attention_kv_cache_create")(
            tvm_ffi.Shape(
                [self.reserved_num_seqs, self.max_total_seq_len, self.prefill_chunk_size, p, 0]
            ),
            tvm_ffi.Shape([self.layer_begin, self.layer_end]),
            hq,
            h,
            d,
            d,
            attn_kinds,
            False,  # enable_kv_transfer
            self.rope_mode,
            self.rotary_scale,
            self.rotary_theta,
            None,  # rope_ext_factors
            tvm.runtime.empty((), dt, device=self._device),
            k("transpose_append", h, d, dt, p),
            None,  # transpose_append_mla
            ["tirx", k("prefill_ragged", h, hq, d, dt)],
            ["tirx", k("prefill_paged", h, hq, d, dt, p)],
            ["tirx", k("decode_paged", h, hq, d, dt, p)],
            [],  # prefill_sliding_window
            [],  # decode_sliding_window
            [],  # prefill_with_tree_mask_paged_kv
            [],  # prefill_with_tree_mask
            [],  # mla_prefill
            [k("merge_state", dt)],
            k("split_rotary", self.rotary_theta, self.rotary_scale, d, hq, h, dt),
            k("copy_single_page", h, p, d, dt),
            k("debug_get_kv", self.num_layers, h, d, dt),
            k("compact_copy", h, d, dt, p),
        )

    # ------------------------------------------------------------------ helpers

    def _call(self, name: str, *args: Any) -> Any:
        """Invoke the TVM global function ``name`` on this cache."""
        return self._tvm.get_global_func(name)(self._obj, *args)

    def _empty(self, shape: Sequence[int]) -> Any:
        return self._tvm.runtime.empty(tuple(shape), self.dtype, device=self._device)

    def _to_tvm(self, array: np.ndarray) -> Any:
        return self._tvm.runtime.tensor(np.ascontiguousarray(array), device=self._device)

    @property
    def bytes_per_page(self) -> int:
        """Bytes of one logical page in one page group (K and V, all heads)."""
        return 2 * self.num_kv_heads * self.page_size * self.head_dim * self.np_dtype.itemsize

    def num_logical_pages(self, seq_length: int) -> int:
        """Pages a sequence of ``seq_length`` tokens occupies in a checkpoint."""
        return -(-int(seq_length) // self.page_size)

    # ------------------------------------------------------------------ sequences

    def add_sequence(self, seq_id: int) -> None:
        """Add an empty sequence."""
        self._call("vm.builtin.kv_state_add_sequence", int(seq_id))

    def remove_sequence(self, seq_id: int) -> None:
        """Remove a sequence and release the pages only it referenced."""
        self._call("vm.builtin.kv_state_remove_sequence", int(seq_id))

    def fork_sequence(self, parent_id: int, child_id: int, fork_pos: int = -1) -> None:
        """Create ``child_id`` sharing the first ``fork_pos`` tokens of ``parent_id`` (-1: all)."""
        self._call("vm.builtin.kv_state_fork_sequence", int(parent_id), int(child_id), int(fork_pos))

    def popn(self, seq_id: int, n: int) -> None:
        """Drop the last ``n`` tokens of a sequence."""
        self._call("vm.builtin.kv_state_popn", int(seq_id), int(n))

    def clear(self) -> None:
        """Remove every sequence."""
        self._call("vm.builtin.kv_state_clear")

    def get_num_available_pages(self) -> int:
        """Free pages left in TVM's page pool."""
        return int(self._call("vm.builtin.attention_kv_cache_get_num_available_pages"))

    def get_total_sequence_length(self) -> int:
        """Sum of the lengths of all sequences."""
        return int(self._call("vm.builtin.attention_kv_cache_get_total_sequence_length"))

    # ------------------------------------------------------------------ K/V data

    def _normalise_batch(self, seq_ids: Sequence[int], kv: KVBatch) -> list[tuple[np.ndarray, np.ndarray]]:
        pairs = [kv[s] for s in seq_ids] if isinstance(kv, Mapping) else list(kv)
        if len(pairs) != len(seq_ids):
            raise ValueError(f"got K/V for {len(pairs)} sequences but {len(seq_ids)} seq_ids")
        out = []
        for seq_id, (k, v) in zip(seq_ids, pairs):
            k_arr = np.asarray(k, dtype=self.np_dtype)
            v_arr = np.asarray(v, dtype=self.np_dtype)
            expected = (self.num_layers, k_arr.shape[1] if k_arr.ndim == 4 else -1,
                        self.num_kv_heads, self.head_dim)
            if k_arr.shape != expected or v_arr.shape != expected or k_arr.shape[1] < 1:
                raise ValueError(
                    f"seq {seq_id}: K and V must both be shaped (num_layers={self.num_layers}, "
                    f"n>=1, num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}); "
                    f"got {k_arr.shape} and {v_arr.shape}"
                )
            out.append((k_arr, v_arr))
        return out

    def append(self, seq_ids: Sequence[int], kv: KVBatch) -> None:
        """Run one forward pass appending caller-chosen K/V to every sequence in ``seq_ids``.

        ``kv`` holds, per sequence (aligned with ``seq_ids`` or keyed by seq id),
        a pair ``(k, v)`` of arrays shaped (num_layers, n_i, num_kv_heads,
        head_dim) (a list of per-layer (n_i, H, D) arrays works too), converted
        to the cache dtype. Each
        layer runs TVM's fused-QKV attention with zero queries; see the module
        docstring for how K is stored under each RoPE mode.
        """
        seq_ids = [int(s) for s in seq_ids]
        pairs = self._normalise_batch(seq_ids, kv)
        lengths = [k.shape[1] for k, _ in pairs]
        total = sum(lengths)
        if total > self.prefill_chunk_size:
            raise ValueError(
                f"one forward can append at most prefill_chunk_size={self.prefill_chunk_size} "
                f"tokens, got {total}"
            )
        tvm_ffi = self._tvm_ffi
        attention = self._tvm.get_global_func("vm.builtin.attention_kv_cache_attention_with_fused_qkv")
        sm_scale = 1.0 / math.sqrt(self.head_dim)
        q = np.zeros((total, self.num_qo_heads, self.head_dim), dtype=self.np_dtype)
        self._call("vm.builtin.kv_state_begin_forward", tvm_ffi.Shape(seq_ids), tvm_ffi.Shape(lengths))
        try:
            for layer in range(self.num_layers):
                k_cat = np.concatenate([k[layer] for k, _ in pairs], axis=0)
                v_cat = np.concatenate([v[layer] for _, v in pairs], axis=0)
                qkv = np.concatenate([q, k_cat, v_cat], axis=1)
                out = self._empty((total, self.num_qo_heads, self.head_dim))
                attention(self._obj, self.layer_begin + layer, sm_scale, self._to_tvm(qkv), out)
        finally:
            self._call("vm.builtin.kv_state_end_forward")

    def append_seq(self, seq_id: int, k: ArrayLike, v: ArrayLike) -> None:
        """Append K/V (each (num_layers, n, H, D)) to a single sequence in one forward pass."""
        self.append([seq_id], [(k, v)])

    def debug_get_kv(self, seq_id: int, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """Return the stored K and V of positions [start, end), each (num_layers, n, H, D)."""
        shape = (self.num_layers, int(end) - int(start), self.num_kv_heads, self.head_dim)
        shape = tuple(max(s, 0) for s in shape)
        k_out, v_out = self._empty(shape), self._empty(shape)
        self._call("vm.builtin.attention_kv_cache_debug_get_kv", int(seq_id), int(start), int(end), k_out, v_out)
        return k_out.numpy(), v_out.numpy()

    def expected_stored_k(self, k: ArrayLike, start_pos: int = 0) -> np.ndarray:
        """K as TVM would store it when appended at ``start_pos`` (rotated only in NORMAL mode)."""
        k = np.asarray(k, dtype=self.np_dtype)
        if self.rope_mode != ROPE_NORMAL:
            return k.copy()
        positions = np.arange(start_pos, start_pos + k.shape[-3])
        return rope_reference(k, positions, rotary_scale=self.rotary_scale, rotary_theta=self.rotary_theta)

    # ------------------------------------------------------------------ checkpoint

    def get_checkpoint_metadata(self, seq_id: int) -> str:
        """TVM's checkpoint metadata JSON for a sequence."""
        return str(self._call("vm.builtin.attention_kv_cache_get_checkpoint_metadata", int(seq_id)))

    def get_layout_hash(self) -> str:
        """TVM's 16-hex-digit FNV-1a layout hash."""
        return str(self._call("vm.builtin.attention_kv_cache_get_layout_hash"))

    def get_sequence_length(self, seq_id: int) -> int:
        """Length of a sequence as reported by the checkpoint API."""
        return int(self._call("vm.builtin.attention_kv_cache_get_sequence_length", int(seq_id)))

    def export_page_group(self, seq_id: int, group_id: int) -> np.ndarray:
        """Export one page group, shaped (1, num_logical_pages, 2, H, page_size, head_dim)."""
        # The metadata call runs the same validity checks as the export itself.
        seq_length = json.loads(self.get_checkpoint_metadata(seq_id))["seq_length"]
        shape = (1, self.num_logical_pages(seq_length), 2, self.num_kv_heads, self.page_size, self.head_dim)
        dst = self._empty(shape)
        self._call("vm.builtin.attention_kv_cache_export_page_group", int(seq_id), int(group_id), dst)
        return dst.numpy()

    def export_groups(self, seq_id: int) -> list[bytes]:
        """Raw little-endian bytes of every page group of a sequence, in group order."""
        return [
            self.export_page_group(seq_id, g).astype(self.np_dtype, copy=False).tobytes()
            for g in range(self.num_layers)
        ]

    def prepare_import(self, seq_id: int, metadata_json: str) -> None:
        """Validate metadata, clear the whole cache and allocate pages for ``seq_id``."""
        self._call("vm.builtin.attention_kv_cache_prepare_import", int(seq_id), str(metadata_json))

    def import_page_group(self, seq_id: int, group_id: int, data: bytes | bytearray | memoryview | np.ndarray) -> None:
        """Import one page group from raw little-endian bytes or an array.

        Arrays go to TVM unchanged (TVM checks dtype and shape); bytes are
        viewed as (1, len / bytes_per_page, 2, H, page_size, head_dim).
        """
        if isinstance(data, np.ndarray):
            array = data
        else:
            raw = bytes(data)
            if len(raw) % self.bytes_per_page:
                raise ValueError(
                    f"{len(raw)} bytes is not a whole number of {self.bytes_per_page}-byte pages"
                )
            array = np.frombuffer(raw, dtype=self.np_dtype).reshape(
                1, len(raw) // self.bytes_per_page, 2, self.num_kv_heads, self.page_size, self.head_dim
            )
        self._call("vm.builtin.attention_kv_cache_import_page_group", int(seq_id), int(group_id), self._to_tvm(array))

    def finish_import(self, seq_id: int) -> None:
        """Complete an import once every page group has been restored."""
        self._call("vm.builtin.attention_kv_cache_finish_import", int(seq_id))

    def import_checkpoint(self, metadata_json: str, groups: Sequence[bytes | np.ndarray], seq_id: int = 0) -> None:
        """Prepare, import every group in order, then finish."""
        self.prepare_import(seq_id, metadata_json)
        for group_id, data in enumerate(groups):
            self.import_page_group(seq_id, group_id, data)
        self.finish_import(seq_id)
