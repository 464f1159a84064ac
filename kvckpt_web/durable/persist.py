"""Durable checkpoints of named sequences in a :class:`~kvckpt_web.stores.store.Store`: save, restore, gc, verify.

A checkpoint is one generation of one named sequence, in the container format
of ``FORMAT.md`` (content-addressed chunks plus a manifest). The functions here
use the cache only through its public API (``get_checkpoint_metadata``,
``map_pages`` / ``read_pages``, ``sequence_state`` / ``unchanged_prefix``, and
``prepare_import`` / ``import_groups`` / ``finish_import`` / ``abort_import``)
and the store only through the :class:`~kvckpt_web.stores.store.Store` API, so they
run unchanged wherever both do (desktop, Pyodide).

Commit protocol (all under ``store.lock()``): write every new chunk in one
``store.batch()`` (each ``set`` atomic, all durable when the batch ends), then
the manifest of generation ``newest + 1``; only after that manifest is
committed, drop manifests beyond the newest ``keep`` of that name that can be
restored (durably) and then delete the chunks no remaining manifest of any name
uses. A crash at any instant therefore leaves the previous or the new generation
restorable, plus at worst unreferenced chunks that :func:`gc` removes.

A chunk already in the store is reused only once it is known to hold the bytes
its name says: this process wrote it or read it back (per store object), else
the save reads it once and, if it differs, rewrites it from the cache's bytes.

Readers (:func:`restore`, :func:`verify`, :func:`list_generations`) take no
lock, so they never hold up a save: a generation that another process's
retention or gc collects while it is read is not damage. Restoring the newest
starts again from the manifests that exist then; verify reports a damaged or
missing object only if a manifest that uses it still holds the bytes it read.

Incremental saves: full pages are immutable once written, so a save rewrites
only the chunks holding pages that changed since this process last saved (or
restored) that name in that store object: pages past the length saved last,
the partial last page, and pages a ``popn`` reached. Only those pages are read
back from the GPU. Without such a record (a new process) every page is read
and hashed, but chunks already in the store are still not written again.
"""

from __future__ import annotations

import asyncio
import hashlib
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import (CheckpointStateError, CorruptionError, FieldError, FormatError, KVCkptError, LayoutHashMismatch,
                      NotFoundError, StoreError, is_int)
from ..kv.cache import PagedKVCache
from ..kv.page_groups import PageGroups
from ..tvm.layout import CacheLimits
from ..tvm.metadata import dump_tvm_json, layout_from_metadata, limits_from_metadata, parse_metadata, validate_import
from .container import (MAX_MANIFEST_BYTES, ChunkRef, Manifest, check_chunk_digest, check_chunk_size, chunk_digest,
                        chunk_key, decode_manifest, encode_manifest, manifest_key, manifest_prefix, parse_manifest_key,
                        plan_chunks, validate_name, verify_chunk)
from .pipeline import Hasher, HashState, MappedBatches, cache_lock, offload, run_bounded

if TYPE_CHECKING:
    from ..gpu.device import Device
    from ..kv.pool import SequenceState
    from ..stores.base import Store

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_KEEP",
    "GcResult",
    "GenerationInfo",
    "RestoreResult",
    "SaveResult",
    "VerifyReport",
    "default_pages_per_chunk",
    "forget",
    "gc",
    "list_generations",
    "list_names",
    "load_manifest",
    "restore",
    "save",
    "verify",
]

DEFAULT_KEEP = 2
"""Generations of each name a save keeps (the new one and the one before)."""

DEFAULT_CHUNK_BYTES = 1 << 20
"""Target chunk size when ``pages_per_chunk`` is not given (see :func:`default_pages_per_chunk`)."""


