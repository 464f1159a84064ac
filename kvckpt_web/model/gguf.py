"""Reading GGUF model files (versions 2 and 3): header, metadata, tensor table and zero-copy tensor data.

A GGUF file is: the magic ``b"GGUF"``, a uint32 version, uint64 tensor and metadata counts; the metadata
(key string, uint32 value type, value); the tensor table (name, uint32 dimension count, uint64 dimensions
ne0 first, uint32 ggml type, uint64 offset into the data section); padding to ``general.alignment``
(default 32); the data section. All little-endian; strings are a uint64 byte length and UTF-8 bytes.
The reader validates everything before it is used and refuses what it does not fully understand.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

from ..errors import FormatError

__all__ = ["DEFAULT_ALIGNMENT", "GGML_TYPES", "MAGIC", "VERSIONS", "GGMLType", "GGUFFile", "GGUFTensor",
           "open_gguf", "parse_gguf"]

MAGIC = b"GGUF"
"""First 4 bytes of every GGUF file."""

VERSIONS = (2, 3)
"""The format versions this reader accepts (version 1 used 32-bit counts and is not read)."""

DEFAULT_ALIGNMENT = 32
"""Alignment of the data section and of every tensor offset when ``general.alignment`` is absent."""

MAX_DIMS = 4
"""Most dimensions a ggml tensor has."""

MAX_ARRAY_NESTING = 8
"""Deepest array-of-arrays a reader follows (deeper nesting would exhaust the stack on hostile input)."""


@dataclass(frozen=True)
class GGMLType:
    """A ggml tensor element type: ``block_size`` elements are stored in ``type_size`` bytes."""

    id: int
    name: str
    block_size: int
    type_size: int


GGML_TYPES: dict[int, GGMLType] = {t.id: t for t in (
    GGMLType(0, "F32", 1, 4), GGMLType(1, "F16", 1, 2),
    GGMLType(2, "Q4_0", 32, 18), GGMLType(3, "Q4_1", 32, 20), GGMLType(6, "Q5_0", 32, 22),
    GGMLType(7, "Q5_1", 32, 24), GGMLType(8, "Q8_0", 32, 34), GGMLType(9, "Q8_1", 32, 40),
    GGMLType(10, "Q2_K", 256, 84), GGMLType(11, "Q3_K", 256, 110), GGMLType(12, "Q4_K", 256, 144),
    GGMLType(13, "Q5_K", 256, 176), GGMLType(14, "Q6_K", 256, 210), GGMLType(15, "Q8_K", 256, 292),
    GGMLType(24, "I8", 1, 1), GGMLType(25, "I16", 1, 2), GGMLType(26, "I32", 1, 4), GGMLType(27, "I64", 1, 8),
    GGMLType(28, "F64", 1, 8), GGMLType(30, "BF16", 1, 2),
)}
"""The ggml types whose tensors this reader sizes, by type id."""

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_STRING, _ARRAY, _BOOL = 8, 9, 7
# Scalar metadata value types: type id -> struct format character.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "B", 10: "Q", 11: "q", 12: "d"}
_VALUE_TYPE_NAMES = {0: "uint8", 1: "int8", 2: "uint16", 3: "int16", 4: "uint32", 5: "int32", 6: "float32",
                     7: "bool", 8: "string", 9: "array", 10: "uint64", 11: "int64", 12: "float64"}
# Fewest bytes one value of each type takes: bounds counts before anything is allocated.
_MIN_VALUE_BYTES = {**{k: struct.calcsize("<" + f) for k, f in _SCALARS.items()}, _STRING: 8, _ARRAY: 12}
_MIN_KV_BYTES = 8 + 4 + 1  # empty key, value type, smallest value
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8  # empty name, no dimensions, type, offset


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of a GGUF file; ``data`` is a view of the file's buffer, not a copy.

    ``shape`` is in GGUF order (ne0, the contiguous dimension, first); ``offset`` is the tensor's offset
    inside the data section as stored in the file; ``type`` is the ggml type id.
    """

    name: str
    type: int
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    data: memoryview

    @property
    def type_name(self) -> str:
        """The ggml type's name, e.g. ``"Q4_1"``."""
        return GGML_TYPES[self.type].name

    @property
    def num_elements(self) -> int:
        """How many elements the tensor holds."""
        count = 1
        for n in self.shape:
            count *= n
        return count


