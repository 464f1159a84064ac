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

from ..errors import FieldError, UnsupportedLayoutError, is_int

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


def _positive_int(name: str, value: object, minimum: int = 1, owner: str = "layout") -> None:
    if not is_int(value, minimum):
        raise FieldError(f"{owner}.{name}", f"an integer >= {minimum}", value)


@dataclass(frozen=True)
class KVLayout:
    """How one cache lays out K/V: the fields TVM's checkpoint metadata and layout hash cover."""

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
            _positive_int(name, getattr(self, name))
        _positive_int("layer_begin", self.layer_begin, minimum=0)
        if self.layer_end is None:
            object.__setattr__(self, "layer_end", self.layer_begin + self.num_layers)
        if self.layer_end != self.layer_begin + self.num_layers:
            raise FieldError("layout.layer_end", f"layer_begin + num_layers = {self.layer_begin + self.num_layers}", self.layer_end)
        if self.v_head_dim is None:
            object.__setattr__(self, "v_head_dim", self.qk_head_dim)
        _positive_int("v_head_dim", self.v_head_dim)
        if self.attn_kinds is None:
            object.__setattr__(self, "attn_kinds", ("mha",) * self.num_layers)
        object.__setattr__(self, "attn_kinds", tuple(self.attn_kinds))
        if len(self.attn_kinds) != self.num_layers:
            raise FieldError("layout.attn_kinds", f"{self.num_layers} entries (one per layer)", len(self.attn_kinds))
        for i, kind in enumerate(self.attn_kinds):
            if kind not in ATTN_KINDS:
                raise FieldError(f"layout.attn_kinds[{i}]", f"one of {ATTN_KINDS}", kind)
        if self.dtype not in DTYPE_BYTES:
            raise FieldError("layout.dtype", f"one of {tuple(DTYPE_BYTES)}", self.dtype)
        if self.rope_mode not in ROPE_MODES:
            raise FieldError("layout.rope_mode", f"one of {ROPE_MODES}", self.rope_mode)
        for name in ("rotary_scale", "rotary_theta"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise FieldError(f"layout.{name}", "a number", value)
            object.__setattr__(self, name, float(value))
        for name in ("has_rope_ext_factors", "support_sliding_window", "support_layer_sliding_window", "kv_transfer"):
            if not isinstance(getattr(self, name), bool):
                raise FieldError(f"layout.{name}", "a bool", getattr(self, name))

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
        _positive_int("reserved_num_seqs", self.reserved_num_seqs, owner="limits")
        _positive_int("max_total_seq_len", self.max_total_seq_len, minimum=0, owner="limits")
        _positive_int("prefill_chunk_size", self.prefill_chunk_size, owner="limits")

    def num_total_pages(self, page_size: int) -> int:
        """Pages the cache allocates: ``ceil(max_total_seq_len / page_size) + 1``, as TVM."""
        return math.ceil(self.max_total_seq_len / page_size) + 1
