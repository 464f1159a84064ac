"""The checkpoint container format, version 1: manifests and data chunks.

Pure functions over bytes; nothing here touches a store. ``FORMAT.md`` beside
this file is the specification; this module is its reference reader and
writer.

A checkpoint of one named sequence is a manifest plus content-addressed data
chunks. A chunk holds ``pages_per_chunk`` consecutive logical pages of one page
group (the last chunk of a group may hold fewer) and lives under
``chunks/<sha256 hex>``; the manifest lives under
``manifests/<name>/<generation as 20 digits>`` (the key layout: :mod:`.keys`).
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from ..errors import CorruptionError, FieldError, FormatError
from ..jsontext import MAX_NESTING, nesting_depth, non_string_key, unique_keys
from .keys import (CHUNKS, HEX64_RE, MAX_INT, check_digest, check_int, chunk_digest, manifest_key, read_checks,
                   validate_name)

__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "MAX_BODY_BYTES",
    "MAX_MANIFEST_BYTES",
    "ChunkRef",
    "Manifest",
    "decode_manifest",
    "encode_manifest",
    "plan_chunks",
    "split_group",
    "check_chunk_digest",
    "check_chunk_size",
    "verify_chunk",
]

MAGIC = b"KVCKMFST"
"""First 8 bytes of every manifest."""

FORMAT_VERSION = 1
"""The one version this module reads and writes."""

MAX_BODY_BYTES = 64 * 1024 * 1024
"""Largest JSON body a reader accepts."""

_PREFIX = struct.Struct("<8sII")  # magic, format version, body length
_DIGEST_BYTES = 32

MAX_MANIFEST_BYTES = _PREFIX.size + MAX_BODY_BYTES + _DIGEST_BYTES
"""Longest manifest a reader accepts: header, the longest body, checksum."""

_BODY_KEYS = frozenset(
    {
        "app_state",
        "chunks",
        "created_ms",
        "format_version",
        "generation",
        "name",
        "num_groups",
        "num_logical_pages",
        "page_bytes",
        "pages_per_chunk",
        "tvm_metadata",
    }
)
_CHUNK_KEYS = frozenset({"first_page", "nbytes", "num_pages", "sha256"})


# -- chunks -------------------------------------------------------------------


def plan_chunks(num_logical_pages: int, pages_per_chunk: int) -> list[tuple[int, int]]:
    """The (first_page, num_pages) of each chunk of one page group, in order."""
    check_int("num_logical_pages", num_logical_pages, 0)
    check_int("pages_per_chunk", pages_per_chunk, 1)
    return [
        (first, min(pages_per_chunk, num_logical_pages - first))
        for first in range(0, num_logical_pages, pages_per_chunk)
    ]


_ENTRY_JSON = '{"first_page":%d,"nbytes":%d,"num_pages":%d,"sha256":"%s"}'
"""One chunk-table entry as ``_dumps`` writes it (keys sorted, no spaces), for ints and a hex digest."""


@dataclass(frozen=True)
class ChunkRef:
    """One entry of a manifest's chunk table: where a chunk's pages belong and what it must hash to."""

    group: int
    first_page: int
    num_pages: int
    nbytes: int
    sha256: str

    @cached_property
    def key(self) -> str:
        """The store key of this chunk (a store refuses it if ``sha256`` is not 64 hex digits)."""
        return CHUNKS + self.sha256

    @cached_property
    def entry_json(self) -> str | None:
        """This ref's chunk-table entry as a manifest writer prints it; None unless every field is of the type
        and form a reader accepts (where it belongs in a table is for the table to check).

        Cached: an incremental save writes the refs it keeps from the previous manifest again.
        """
        if (type(self.first_page) is int and type(self.num_pages) is int and type(self.nbytes) is int
                and type(self.sha256) is str and HEX64_RE.fullmatch(self.sha256)):
            return _ENTRY_JSON % (self.first_page, self.nbytes, self.num_pages, self.sha256)
        return None

    def describe(self) -> str:
        """``chunks/<hex> (group G, pages A..B)`` for messages."""
        last = self.first_page + self.num_pages - 1
        return f"chunk {CHUNKS}{self.sha256} (group {self.group}, pages {self.first_page}..{last})"


def split_group(
    group: int, data: bytes | bytearray | memoryview, page_bytes: int, pages_per_chunk: int
) -> list[tuple[ChunkRef, bytes]]:
    """Cut the bytes of one page group (all its logical pages, in order) into chunks and their refs."""
    check_int("group", group, 0)
    check_int("page_bytes", page_bytes, 1)
    try:
        view = memoryview(data).cast("B")
    except TypeError as exc:
        raise FieldError(f"group {group} bytes", "a contiguous bytes-like buffer", type(data).__name__) from exc
    if len(view) % page_bytes:
        raise FieldError(f"group {group} bytes", f"a multiple of page_bytes={page_bytes}", len(view))
    out = []
    for first, count in plan_chunks(len(view) // page_bytes, pages_per_chunk):
        chunk = bytes(view[first * page_bytes : (first + count) * page_bytes])
        out.append((ChunkRef(group, first, count, len(chunk), chunk_digest(chunk)), chunk))
    return out


def check_chunk_size(ref: ChunkRef, nbytes: int | None) -> None:
    """Raise :class:`CorruptionError` unless a stored chunk of ``nbytes`` (None: missing) can be ``ref``."""
    if nbytes is None:
        raise CorruptionError(f"{ref.describe()}: expected {ref.nbytes} bytes, got a missing chunk")
    if nbytes != ref.nbytes:
        raise CorruptionError(f"{ref.describe()}: nbytes expected {ref.nbytes}, got {nbytes}")


def check_chunk_digest(ref: ChunkRef, digest: str) -> None:
    """Raise :class:`CorruptionError` unless ``digest`` is the sha256 ``ref`` names."""
    if digest != ref.sha256:
        raise CorruptionError(f"{ref.describe()}: sha256 expected {ref.sha256}, got {digest}")


def verify_chunk(ref: ChunkRef, data: bytes | bytearray | memoryview | None) -> bytes:
    """Return ``data`` as bytes if it is the chunk ``ref`` names, else raise :class:`CorruptionError`."""
    check_chunk_size(ref, None if data is None else len(memoryview(data).cast("B")))
    data = bytes(data)
    check_chunk_digest(ref, chunk_digest(data))
    return data


# -- manifest -----------------------------------------------------------------


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class Manifest:
    """One generation of one sequence's checkpoint (see FORMAT.md for each field).

    ``chunks[g]`` is group ``g``'s chunk table; ``num_groups`` is its length.
    """

    name: str
    generation: int
    tvm_metadata: str
    page_bytes: int
    pages_per_chunk: int
    num_logical_pages: int
    chunks: tuple[tuple[ChunkRef, ...], ...]
    app_state: dict[str, Any] = field(default_factory=dict)
    created_ms: int = field(default_factory=_now_ms)

    def __post_init__(self) -> None:
        if isinstance(self.chunks, (list, tuple)):  # accept lists; store tuples so equality is by value
            groups = tuple(tuple(g) if isinstance(g, (list, tuple)) else g for g in self.chunks)
            object.__setattr__(self, "chunks", groups)

    @property
    def num_groups(self) -> int:
        """Number of page groups (layers)."""
        return len(self.chunks)

    @property
    def key(self) -> str:
        """The store key of this manifest."""
        return manifest_key(self.name, self.generation)

    def chunk_refs(self) -> Iterator[ChunkRef]:
        """Every chunk reference, group by group, in page order."""
        for group in self.chunks:
            yield from group

    def chunk_keys(self) -> set[str]:
        """The distinct store keys of the chunks this manifest needs."""
        return {ref.key for ref in self.chunk_refs()}


def _to_body(m: Manifest, table: bool = True) -> dict[str, Any]:
    """``m`` as the JSON body; without ``table``, ``chunks`` is left None (its length still sets num_groups)."""
    if not isinstance(m, Manifest):
        raise FormatError("manifest", "a Manifest", type(m).__name__)
    if not isinstance(m.chunks, Sequence):
        raise FormatError("chunks", "a sequence of groups", type(m.chunks).__name__)
    groups = []
    for g, group in enumerate(m.chunks if table else ()):
        if not isinstance(group, Sequence):
            raise FormatError(f"chunks[{g}]", "a sequence of ChunkRef", type(group).__name__)
        entries = []
        for i, ref in enumerate(group):
            if not isinstance(ref, ChunkRef):
                raise FormatError(f"chunks[{g}][{i}]", "a ChunkRef", type(ref).__name__)
            if ref.group != g:
                raise FormatError(f"chunks[{g}][{i}].group", g, ref.group)
            entries.append(
                {"first_page": ref.first_page, "nbytes": ref.nbytes, "num_pages": ref.num_pages, "sha256": ref.sha256}
            )
        groups.append(entries)
    return {
        "app_state": m.app_state,
        "chunks": groups if table else None,
        "created_ms": m.created_ms,
        "format_version": FORMAT_VERSION,
        "generation": m.generation,
        "name": m.name,
        "num_groups": len(m.chunks),
        "num_logical_pages": m.num_logical_pages,
        "page_bytes": m.page_bytes,
        "pages_per_chunk": m.pages_per_chunk,
        "tvm_metadata": m.tvm_metadata,
    }


@read_checks()
def _parse_table(raw: Any, num_groups: int, num_pages: int, page_bytes: int, per_chunk: int) -> tuple:
    if not isinstance(raw, list):
        raise FormatError("chunks", "a list of groups", type(raw).__name__)
    if len(raw) != num_groups:
        raise FormatError("chunks", f"num_groups={num_groups} groups", len(raw))
    plan = plan_chunks(num_pages, per_chunk)
    groups = []
    for g, entries in enumerate(raw):
        where = f"chunks[{g}]"
        if not isinstance(entries, list):
            raise FormatError(where, "a list of chunks", type(entries).__name__)
        if len(entries) != len(plan):
            raise FormatError(
                where, f"{len(plan)} chunks covering {num_pages} pages by {per_chunk}", f"{len(entries)} chunks"
            )
        refs = []
        for i, (entry, (first, count)) in enumerate(zip(entries, plan)):
            if (type(entry) is dict and entry.keys() == _CHUNK_KEYS and type(entry["first_page"]) is int
                    and entry["first_page"] == first and type(entry["num_pages"]) is int and entry["num_pages"] == count
                    and type(entry["nbytes"]) is int and entry["nbytes"] == count * page_bytes
                    and type(entry["sha256"]) is str and HEX64_RE.fullmatch(entry["sha256"])):
                refs.append(ChunkRef(g, first, count, count * page_bytes, entry["sha256"]))  # all as planned
                continue
            at = f"{where}[{i}]"
            if not isinstance(entry, dict):
                raise FormatError(at, "an object", type(entry).__name__)
            if entry.keys() != _CHUNK_KEYS:
                raise FormatError(at, f"keys {sorted(_CHUNK_KEYS)}", sorted(entry))
            got_first = check_int(f"{at}.first_page", entry["first_page"], 0)
            if got_first != first:
                raise FormatError(f"{at}.first_page", first, got_first, "chunks must be contiguous and in order")
            got_count = check_int(f"{at}.num_pages", entry["num_pages"], 1)
            if got_count != count:
                raise FormatError(f"{at}.num_pages", count, got_count)
            nbytes = check_int(f"{at}.nbytes", entry["nbytes"], 1)
            if nbytes != count * page_bytes:
                raise FormatError(f"{at}.nbytes", f"num_pages*page_bytes={count * page_bytes}", nbytes)
            refs.append(ChunkRef(g, first, count, nbytes, check_digest(f"{at}.sha256", entry["sha256"])))
        groups.append(tuple(refs))
    return tuple(groups)


@read_checks()
def _parse_header(body: Any, metadata_is_valid: bool = False) -> tuple[str, int, int, str, int, int, int, int,
                                                                         dict[str, Any]]:
    """Every body field but the chunk table, validated: (name, generation, created_ms, tvm_metadata,
    page_bytes, pages_per_chunk, num_groups, num_logical_pages, app_state). ``metadata_is_valid``
    skips parsing tvm_metadata."""
    if not isinstance(body, dict):
        raise FormatError("body", "a JSON object", type(body).__name__)
    if body.keys() != _BODY_KEYS:
        missing, extra = sorted(_BODY_KEYS - body.keys()), sorted(body.keys() - _BODY_KEYS)
        raise FormatError("body", f"keys {sorted(_BODY_KEYS)}", f"missing {missing}, unknown {extra}")
    version = check_int("body.format_version", body["format_version"], 0)
    if version != FORMAT_VERSION:
        raise FormatError("body.format_version", FORMAT_VERSION, version)
    name = validate_name(body["name"])
    generation = check_int("body.generation", body["generation"], 1)
    created_ms = check_int("body.created_ms", body["created_ms"], 0)
    tvm_metadata = body["tvm_metadata"]
    if not isinstance(tvm_metadata, str):
        raise FormatError("body.tvm_metadata", "a str", type(tvm_metadata).__name__)
    if not metadata_is_valid and not isinstance(_loads(tvm_metadata, "body.tvm_metadata"), dict):
        raise FormatError("body.tvm_metadata", "the text of a JSON object", tvm_metadata[:64])
    page_bytes = check_int("body.page_bytes", body["page_bytes"], 1)
    per_chunk = check_int("body.pages_per_chunk", body["pages_per_chunk"], 1)
    num_groups = check_int("body.num_groups", body["num_groups"], 1)
    num_pages = check_int("body.num_logical_pages", body["num_logical_pages"], 0)
    if num_pages * page_bytes > MAX_INT:
        raise FormatError("body.num_logical_pages*page_bytes", f"at most {MAX_INT}", num_pages * page_bytes)
    app_state = body["app_state"]
    if not isinstance(app_state, dict):
        raise FormatError("body.app_state", "a JSON object", type(app_state).__name__)
    return name, generation, created_ms, tvm_metadata, page_bytes, per_chunk, num_groups, num_pages, app_state


def _parse_body(body: Any) -> Manifest:
    name, generation, created_ms, tvm_metadata, page_bytes, per_chunk, num_groups, num_pages, app_state = \
        _parse_header(body)
    chunks = _parse_table(body["chunks"], num_groups, num_pages, page_bytes, per_chunk)
    return Manifest(name, generation, tvm_metadata, page_bytes, per_chunk, num_pages, chunks, app_state, created_ms)


def _table_json(m: Manifest) -> str | None:
    """The JSON text of ``m``'s chunk table if every ref is exactly what the reader accepts, else None.

    A manifest's header must have passed :func:`_parse_header`. None sends the writer down the
    reader's own checks, which name what is wrong.
    """
    if not isinstance(m.chunks, tuple):
        return None
    plan = plan_chunks(m.num_logical_pages, m.pages_per_chunk)
    page_bytes = m.page_bytes
    groups = []
    for g, group in enumerate(m.chunks):
        if not isinstance(group, tuple) or len(group) != len(plan):
            return None
        entries = []
        for ref, (first, count) in zip(group, plan):
            if not (type(ref) is ChunkRef and ref.group == g and ref.first_page == first and ref.num_pages == count
                    and ref.nbytes == count * page_bytes):
                return None
            entry = ref.entry_json
            if entry is None:
                return None
            entries.append(entry)
        groups.append("[" + ",".join(entries) + "]")
    return "[" + ",".join(groups) + "]"


def _reject_constant(token: str) -> Any:
    raise ValueError(f"non-finite number {token}")


def _finite_float(token: str) -> float:
    value = float(token)
    if value in (math.inf, -math.inf):
        raise ValueError(f"number {token} overflows a double")
    return value


def _dumps(value: Any, field_name: str) -> str:
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise FormatError(field_name, "JSON-serialisable data", str(exc)) from exc


def _loads(text: str, field_name: str) -> Any:
    depth = nesting_depth(text)
    if depth > MAX_NESTING:
        raise FormatError(field_name, f"JSON nested at most {MAX_NESTING} deep", f"{depth} levels")
    try:
        return json.loads(
            text, object_pairs_hook=unique_keys, parse_constant=_reject_constant, parse_float=_finite_float
        )
    except ValueError as exc:
        raise FormatError(field_name, "valid JSON", str(exc)) from exc


def encode_manifest(manifest: Manifest, *, metadata_is_valid: bool = False) -> bytes:
    """The version-1 envelope of ``manifest``; deterministic, and raises :class:`FormatError` if invalid.

    ``metadata_is_valid``: the caller vouches that ``tvm_metadata`` is JSON text the reader accepts
    (it came from ``get_checkpoint_metadata``), which spares parsing it again (17 KB for 4096 tokens).
    """
    body = _to_body(manifest, table=False)
    _parse_header(body, metadata_is_valid)  # the writer enforces exactly what the reader checks
    bad_key = non_string_key(body["app_state"])
    if bad_key is not None:  # json.dumps would write it as a string: it would come back as another key
        path, key = bad_key
        raise FormatError(f"app_state{path} key {key!r}", "a str (JSON object keys are strings)", type(key).__name__)
    table = _table_json(manifest)
    if table is None:  # not what the reader accepts: its checks say why
        body = _to_body(manifest)
        _parse_body(body)
        table = _dumps(body["chunks"], "body")
    # the body as _dumps writes it (keys sorted, no spaces), the table text spliced in as its value
    text = ",".join(f'"{key}":{table if key == "chunks" else _dumps(body[key], "body")}' for key in sorted(body))
    try:
        raw = ("{" + text + "}").encode("utf-8")
    except UnicodeEncodeError as exc:
        raise FormatError("body", "text encodable as UTF-8", str(exc)) from exc
    if len(raw) > MAX_BODY_BYTES:
        raise FormatError("body length", f"at most {MAX_BODY_BYTES} bytes", len(raw))
    # Only app_state nests deeply: the rest of the body is at most 4 levels, far below MAX_NESTING.
    depth = 1 + nesting_depth(_dumps(body["app_state"], "app_state"))
    if depth > MAX_NESTING:
        raise FormatError("app_state", f"JSON nested at most {MAX_NESTING} deep (with the body)", f"{depth} levels")
    head = _PREFIX.pack(MAGIC, FORMAT_VERSION, len(raw)) + raw
    return head + hashlib.sha256(head).digest()


def decode_manifest(data: bytes | bytearray | memoryview) -> Manifest:
    """Parse and fully validate a manifest envelope.

    Raises :class:`FormatError` for anything off the specification and
    :class:`CorruptionError` when the checksum does not match.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise FormatError("manifest", "bytes, bytearray or memoryview", type(data).__name__)
    data = bytes(data)
    minimum = _PREFIX.size + _DIGEST_BYTES
    if len(data) < minimum:
        raise FormatError("manifest length", f"at least {minimum} bytes", len(data))
    magic, version, body_len = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise FormatError("magic", MAGIC.hex(), magic.hex())
    if version != FORMAT_VERSION:
        raise FormatError("format_version", FORMAT_VERSION, version)
    if body_len > MAX_BODY_BYTES:
        raise FormatError("body length", f"at most {MAX_BODY_BYTES}", body_len)
    if len(data) != minimum + body_len:
        raise FormatError("manifest length", f"{minimum + body_len} bytes (body length {body_len})", len(data))
    head, stored = data[: _PREFIX.size + body_len], data[_PREFIX.size + body_len :]
    computed = hashlib.sha256(head).digest()
    if computed != stored:
        raise CorruptionError(f"manifest checksum: expected sha256 {stored.hex()}, got {computed.hex()}")
    try:
        text = head[_PREFIX.size :].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError("body", "UTF-8 text", str(exc)) from exc
    return _parse_body(_loads(text, "body"))
