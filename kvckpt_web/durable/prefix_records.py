"""Prefix index records (FORMAT.md section 7): the scope id, the chained page hashes of token ids, the record
keys and the record bytes.

Pure functions over values; nothing here touches a store. Each committed generation of a name may have one
record, ``prefixes/<scope id>/<name>/<generation>``, that lists the chained SHA-256 hashes of the full pages
of token ids whose K/V the checkpoint holds. :mod:`.prefix_index` keeps them in a store and looks them up.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import BadValueError, FieldError, FormatError, is_int
from ..jsontext import nesting_depth, unique_keys
from .keys import MANIFESTS, MAX_INT, PREFIXES, manifest_key, parse_manifest_key

__all__ = ["HASH_BYTES", "MAX_RECORD_BYTES", "MAX_TOKEN", "RECORD_FORMAT", "RECORD_VERSION", "PrefixKey",
           "PrefixRecord", "chain_hashes", "check_page_size", "checked_tokens", "decode_record", "encode_record",
           "manifest_of", "page_hashes", "parse_record_key", "prefix_record", "record_key", "scope_hash", "scope_id"]

RECORD_FORMAT = "kvckpt.prefixes"
"""The ``format`` field of every record."""

RECORD_VERSION = 1
"""The one record version this module reads and writes."""

MAX_RECORD_BYTES = 1 << 20
"""The largest record a reader reads (about 30,800 pages, or 493,000 tokens in pages of 16). An index reads
every record of its scope, so a damaged or hostile value must not make it allocate without bound. A save
whose record would be larger writes none, and lookups miss that checkpoint."""

HASH_BYTES = 16
"""Bytes of each chained page hash that a record keeps (32 hex digits)."""

MAX_TOKEN = 2**32 - 1
"""The largest token id: page hashes take token ids as little-endian u32."""

_HEX32_RE = re.compile(r"[0-9a-f]{32}")
_RECORD_KEYS = frozenset({"format", "generation", "name", "page_size", "pages", "scope_id", "tokens", "version"})
_RECORD_DEPTH = 2
"""A record nests one list inside one object."""


# -- scopes, tokens and chained page hashes ----------------------------------------------------------------------


def scope_hash(scope: str) -> bytes:
    """h_0 of ``scope``: SHA-256 of the scope text (UTF-8); :class:`FieldError` unless it is a non-empty str."""
    if not isinstance(scope, str) or not scope:
        raise FieldError("scope", "a non-empty str", scope if isinstance(scope, str) else type(scope).__name__)
    try:
        return hashlib.sha256(scope.encode("utf-8")).digest()
    except UnicodeEncodeError as exc:
        raise FieldError("scope", "text encodable as UTF-8", str(exc)) from None


def scope_id(scope: str) -> str:
    """The id of ``scope`` in record keys: the first 16 bytes of SHA-256(scope, UTF-8) as 32 lowercase hex."""
    return scope_hash(scope)[:HASH_BYTES].hex()


def checked_tokens(tokens: Sequence[int], field: str) -> tuple[int, ...]:
    """``tokens`` as a tuple once each is an int token id (a bool is not), else :class:`FieldError`."""
    if isinstance(tokens, (str, bytes, bytearray)) or not isinstance(tokens, Sequence):
        raise FieldError(field, "a sequence of token ids", type(tokens).__name__)
    tokens = tuple(tokens)
    if not all(type(t) is int and 0 <= t <= MAX_TOKEN for t in tokens):
        i, bad = next((i, t) for i, t in enumerate(tokens) if not is_int(t, 0, MAX_TOKEN))
        raise FieldError(f"{field}[{i}]", f"an integer token id in [0, {MAX_TOKEN}]", bad)
    return tokens


def check_page_size(page_size: int) -> int:
    """``page_size`` if it is an integer >= 1, else :class:`FieldError`."""
    if not is_int(page_size, 1, MAX_INT):
        raise FieldError("page_size", "an integer >= 1", page_size)
    return page_size


def chain_hashes(h0: bytes, tokens: tuple[int, ...], page_size: int) -> bytes:
    """The first :data:`HASH_BYTES` of h_1 .. h_n back to back, where h_0 is ``h0``, h_(i+1) = SHA-256(h_i ||
    page i of ``tokens`` as little-endian u32), and n counts the full pages."""
    pack = struct.Struct(f"<{page_size}I").pack
    out = bytearray()
    h = h0
    for start in range(0, len(tokens) - page_size + 1, page_size):
        h = hashlib.sha256(h + pack(*tokens[start:start + page_size])).digest()
        out += h[:HASH_BYTES]
    return bytes(out)


def page_hashes(scope: str, tokens: Sequence[int], page_size: int) -> list[str]:
    """The record hashes of ``tokens``: one per full page of ``page_size`` tokens, each the first 16 bytes of
    the chained hash (h_0 = SHA-256(scope), h_(i+1) = SHA-256(h_i || page i as little-endian u32)), as hex."""
    blob = chain_hashes(scope_hash(scope), checked_tokens(tokens, "tokens"), check_page_size(page_size))
    return [blob[i:i + HASH_BYTES].hex() for i in range(0, len(blob), HASH_BYTES)]


@dataclass(frozen=True)
class PrefixKey:
    """What a save indexes its checkpoint under: the caller's ``scope`` text (model identity, layout and
    kernels) and ``tokens``, the ids of the tokens whose K/V the sequence holds (exactly its length)."""

    scope: str
    tokens: tuple[int, ...]

    def __post_init__(self) -> None:
        scope_hash(self.scope)
        object.__setattr__(self, "tokens", checked_tokens(self.tokens, "prefix.tokens"))


# -- records --------------------------------------------------------------------------------------------------


def _check_scope_id(value: Any) -> str:
    if not isinstance(value, str) or _HEX32_RE.fullmatch(value) is None:
        got = value if isinstance(value, str) else type(value).__name__
        raise FieldError("scope_id", "32 lowercase hex digits", got)
    return value


def record_key(scope_id_hex: str, name: str, generation: int) -> str:
    """The store key of the record of generation ``generation`` of ``name`` in the scope ``scope_id_hex``."""
    return f"{PREFIXES}{_check_scope_id(scope_id_hex)}/{manifest_key(name, generation)[len(MANIFESTS):]}"


def parse_record_key(key: str) -> tuple[str, str, int]:
    """The (scope id, name, generation) of a key that :func:`record_key` made, else :class:`FormatError`."""
    parts = key.split("/") if isinstance(key, str) else []
    try:
        if len(parts) != 4 or f"{parts[0]}/" != PREFIXES:
            raise FormatError("record key", "", key)
        name, generation = parse_manifest_key(f"{MANIFESTS}{parts[2]}/{parts[3]}")
        return _check_scope_id(parts[1]), name, generation
    except BadValueError:
        raise FormatError("record key", f"'{PREFIXES}<32 hex>/<name>/<20 digits>'", key) from None


def manifest_of(key: str) -> str | None:
    """The manifest key of the checkpoint the record under ``key`` indexes; None if ``key`` is no record key."""
    try:
        _, name, generation = parse_record_key(key)
    except FormatError:
        return None
    return manifest_key(name, generation)


@dataclass(frozen=True)
class PrefixRecord:
    """The index record of one committed generation (FORMAT.md section 7): ``pages`` holds the hex hashes of
    the full pages of the ``tokens`` tokens whose K/V the checkpoint holds."""

    scope_id: str
    name: str
    generation: int
    page_size: int
    tokens: int
    pages: tuple[str, ...]

    @property
    def key(self) -> str:
        """The store key of this record."""
        return record_key(self.scope_id, self.name, self.generation)


def _record_int(key: str, body: dict[str, Any], field: str, minimum: int) -> int:
    value = body[field]
    if not is_int(value, minimum, MAX_INT):
        raise FormatError(f"{key}: {field}", f"an integer in [{minimum}, {MAX_INT}]", value)
    return value


def decode_record(key: str, data: bytes | bytearray | memoryview) -> PrefixRecord:
    """The record ``data`` stored under ``key``. Raises :class:`FormatError` naming the key if the record is
    anything a reader ignores: oversize, not UTF-8 JSON, another format or version, or a field that breaks
    its rule or does not match the key."""
    scope, name, generation = parse_record_key(key)
    if len(data) > MAX_RECORD_BYTES:
        raise FormatError(f"{key} length", f"at most {MAX_RECORD_BYTES} bytes", len(data))
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError(key, "UTF-8 JSON text", str(exc)) from None
    depth = nesting_depth(text)
    if depth > _RECORD_DEPTH:
        raise FormatError(key, f"JSON nested at most {_RECORD_DEPTH} deep", f"{depth} levels")
    try:
        body = json.loads(text, object_pairs_hook=unique_keys)
    except ValueError as exc:
        raise FormatError(key, "valid JSON", str(exc)) from None
    if not isinstance(body, dict):
        raise FormatError(key, "a JSON object", type(body).__name__)
    if body.get("format") != RECORD_FORMAT:
        raise FormatError(f"{key}: format", RECORD_FORMAT, body.get("format"))
    if not is_int(body.get("version"), RECORD_VERSION, RECORD_VERSION):
        raise FormatError(f"{key}: version", RECORD_VERSION, body.get("version"))
    if body.keys() != _RECORD_KEYS:
        missing, extra = sorted(_RECORD_KEYS - body.keys()), sorted(body.keys() - _RECORD_KEYS)
        raise FormatError(key, f"keys {sorted(_RECORD_KEYS)}", f"missing {missing}, unknown {extra}")
    for field, expected in (("scope_id", scope), ("name", name), ("generation", generation)):
        if type(body[field]) is not type(expected) or body[field] != expected:
            raise FormatError(f"{key}: {field}", f"{expected!r} (from its key)", body[field])
    page_size = _record_int(key, body, "page_size", 1)
    tokens = _record_int(key, body, "tokens", 0)
    pages = body["pages"]
    if not isinstance(pages, list) or len(pages) != tokens // page_size:
        got = f"{len(pages)} entries" if isinstance(pages, list) else type(pages).__name__
        raise FormatError(f"{key}: pages", f"a list of {tokens // page_size} hashes (tokens // page_size)", got)
    if not all(type(p) is str and _HEX32_RE.fullmatch(p) for p in pages):
        i, bad = next((i, p) for i, p in enumerate(pages) if not (type(p) is str and _HEX32_RE.fullmatch(p)))
        raise FormatError(f"{key}: pages[{i}]", "32 lowercase hex digits", bad)
    return PrefixRecord(scope, name, generation, page_size, tokens, tuple(pages))


def encode_record(record: PrefixRecord) -> bytes:
    """The bytes of ``record``: compact JSON, keys sorted, UTF-8. The result is deterministic. Raises
    :class:`FormatError` for a record that a reader would ignore, one over :data:`MAX_RECORD_BYTES` included."""
    if not isinstance(record, PrefixRecord):
        raise FormatError("record", "a PrefixRecord", type(record).__name__)
    body = {"format": RECORD_FORMAT, "generation": record.generation, "name": record.name,
            "page_size": record.page_size, "pages": list(record.pages) if isinstance(record.pages, tuple) else None,
            "scope_id": record.scope_id, "tokens": record.tokens, "version": RECORD_VERSION}
    try:
        data = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise FormatError("record", "JSON-serialisable fields", str(exc)) from None
    decode_record(record.key, data)  # the writer enforces exactly what the reader checks
    return data


# -- what a save writes -------------------------------------------------------------------------------------


def prefix_record(prefix: PrefixKey | None, name: str, generation: int, seq_length: int, page_size: int
                  ) -> PrefixRecord | None:
    """The record a save of ``name`` as ``generation`` commits for ``prefix`` (None without one). Raises
    :class:`FieldError` unless ``prefix`` names exactly ``seq_length`` tokens."""
    if prefix is None:
        return None
    if not isinstance(prefix, PrefixKey):
        raise FieldError("prefix", "a PrefixKey or None", type(prefix).__name__)
    if len(prefix.tokens) != seq_length:
        raise FieldError("prefix.tokens", f"{seq_length} token ids (the length of the sequence saved)",
                         f"{len(prefix.tokens)} ids")
    return PrefixRecord(scope_id(prefix.scope), name, generation, page_size, seq_length,
                        tuple(page_hashes(prefix.scope, prefix.tokens, page_size)))
