"""Checkpoint metadata, format_version 1: TVM's exact JSON text, and its validation.

:func:`write_metadata` produces the text TVM's ``get_checkpoint_metadata`` produces
for the same cache state, byte for byte. :func:`validate_import` performs every
check TVM's ``PrepareImport`` performs, in the same order, and raises
:class:`~kvckpt_web.errors.MetadataError` naming the field, expected and got.
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from ..errors import FieldError, LayoutHashMismatch, MetadataError, is_int
from ..jsontext import MAX_NESTING, DuplicateKeyError, nesting_depth, unique_keys
from .layout import CACHE_TYPE, FORMAT_VERSION, PAGE_GROUP_LAYOUT, CacheLimits, KVLayout

_INT64 = (-(1 << 63), (1 << 63) - 1)
_INT32_MAX = (1 << 31) - 1


def tvm_json_double(value: float) -> str:
    """A double as TVM's JSON writer prints it (``"1.0"``, ``"0.10000000000000001"``, ``"1e+17"``)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if abs(value) < (1 << 53) and value == math.floor(value):
        return "%.1f" % value
    return "%.17g" % value


def dump_tvm_json(value: Any) -> str:
    """Serialize ``value`` compactly, in insertion order, with TVM's double format."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return tvm_json_double(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(dump_tvm_json(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(json.dumps(k) + ":" + dump_tvm_json(v) for k, v in value.items()) + "}"
    raise TypeError(f"cannot serialize {type(value).__name__} as checkpoint metadata")


def layout_fields(layout: KVLayout, limits: CacheLimits) -> dict[str, Any]:
    """The layout part of the metadata object, keys in TVM's order."""
    return {
        "format_version": FORMAT_VERSION,
        "cache_type": CACHE_TYPE,
        "page_size": layout.page_size,
        "num_layers": layout.num_layers,
        "layer_begin": layout.layer_begin,
        "layer_end": layout.layer_end,
        "num_qo_heads": layout.num_qo_heads,
        "num_kv_heads": layout.num_kv_heads,
        "qk_head_dim": layout.qk_head_dim,
        "v_head_dim": layout.v_head_dim,
        "reserved_num_seqs": limits.reserved_num_seqs,
        "num_total_pages": limits.num_total_pages(layout.page_size),
        "prefill_chunk_size": limits.prefill_chunk_size,
        "dtype": layout.dtype,
        "attn_kinds": list(layout.attn_kinds),
        "rope_mode": layout.rope_mode,
        "rotary_scale": layout.rotary_scale,
        "rotary_theta": layout.rotary_theta,
        "has_rope_ext_factors": layout.has_rope_ext_factors,
        "support_sliding_window": layout.support_sliding_window,
        "support_layer_sliding_window": layout.support_layer_sliding_window,
        "page_group_layout": PAGE_GROUP_LAYOUT,
        **({"sliding_window": layout.sliding_window, "sliding_rotary_theta": layout.sliding_theta}
           if layout.sliding else {}),  # kvckpt's extension (FORMAT.md section 11): never in TVM's metadata
    }


def write_metadata(layout: KVLayout, limits: CacheLimits, seq_id: int, seq_length: int) -> str:
    """The checkpoint metadata JSON of a sequence, byte-identical to TVM's."""
    npages = layout.num_logical_pages(seq_length)
    metadata = layout_fields(layout, limits)
    metadata["layout_hash"] = layout.layout_hash()
    metadata["seq_id"] = seq_id
    metadata["seq_length"] = seq_length
    p = layout.page_size
    # One entry per page and per group, of integers and the dtype name: formatted directly, as
    # dump_tvm_json would print them (20x slower).
    pages = ",".join(f'{{"logical_page_index":{i},"start_pos":{i * p},"length":{min(p, seq_length - i * p)}}}'
                     for i in range(npages))
    shape = ",".join(str(d) for d in layout.group_shape(npages))
    dtype = json.dumps(layout.dtype)
    groups = ",".join(f'{{"group_index":{g},"layer_begin":{layout.layer_begin + g},'
                      f'"layer_end":{layout.layer_begin + g + 1},"num_logical_pages":{npages},"dtype":{dtype},'
                      f'"shape":[{shape}],"nbytes":{npages * layout.page_bytes}}}' for g in range(layout.num_layers))
    return f'{dump_tvm_json(metadata)[:-1]},"logical_pages":[{pages}],"groups":[{groups}]}}'


@dataclass(frozen=True)
class _OutOfRange:
    """A number literal TVM's JSON parser refuses (``strtod`` range error); reported with its field after parsing."""

    literal: str


