"""Retention: which generations of a name stay, after each save (:func:`retain`) and on demand (:func:`gc`).

A generation stays while it is among the newest ``keep`` of its name that can be restored; a damaged one
newer than those stays too, as evidence, without counting; while fewer than ``keep`` can be restored, none
is dropped, so the last restorable generation is never deleted. A generation counts as restorable only once
each chunk it uses is stored with its SHA-256 (or is one the :class:`~.ledger.Ledger` wrote or read back
intact). Manifests go first, durably, and only then the chunks no remaining manifest of any name uses; while
a manifest cannot be read, no chunk is deleted. In a store without an exclusive lock (object storage), a chunk
is deleted only once it has settled (FORMAT.md section 8): a writer elsewhere may be about to commit a manifest
that names it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..checks import check_callable, check_each, check_int
from ..errors import ConflictError, CorruptionError, FormatError, KVCkptError, NotFoundError
from .catalog import decode_at, manifest_keys
from .chunk_reads import read_chunk, stored_size
from .container import MAX_MANIFEST_BYTES, ChunkRef
from .keys import CHUNKS, is_chunk_key, validate_name
from .ledger import Ledger, ledger_for
from .pipeline import IO_CONCURRENCY, run_bounded
from .prefix_index import drop_records
from .results import GcResult, Progress

if TYPE_CHECKING:
    from ..stores.base import Store

__all__ = ["DEFAULT_KEEP", "check_keep", "delete_name", "delete_names", "gc", "retain"]

DEFAULT_KEEP = 2
"""Generations of each name a save keeps (the new one and the one before)."""


def check_keep(keep: int) -> int:
    """``keep`` if it is an integer >= 1, else :class:`FieldError`."""
    return check_int("keep", keep, 1)


async def _unusable(store: "Store", key: str, ledger: Ledger | None, seen: dict[str, str | None]
                    ) -> tuple[str | None, bytes | None]:
    """Why the manifest under ``key`` cannot be restored (None if it can: it decodes and matches its key, and
    each chunk it uses that ``ledger`` does not trust (with None: every chunk) is stored with its size and
    SHA-256), and the bytes it held.

    ``seen`` remembers each chunk's finding (None: good) across calls.
    """
    try:
        data = await store.get(key, max_bytes=MAX_MANIFEST_BYTES)
        if ledger is not None:
            refs = ledger.manifest_refs(key, data)
            if refs is not None and ledger.trusts_all(refs):
                return None, data
        manifest = decode_at(key, data)
    except KVCkptError as exc:
        return str(exc), None
    todo = {ref.key: ref for ref in manifest.chunk_refs()
            if (ledger is None or not ledger.trusts(ref.key)) and ref.key not in seen}

    async def check(ref: ChunkRef) -> None:
        try:
            await read_chunk(store, ref, verify=True)
            seen[ref.key] = None
        except CorruptionError as exc:
            seen[ref.key] = str(exc)

    await run_bounded((lambda r=r: check(r) for r in todo.values()), IO_CONCURRENCY)
    bad = [seen[ref.key] for ref in manifest.chunk_refs() if seen.get(ref.key) is not None]
    return (f"{key}: {bad[0]}" if bad else None), data


async def _refs_of(store: "Store", key: str, ledger: Ledger) -> frozenset[str] | None:
    """The chunk keys the manifest under ``key`` uses (decoded by ``ledger`` once); None if it is missing or
    cannot be read or decoded."""
    try:
        data = await store.get(key, max_bytes=MAX_MANIFEST_BYTES)
    except FormatError:  # longer than any manifest, or no value (a FIFO, a device): it cannot be read
        return None
    return ledger.manifest_refs(key, data)


async def _referenced(store: "Store", ledger: Ledger) -> tuple[set[str], list[str]]:
    """Every chunk key used by a manifest of any name, and the keys of manifests that could not be read."""
    used: set[str] = set()
    damaged = []
    for _, _, key in await manifest_keys(store):
        refs = await _refs_of(store, key, ledger)
        if refs is None:
            damaged.append(key)
        else:
            used |= refs
    return used, damaged


@dataclass
class _Selection:
    """What retention decided for one name's manifests."""

    drop: list[str]
    """The manifest keys it drops, oldest first."""
    reasons: dict[str, str]
    """Why it keeps each other manifest it looked at."""
    counted: dict[str, bytes]
    """The manifests it counted as restorable, and the bytes each held then: dropping the others is right
    while they still hold them."""