@dataclass(frozen=True)
class GGUFFile:
    """A parsed GGUF file: its metadata, its tensor table (in file order) and views of the tensor data.

    ``digest`` is the SHA-256 (hex) of the header, metadata and tensor table bytes (everything before the
    data section's padding), then of the data section: it identifies the model, weights included, so a
    fine-tune of the same shapes is another model.
    """

    version: int
    metadata: dict[str, Any]
    tensors: dict[str, GGUFTensor]
    alignment: int
    data_offset: int
    digest: str

    def field(self, key: str, kind: type | tuple[type, ...], item: type | None = None) -> Any:
        """Metadata value ``key``, which must be of ``kind`` (and, for a list, every item of ``item``).

        Raises :class:`FormatError` naming the key when it is missing or of another type; a bool is not
        accepted where an int is asked for.
        """
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if key not in self.metadata:
            raise FormatError(key, f"a metadata value of type {_kind_names(kinds)}", "nothing (key missing)")
        value = self.metadata[key]
        if not _is_kind(value, kinds):
            raise FormatError(key, f"a metadata value of type {_kind_names(kinds)}", type(value).__name__)
        if item is not None:
            for i, element in enumerate(value):
                if not _is_kind(element, (item,)):
                    raise FormatError(f"{key}[{i}]", f"a {item.__name__}", type(element).__name__)
        return value


def _is_kind(value: Any, kinds: tuple[type, ...]) -> bool:
    return isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)


def _kind_names(kinds: tuple[type, ...]) -> str:
    return " or ".join(k.__name__ for k in kinds)


class _Cursor:
    """Reads little-endian values from a byte view, raising FormatError on truncation."""

    def __init__(self, view: memoryview) -> None:
        self.view = view
        self.pos = 0

    def left(self) -> int:
        return len(self.view) - self.pos

    def take(self, n: int, field: str) -> memoryview:
        if n > self.left():
            raise FormatError(field, f"{n} bytes at offset {self.pos}", f"{self.left()} bytes before the end",
                              "truncated")
        start = self.pos
        self.pos += n
        return self.view[start:self.pos]

    def u32(self, field: str) -> int:
        return _U32.unpack(self.take(4, field))[0]

    def u64(self, field: str) -> int:
        return _U64.unpack(self.take(8, field))[0]

    def count(self, field: str, min_bytes_each: int) -> int:
        """A uint64 count of items that each take at least ``min_bytes_each`` bytes of what is left."""
        n = self.u64(field)
        if n * min_bytes_each > self.left():
            raise FormatError(field, f"at most {self.left() // min_bytes_each} (what the remaining bytes can hold)",
                              n)
        return n

    def string(self, field: str) -> str:
        length = self.u64(f"{field} length")
        raw = self.take(length, field)
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError as exc:
            raise FormatError(field, "UTF-8 text", f"invalid byte at {exc.start}") from None


def _read_value(cur: _Cursor, value_type: int, field: str, depth: int = 0) -> Any:
    fmt = _SCALARS.get(value_type)
    if fmt is not None:
        size = _MIN_VALUE_BYTES[value_type]
        value = struct.unpack("<" + fmt, cur.take(size, field))[0]
        return _as_bool(value, field) if value_type == _BOOL else value
    if value_type == _STRING:
        return cur.string(field)
    if value_type == _ARRAY:
        return _read_array(cur, field, depth)
    raise FormatError(f"{field} type", f"a GGUF value type (one of {sorted(_VALUE_TYPE_NAMES)})", value_type)


def _read_array(cur: _Cursor, field: str, depth: int) -> list[Any]:
    if depth >= MAX_ARRAY_NESTING:
        raise FormatError(field, f"arrays nested at most {MAX_ARRAY_NESTING} deep", f"{depth + 1} levels")
    item_type = cur.u32(f"{field} item type")
    if item_type not in _MIN_VALUE_BYTES:
        raise FormatError(f"{field} item type", f"a GGUF value type (one of {sorted(_VALUE_TYPE_NAMES)})",
                          item_type)
    n = cur.count(f"{field} count", _MIN_VALUE_BYTES[item_type])
    fmt = _SCALARS.get(item_type)
    if fmt is not None:
        values = list(struct.unpack(f"<{n}{fmt}", cur.take(n * _MIN_VALUE_BYTES[item_type], field)))
        if item_type == _BOOL:
            values = [_as_bool(v, f"{field}[{i}]") for i, v in enumerate(values)]
        return values
    if item_type == _STRING:
        return [cur.string(f"{field}[{i}]") for i in range(n)]
    return [_read_array(cur, f"{field}[{i}]", depth + 1) for i in range(n)]


def _as_bool(value: int, field: str) -> bool:
    if value not in (0, 1):
        raise FormatError(field, "a bool byte (0 or 1)", value)
    return value == 1


def _read_metadata(cur: _Cursor, count: int) -> dict[str, Any]:
    metadata: dict[str, Any] = {}
    for i in range(count):
        key = cur.string(f"metadata[{i}].key")
        if key in metadata:
            raise FormatError(f"metadata[{i}].key", "a key not used before", key)
        metadata[key] = _read_value(cur, cur.u32(f"metadata[{key!r}] type"), f"metadata[{key!r}]")
    return metadata