def default_pages_per_chunk(page_bytes: int) -> int:
    """Pages per chunk of a save that does not say: about :data:`DEFAULT_CHUNK_BYTES`, at least one page."""
    return max(1, DEFAULT_CHUNK_BYTES // page_bytes)


READ_BATCH_BYTES = 32 << 20
"""Bytes (all groups together) a save maps from the GPU per batch."""

IO_CONCURRENCY = 16
"""Chunk reads or writes (with their hashing) in flight at once."""

LIST_THRESHOLD = 32
"""A save storing more chunks than this lists the store's chunks once instead of asking for each."""

MANIFESTS = "manifests/"
CHUNKS = "chunks/"

#: ``progress(phase, done, total)``: called as a long operation advances.
Progress = Callable[[str, int, int], None]


# ----- results --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SaveResult:
    """What one :func:`save` did."""

    name: str
    generation: int
    key: str
    seq_id: int
    seq_length: int
    num_chunks: int
    """Chunks the new manifest references (all groups)."""
    chunks_written: int
    """Chunks this save stored (the others were unchanged or already in the store)."""
    bytes_written: int
    """Payload bytes this save stored: new chunks plus the manifest."""
    pages_read: int
    """Logical pages per group read back from the GPU."""
    deleted_manifests: tuple[str, ...] = ()
    deleted_chunks: int = 0
    warnings: tuple[str, ...] = ()
    """What went wrong without failing the save: chunks it found damaged and rewrote, damaged manifests it
    kept, a failed clean-up after the commit."""


@dataclass(frozen=True)
class RestoreResult:
    """What one :func:`restore` loaded."""

    name: str
    generation: int
    key: str
    seq_id: int
    seq_length: int
    app_state: dict[str, Any]
    num_chunks: int
    nbytes: int
    """Bytes of page-group data imported (all groups)."""


@dataclass(frozen=True)
class GenerationInfo:
    """One manifest in a store, as :func:`list_generations` found it."""

    name: str
    generation: int
    key: str
    manifest_bytes: int
    error: str | None = None
    """Why the manifest cannot be used; None if it decodes and matches its key."""
    created_ms: int | None = None
    seq_id: int | None = None
    seq_length: int | None = None
    num_groups: int | None = None
    num_logical_pages: int | None = None
    pages_per_chunk: int | None = None
    chunk_keys: tuple[str, ...] = ()
    """Every chunk key of the manifest, group by group (repeats kept)."""
    chunk_nbytes: tuple[int, ...] = ()
    """The size of each chunk of ``chunk_keys``."""
    nbytes: int = 0
    """Page-group bytes the checkpoint holds (all groups)."""
    app_state: dict[str, Any] | None = None


@dataclass(frozen=True)
class GcResult:
    """What :func:`gc` kept and deleted."""

    kept_manifests: tuple[str, ...]
    deleted_manifests: tuple[str, ...]
    deleted_chunks: int
    freed_bytes: int
    damaged_manifests: tuple[str, ...] = ()
    """Kept manifests that could not be read; while any is kept, no chunk is deleted."""
    kept_reasons: dict[str, str] = field(default_factory=dict)
    """Why each kept manifest was kept (restorable and among the newest ``keep``, damaged and newer than
    those, or not collected)."""


@dataclass
class VerifyReport:
    """What :func:`verify` checked and found; ``ok`` only if nothing is wrong."""

    manifests_checked: list[str] = field(default_factory=list)
    chunks_checked: int = 0
    bytes_checked: int = 0
    loaded: list[str] = field(default_factory=list)
    """Manifests restored into a GPU cache and read back identical."""
    unreferenced_chunks: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True if every manifest and chunk is intact (unreferenced chunks are not a problem)."""
        return not self.problems


# ----- what this process saved last, per store object and name ----------------------------------------


@dataclass(frozen=True)
class _Saved:
    key: str
    envelope: bytes
    state: "SequenceState"
    page_bytes: int
    pages_per_chunk: int
    chunks: tuple[tuple[ChunkRef, ...], ...]
    chunk_keys: frozenset[str]
    tails: dict[int, tuple[int, HashState]]
    """Per group, the chunk a save hashed last and the SHA-256 state over its full pages (immutable once
    full), from which the next save's digest of that chunk, grown by new pages, continues."""


_MEMORY: "weakref.WeakKeyDictionary[Store, dict[str, _Saved]]" = weakref.WeakKeyDictionary()


_TRUSTED: "weakref.WeakKeyDictionary[Store, set[str]]" = weakref.WeakKeyDictionary()
"""Per store object, chunk keys whose stored bytes this process wrote, or read back and found to be the bytes
their name says: a save reuses them without reading them (damage to them after that goes unseen until a
restore or verify reads them)."""


def forget(store: "Store", name: str | None = None) -> None:
    """Drop what this process remembers of its saves to ``store`` (one name or all): the next save reads every
    page; with all names, it also reads back every chunk already stored that it reuses, once."""
    if name is None:
        _MEMORY.pop(store, None)
        _TRUSTED.pop(store, None)
    else:
        _MEMORY.get(store, {}).pop(name, None)


def _trusted(store: "Store") -> set[str]:
    return _TRUSTED.setdefault(store, set())


def _remember(store: "Store", envelope: bytes, manifest: Manifest, state: "SequenceState",
              tails: dict[int, tuple[int, HashState]] | None = None) -> None:
    """Record ``manifest`` (committed as ``envelope``) as what this process last saved or restored of its
    name, with the sequence state it holds and the hash states of its last chunks (a save's)."""
    chunk_keys = frozenset(manifest.chunk_keys())
    _cache_refs(envelope, chunk_keys)
    _MEMORY.setdefault(store, {})[manifest.name] = _Saved(manifest.key, envelope, state, manifest.page_bytes,
                                                          manifest.pages_per_chunk, manifest.chunks, chunk_keys,
                                                          tails or {})


# ----- helpers --------------------------------------------------------------------------------------


def _where(exc: KVCkptError, where: str) -> KVCkptError:
    """``exc`` with ``where`` (a store key) in front of its message, same type."""
    if isinstance(exc, FieldError):
        return type(exc)(f"{where}: {exc.field}", exc.expected, exc.got)
    return type(exc)(f"{where}: {exc}")


async def _nothing() -> None:
    return None


async def _manifest_keys(store: "Store", name: str | None = None) -> list[tuple[str, int, str]]:
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
    return sorted({n for n, _, _ in await _manifest_keys(store)})


def _decode_at(key: str, data: bytes | None) -> Manifest:
    """Decode the manifest stored under ``key``; errors name the key; a manifest under another key is corruption."""
    if data is None:
        raise NotFoundError(f"{key}: no such manifest")
    try:
        manifest = decode_manifest(data)
    except (FormatError, CorruptionError) as exc:
        raise _where(exc, key) from None
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
    validate_name(name)
    if generation is None:
        keys = await _manifest_keys(store, name)
        if not keys:
            raise NotFoundError(f"{manifest_prefix(name)}: no checkpoint named {name!r} in {store!r}")
        key = keys[-1][2]
    else:
        key = manifest_key(name, generation)
    data = await store.get(key, max_bytes=MAX_MANIFEST_BYTES)
    if data is None and generation is not None:
        have = [g for _, g, _ in await _manifest_keys(store, name)]
        raise NotFoundError(f"{key}: no generation {generation} of {name!r} (generations in store: {have})")
    return _decode_at(key, data), data


_REFS: "OrderedDict[bytes, frozenset[str]]" = OrderedDict()
_REFS_MAX = 64


async def _refs_of(store: "Store", key: str) -> frozenset[str] | None:
    """The chunk keys the manifest under ``key`` uses; None if it is missing or cannot be decoded.

    Decoded reference sets are remembered by the SHA-256 of the envelope bytes, so a result is
    never stale.
    """
    return _decoded_refs(key, await store.get(key, max_bytes=MAX_MANIFEST_BYTES))


def _decoded_refs(key: str, data: bytes | None) -> frozenset[str] | None:
    """The chunk keys of the manifest ``data`` stored under ``key``; None if it is missing or damaged."""
    if data is None:
        return None
    digest = hashlib.sha256(data).digest()
    refs = _REFS.get(digest)
    if refs is None:
        try:
            refs = frozenset(_decode_at(key, data).chunk_keys())
        except KVCkptError:
            return None
        _REFS[digest] = refs
        while len(_REFS) > _REFS_MAX:
            _REFS.popitem(last=False)
    else:
        _REFS.move_to_end(digest)
    return refs


def _cache_refs(envelope: bytes, chunk_keys: frozenset[str]) -> None:
    _REFS[hashlib.sha256(envelope).digest()] = chunk_keys
    while len(_REFS) > _REFS_MAX:
        _REFS.popitem(last=False)


async def _referenced(store: "Store") -> tuple[set[str], list[str]]:
    """Every chunk key used by a manifest of any name, and the keys of manifests that could not be read."""
    used: set[str] = set()
    damaged = []
    for _, _, key in await _manifest_keys(store):
        refs = await _refs_of(store, key)
        if refs is None:
            damaged.append(key)
        else:
            used |= refs
    return used, damaged


def _check_keep(keep: int) -> int:
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
        refs = _decoded_refs(key, data)
        if refs is not None and refs <= trusted:
            return None
        manifest = _decode_at(key, data)
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


async def _retain(store: "Store", keep: int, keys: list[str]) -> tuple[list[str], int, list[str]]:
    """Drop the manifests of ``keys`` (every manifest key of one name, oldest first, as listed under the lock
    held) beyond the newest ``keep`` that can be restored, then the chunks only they used; warnings name
    the damaged manifests kept."""
    if len(keys) <= keep:
        return [], 0, []
    drop, reasons = await _select(store, keep, keys, _trusted(store), False, {})
    warnings = [f"{key}: {why}" for key, why in reasons.items() if why.startswith("damaged")]
    if not drop:
        return [], 0, warnings
    candidates: set[str] = set()
    for key in drop:
        candidates |= await _refs_of(store, key) or frozenset()
    async with store.batch():  # the manifests are gone for good before any chunk they used is deleted
        await run_bounded(((lambda k=k: store.delete(k)) for k in drop), IO_CONCURRENCY)
    if not candidates:
        return drop, 0, warnings
    used, damaged = await _referenced(store)
    if damaged:
        return drop, 0, warnings + [f"chunks not deleted: cannot tell which chunks damaged manifests use: "
                                    f"{', '.join(damaged)}"]
    unused = sorted(candidates - used)
    async with store.batch():
        await run_bounded(((lambda k=k: store.delete(k)) for k in unused), IO_CONCURRENCY)
    _trusted(store).difference_update(unused)
    return drop, len(unused), warnings


# ----- save -----------------------------------------------------------------------------------------


async def save(cache: "PagedKVCache", seq_id: int, store: "Store", name: str, *,
               app_state: dict[str, Any] | None = None, keep: int = DEFAULT_KEEP, pages_per_chunk: int | None = None,
               progress: Progress | None = None) -> SaveResult:
    """Checkpoint sequence ``seq_id`` of ``cache`` as the next generation of ``name`` in ``store``.

    Writes only chunks whose pages changed since this process last saved or restored ``name`` with
    this ``store`` object (and, even then, none the store already holds intact: one this process has
    not written or read back yet is read once, and rewritten if it differs), then the manifest; then
    keeps the newest ``keep`` generations of ``name`` that can be restored (and any damaged one newer
    than those) and deletes chunks no kept manifest of any name uses.
    ``app_state`` (a JSON object) is stored verbatim in the manifest. ``pages_per_chunk`` defaults to
    about :data:`DEFAULT_CHUNK_BYTES` per chunk. The sequence must not change while the save runs
    (:class:`CheckpointStateError` if it did; nothing is committed then). If anything fails before the
    manifest is committed, the store still holds the previous generations intact; a failure of the
    clean-up after the commit is reported in ``warnings`` instead.
    """
    validate_name(name)
    _check_keep(keep)
    app_state = {} if app_state is None else app_state
    if not isinstance(app_state, dict):
        raise FormatError("app_state", "a JSON object (dict)", type(app_state).__name__)
    lay = cache.layout
    page_bytes, num_groups = lay.page_bytes, lay.num_layers
    if pages_per_chunk is None:
        pages_per_chunk = default_pages_per_chunk(page_bytes)
    if not is_int(pages_per_chunk, 1):
        raise FieldError("pages_per_chunk", "an integer >= 1", pages_per_chunk)
    ppc = pages_per_chunk
    # refuse an app_state no manifest can hold before anything is written
    encode_manifest(Manifest(name, 1, "{}", page_bytes, ppc, 0, ((),) * num_groups, app_state))

    async with store.lock():
        state = cache.sequence_state(seq_id)
        metadata = cache.get_checkpoint_metadata(seq_id)
        npages = lay.num_logical_pages(state.length)
        plan = plan_chunks(npages, ppc)
        # What can be kept from this process's last save of `name`: chunks whose pages are all unchanged, if
        # the store still holds that save's manifest (read while the manifests are listed).
        prev = _MEMORY.get(store, {}).get(name)
        if prev is not None and (prev.page_bytes, prev.pages_per_chunk, len(prev.chunks)) != (page_bytes, ppc,
                                                                                                num_groups):
            prev = None
        existing, kept = await asyncio.gather(_manifest_keys(store, name),
                                              store.get(prev.key) if prev is not None else _nothing())
        generation = existing[-1][1] + 1 if existing else 1
        written_before = store.bytes_written
        reuse, known, starts = 0, frozenset[str](), {}
        if prev is not None and kept == prev.envelope:  # its chunks are still kept
            known = prev.chunk_keys
            unchanged_pages = cache.unchanged_prefix(seq_id, prev.state) // lay.page_size
            reuse = min(unchanged_pages // ppc, len(prev.chunks[0]), len(plan))
            # a chunk that grew since then: its digest continues from the state over its unchanged full pages
            starts = {(i, g): start for g, (i, start) in prev.tails.items()
                      if reuse <= i < len(plan) and i * ppc + start.nbytes // page_bytes <= unchanged_pages}
        # and this save leaves the state over its last chunk's full pages for the next one
        last, full_pages = len(plan) - 1, state.length // lay.page_size
        keeps = ({(last, g): (full_pages - last * ppc) * page_bytes for g in range(num_groups)}
                 if plan and last >= reuse and full_pages > last * ppc else {})
        table: list[list[ChunkRef | None]] = [
            list(prev.chunks[g][:reuse]) + [None] * (len(plan) - reuse) if reuse else [None] * len(plan)
            for g in range(num_groups)
        ]

        column_bytes = ppc * page_bytes * num_groups
        per_batch = max(1, READ_BATCH_BYTES // column_bytes)
        batches = [list(range(c, min(c + per_batch, len(plan)))) for c in range(reuse, len(plan), per_batch)]
        first_page = reuse * ppc
        claimed: set[str] = set()
        trusted = _trusted(store)
        repaired: list[str] = []
        counts = {"written": 0, "done": reuse * num_groups}
        total_chunks = len(plan) * num_groups
        # Many chunks to store: one listing answers every "is it there already?" (the lock keeps it true).
        present = (set(await store.list_prefix(CHUNKS))
                   if (len(plan) - reuse) * num_groups > LIST_THRESHOLD else None)

        async def put(b: int, i: int, g: int) -> None:
            try:
                data, digest = await mapped.chunk(b, i, g)
                key = chunk_key(digest)
                table[g][i] = ChunkRef(g, plan[i][0], plan[i][1], len(data), digest)
                if key not in known and key not in claimed:
                    claimed.add(key)
                    if present is None:
                        stored = await store.set_if_absent(key, data)
                    elif key not in present:
                        await store.set(key, data)
                        stored = True
                    else:
                        stored = False
                    if not stored and key not in trusted and await _rewrite_if_damaged(store, key, data):
                        repaired.append(key)
                        stored = True
                    trusted.add(key)
                    counts["written"] += stored  # counted after the awaits: puts run at once
            except BaseException:
                mapped.stop()  # chunks waiting for a batch that will never be mapped give up
                raise
            counts["done"] += 1
            mapped.done(b)
            if progress is not None:
                progress("save", counts["done"], total_chunks)

        jobs = ((lambda b=b, i=i, g=g: put(b, i, g)) for b, batch in enumerate(batches) for i in batch
                for g in range(num_groups))
        if progress is not None:
            progress("save", counts["done"], total_chunks)
        async with cache_lock(cache, "slots"):  # the staging slots serve one save at a time
            mapped = MappedBatches(cache, seq_id, plan, batches, starts, keeps)
            try:
                async with store.batch():  # every chunk durable before the manifest is written
                    await run_bounded(jobs, IO_CONCURRENCY)
            finally:
                await mapped.close()
        if cache.sequence_state(seq_id) != state:
            raise CheckpointStateError(f"save {name!r}: sequence {seq_id} changed while it was being saved; "
                                       "nothing was committed")

        # encoded once the chunk writes are done: Python work on the loop meanwhile holds up the writer threads
        manifest = Manifest(name, generation, metadata, page_bytes, ppc, npages,
                            tuple(tuple(group) for group in table), app_state)  # type: ignore[arg-type]
        envelope = encode_manifest(manifest, metadata_is_valid=True)  # the cache wrote that metadata
        await store.set(manifest.key, envelope)  # the commit point
        _remember(store, envelope, manifest, state, mapped.kept)
        trusted.update(manifest.chunk_keys())  # each one written, read back, or reused from a save of this process
        written = store.bytes_written - written_before
        warnings = [f"{key}: stored bytes differed from the chunk its name says; rewritten from the cache"
                    for key in sorted(repaired)]
        try:
            names_keys = [key for _, _, key in existing] + [manifest.key]
            dropped, deleted, retained = await _retain(store, keep, names_keys)
        except KVCkptError as exc:  # the checkpoint is committed: report, do not fail the save
            dropped, deleted, retained = [], 0, [f"retention after the commit failed (kvckpt gc retries): {exc}"]
    return SaveResult(name, generation, manifest.key, seq_id, state.length, total_chunks, counts["written"], written,
                      npages - first_page, tuple(dropped), deleted, tuple(warnings + retained))


async def _rewrite_if_damaged(store: "Store", key: str, data: memoryview) -> bool:
    """Make the chunk under ``key`` hold ``data`` (the bytes its name says): read it back and, if it is missing or
    differs, store ``data`` over it; whether it had to."""
    stored = bytearray(len(data))
    if await store.get_into(key, memoryview(stored)) == len(data) and stored == data:
        return False
    await store.set(key, data)
    return True


# ----- restore --------------------------------------------------------------------------------------


def _metadata_for(text: str, seq_id: int | None) -> tuple[str, int]:
    """The metadata text to import and the target seq id: the stored text verbatim unless another seq id is asked."""
    meta = parse_metadata(text)
    stored = meta.get("seq_id")
    if seq_id is None:
        if not is_int(stored, 0):
            raise FormatError("tvm_metadata.seq_id", "a non-negative integer", stored)
        return text, stored
    if not is_int(seq_id, 0):
        raise FieldError("seq_id", "a non-negative integer", seq_id)
    if stored == seq_id and is_int(stored):
        return text, seq_id
    meta["seq_id"] = seq_id  # same key, same position: only this field's text changes
    return dump_tvm_json(meta), seq_id


def _carried(manifest: Manifest, old: PageGroups | None, fetched: set[ChunkRef], new: PageGroups
             ) -> tuple[PageGroups, set[ChunkRef]]:
    """``new`` with the chunks of ``manifest`` that ``old`` holds already (``fetched``) copied in, and those."""
    carried = {ref for ref in manifest.chunk_refs() if ref in fetched}
    for ref in carried:
        lo = ref.first_page * manifest.page_bytes
        new[ref.group][lo:lo + ref.nbytes] = old[ref.group][lo:lo + ref.nbytes]
    return new, carried


def _check_fits(manifest: Manifest, metadata: str, cache: "PagedKVCache", seq_id: int, key: str) -> None:
    """Everything about ``manifest`` that can be checked against ``cache`` without touching it."""
    lay = cache.layout
    try:
        got_hash = parse_metadata(metadata).get("layout_hash")
        if got_hash != lay.layout_hash():
            raise LayoutHashMismatch("tvm_metadata.layout_hash", lay.layout_hash(), got_hash,
                                     "the checkpoint was written by a cache of another layout")
        plan = validate_import(metadata, lay, cache.limits, seq_id)
    except FieldError as exc:
        raise _where(exc, key) from None
    for what, expected, got in (("page_bytes", lay.page_bytes, manifest.page_bytes),
                                ("num_groups", lay.num_layers, manifest.num_groups),
                                ("num_logical_pages", plan.num_logical_pages, manifest.num_logical_pages)):
        if expected != got:
            raise FormatError(f"{key}: {what}", f"{expected} (from tvm_metadata and the cache layout)", got)


async def _fetch_groups(store: "Store", manifest: Manifest, key: str, groups: PageGroups,
                        progress: Progress | None, fetched: set[ChunkRef]) -> PageGroups:
    """Every group's bytes read into ``groups``, each chunk in place and verified (size and SHA-256);
    CorruptionError names a damaged one. Chunks in ``fetched`` are in ``groups`` already; each one read
    and verified is added to it."""
    pb = manifest.page_bytes
    everything = list(manifest.chunk_refs())
    refs = [ref for ref in everything if ref not in fetched]
    done = [len(everything) - len(refs)]
    hasher = Hasher()

    async def fetch(ref: ChunkRef) -> None:
        view = groups[ref.group][ref.first_page * pb:ref.first_page * pb + ref.nbytes]
        try:
            check_chunk_size(ref, await store.get_into(ref.key, view))
            check_chunk_digest(ref, (await hasher.digest(view))[0])
        except CorruptionError as exc:
            raise _where(exc, key) from None
        fetched.add(ref)
        done[0] += 1
        if progress is not None:
            progress("restore", done[0], len(everything))

    try:
        await run_bounded((lambda r=r: fetch(r) for r in refs), IO_CONCURRENCY)
    finally:
        await hasher.close()
    return groups


async def restore(store: "Store", name: str, cache: "PagedKVCache", *, seq_id: int | None = None,
                  generation: int | None = None, progress: Progress | None = None) -> RestoreResult:
    """Load generation ``generation`` (default: the newest) of ``name`` into ``cache`` as ``seq_id``.

    ``seq_id`` defaults to the one the checkpoint was taken from. The manifest, its TVM metadata
    against this cache's layout and limits, and every chunk's size and SHA-256 are verified before
    the cache is touched; then prepare_import (non-exclusive: other sequences stay), import_groups
    and finish_import run, and on any error the import is aborted, leaving ``cache`` as it was. An
    existing ``seq_id`` is replaced only when the import finishes (the cache needs free pages for the
    checkpoint meanwhile). A damaged newest generation is an error, never a silent fallback: pass
    ``generation`` to load an older one. Takes no lock: if another process's retention or gc deletes
    the generation while it is read, a restore of the newest starts again from the newest there is
    then (up to :data:`READ_ATTEMPTS` times, reading only the chunks it does not hold yet), and one of
    a given ``generation`` raises :class:`NotFoundError`. Raises :class:`NotFoundError`,
    :class:`CorruptionError` / :class:`FormatError` naming the damaged key, :class:`MetadataError`
    (:class:`LayoutHashMismatch`), :class:`CapacityError`, or :class:`StoreError` if the newest kept
    being collected.
    """
    return await _restore(store, name, cache, seq_id, generation, progress, remember=True)


READ_ATTEMPTS = 8
"""Times a restore of the newest generation starts again when other writers collect what it is reading."""


async def _restore(store: "Store", name: str, cache: "PagedKVCache", seq_id: int | None, generation: int | None,
                   progress: Progress | None, *, remember: bool) -> RestoreResult:
    groups: PageGroups | None = None
    fetched: set[ChunkRef] = set()  # chunks in `groups` already, from an attempt whose generation was collected
    for _ in range(READ_ATTEMPTS):
        try:
            manifest, envelope = await load_manifest(store, name, generation)
        except NotFoundError:
            if generation is None and await _manifest_keys(store, name):
                continue  # the newest it listed was collected before it was read
            raise
        key = manifest.key
        metadata, target = _metadata_for(manifest.tvm_metadata, seq_id)
        _check_fits(manifest, metadata, cache, target, key)
        if groups is None or groups.group_bytes != manifest.num_logical_pages * manifest.page_bytes:
            groups, fetched = _carried(manifest, groups, fetched, cache.host_groups(manifest.num_logical_pages))
        try:
            await _fetch_groups(store, manifest, key, groups, progress, fetched)
            break
        except CorruptionError as exc:
            if await store.get(key, max_bytes=MAX_MANIFEST_BYTES) == envelope:
                raise  # the manifest is still there, so is every chunk it uses: this one is damaged
            if generation is not None:
                raise NotFoundError(f"{key}: deleted by another writer (retention or gc) while it was being read "
                                    f"({exc})") from None
    else:
        raise StoreError(f"restore {name!r}: other writers collected the newest generation while it was being read, "
                         f"{READ_ATTEMPTS} times in a row")
    async with cache_lock(cache):
        cache.prepare_import(target, metadata, exclusive=False)
        try:
            await cache.import_groups(target, groups)
            cache.finish_import(target)
        except BaseException:
            cache.abort_import(target)
            raise
    if remember:
        _remember(store, envelope, manifest, cache.sequence_state(target))
        _trusted(store).update(manifest.chunk_keys())  # each one read back and verified
    seq_length = cache.get_sequence_length(target)
    return RestoreResult(name, manifest.generation, key, target, seq_length, manifest.app_state,
                         sum(len(g) for g in manifest.chunks), sum(len(g) for g in groups))


# ----- listing, gc, verify --------------------------------------------------------------------------


def _describe(name: str, generation: int, key: str, data: bytes | None) -> GenerationInfo:
    size = len(data) if data is not None else 0
    try:
        m = _decode_at(key, data)
        meta = parse_metadata(m.tvm_metadata)
    except KVCkptError as exc:
        return GenerationInfo(name, generation, key, size, error=str(exc))
    ints = {k: meta.get(k) if is_int(meta.get(k)) else None
            for k in ("seq_id", "seq_length")}
    return GenerationInfo(name, generation, key, size, None, m.created_ms, ints["seq_id"], ints["seq_length"],
                          m.num_groups, m.num_logical_pages, m.pages_per_chunk,
                          tuple(ref.key for ref in m.chunk_refs()), tuple(ref.nbytes for ref in m.chunk_refs()),
                          m.num_groups * m.num_logical_pages * m.page_bytes, m.app_state)


async def list_generations(store: "Store", name: str | None = None) -> list[GenerationInfo]:
    """Every manifest in ``store`` (of ``name``, or of all names), by name then generation; damaged ones say why.

    A manifest another writer deletes between the listing and its reading is left out.
    """
    if name is not None:
        validate_name(name)
    found = [(n, g, key, await store.get(key, max_bytes=MAX_MANIFEST_BYTES))
             for n, g, key in await _manifest_keys(store, name)]
    return [_describe(n, g, key, data) for n, g, key, data in found if data is not None]


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
        _check_keep(keep)
    only = None if names is None else {validate_name(n) for n in names}
    async with store.lock():
        entries = await _manifest_keys(store)
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
        used, damaged = await _referenced(store)
        kept = tuple(key for _, _, key in await _manifest_keys(store))
        kept_reasons = {key: reasons[key] for key in kept}
        if damaged:
            return GcResult(kept, tuple(drop), 0, 0, tuple(damaged), kept_reasons)
        chunks = await store.list_prefix(CHUNKS)
        unused = [key for key in chunks if key not in used and _is_chunk_key(key)]
        freed = 0
        size_only = memoryview(bytearray())  # get_into gives a value's length and reads it only into a buffer that fits
        async with store.batch():
            for i, key in enumerate(unused):
                freed += await store.get_into(key, size_only) or 0
                await store.delete(key)
                if progress is not None:
                    progress("gc", i + 1, len(unused))
        _trusted(store).difference_update(unused)
    return GcResult(kept, tuple(drop), len(unused), freed, (), kept_reasons)


def _is_chunk_key(key: str) -> bool:
    try:
        return chunk_key(key[len(CHUNKS):]) == key
    except FormatError:
        return False


async def verify(store: "Store", *, name: str | None = None, device: "Device | None" = None,
                 progress: Progress | None = None) -> VerifyReport:
    """Check everything in ``store`` (or only the manifests of ``name`` and their chunks).

    Decodes every manifest and checks it against its key and its TVM metadata; re-hashes every chunk
    (all of them when ``name`` is None, also those no manifest uses); with a ``device``, restores
    every intact generation into a fresh GPU cache of its layout and checks that it reads back
    byte-identical. Never raises for damage: it is listed in ``problems``. Takes no lock: damage
    found in a manifest, or in a chunk it uses, is reported only if that manifest still holds the
    bytes verify read once it is done, so a generation another process collects meanwhile is not.
    """
    if name is not None:
        validate_name(name)
    return await _verify(store, name, device, progress)


async def _verify(store: "Store", name: str | None, device: "Device | None", progress: Progress | None) -> VerifyReport:
    report = VerifyReport()
    envelopes: dict[str, bytes] = {}
    found: list[tuple[str, list[str]]] = []  # each problem, and the manifests it concerns (none: it stands anyway)
    manifests: list[tuple[str, Manifest]] = []
    for _, _, key in await _manifest_keys(store, name):
        try:
            data = await store.get(key, max_bytes=MAX_MANIFEST_BYTES)
        except FormatError as exc:  # longer than any manifest can be
            report.manifests_checked.append(key)
            found.append((str(exc), []))
            continue
        if data is None:  # deleted since it was listed
            continue
        envelopes[key] = data
        report.manifests_checked.append(key)
        try:
            m = _decode_at(key, data)
            meta = parse_metadata(m.tvm_metadata)
            layout = layout_from_metadata(meta)
            seq_id = meta.get("seq_id")
            limits = limits_from_metadata(meta)
            _check_fits(m, m.tvm_metadata, _Shape(layout, limits), seq_id, key)
        except KVCkptError as exc:
            found.append((str(exc) if str(exc).startswith(key) else f"{key}: {exc}", [key]))
            continue
        manifests.append((key, m))

    # Every chunk: the referenced ones against their refs, the others against their own key.
    refs: dict[str, ChunkRef] = {}
    users: dict[str, list[str]] = {}
    for key, m in manifests:
        for ref in m.chunk_refs():
            refs.setdefault(ref.key, ref)
            users.setdefault(ref.key, []).append(key)
    listed = set(await store.list_prefix(CHUNKS)) if name is None else set()
    todo = sorted(set(refs) | {k for k in listed if _is_chunk_key(k)})
    bad: set[str] = set()
    done = [0]

    async def check(ckey: str) -> None:
        data = await store.get(ckey)
        ref = refs.get(ckey)
        if ref is None:
            report.unreferenced_chunks.append(ckey)
            digest = None if data is None else await offload(chunk_digest, data)
            if digest is not None and chunk_key(digest) != ckey:
                found.append((f"{ckey}: unreferenced chunk: sha256 expected {ckey[len(CHUNKS):]}, got {digest}", []))
                bad.add(ckey)
        else:
            try:
                await offload(verify_chunk, ref, data)
            except CorruptionError as exc:
                bad.add(ckey)
                found.append((f"{exc} (used by {', '.join(users[ckey])})", users[ckey]))
        report.chunks_checked += 1
        report.bytes_checked += len(data) if data is not None else 0
        done[0] += 1
        if progress is not None:
            progress("verify chunks", done[0], len(todo))

    await run_bounded(((lambda k=k: check(k)) for k in todo), IO_CONCURRENCY)
    report.unreferenced_chunks.sort()

    if device is not None:
        intact = [(key, m) for key, m in manifests if not any(ref.key in bad for ref in m.chunk_refs())]
        for i, (key, m) in enumerate(intact):
            meta = parse_metadata(m.tvm_metadata)
            layout = layout_from_metadata(meta)
            pages = max(1, m.num_logical_pages)
            limits = limits_from_metadata(meta)
            cache = PagedKVCache(device, layout, CacheLimits(1, pages * layout.page_size, limits.prefill_chunk_size))
            try:
                result = await _restore(store, m.name, cache, None, m.generation, None, remember=False)
                back = await cache.read_pages(result.seq_id, 0, m.num_logical_pages)
                for ref in m.chunk_refs():
                    lo = ref.first_page * m.page_bytes
                    if chunk_digest(back[ref.group][lo:lo + ref.nbytes]) != ref.sha256:
                        raise CorruptionError(f"{key}: {ref.describe()} reads back different from the GPU cache")
                report.loaded.append(key)
            except KVCkptError as exc:
                found.append((str(exc) if str(exc).startswith(key) else f"{key}: {exc}", [key]))
            finally:
                cache.close()
            if progress is not None:
                progress("verify load", i + 1, len(intact))

    # A manifest deleted or replaced since it was read was collected by another writer, not damaged.
    concerned = sorted({key for _, keys in found for key in keys})
    current = dict(zip(concerned, await asyncio.gather(*(store.get(key, max_bytes=MAX_MANIFEST_BYTES)
                                                         for key in concerned))))
    report.problems = [text for text, keys in found if not keys or any(current[k] == envelopes[k] for k in keys)]
    return report


@dataclass(frozen=True)
class _Shape:
    """The layout and limits :func:`_check_fits` reads, for checking a manifest without a cache."""

    layout: Any
    limits: Any
