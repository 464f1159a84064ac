"""The catalog of a checkpoint store: the manifests it holds, by name and generation, decoded and described.

A manifest under another key than its own is corruption.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import BadValueError, CorruptionError, FormatError, KVCkptError, NotFoundError, is_int
from ..stores.base import check_store
from ..tvm.metadata import parse_metadata
from .container import MAX_MANIFEST_BYTES, Manifest, decode_manifest
from .keys import MANIFESTS, manifest_key, manifest_prefix, parse_manifest_key, validate_name
from .results import GenerationInfo

if TYPE_CHECKING:
    from ..stores.base import Store

__all__ = ["at_key", "decode_at", "list_generations", "list_names", "load_manifest", "manifest_keys", "newest_readable"]


def at_key(exc: KVCkptError, where: str) -> KVCkptError:
    """``exc`` with ``where`` (a store key) in front of its message, same type."""
    if isinstance(exc, BadValueError):
        return type(exc)(f"{where}: {exc.field}", exc.expected, exc.got)
    return type(exc)(f"{where}: {exc}")


async def manifest_keys(store: "Store", name: str | None = None) -> list[tuple[str, int, str]]:
    """(name, generation, key) of every manifest key (of ``name``), by name then generation; junk keys skipped."""
    prefix = manifest_prefix(name) if name is not None else MANIFESTS
    out = []
    for key in await store.list_prefix(prefix):
        try:
            key_name, generation = parse_manifest_key(key)
        except FormatError:
            continue
        out.append((key_name, generation, key))
    return sorted(out)


async def list_names(store: "Store") -> list[str]:
    """Names with at least one manifest in ``store``, sorted."""
    check_store(store)
    return sorted({n for n, _, _ in await manifest_keys(store)})


def decode_at(key: str, data: bytes | None) -> Manifest:
    """Decode the manifest stored under ``key``; errors name the key; a manifest under another key is corruption."""
    if data is None:
        raise NotFoundError(f"{key}: no such manifest")
    try:
        manifest = decode_manifest(data)
    except (FormatError, CorruptionError) as exc:
        raise at_key(exc, key) from None
    name, generation = parse_manifest_key(key)
    if (manifest.name, manifest.generation) != (name, generation):
        raise CorruptionError(f"{key}: holds the manifest of name {manifest.name!r} generation "
                              f"{manifest.generation}, expected name {name!r} generation {generation}")
    return manifest


async def load_manifest(store: "Store", name: str, generation: int | None = None) -> tuple[Manifest, bytes]:
    """The decoded manifest of ``name`` (its newest generation unless told) and its envelope bytes.

    Raises :class:`NotFoundError` if there is none, :class:`CorruptionError` or :class:`FormatError`
    (both naming the key) if it is damaged.
    """
    check_store(store)
    validate_name(name)
    if generation is None:
        keys = await manifest_keys(store, name)
        if not keys:
            raise NotFoundError(f"{manifest_prefix(name)}: no checkpoint named {name!r} in {store.location}")
        key = keys[-1][2]
    else:
        key = manifest_key(name, generation)
    data = await store.get(key, max_bytes=MAX_MANIFEST_BYTES)
    if data is None and generation is not None:
        have = [g for _, g, _ in await manifest_keys(store, name)]
        raise NotFoundError(f"{key}: no generation {generation} of {name!r} (generations in store: {have})")
    return decode_at(key, data), data


async def newest_readable(store: "Store", name: str, keys: list[tuple[str, int, str]]) -> Manifest | None:
    """The newest manifest of ``name`` among ``keys`` (its :func:`manifest_keys`) that can be read; damaged ones,
    and ones deleted since the listing, are passed over. None if none can be read."""
    for _, generation, _ in reversed(keys):
        try:
            manifest, _ = await load_manifest(store, name, generation)
        except (CorruptionError, FormatError, NotFoundError):
            continue
        return manifest
    return None


async def list_generations(store: "Store", name: str | None = None) -> list[GenerationInfo]:
    """Every manifest in ``store`` (of ``name``, or of all names), by name then generation; damaged ones say why.

    A manifest another writer deletes between the listing and its reading is left out.
    """
    check_store(store)
    if name is not None:
        validate_name(name)
    found = [(n, g, key, await store.get(key, max_bytes=MAX_MANIFEST_BYTES))
             for n, g, key in await manifest_keys(store, name)]
    return [_describe(n, g, key, data) for n, g, key, data in found if data is not None]


def _describe(name: str, generation: int, key: str, data: bytes | None) -> GenerationInfo:
    size = len(data) if data is not None else 0
    try:
        m = decode_at(key, data)
        meta = parse_metadata(m.tvm_metadata)
    except KVCkptError as exc:
        return GenerationInfo(name, generation, key, size, error=str(exc))
    ints = {k: meta.get(k) if is_int(meta.get(k)) else None
            for k in ("seq_id", "seq_length")}
    return GenerationInfo(name, generation, key, size, None, m.created_ms, ints["seq_id"], ints["seq_length"],
                          m.num_groups, m.num_logical_pages, m.pages_per_chunk,
                          tuple(ref.key for ref in m.chunk_refs()), tuple(ref.nbytes for ref in m.chunk_refs()),
                          m.num_groups * m.num_logical_pages * m.page_bytes, m.app_state)