_DBL_MIN = Decimal(sys.float_info.min)
_SURROGATE = re.compile(r"[\ud800-\udfff]")


class _Numbers:
    """Number hooks for one ``json.loads``: literals TVM's parser refuses become :class:`_OutOfRange`
    markers, and ``refused`` counts them."""

    def __init__(self) -> None:
        self.refused = 0

    def _refuse(self, literal: str) -> _OutOfRange:
        self.refused += 1
        return _OutOfRange(literal)

    def parse_float(self, literal: str) -> float | _OutOfRange:
        # TVM reads numbers with strtod and refuses overflow and underflow (ERANGE: results that are
        # infinite, subnormal, or zero from a non-zero literal); Python would give inf, a subnormal or 0.0.
        value = float(literal)
        if math.isinf(value) or (abs(value) < sys.float_info.min and 0 < Decimal(literal).copy_abs() < _DBL_MIN):
            return self._refuse(literal)
        return value

    def parse_int(self, literal: str) -> int | _OutOfRange:
        # TVM reads integers outside int64 as doubles, so it refuses those beyond the double range.
        if len(literal) > 19 and math.isinf(float(literal)):
            return self._refuse(literal)
        return int(literal)


def _check_representable(value: Any) -> None:
    """Reject what TVM's parser refuses but Python's accepts: out-of-range numbers, lone surrogates."""
    stack: list[tuple[str, Any]] = [("metadata", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, _OutOfRange):
            raise MetadataError(path, "a number within the range of a double", item.literal[:40],
                                "TVM's JSON parser rejects it")
        if isinstance(item, str) and _SURROGATE.search(item):
            raise MetadataError(path, "a string without lone UTF-16 surrogates", ascii(item)[1:-1][:40],
                                "TVM's JSON parser rejects it")
        if isinstance(item, dict):
            for key, child in item.items():
                name = f"{path}.{ascii(key)[1:-1]}"
                if _SURROGATE.search(key):
                    raise MetadataError(name, "a key without lone UTF-16 surrogates", ascii(key)[1:-1][:40],
                                        "TVM's JSON parser rejects it")
                stack.append((name, child))
        elif isinstance(item, list):
            stack.extend((f"{path}[{i}]", child) for i, child in enumerate(item))


def parse_metadata(text: str | bytes) -> dict[str, Any]:
    """Parse metadata JSON text into an object (any JSON object; fields are checked later)."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MetadataError("metadata", "UTF-8 JSON text", f"undecodable bytes ({exc.reason})") from None
    if not isinstance(text, str):
        raise MetadataError("metadata", "JSON text", type(text).__name__)
    depth = nesting_depth(text)
    if depth > MAX_NESTING:
        raise MetadataError("metadata", f"JSON nested at most {MAX_NESTING} deep", f"{depth} levels")
    try:
        numbers = _Numbers()
        value = json.loads(text, object_pairs_hook=unique_keys, parse_float=numbers.parse_float,
                           parse_int=numbers.parse_int)
    except DuplicateKeyError as exc:
        raise MetadataError(f"metadata.{exc.key}", "a key that appears once", "a duplicate key") from None
    except json.JSONDecodeError as exc:
        raise MetadataError("metadata", "valid JSON", f"parse error: {exc.msg} at position {exc.pos}") from None
    if not isinstance(value, dict):
        raise MetadataError("metadata", "a JSON object", type(value).__name__)
    if numbers.refused or "\\u" in text or _SURROGATE.search(text):  # something to find and name
        _check_representable(value)
    return value


class _Reader:
    """Typed access to one JSON object; errors name ``<path>.<field>``."""

    def __init__(self, obj: Any, path: str) -> None:
        if not isinstance(obj, dict):
            raise MetadataError(path, "a JSON object", type(obj).__name__)
        self.obj, self.path = obj, path

    def _get(self, name: str) -> Any:
        if name not in self.obj:
            raise MetadataError(f"{self.path}.{name}", "a field that is present", "missing field")
        return self.obj[name]

    def int(self, name: str) -> int:
        value = self._get(name)
        if not is_int(value, _INT64[0], _INT64[1]):
            raise MetadataError(f"{self.path}.{name}", "an int64 integer", value)
        return value

    def number(self, name: str) -> float:
        value = self._get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise MetadataError(f"{self.path}.{name}", "a number", value)
        return float(value)

    def bool(self, name: str) -> bool:
        value = self._get(name)
        if not isinstance(value, bool):
            raise MetadataError(f"{self.path}.{name}", "true or false", value)
        return value

    def str(self, name: str) -> str:
        value = self._get(name)
        if not isinstance(value, str):
            raise MetadataError(f"{self.path}.{name}", "a string", value)
        return value

    def list(self, name: str) -> list[Any]:
        value = self._get(name)
        if not isinstance(value, list):
            raise MetadataError(f"{self.path}.{name}", "a JSON array", type(value).__name__)
        return value

    def expect(self, kind: str, name: str, expected: Any) -> None:
        got = getattr(self, kind)(name)
        if got != expected:
            raise MetadataError(f"{self.path}.{name}", expected, got)


def layout_from_metadata(metadata: dict[str, Any]) -> KVLayout:
    """The :class:`KVLayout` a metadata object describes (layout fields only, typed strictly)."""
    r = _Reader(metadata, "metadata")
    r.expect("int", "format_version", FORMAT_VERSION)
    r.expect("str", "cache_type", CACHE_TYPE)
    kinds = r.list("attn_kinds")
    for i, kind in enumerate(kinds):
        if not isinstance(kind, str):
            raise MetadataError(f"metadata.attn_kinds[{i}]", "a string", kind)
    try:
        return KVLayout(
            page_size=r.int("page_size"), num_layers=r.int("num_layers"), layer_begin=r.int("layer_begin"),
            layer_end=r.int("layer_end"), num_qo_heads=r.int("num_qo_heads"), num_kv_heads=r.int("num_kv_heads"),
            qk_head_dim=r.int("qk_head_dim"), v_head_dim=r.int("v_head_dim"), dtype=r.str("dtype"),
            attn_kinds=tuple(kinds), rope_mode=r.str("rope_mode"), rotary_scale=r.number("rotary_scale"),
            rotary_theta=r.number("rotary_theta"), has_rope_ext_factors=r.bool("has_rope_ext_factors"),
            support_sliding_window=r.bool("support_sliding_window"),
            support_layer_sliding_window=r.bool("support_layer_sliding_window"),
            **({"sliding_window": r.int("sliding_window"), "sliding_rotary_theta": r.number("sliding_rotary_theta")}
               if "sliding_window" in metadata else {}),  # kvckpt's extension (FORMAT.md section 11)
        )
    except FieldError as exc:  # KVLayout's own checks: report them under "metadata."
        raise MetadataError(exc.field.replace("layout.", "metadata.", 1), exc.expected, exc.got) from None


def limits_from_metadata(metadata: dict[str, Any]) -> CacheLimits:
    """Operational limits that reproduce the source cache's reserved_num_seqs, num_total_pages, prefill_chunk_size."""
    r = _Reader(metadata, "metadata")
    page_size = r.int("page_size")
    total = r.int("num_total_pages")
    if total < 1:
        raise MetadataError("metadata.num_total_pages", "a positive integer", total)
    return CacheLimits(reserved_num_seqs=max(1, r.int("reserved_num_seqs")),
                       max_total_seq_len=(total - 1) * page_size,
                       prefill_chunk_size=max(1, r.int("prefill_chunk_size")))


@dataclass(frozen=True)
class ImportPlan:
    """What a validated metadata says to import."""

    seq_id: int
    seq_length: int
    num_logical_pages: int


def validate_import(metadata_json: str | bytes, layout: KVLayout, limits: CacheLimits, seq_id: int) -> ImportPlan:
    """Every check of TVM's ``PrepareImport`` against a cache of ``layout``/``limits``, importing into ``seq_id``,
    in TVM's order."""
    layout.check_checkpointable()
    m = _Reader(parse_metadata(metadata_json), "metadata")
    _check_layout(m, layout)
    seq_length, npages = _check_length(m, layout, limits, seq_id)
    _check_logical_pages(m, layout, seq_length, npages)
    _check_groups(m, layout, npages)
    return ImportPlan(seq_id=seq_id, seq_length=seq_length, num_logical_pages=npages)


def _check_layout(m: _Reader, layout: KVLayout) -> None:
    """The metadata's format, layout fields, source limits, layout hash and attention kinds."""
    m.expect("int", "format_version", FORMAT_VERSION)
    m.expect("str", "cache_type", CACHE_TYPE)
    for name in ("page_size", "num_layers", "layer_begin", "layer_end", "num_qo_heads", "num_kv_heads",
                 "qk_head_dim", "v_head_dim"):
        m.expect("int", name, getattr(layout, name))
    m.expect("str", "dtype", layout.dtype)
    m.expect("str", "rope_mode", layout.rope_mode)
    m.expect("number", "rotary_scale", layout.rotary_scale)
    m.expect("number", "rotary_theta", layout.rotary_theta)
    for name in ("has_rope_ext_factors", "support_sliding_window", "support_layer_sliding_window"):
        m.expect("bool", name, getattr(layout, name))
    m.expect("str", "page_group_layout", PAGE_GROUP_LAYOUT)
    if layout.sliding:
        m.expect("int", "sliding_window", layout.sliding_window)
        m.expect("number", "sliding_rotary_theta", layout.sliding_theta)
    for name in ("reserved_num_seqs", "num_total_pages", "prefill_chunk_size"):
        if m.int(name) <= 0:
            raise MetadataError(f"metadata.{name}", "a positive integer", m.int(name))
    expected_hash = layout.layout_hash()
    got_hash = m.str("layout_hash")
    if got_hash != expected_hash:
        raise LayoutHashMismatch("metadata.layout_hash", expected_hash, got_hash, "layout hash mismatch")
    kinds = m.list("attn_kinds")
    if len(kinds) != layout.num_layers:
        raise MetadataError("metadata.attn_kinds", f"{layout.num_layers} entries", len(kinds), "size mismatch")
    for i, (got, expected) in enumerate(zip(kinds, layout.attn_kinds)):
        if got != expected:
            raise MetadataError(f"metadata.attn_kinds[{i}]", expected, got)


def _check_length(m: _Reader, layout: KVLayout, limits: CacheLimits, seq_id: int) -> tuple[int, int]:
    """The sequence id and length, and that both caches hold its pages: (seq_length, logical pages)."""
    m.expect("int", "seq_id", seq_id)
    seq_length = m.int("seq_length")
    if not 0 <= seq_length <= _INT32_MAX:
        raise MetadataError("metadata.seq_length", f"0 <= seq_length <= {_INT32_MAX}", seq_length)
    npages = layout.num_logical_pages(seq_length)
    source_pages = m.int("num_total_pages")
    if npages > source_pages:
        raise MetadataError("metadata.num_total_pages", f">= {npages} (pages seq_length {seq_length} needs)",
                            source_pages, "the source cache cannot have held this sequence")
    own_pages = limits.num_total_pages(layout.page_size)
    if npages > own_pages:
        raise MetadataError("metadata.seq_length", f"at most {own_pages} pages (this cache only has {own_pages} pages)",
                            f"{seq_length} tokens = {npages} pages")
    return seq_length, npages


def _check_logical_pages(m: _Reader, layout: KVLayout, seq_length: int, npages: int) -> None:
    """Each logical page's index, start position and length."""
    pages = m.list("logical_pages")
    if len(pages) != npages:
        raise MetadataError("metadata.logical_pages", f"{npages} entries (sequence length {seq_length} "
                            f"requires {npages} logical pages)", len(pages))
    start = 0
    for i, page in enumerate(pages):
        want = (("logical_page_index", i), ("start_pos", start), ("length", min(layout.page_size, seq_length - start)))
        # The check of _Reader.expect("int", ...), inline for the common case; _Reader names what differs.
        if type(page) is not dict or not all(type(page.get(k)) is int and page[k] == v for k, v in want):
            p = _Reader(page, f"metadata.logical_pages[{i}]")
            for name, expected in want:
                p.expect("int", name, expected)
        start += want[2][1]


def _check_groups(m: _Reader, layout: KVLayout, npages: int) -> None:
    """Each page group's layers, dtype, shape and size."""
    groups = m.list("groups")
    if len(groups) != layout.num_layers:
        raise MetadataError("metadata.groups", f"{layout.num_layers} entries", len(groups), "size mismatch")
    shape = list(layout.group_shape(npages))
    for g, group in enumerate(groups):
        r = _Reader(group, f"metadata.groups[{g}]")
        r.expect("int", "group_index", g)
        r.expect("int", "layer_begin", layout.layer_begin + g)
        r.expect("int", "layer_end", layout.layer_begin + g + 1)
        r.expect("int", "num_logical_pages", npages)
        r.expect("str", "dtype", layout.dtype)
        got_shape = r.list("shape")
        if len(got_shape) != len(shape):
            raise MetadataError(f"metadata.groups[{g}].shape", f"rank {len(shape)}", len(got_shape), "rank mismatch")
        for d, expected in enumerate(shape):
            dim = got_shape[d]
            if not is_int(dim, expected, expected):
                raise MetadataError(f"metadata.groups[{g}].shape[{d}]", expected, dim, "shape mismatch")
        r.expect("int", "nbytes", npages * layout.page_bytes)
