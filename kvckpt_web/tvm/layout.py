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
        """Raise :class:`UnsupportedLayoutError` with TVM's reason if this layout cannot be checkpointed."""
        if any(kind != "mha" for kind in self.attn_kinds):
            raise UnsupportedLayoutError("checkpointing only supports full-context MHA/GQA layers "
                                         f"(attn_kinds: expected all 'mha', got {list(self.attn_kinds)})")
        if self.qk_head_dim != self.v_head_dim:
            raise UnsupportedLayoutError("checkpointing requires qk_head_dim to equal v_head_dim "
                                         f"(qk_head_dim {self.qk_head_dim}, v_head_dim {self.v_head_dim})")
        if self.support_sliding_window or self.support_layer_sliding_window:
            raise UnsupportedLayoutError("checkpointing does not support sliding-window cache layouts")
        if self.has_rope_ext_factors:
            raise UnsupportedLayoutError("checkpointing does not support RoPE extension factors")
        if self.kv_transfer:
            raise UnsupportedLayoutError("checkpointing does not support KV transfer/disaggregation")

    def descriptor(self) -> str:
        """TVM's layout descriptor string, the input of the layout hash."""
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
