"""Retention: which generations of a name stay, after each save (:func:`retain`) and on demand (:func:`gc`).

A generation stays while it is among the newest ``keep`` of its name that can be restored; a damaged one
newer than those stays too, as evidence, without counting; while fewer than ``keep`` can be restored, none
is dropped, so the last restorable generation is never deleted. Manifests go first, durably, and only then
the chunks no remaining manifest of any name uses; while a manifest cannot be read, no chunk is deleted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..errors import CorruptionError, FieldError, KVCkptError, NotFoundError, is_int
from .catalog import decode_at, decoded_refs, manifest_keys, referenced, refs_of
from .container import (CHUNKS, MAX_MANIFEST_BYTES, ChunkRef, check_chunk_digest, check_chunk_size, chunk_digest,
                        is_chunk_key, validate_name)
from .memo import trusted_chunks
from .pipeline import IO_CONCURRENCY, offload, run_bounded
from .prefix_index import drop_records
from .results import GcResult, Progress

if TYPE_CHECKING:
    from ..stores.base import Store

__all__ = ["DEFAULT_KEEP", "check_keep", "delete_name", "gc", "retain"]

DEFAULT_KEEP = 2
"""Generations of each name a save keeps (the new one and the one before)."""


def check_keep(keep: int) -> int:
    """``keep`` if it is an integer >= 1, else :class:`FieldError`."""
    if not is_int(keep, 1):
        raise FieldError("keep", "an integer >= 1", keep)
    return keep


async def _unusable(store: "Store", key: str, trusted: set[str], deep: bool, seen: dict[str, str | None]
                    ) -> str | None:
    """Why the manifest under ``key`` cannot be restored, or None if it can: it decodes and matches its key, and
    each chunk it uses that is not ``trusted`` is stored with its size (``deep``: and its SHA-256).

    ``seen`` remembers each chunk's finding (None: good) across calls.
    """
    try:
        data = await store.get(key, max_bytes=MAX_MANIFEST_BYTES)
        refs = decoded_refs(key, data)
        if refs is not None and refs <= trusted:
            return None
        manifest = decode_at(key, data)
    except KVCkptError as exc:
        return str(exc)
    todo = {ref.key: ref for ref in manifest.chunk_refs() if ref.key not in trusted and ref.key not in seen}
    size_only = memoryview(bytearray())  # get_into gives a value's length and reads it only into a buffer that fits

    async def check(ref: ChunkRef) -> None:
        try:
            if deep:
                data = memoryview(bytearray(ref.nbytes))
                check_chunk_size(ref, await store.get_into(ref.key, data))
                check_chunk_digest(ref, await offload(chunk_digest, data))
            else:
                check_chunk_size(ref, await store.get_into(ref.key, size_only))
            seen[ref.key] = None
        except CorruptionError as exc:
            seen[ref.key] = str(exc)

    await run_bounded((lambda r=r: check(r) for r in todo.values()), IO_CONCURRENCY)
    bad = [seen[ref.key] for ref in manifest.chunk_refs() if seen.get(ref.key) is not None]
    return f"{key}: {bad[0]}" if bad else None


async def _select(store: "Store", keep: int, keys: list[str], trusted: set[str], deep: bool,
                  seen: dict[str, str | None]) -> tuple[list[str], dict[str, str]]:
    """Of one name's manifest keys (oldest first): those retention drops, and why it keeps each other one.

    The newest ``keep`` that can be restored (see :func:`_unusable`) are kept; a damaged one newer than
    the oldest of those is kept too (evidence) but not counted; older ones are dropped. While fewer than
    ``keep`` can be restored, none is dropped: the last restorable generation is never deleted.
    """
    reasons: dict[str, str] = {}
    counted = 0
    for i in range(len(keys) - 1, -1, -1):
        if counted == keep:
            return keys[:i + 1], reasons
        why = await _unusable(store, keys[i], trusted, deep, seen)
        if why is None:
            counted += 1
            reasons[keys[i]] = f"restorable, {counted} of the newest {keep} that are"
        else:
            reasons[keys[i]] = f"damaged, kept as evidence and not counted: {why}"
    return [], reasons


async def retain(store: "Store", keep: int, keys: list[str]) -> tuple[list[str], int, list[str]]:
    """Drop the manifests of ``keys`` (every manifest key of one name, oldest first, as listed under the lock
    held) beyond the newest ``keep`` that can be restored, then the chunks only they used; warnings name
    the damaged manifests kept."""
    if len(keys) <= keep:
        return [], 0, []
    drop, reasons = await _select(store, keep, keys, trusted_chunks(store), False, {})
    warnings = [f"{key}: {why}" for key, why in reasons.items() if why.startswith("damaged")]
    if not drop:
        return [], 0, warnings
    candidates: set[str] = set()
    for key in drop:
        candidates |= await refs_of(store, key) or frozenset()
    async with store.batch():  # the manifests are gone for good before any chunk they used is deleted
        await run_bounded(((lambda k=k: store.delete(k)) for k in drop), IO_CONCURRENCY)
    await drop_records(store, drop)  # their prefix index records go after them
    if not candidates:
        return drop, 0, warnings
    used, damaged = await referenced(store)
    if damaged:
        return drop, 0, warnings + [f"chunks not deleted: cannot tell which chunks damaged manifests use: "
                                    f"{', '.join(damaged)}"]
    unused = sorted(candidates - used)
    async with store.batch():
        await run_bounded(((lambda k=k: store.delete(k)) for k in unused), IO_CONCURRENCY)
    trusted_chunks(store).difference_update(unused)
    return drop, len(unused), warnings


async def gc(store: "Store", *, keep: int | None = DEFAULT_KEEP, names: Iterable[str] | None = None,
             progress: Progress | None = None) -> GcResult:
    """Keep the newest ``keep`` manifests of each name that can be restored (``names``: only those names;
    ``keep=None``: every manifest), then delete every chunk no remaining manifest uses, including those of
    interrupted saves.

    A manifest can be restored if it decodes, matches its key, and every chunk it uses is stored with
    its size and SHA-256 (each chunk read once, even one this process wrote). A damaged
    manifest newer than the kept ones is kept too but not counted; while fewer than ``keep`` of a name
    can be restored, none of its manifests is deleted. ``kept_reasons`` says why each was kept. While a
    kept manifest cannot be read, no chunk is deleted (it is reported in ``damaged_manifests``).
    """
    if keep is not None:
        check_keep(keep)
    only = None if names is None else {validate_name(n) for n in names}
    async with store.lock():
        entries = await manifest_keys(store)
        by_name: dict[str, list[str]] = {}
        for n, _, key in entries:
            by_name.setdefault(n, []).append(key)
        drop: list[str] = []
        reasons: dict[str, str] = {}
        seen: dict[str, str | None] = {}
        for n, keys in by_name.items():
            if keep is None or (only is not None and n not in only):
                reasons.update((key, "not collected (keep=None)" if keep is None else "not collected (name not selected)")
                               for key in keys)
                continue
            dropped, why = await _select(store, keep, keys, set(), True, seen)
            drop += dropped
            reasons.update(why)
        async with store.batch():  # the manifests are gone for good before any chunk they used is deleted
            for key in drop:
                await store.delete(key)
        records = await drop_records(store)  # of the manifests dropped, and any other whose manifest is gone
        used, damaged = await referenced(store)
        kept = tuple(key for _, _, key in await manifest_keys(store))
        kept_reasons = {key: reasons[key] for key in kept}
        if damaged:
            return GcResult(kept, tuple(drop), 0, 0, tuple(damaged), kept_reasons, records)
        chunks = await store.list_prefix(CHUNKS)
        unused = [key for key in chunks if key not in used and is_chunk_key(key)]
        freed = 0
        size_only = memoryview(bytearray())  # get_into gives a value's length and reads it only into a buffer that fits
        async with store.batch():
            for i, key in enumerate(unused):
                freed += await store.get_into(key, size_only) or 0
                await store.delete(key)
                if progress is not None:
                    progress("gc", i + 1, len(unused))
        trusted_chunks(store).difference_update(unused)
    return GcResult(kept, tuple(drop), len(unused), freed, (), kept_reasons, records)


async def delete_name(store: "Store", name: str, *, progress: Progress | None = None) -> GcResult:
    """Delete every generation of ``name`` (a deletion asked for: restorable ones too), then every chunk no
    other manifest uses; NotFoundError if ``store`` holds no generation of ``name``."""
    validate_name(name)
    async with store.lock():
        keys = tuple(key for _, _, key in await manifest_keys(store, name))
        if not keys:
            raise NotFoundError(f"name: expected a checkpoint named {name!r} in the store, got none")
        async with store.batch():
            for key in keys:
                await store.delete(key)
    return dataclasses.replace(await gc(store, keep=None, progress=progress), deleted_manifests=keys)
