"""The key layout of a checkpoint store (FORMAT.md sections 1 and 7): where manifests, chunks and prefix records
live, and the rules for the names and numbers in their keys.

A manifest lives under ``manifests/<name>/<generation as 20 digits>``, a chunk under ``chunks/<sha256 hex>``,
a prefix index record under ``prefixes/<scope id>/<name>/<generation as 20 digits>``. Pure functions over
strings; nothing here touches a store.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..errors import FieldError, FormatError

__all__ = ["CHUNKS", "HEX64_RE", "MANIFESTS", "MAX_INT", "PREFIXES", "STORE_TOPS", "check_digest", "check_int",
           "chunk_digest", "chunk_key", "is_chunk_key", "manifest_key", "manifest_prefix", "parse_manifest_key",
           "validate_name"]

MAX_INT = 2**53 - 1
"""Largest integer in a manifest field: every JSON reader holds it exactly."""

MANIFESTS = "manifests/"
"""The key prefix of every manifest: ``manifests/<name>/<generation as 20 digits>``."""

CHUNKS = "chunks/"
"""The key prefix of every chunk: ``chunks/<sha256 hex>``."""

PREFIXES = "prefixes/"
"""The key prefix of every prefix index record: ``prefixes/<scope id>/<name>/<generation as 20 digits>``
(FORMAT.md section 7; :mod:`.prefix_records`)."""

STORE_TOPS = (MANIFESTS.rstrip("/"), CHUNKS.rstrip("/"), PREFIXES.rstrip("/"))
"""The first segment of every key of a checkpoint store."""

_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,128}")
HEX64_RE = re.compile(r"[0-9a-f]{64}")
_GENERATION_RE = re.compile(r"[0-9]{20}")


@contextmanager
def read_checks() -> Iterator[None]:
    """Inside it, a check written for a caller's values (a name, an integer, a digest) that fails on a stored
    field or key raises the :class:`FormatError` it is there, not a :class:`FieldError`."""
    try:
        yield
    except FieldError as exc:
        raise FormatError(exc.field, exc.expected, exc.got) from None


def validate_name(name: str, field: str = "name") -> str:
    """Return ``name`` if it is a valid sequence name, else raise :class:`FieldError` naming ``field`` (a name read
    from a store is checked by its reader, which raises :class:`FormatError`).

    Valid: 1 to 128 characters of ``[A-Za-z0-9._-]``, other than ``.`` and ``..``.
    """
    if not isinstance(name, str) or _NAME_RE.fullmatch(name) is None or name in (".", ".."):
        raise FieldError(field, "1-128 characters of [A-Za-z0-9._-], not '.' or '..'", name)
    return name


def check_int(field_name: str, value: Any, minimum: int) -> int:
    """``value`` if it is an int (not a bool) in [``minimum``, :data:`MAX_INT`], else :class:`FieldError`
    naming ``field_name``."""
    if type(value) is not int:
        raise FieldError(field_name, "an integer", type(value).__name__)
    if not minimum <= value <= MAX_INT:
        raise FieldError(field_name, f"an integer in [{minimum}, {MAX_INT}]", value)
    return value


def check_digest(field_name: str, digest: Any) -> str:
    """``digest`` if it is 64 lowercase hex digits, else :class:`FieldError` naming ``field_name``."""
    if not isinstance(digest, str) or HEX64_RE.fullmatch(digest) is None:
        got = digest if isinstance(digest, str) else type(digest).__name__
        raise FieldError(field_name, "64 lowercase hex digits", got)
    return digest


def chunk_digest(data: bytes | bytearray | memoryview) -> str:
    """The sha256 of ``data`` as 64 lowercase hex digits."""
    return hashlib.sha256(data).hexdigest()


def chunk_key(digest: str) -> str:
    """The store key of the chunk whose sha256 hex is ``digest``."""
    return CHUNKS + check_digest("digest", digest)


def is_chunk_key(key: str) -> bool:
    """Whether ``key`` is the key of a chunk (``chunks/`` and 64 lowercase hex digits)."""
    try:
        return chunk_key(key[len(CHUNKS):]) == key
    except FieldError:
        return False


def manifest_prefix(name: str) -> str:
    """The store-key prefix under which all manifests of sequence ``name`` live."""
    return f"{MANIFESTS}{validate_name(name)}/"


def manifest_key(name: str, generation: int) -> str:
    """The store key of generation ``generation`` of sequence ``name``."""
    return f"{manifest_prefix(name)}{check_int('generation', generation, 1):020d}"


def parse_manifest_key(key: str) -> tuple[str, int]:
    """The (name, generation) of a key made by :func:`manifest_key`; FormatError if it is none (a key listed in a
    store, or sent to one)."""
    parts = key.split("/") if isinstance(key, str) else []
    if len(parts) != 3 or f"{parts[0]}/" != MANIFESTS or _GENERATION_RE.fullmatch(parts[2]) is None:
        raise FormatError("manifest key", f"'{MANIFESTS}<name>/<20 digits>'", key)
    with read_checks():
        return validate_name(parts[1]), check_int("generation", int(parts[2]), 1)
