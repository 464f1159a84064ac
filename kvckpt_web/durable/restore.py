"""Restore: a generation of a named sequence read from a store, verified, and imported into a cache.

Readers take no lock, so they never hold up a save: a generation that another process's retention or gc
collects while it is read is not damage. Restoring the newest starts again from the manifests that exist
then, reading only the chunks it does not hold yet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..checks import check_callable, check_int
from ..errors import (BadValueError, CorruptionError, FieldError, FormatError, LayoutHashMismatch, NotFoundError,
                      StoreError, is_int)
from ..kv.cache import check_cache
from ..kv.page_groups import PageGroups
from ..tvm.layout import CacheLimits, KVLayout
from ..tvm.metadata import dump_tvm_json, limits_from_metadata, parse_metadata, validate_import, write_metadata
from .catalog import at_key, load_manifest, manifest_keys
from .chunk_reads import read_chunk_into
from .container import MAX_MANIFEST_BYTES, ChunkRef, Manifest
from .ledger import Ledger, ledger_for
from .pipeline import IO_CONCURRENCY, run_bounded
from .results import Progress, RestoreResult

if TYPE_CHECKING:
    from ..kv.cache import PagedKVCache
    from ..stores.base import Store

__all__ = ["READ_ATTEMPTS", "check_fits", "restore", "restore_into"]


async def restore(store: "Store", name: str, cache: "PagedKVCache", *, seq_id: int | None = None,
                  generation: int | None = None, length: int | None = None,
                  progress: Progress | None = None, ledger: Ledger | None = None,
                  manifest: tuple[Manifest, bytes] | None = None) -> RestoreResult:
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

    ``length`` restores a prefix: only the first ``length`` tokens (1 <= length <= the checkpoint's
    seq_length, else :class:`FieldError` before the cache is touched). Only the chunks that hold their
    pages are read, each verified whole, and the sequence then holds exactly ``length`` tokens (the
    metadata imported is what this cache would write for them).

    ``ledger`` (default: the store object's own, :meth:`~.ledger.Ledger.of`) remembers what was loaded, so
    that its next save of ``name`` writes only what changed since, and trusts the chunks verified. A prefix
    restore shorter than the checkpoint is not remembered as the last save of ``name``, since the caller goes
    on under another name, but the chunks it verified are trusted by later saves; one of all its tokens (a
    conversation's next turn) is remembered as a whole restore is.

    ``manifest`` is that generation's manifest and its envelope bytes as the caller read them already
    (:func:`~.catalog.load_manifest`): it is not read again. It needs ``generation``, and must be of ``name``
    and ``generation`` (else :class:`FieldError`).
    """
    if length is not None and not is_int(length, 1):
        raise FieldError("length", "an integer >= 1 (tokens to restore) or None", length)
    if manifest is not None:
        if (not isinstance(manifest, tuple) or len(manifest) != 2 or not isinstance(manifest[0], Manifest)
                or not isinstance(manifest[1], bytes)):
            raise FieldError("manifest", "a (Manifest, bytes) pair from load_manifest, or None", type(manifest).__name__)
        if (manifest[0].name, manifest[0].generation) != (name, generation):
            raise FieldError("manifest", f"the manifest of {name!r} generation {generation}", manifest[0].key)
    return await restore_into(store, ledger_for(store, ledger), name, cache, seq_id, generation, progress,
                              record=True, length=length, loaded=manifest)


READ_ATTEMPTS = 8
"""Times a restore of the newest generation starts again when other writers collect what it is reading."""


async def restore_into(store: "Store", ledger: Ledger, name: str, cache: "PagedKVCache", seq_id: int | None,
                       generation: int | None, progress: Progress | None, *, record: bool,
                       length: int | None = None, loaded: tuple[Manifest, bytes] | None = None) -> RestoreResult:
    """:func:`restore`; only if ``record``, ``ledger`` trusts the chunks it verified and, unless it loads a
    prefix (``length``), remembers what it loaded for its next save of ``name``. A chunk found damaged is
    no longer trusted either way; a prefix of all the checkpoint's tokens counts as the whole. ``loaded``: the manifest of ``generation`` and its envelope, read already."""
    check_cache(cache)
    if seq_id is not None:
        check_int("seq_id", seq_id, 0)
    check_callable("progress", progress)
    groups: PageGroups | None = None
    fetched: set[ChunkRef] = set()  # chunks in `groups` already, from an attempt whose generation was collected
    for _ in range(READ_ATTEMPTS):
        try:
            manifest, envelope = loaded if loaded is not None else await load_manifest(store, name, generation)
        except NotFoundError:
            if generation is None and await manifest_keys(store, name):
                continue  # the newest it listed was collected before it was read
            raise
        key = manifest.key
        metadata, target = _metadata_for(manifest.tvm_metadata, seq_id)
        if length is None:
            check_fits(manifest, metadata, cache.layout, cache.limits, target, key)
            pages = manifest.num_logical_pages
        else:
            metadata = _prefix_metadata(manifest, cache, target, length, key)
            pages = cache.layout.num_logical_pages(length)
        if groups is None or groups.group_bytes != pages * manifest.page_bytes:
            groups, fetched = _carried(manifest, groups, fetched, cache.host_groups(pages))
        try:
            await _fetch_groups(store, ledger, manifest, key, groups, progress, fetched)
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
    async with cache.lock():
        cache.prepare_import(target, metadata, exclusive=False)
        try:
            await cache.import_groups(target, groups)
            cache.finish_import(target)
        except BaseException:
            cache.abort_import(target)
            raise
    read = _needed(manifest, pages)
    if record:
        if length is None or length == parse_metadata(manifest.tvm_metadata)["seq_length"]:
            ledger.remember(envelope, manifest, cache.sequence_state(target))
        ledger.trust(ref.key for ref in read)  # each one read back and verified
    seq_length = cache.get_sequence_length(target)
    return RestoreResult(name, manifest.generation, key, target, seq_length, manifest.app_state, len(read),
                         sum(len(g) for g in groups))