def _alignment(metadata: dict[str, Any]) -> int:
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment <= 0 \
            or alignment & (alignment - 1):
        raise FormatError("general.alignment", "a power of two", alignment)
    return alignment


def _read_tensor_info(cur: _Cursor, i: int) -> tuple[str, int, tuple[int, ...], int, int]:
    """One tensor table entry: (name, type, shape, offset, nbytes)."""
    name = cur.string(f"tensors[{i}].name")
    where = f"tensors[{name!r}]"
    n_dims = cur.u32(f"{where}.n_dims")
    if not 1 <= n_dims <= MAX_DIMS:
        raise FormatError(f"{where}.n_dims", f"1 to {MAX_DIMS}", n_dims)
    shape = tuple(cur.u64(f"{where}.shape[{d}]") for d in range(n_dims))
    type_id = cur.u32(f"{where}.type")
    ggml_type = GGML_TYPES.get(type_id)
    if ggml_type is None:
        raise FormatError(f"{where}.type", f"a known ggml type id (one of {sorted(GGML_TYPES)})", type_id)
    offset = cur.u64(f"{where}.offset")
    if shape[0] % ggml_type.block_size:
        raise FormatError(f"{where}.shape[0]", f"a multiple of {ggml_type.name}'s block size "
                          f"{ggml_type.block_size}", shape[0])
    count = 1
    for n in shape:
        count *= n
    return name, type_id, shape, offset, count // ggml_type.block_size * ggml_type.type_size


def _check_placement(entries: list[tuple[str, int, tuple[int, ...], int, int]], alignment: int,
                     data_bytes: int) -> None:
    """Every tensor aligned, inside the data section, and no two overlapping."""
    for name, _, _, offset, nbytes in entries:
        if offset % alignment:
            raise FormatError(f"tensors[{name!r}].offset", f"a multiple of the alignment {alignment}", offset)
        if offset + nbytes > data_bytes:
            raise FormatError(f"tensors[{name!r}]", f"bytes [{offset}, {offset + nbytes}) inside the data section "
                              f"of {data_bytes} bytes", "bytes past its end", "truncated or out of range")
    by_offset = sorted(entries, key=lambda e: (e[3], e[3] + e[4]))
    for (prev, _, _, prev_offset, prev_nbytes), (name, _, _, offset, _) in zip(by_offset, by_offset[1:]):
        if prev_offset + prev_nbytes > offset:
            raise FormatError(f"tensors[{name!r}].offset", f"at least {prev_offset + prev_nbytes} (the end of "
                              f"tensor {prev!r})", offset, "tensors overlap")


def parse_gguf(buffer: bytes | bytearray | memoryview | mmap.mmap) -> GGUFFile:
    """Parse and validate a whole GGUF file held in ``buffer``; tensor data stays in ``buffer`` (views).

    Raises :class:`FormatError` naming the offending field for anything malformed or unsupported.
    """
    view = memoryview(buffer).cast("B")
    cur = _Cursor(view)
    magic = bytes(cur.take(4, "header.magic"))
    if magic != MAGIC:
        raise FormatError("header.magic", f"{MAGIC!r}", repr(magic), "not a GGUF file")
    version = cur.u32("header.version")
    if version not in VERSIONS:
        raise FormatError("header.version", f"one of {VERSIONS}", version, "unsupported GGUF version")
    tensor_count = cur.u64("header.tensor_count")
    kv_count = cur.count("header.kv_count", _MIN_KV_BYTES)
    metadata = _read_metadata(cur, kv_count)
    if tensor_count * _MIN_TENSOR_INFO_BYTES > cur.left():
        raise FormatError("header.tensor_count", f"at most {cur.left() // _MIN_TENSOR_INFO_BYTES} (what the "
                          "remaining bytes can hold)", tensor_count)
    entries = [_read_tensor_info(cur, i) for i in range(tensor_count)]
    names = [e[0] for e in entries]
    if len(set(names)) != len(names):
        duplicate = next(n for i, n in enumerate(names) if n in names[:i])
        raise FormatError("tensors.name", "names used once each", duplicate)
    alignment = _alignment(metadata)
    table_end = cur.pos
    data_offset = -(-table_end // alignment) * alignment
    _check_placement(entries, alignment, max(0, len(view) - data_offset))
    tensors = {name: GGUFTensor(name, type_id, shape, offset, nbytes,
                                view[data_offset + offset:data_offset + offset + nbytes])
               for name, type_id, shape, offset, nbytes in entries}
    digest = hashlib.sha256(view[:table_end])
    digest.update(view[data_offset:])
    return GGUFFile(version, metadata, tensors, alignment, data_offset, digest.hexdigest())


def open_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    """Map the GGUF file at ``path`` read-only and parse it; tensor data is read from the mapping on use."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return parse_gguf(b"")  # mmap refuses empty files; the parser reports the missing magic
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return parse_gguf(mapping)
