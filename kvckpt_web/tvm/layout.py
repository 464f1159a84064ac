"""Cache layouts and TVM's layout hash.

A :class:`KVLayout` says how K/V bytes are arranged in a paged cache; two caches
whose layouts hash equal can exchange checkpoints. Field names are the names the
checkpoint metadata JSON uses. Operational limits (how many sequences, pages,
tokens per prefill) are not part of a layout; they live in :class:`CacheLimits`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

from ..checks import check_bool, check_int, check_items, type_name
from ..errors import FieldError, UnsupportedLayoutError

FORMAT_VERSION = 1
CACHE_TYPE = "relax.vm.PagedAttentionKVCache"
PAGE_GROUP_LAYOUT = "1,num_logical_pages,2,num_kv_heads,page_size,qk_head_dim"

#: Bytes per element of each supported K/V dtype (TVM's DLDataType strings).
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
ATTN_KINDS = ("mha", "mla", "linear", "mha_sliding")
ROPE_MODES = ("none", "normal", "inline")

_FNV64_OFFSET = 14695981039346656037
_FNV64_PRIME = 1099511628211
_U64 = (1 << 64) - 1


def fnv1a64(data: bytes) -> int:
    """FNV-1a 64-bit hash of ``data``."""
    h = _FNV64_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV64_PRIME) & _U64
    return h


def cpp_double(value: float) -> str:
    """``value`` as a C++ ostream prints it with ``setprecision(17)`` (``%.17g``)."""
    return "%.17g" % value


def _one_of(field: str, value: object, choices: tuple[str, ...]) -> None:
    if not isinstance(value, str) or value not in choices:
        raise FieldError(field, f"one of {choices}", value if isinstance(value, str) else type_name(value))


@dataclass(frozen=True)
class KVLayout:
    """How one cache lays out K/V: the fields TVM's checkpoint metadata and layout hash cover.

    ``num_qo_heads`` is a multiple of ``num_kv_heads`` (grouped-query attention, as TVM's kernels take it).
    """

    page_size: int
    num_layers: int
    num_qo_heads: int
    num_kv_heads: int
    qk_head_dim: int
    dtype: str = "float16"
    layer_begin: int = 0
    layer_end: int | None = None
    v_head_dim: int | None = None
    attn_kinds: tuple[str, ...] | None = None
    rope_mode: str = "normal"
    rotary_scale: float = 1.0
    rotary_theta: float = 10000.0
    has_rope_ext_factors: bool = False
    support_sliding_window: bool = False
    support_layer_sliding_window: bool = False
    #: kvckpt's extension (not TVM's): tokens a layer of kind "mha_sliding" attends to (the newest ones), 0 where no
    #: layer slides. The cache keeps every token's K/V in every layer; such a layer masks the older ones.
    sliding_window: int = 0
    #: kvckpt's extension: the RoPE base of the "mha_sliding" layers (None: ``rotary_theta``, as every layer's).
    sliding_rotary_theta: float | None = None
    #: TVM's enable_kv_transfer; not in the metadata, but it forbids checkpointing.
    kv_transfer: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("page_size", "num_layers", "num_qo_heads", "num_kv_heads", "qk_head_dim"):
            check_int(f"layout.{name}", getattr(self, name), 1)
        if self.num_qo_heads % self.num_kv_heads:  # grouped-query attention: whole groups of query heads per K/V head
            raise FieldError("layout.num_qo_heads", f"a multiple of num_kv_heads={self.num_kv_heads}",
                             self.num_qo_heads)
        check_int("layout.layer_begin", self.layer_begin, 0)
        if self.layer_end is None:
            object.__setattr__(self, "layer_end", self.layer_begin + self.num_layers)
        check_int("layout.layer_end", self.layer_end, 1)
        if self.layer_end != self.layer_begin + self.num_layers:
            raise FieldError("layout.layer_end", f"layer_begin + num_layers = {self.layer_begin + self.num_layers}", self.layer_end)
        if self.v_head_dim is None:
            object.__setattr__(self, "v_head_dim", self.qk_head_dim)
        check_int("layout.v_head_dim", self.v_head_dim, 1)
        if self.attn_kinds is None:
            object.__setattr__(self, "attn_kinds", ("mha",) * self.num_layers)
        object.__setattr__(self, "attn_kinds", tuple(check_items("layout.attn_kinds", self.attn_kinds,
                                                                 "one attention kind per layer")))
        if len(self.attn_kinds) != self.num_layers:
            raise FieldError("layout.attn_kinds", f"{self.num_layers} entries (one per layer)", len(self.attn_kinds))
        for i, kind in enumerate(self.attn_kinds):
            _one_of(f"layout.attn_kinds[{i}]", kind, ATTN_KINDS)
        _one_of("layout.dtype", self.dtype, tuple(DTYPE_BYTES))
        _one_of("layout.rope_mode", self.rope_mode, ROPE_MODES)
        for name in ("rotary_scale", "rotary_theta"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise FieldError(f"layout.{name}", "a finite number", type_name(value))
            if not math.isfinite(value):  # TVM's metadata and layout descriptor print it as a finite double
                raise FieldError(f"layout.{name}", "a finite number", value)
            object.__setattr__(self, name, float(value))
        for name in ("has_rope_ext_factors", "support_sliding_window", "support_layer_sliding_window", "kv_transfer"):
            check_bool(f"layout.{name}", getattr(self, name))
        self._check_sliding()

    def _check_sliding(self) -> None:
        """The window fields agree with the layers that slide: a window (and TVM's per-layer flag) exactly where a
        layer is of kind "mha_sliding"."""
        check_int("layout.sliding_window", self.sliding_window, 0)
        sliding = "mha_sliding" in self.attn_kinds
        if self.sliding_rotary_theta is not None:
            value = self.sliding_rotary_theta
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise FieldError("layout.sliding_rotary_theta", "a finite number or None",
                                 value if isinstance(value, (int, float)) else type_name(value))
            object.__setattr__(self, "sliding_rotary_theta", float(value))
            if not self.sliding_window:
                raise FieldError("layout.sliding_rotary_theta", "None where no layer slides (sliding_window 0)",
                                 self.sliding_rotary_theta)
        if self.sliding_window and not sliding:
            raise FieldError("layout.sliding_window", "0 where no layer is of kind 'mha_sliding'", self.sliding_window)
        if self.sliding_window and not self.support_layer_sliding_window:
            raise FieldError("layout.support_layer_sliding_window", "True where layers slide (sliding_window "
                             f"{self.sliding_window})", False)

    @property
    def sliding(self) -> bool:
        """Some layers attend to a window of the newest tokens (kvckpt's extension of TVM's layout)."""
        return self.sliding_window > 0

    @property
    def sliding_theta(self) -> float:
        """The RoPE base of the "mha_sliding" layers."""
        return self.rotary_theta if self.sliding_rotary_theta is None else self.sliding_rotary_theta

    @property
    def head_dim(self) -> int:
        """The K/V head dimension (``qk_head_dim``; checkpointable layouts have equal V)."""
        return self.qk_head_dim

    @property
    def elem_bytes(self) -> int:
        """Bytes per K/V element."""
        return DTYPE_BYTES[self.dtype]

    @property
    def page_elems(self) -> int:
        """Elements in one page of one layer: ``2 * num_kv_heads * page_size * head_dim``."""
        return 2 * self.num_kv_heads * self.page_size * self.qk_head_dim

    @property
    def page_bytes(self) -> int:
        """Bytes in one page of one layer (a page group holds ``num_logical_pages`` of these)."""
        return self.page_elems * self.elem_bytes

    def num_logical_pages(self, seq_length: int) -> int:
        """Pages a sequence of ``seq_length`` tokens occupies."""
        return -(-seq_length // self.page_size)

    def group_shape(self, num_logical_pages: int) -> tuple[int, ...]:
        """Shape of one page group: ``(1, num_logical_pages, 2, num_kv_heads, page_size, head_dim)``."""
        return (1, num_logical_pages, 2, self.num_kv_heads, self.page_size, self.qk_head_dim)

    def check_checkpointable(self) -> None:
        """Raise :class:`UnsupportedLayoutError` with TVM's reason if this layout cannot be checkpointed here: TVM's
        rules, except that layers of kind "mha_sliding" with a window (:attr:`sliding_window`, kvckpt's extension,
        FORMAT.md section 11) are checkpointed, every page of every layer kept."""
        kinds = ("mha", "mha_sliding") if self.sliding else ("mha",)
        if any(kind not in kinds for kind in self.attn_kinds):
            raise UnsupportedLayoutError("checkpointing only supports full-context MHA/GQA layers "
                                         f"(attn_kinds: expected all 'mha', got {list(self.attn_kinds)})")
        if self.qk_head_dim != self.v_head_dim:
            raise UnsupportedLayoutError("checkpointing requires qk_head_dim to equal v_head_dim "
                                         f"(qk_head_dim {self.qk_head_dim}, v_head_dim {self.v_head_dim})")
        if self.support_sliding_window or (self.support_layer_sliding_window and not self.sliding):
            raise UnsupportedLayoutError("checkpointing does not support sliding-window cache layouts")
        if self.has_rope_ext_factors:
            raise UnsupportedLayoutError("checkpointing does not support RoPE extension factors")
        if self.kv_transfer:
            raise UnsupportedLayoutError("checkpointing does not support KV transfer/disaggregation")

    def check_tvm_checkpointable(self) -> None:
        """Raise :class:`UnsupportedLayoutError` if TVM (format_version 1) cannot take this layout's checkpoints:
        :meth:`check_checkpointable`'s reasons, and any sliding-window layer (TVM's ``PrepareImport`` refuses a
        cache that supports sliding windows)."""
        self.check_checkpointable()
        if self.sliding:
            raise UnsupportedLayoutError(
                "TVM's checkpoints (format_version 1) do not support sliding-window cache layouts: TVM refuses a cache "
                f"with sliding-window layers (attn_kinds {list(self.attn_kinds)}, window {self.sliding_window} tokens)")

    def descriptor(self) -> str:
        """TVM's layout descriptor string, the input of the layout hash (where layers slide, kvckpt's window and
        its RoPE base follow TVM's parts: FORMAT.md section 11)."""
        b = lambda flag: "1" if flag else "0"  # noqa: E731 - C++ prints bools as 0/1
        parts = [
            f"format_version={FORMAT_VERSION}",
            f"cache_type={CACHE_TYPE}",
            f"page_size={self.page_size}",
            f"num_layers={self.num_layers}",
            f"layer_begin={self.layer_begin}",
            f"layer_end={self.layer_end}",
            f"num_qo_heads={self.num_qo_heads}",
            f"num_kv_heads={self.num_kv_heads}",
            f"qk_head_dim={self.qk_head_dim}",
            f"v_head_dim={self.v_head_dim}",
            f"dtype={self.dtype}",
            f"rope_mode={self.rope_mode}",
            f"rotary_scale={cpp_double(self.rotary_scale)}",
            f"rotary_theta={cpp_double(self.rotary_theta)}",
            f"has_rope_ext_factors={b(self.has_rope_ext_factors)}",
            f"support_sliding_window={b(self.support_sliding_window)}",
            f"support_layer_sliding_window={b(self.support_layer_sliding_window)}",
            f"page_group_layout={PAGE_GROUP_LAYOUT}",
            "attn_kinds=" + ",".join(self.attn_kinds),
        ]
        if self.sliding:  # kvckpt's extension: only a layout TVM cannot take has these parts
            parts += [f"sliding_window={self.sliding_window}",
                      f"sliding_rotary_theta={cpp_double(self.sliding_theta)}"]
        return ";".join(parts)

    def layout_hash(self) -> str:
        """TVM's ``get_layout_hash``: FNV-1a 64 of the descriptor as 16 lowercase hex digits."""
        self.check_checkpointable()
        return self._descriptor_hash

    @cached_property
    def _descriptor_hash(self) -> str:  # the fields are frozen: computed once per layout
        return "%016x" % fnv1a64(self.descriptor().encode("utf-8"))


@dataclass(frozen=True)
class CacheLimits:
    """Operational limits of one cache (TVM's reserved_num_seqs, max_total_seq_len, prefill_chunk_size)."""

    reserved_num_seqs: int = 4
    max_total_seq_len: int = 4096
    prefill_chunk_size: int = 2048

    def __post_init__(self) -> None:
        check_int("limits.reserved_num_seqs", self.reserved_num_seqs, 1)
        check_int("limits.max_total_seq_len", self.max_total_seq_len, 0)
        check_int("limits.prefill_chunk_size", self.prefill_chunk_size, 1)

    def num_total_pages(self, page_size: int) -> int:
        """Pages the cache allocates: ``ceil(max_total_seq_len / page_size) + 1``, as TVM."""
        return math.ceil(self.max_total_seq_len / page_size) + 1