def _metadata_for(text: str, seq_id: int | None) -> tuple[str, int]:
    """The metadata text to import and the target seq id: the stored text verbatim unless another seq id is asked."""
    meta = parse_metadata(text)
    stored = meta.get("seq_id")
    if seq_id is None:
        if not is_int(stored, 0):
            raise FormatError("tvm_metadata.seq_id", "a non-negative integer", stored)
        return text, stored
    if stored == seq_id and is_int(stored):
        return text, seq_id
    meta["seq_id"] = seq_id  # same key, same position: only this field's text changes
    return dump_tvm_json(meta), seq_id


def _prefix_metadata(manifest: Manifest, cache: "PagedKVCache", seq_id: int, length: int, key: str) -> str:
    """The metadata that imports the first ``length`` tokens of ``manifest`` (checked against this cache's layout,
    as written by a cache of its own limits) into ``cache`` as ``seq_id``; FieldError if the checkpoint holds
    fewer tokens or ``cache`` cannot hold that many."""
    stored = parse_metadata(manifest.tvm_metadata)
    check_fits(manifest, manifest.tvm_metadata, cache.layout, limits_from_metadata(stored), stored.get("seq_id"), key)
    if length > stored["seq_length"]:
        raise FieldError("length", f"an integer in [1, {stored['seq_length']}] (the tokens {key} holds)", length)
    metadata = write_metadata(cache.layout, cache.limits, seq_id, length)
    try:
        validate_import(metadata, cache.layout, cache.limits, seq_id)
    except BadValueError as exc:
        raise at_key(exc, key) from None
    return metadata


def _needed(manifest: Manifest, pages: int) -> list[ChunkRef]:
    """The chunks of ``manifest`` that hold any of its first ``pages`` pages."""
    return [ref for ref in manifest.chunk_refs() if ref.first_page < pages]


def _carried(manifest: Manifest, old: PageGroups | None, fetched: set[ChunkRef], new: PageGroups
             ) -> tuple[PageGroups, set[ChunkRef]]:
    """``new`` with the chunks of ``manifest`` that ``old`` holds already (``fetched``) copied in, and those."""
    carried = {ref for ref in manifest.chunk_refs() if ref in fetched}
    for ref in carried:
        lo = ref.first_page * manifest.page_bytes
        new[ref.group][lo:lo + ref.nbytes] = old[ref.group][lo:lo + ref.nbytes]
    return new, carried


def check_fits(manifest: Manifest, metadata: str, lay: KVLayout, limits: CacheLimits, seq_id: int, key: str) -> None:
    """Everything about ``manifest`` (to import with ``metadata`` as ``seq_id``) that can be checked against a
    cache of layout ``lay`` and ``limits`` without one; errors name ``key``."""
    try:
        got_hash = parse_metadata(metadata).get("layout_hash")
        if got_hash != lay.layout_hash():
            raise LayoutHashMismatch("tvm_metadata.layout_hash", lay.layout_hash(), got_hash,
                                     "the checkpoint was written by a cache of another layout")
        plan = validate_import(metadata, lay, limits, seq_id)
    except BadValueError as exc:
        raise at_key(exc, key) from None
    for what, expected, got in (("page_bytes", lay.page_bytes, manifest.page_bytes),
                                ("num_groups", lay.num_layers, manifest.num_groups),
                                ("num_logical_pages", plan.num_logical_pages, manifest.num_logical_pages)):
        if expected != got:
            raise FormatError(f"{key}: {what}", f"{expected} (from tvm_metadata and the cache layout)", got)


async def _fetch_groups(store: "Store", ledger: Ledger, manifest: Manifest, key: str, groups: PageGroups,
                        progress: Progress | None, fetched: set[ChunkRef]) -> PageGroups:
    """The pages ``groups`` has room for read into it, each chunk that holds any of them read and verified whole
    (size and SHA-256), in place where all its pages fit; CorruptionError names a damaged one, which ``ledger``
    no longer trusts. Chunks in ``fetched`` are in ``groups`` already; each one read and verified is added to it."""
    pb = manifest.page_bytes
    everything = _needed(manifest, groups.group_bytes // pb)
    refs = [ref for ref in everything if ref not in fetched]
    done = [len(everything) - len(refs)]

    async def fetch(ref: ChunkRef) -> None:
        view = groups[ref.group][ref.first_page * pb:ref.first_page * pb + ref.nbytes]
        whole = view if len(view) == ref.nbytes else memoryview(bytearray(ref.nbytes))  # pages past the prefix too
        try:
            await read_chunk_into(store, ref, whole, verify=True)
        except CorruptionError as exc:
            ledger.distrust((ref.key,))  # found damaged: no later save reuses it unread
            raise at_key(exc, key) from None
        if whole is not view:
            view[:] = whole[:len(view)]
        fetched.add(ref)
        done[0] += 1
        if progress is not None:
            progress("restore", done[0], len(everything))

    await run_bounded((lambda r=r: fetch(r) for r in refs), IO_CONCURRENCY)
    return groups