async def _select(store: "Store", keep: int, keys: list[str], ledger: Ledger | None, seen: dict[str, str | None]
                  ) -> _Selection:
    """What retention drops of one name's manifest keys (oldest first), and why it keeps each other one.

    The newest ``keep`` that can be restored (see :func:`_unusable`) are kept; a damaged one newer than
    the oldest of those is kept too (evidence) but not counted; older ones are dropped. While fewer than
    ``keep`` can be restored, none is dropped: the last restorable generation is never deleted.
    """
    selection = _Selection([], {}, {})
    for i in range(len(keys) - 1, -1, -1):
        if len(selection.counted) == keep:
            selection.drop = keys[:i + 1]
            break
        why, data = await _unusable(store, keys[i], ledger, seen)
        if why is None and data is not None:
            selection.counted[keys[i]] = data
            selection.reasons[keys[i]] = f"restorable, {len(selection.counted)} of the newest {keep} that are"
        else:
            selection.reasons[keys[i]] = f"damaged, kept as evidence and not counted: {why}"
    return selection


async def retain(store: "Store", keep: int, keys: list[str], *, ledger: Ledger | None = None
                 ) -> tuple[list[str], int, list[str]]:
    """Drop the manifests of ``keys`` (every manifest key of one name, oldest first, as listed under the lock
    held) beyond the newest ``keep`` that can be restored, then the chunks only they used; warnings name
    the damaged manifests kept. The chunks of the generations it counts that ``ledger`` (default: the store
    object's own) has not written or read back intact are read and hashed (once: then it trusts them)."""
    if len(keys) <= keep:
        return [], 0, []
    ledger = ledger_for(store, ledger)
    seen: dict[str, str | None] = {}
    selection = await _select(store, keep, keys, ledger, seen)
    ledger.trust(key for key, why in seen.items() if why is None)
    drop = selection.drop
    warnings = [f"{key}: {why}" for key, why in selection.reasons.items() if why.startswith("damaged")]
    if not drop:
        return [], 0, warnings
    candidates: set[str] = set()
    for key in drop:
        candidates |= await _refs_of(store, key, ledger) or frozenset()
    async with store.batch():  # the manifests are gone for good before any chunk they used is deleted
        await run_bounded(((lambda k=k: store.delete(k)) for k in drop), IO_CONCURRENCY)
    await drop_records(store, drop)  # their prefix index records go after them
    if not candidates:
        return drop, 0, warnings
    unused, damaged = await _unused_chunks(store, candidates, ledger)
    if damaged:
        return drop, 0, warnings + [f"chunks not deleted: cannot tell which chunks damaged manifests use: "
                                    f"{', '.join(damaged)}"]
    async with store.batch():
        await run_bounded(((lambda k=k: store.delete(k)) for k in unused), IO_CONCURRENCY)
    ledger.distrust(unused)
    return drop, len(unused), warnings


async def _unused_chunks(store: "Store", candidates: Collection[str], ledger: Ledger) -> tuple[list[str], list[str]]:
    """The chunk keys of ``candidates`` that no manifest uses and that may be deleted now, or none and the keys
    of the manifests that could not be read (then which chunks they use is unknown).

    With a store's exclusive lock (held), that is every candidate no manifest uses. Without one, a writer
    elsewhere may be about to commit a manifest naming a candidate: only candidates :meth:`~Store.settled`
    before the manifests are listed, and still settled after that, go (FORMAT.md section 8).
    """
    if not store.exclusive_lock:
        used, damaged = await _referenced(store, ledger)
        if damaged:
            return [], damaged
        candidates = await store.settled(set(candidates) - used)
    used, damaged = await _referenced(store, ledger)
    if damaged:
        return [], damaged
    unused = set(candidates) - used
    if not store.exclusive_lock:
        unused = await store.settled(unused)
    return sorted(unused), []


async def gc(store: "Store", *, keep: int | None = DEFAULT_KEEP, names: Iterable[str] | None = None,
             progress: Progress | None = None, ledger: Ledger | None = None) -> GcResult:
    """Keep the newest ``keep`` manifests of each name that can be restored (``names``: only those names, a
    collection: a bare str is refused; ``keep=None``: every manifest), then delete every chunk no remaining
    manifest uses, including those of interrupted saves.

    A manifest can be restored if it decodes, matches its key, and every chunk it uses is stored with
    its size and SHA-256 (each chunk read once, even one this process wrote). A damaged
    manifest newer than the kept ones is kept too but not counted; while fewer than ``keep`` of a name
    can be restored, none of its manifests is deleted. ``kept_reasons`` says why each was kept. While a
    kept manifest cannot be read, no chunk is deleted (it is reported in ``damaged_manifests``).

    The chunks are read and hashed without the store's lock, so saves go on meanwhile; under the lock, a
    name's manifests are dropped only if those counted as restorable still hold the bytes that were judged,
    and the chunks to delete are those no manifest there is then uses. ``ledger`` (default: the store
    object's own) decodes each manifest once and no longer trusts the chunks deleted.
    """
    ledger = ledger_for(store, ledger)
    if keep is not None:
        check_keep(keep)
    only = None if names is None else set(check_each("names", names, "a list of checkpoint names",
                                                     lambda field, name: validate_name(name, field)))
    check_callable("progress", progress)
    selections, reasons = await _judge(store, keep, only)
    async with store.lock():
        drop: list[str] = []
        for selection in selections:
            if await _still_held(store, selection.counted):
                drop += selection.drop
            else:
                reasons.update((key, "not collected: a generation counted as restorable changed while gc judged "
                                     "them (run gc again)") for key in selection.drop)
        async with store.batch():  # the manifests are gone for good before any chunk they used is deleted
            for key in drop:
                await store.delete(key)
        records = await drop_records(store)  # of the manifests dropped, and any other whose manifest is gone
        chunks = [key for key in await store.list_prefix(CHUNKS) if is_chunk_key(key)]  # before the manifests
        unused, damaged = await _unused_chunks(store, chunks, ledger)
        kept = tuple(key for _, _, key in await manifest_keys(store))
        kept_reasons = {key: reasons.get(key, "committed while gc ran (not judged)") for key in kept}
        if damaged:
            return GcResult(kept, tuple(drop), 0, 0, tuple(damaged), kept_reasons, records)
        freed = 0
        async with store.batch():
            for i, key in enumerate(unused):
                try:
                    freed += await stored_size(store, key) or 0
                except CorruptionError:  # no value (a FIFO, ...) under a chunk's name: it goes all the same
                    pass
                await store.delete(key)
                if progress is not None:
                    progress("gc", i + 1, len(unused))
        ledger.distrust(unused)
    return GcResult(kept, tuple(drop), len(unused), freed, (), kept_reasons, records)


async def _judge(store: "Store", keep: int | None, only: set[str] | None) -> tuple[list[_Selection], dict[str, str]]:
    """What :func:`gc` drops of each name it collects (every chunk read and hashed, none trusted), and why it
    keeps each manifest it does not collect."""
    by_name: dict[str, list[str]] = {}
    for n, _, key in await manifest_keys(store):
        by_name.setdefault(n, []).append(key)
    selections: list[_Selection] = []
    reasons: dict[str, str] = {}
    seen: dict[str, str | None] = {}
    for n, keys in by_name.items():
        if keep is None or (only is not None and n not in only):
            reasons.update((key, "not collected (keep=None)" if keep is None else "not collected (name not selected)")
                           for key in keys)
            continue
        selection = await _select(store, keep, keys, None, seen)
        selections.append(selection)
        reasons.update(selection.reasons)
    return selections, reasons


async def _still_held(store: "Store", envelopes: dict[str, bytes]) -> bool:
    """Whether each manifest key of ``envelopes`` still holds those bytes."""
    for key, data in envelopes.items():
        try:
            if await store.get(key, max_bytes=MAX_MANIFEST_BYTES) != data:
                return False
        except KVCkptError:
            return False
    return True


async def _drop_manifests(store: "Store", name: str) -> tuple[str, ...]:
    """Delete every manifest of ``name`` under its claim; their keys. NotFoundError if there is none,
    ConflictError (deleting nothing) while another writer holds the name."""
    async with store.claim(name), store.lock():
        keys = tuple(key for _, _, key in await manifest_keys(store, name))
        if not keys:
            raise NotFoundError(f"name: expected a checkpoint named {name!r} in the store, got none")
        async with store.batch():
            for key in keys:
                await store.delete(key)
    return keys


async def delete_name(store: "Store", name: str, *, progress: Progress | None = None,
                      ledger: Ledger | None = None) -> GcResult:
    """Delete every generation of ``name`` (a deletion asked for: restorable ones too), then every chunk no
    other manifest uses; NotFoundError if ``store`` holds no generation of ``name``, ConflictError (deleting
    nothing) while another writer holds the name's :meth:`~kvckpt_web.stores.base.Store.claim`. ``ledger``
    (default: the store object's own) forgets ``name`` and no longer trusts the chunks deleted."""
    ledger = ledger_for(store, ledger)
    validate_name(name)
    check_callable("progress", progress)
    keys = await _drop_manifests(store, name)
    ledger.forget(name)
    return dataclasses.replace(await gc(store, keep=None, progress=progress, ledger=ledger), deleted_manifests=keys)


async def delete_names(store: "Store", names: Iterable[str], *, ledger: Ledger | None = None) -> list[str]:
    """:func:`delete_name` of each of ``names`` (a collection: a bare str is refused), their manifests first and
    then one pass over the store's chunks for all of them; a name that holds no generation, or that another
    writer holds, is left. The names deleted; without one, nothing else is read."""
    ledger = ledger_for(store, ledger)
    names = check_each("names", names, "a list of checkpoint names", lambda field, name: validate_name(name, field))
    deleted: list[str] = []
    for name in names:
        try:
            await _drop_manifests(store, name)
        except (ConflictError, NotFoundError):
            continue
        ledger.forget(name)
        deleted.append(name)
    if deleted:
        await gc(store, keep=None, ledger=ledger)
    return deleted
