"""Save: a named sequence of a cache checkpointed as the next generation of its name in a store.

Commit protocol (all under ``store.lock()``): write every new chunk in one ``store.batch()`` (each ``set``
atomic, all durable when the batch ends), then the manifest of generation ``newest + 1``, create-only (where the
lock does not exclude every writer, a save whose generation another writer committed first fails with
ConflictError); only after that manifest is committed, retention (:mod:`.retention`; none with ``keep=None``)
drops the generations of that name it does not keep and then the chunks no remaining manifest of any name uses.
A crash at any instant therefore leaves the previous or the new generation restorable, plus at worst
unreferenced chunks that :func:`~.retention.gc` removes. A save whose ``app_state`` records a conversation
commits only on top of that conversation's newest generation: before anything is written, the name's newest
readable generation must be of it (so two writers of one name never interleave two conversations under it).

A chunk already in the store is reused only once it is known to hold the bytes its name says: the save's
:class:`~.ledger.Ledger` wrote it or read it back, else the save reads it once and, if it differs, rewrites
it from the cache's bytes.

Incremental saves: full pages are immutable once written, so a save rewrites only the chunks holding pages
that changed since its ledger last saved (or restored) that name: pages past the length saved last, the
partial last page, and pages a ``popn`` reached. Only those pages are read back from the GPU. Without such
a record (a new ledger, as in a new process) every page is read and hashed, but chunks already in the store
are still not written again.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..checks import check_callable, check_int
from ..errors import CheckpointStateError, ConflictError, FieldError, FormatError, KVCkptError
from ..kv.cache import check_cache
from ..kv.pool import check_seq_id
from ..stores.base import check_store
from .catalog import manifest_keys, newest_readable
from .container import MAX_MANIFEST_BYTES, ChunkRef, Manifest, encode_manifest, plan_chunks
from .keys import CHUNKS, chunk_key, validate_name
from .ledger import Ledger, Saved, ledger_for
from .pipeline import IO_CONCURRENCY, HashState, MappedBatches, run_bounded
from .prefix_index import commit_record
from .prefix_records import PrefixKey, prefix_record
from .results import Progress, SaveResult
from .retention import DEFAULT_KEEP, check_keep, retain

if TYPE_CHECKING:
    from ..kv.cache import PagedKVCache
    from ..stores.base import Store

__all__ = ["DEFAULT_CHUNK_BYTES", "LIST_THRESHOLD", "READ_BATCH_BYTES", "default_pages_per_chunk", "save"]

DEFAULT_CHUNK_BYTES = 1 << 20
"""Target chunk size when ``pages_per_chunk`` is not given (see :func:`default_pages_per_chunk`)."""

READ_BATCH_BYTES = 32 << 20
"""Bytes (all groups together) a save maps from the GPU per batch."""

LIST_THRESHOLD = 32
"""A save storing more chunks than this lists the store's chunks once instead of asking for each."""


def default_pages_per_chunk(page_bytes: int) -> int:
    """Pages per chunk of a save that does not say: about :data:`DEFAULT_CHUNK_BYTES`, at least one page."""
    return max(1, DEFAULT_CHUNK_BYTES // page_bytes)


async def save(cache: "PagedKVCache", seq_id: int, store: "Store", name: str, *,
               app_state: dict[str, Any] | None = None, keep: int | None = DEFAULT_KEEP,
               pages_per_chunk: int | None = None, progress: Progress | None = None,
               prefix: PrefixKey | None = None, ledger: Ledger | None = None) -> SaveResult:
    """Checkpoint sequence ``seq_id`` of ``cache`` as the next generation of ``name`` in ``store``.

    Writes only chunks whose pages changed since ``ledger`` (default: the store object's own,
    :meth:`~.ledger.Ledger.of`) last saved or restored ``name`` (and, even then, none the store already
    holds intact: one the ledger has not written or read back yet is read once, and rewritten if it
    differs), then the manifest; then
    keeps the newest ``keep`` generations of ``name`` that can be restored (and any damaged one newer
    than those) and deletes chunks no kept manifest of any name uses; ``keep=None`` applies no retention
    (every generation already there stays, the new one is added).
    ``app_state`` (a JSON object) is stored verbatim in the manifest; if it records a ``conversation`` (FORMAT.md
    section 4), ConflictError (nothing written) unless ``name`` holds no generation or its newest readable one
    records the same conversation. ``pages_per_chunk`` defaults to
    about :data:`DEFAULT_CHUNK_BYTES` per chunk. The sequence must not change while the save runs
    (:class:`CheckpointStateError` if it did; nothing is committed then). If anything fails before the
    manifest is committed, the store still holds the previous generations intact; a failure of the
    clean-up after the commit is reported in ``warnings`` instead.
    ``prefix`` (a :class:`~.prefix_records.PrefixKey` whose ``tokens`` are the ids of the sequence's tokens,
    exactly its length, else :class:`FieldError` before anything is written) indexes the checkpoint: its
    prefix index record is written right after the manifest (``SaveResult.prefix_record``); a record that
    cannot be written is a warning, not a failed save.
    """
    started = time.perf_counter()
    app_state, ppc = _checked_arguments(cache, seq_id, store, name, keep, app_state, pages_per_chunk, progress)
    ledger = ledger_for(store, ledger)
    lay = cache.layout
    page_bytes, num_groups = lay.page_bytes, lay.num_layers
    async with store.lock():
        await store.renew_claim(name)  # a writer whose claim was taken over writes nothing
        state = cache.sequence_state(seq_id)
        metadata = cache.get_checkpoint_metadata(seq_id)
        npages = lay.num_logical_pages(state.length)
        plan = plan_chunks(npages, ppc)
        existing, reuse, known = await _reusable(store, ledger, cache, seq_id, name, ppc, len(plan))
        await _check_conversation(store, name, existing, app_state, known)  # before anything is written
        generation = existing[-1][1] + 1 if existing else 1
        record = prefix_record(prefix, name, generation, state.length, lay.page_size)  # nothing written yet
        written_before = store.bytes_written
        # this save leaves the state over its last chunk's full pages for the next one
        last, full_pages = len(plan) - 1, state.length // lay.page_size
        keeps = ({(last, g): (full_pages - last * ppc) * page_bytes for g in range(num_groups)}
                 if plan and last >= reuse.chunks and full_pages > last * ppc else {})
        table: list[list[ChunkRef | None]] = [
            list(reuse.refs[g][:reuse.chunks]) + [None] * (len(plan) - reuse.chunks) for g in range(num_groups)]
        stored, repaired, tails = await _write_chunks(store, name, ledger, cache, seq_id, plan, ppc, reuse, keeps,
                                                      table, progress)
        if cache.sequence_state(seq_id) != state:
            raise CheckpointStateError(f"save {name!r}: sequence {seq_id} changed while it was being saved; "
                                       "nothing was committed")

        # encoded once the chunk writes are done: Python work on the loop meanwhile holds up the writer threads
        manifest = Manifest(name, generation, metadata, page_bytes, ppc, npages,
                            tuple(tuple(group) for group in table), app_state)  # type: ignore[arg-type]
        envelope = encode_manifest(manifest, metadata_is_valid=True)  # the cache wrote that metadata
        await store.renew_claim(name)  # still this writer's name as it commits
        if not await store.set_if_absent(manifest.key, envelope):  # the commit point: create-only
            raise ConflictError(f"save {name!r}: generation {generation} was committed by another writer while this "
                                f"save ran ({manifest.key} exists); nothing of this save is used, the store's "
                                "checkpoints are as that writer left them")
        ledger.remember(envelope, manifest, state, tails)
        ledger.trust(manifest.chunk_keys())  # each one written, read back, or reused
        record, not_indexed = await commit_record(store, record)  # after the manifest: a crash leaves it to be rebuilt
        written = store.bytes_written - written_before
        warnings = [f"{key}: stored bytes differed from the chunk its name says; rewritten from the cache"
                    for key in sorted(repaired)]
        try:
            names_keys = [key for _, _, key in existing] + [manifest.key]
            dropped, deleted, retained = [], 0, []
            if keep is not None:
                dropped, deleted, retained = await retain(store, keep, names_keys, ledger=ledger)
        except KVCkptError as exc:  # the checkpoint is committed: report, do not fail the save
            dropped, deleted, retained = [], 0, [f"retention after the commit failed (kvckpt gc retries): {exc}"]
    return SaveResult(name, generation, manifest.key, seq_id, state.length, len(plan) * num_groups, stored, written,
                      npages - reuse.chunks * ppc, tuple(dropped), deleted, tuple(warnings + not_indexed + retained),
                      time.perf_counter() - started, record)


def _checked_arguments(cache: "PagedKVCache", seq_id: int, store: "Store", name: str, keep: int | None,
                       app_state: dict[str, Any] | None, pages_per_chunk: int | None,
                       progress: Progress | None) -> tuple[dict[str, Any], int]:
    """The app_state and pages per chunk a save of ``cache`` stores, once every argument is checked (an
    app_state no manifest can hold included) before anything is written."""
    check_cache(cache)
    check_seq_id("seq_id", seq_id)
    check_store(store)
    validate_name(name)
    if keep is not None:
        check_keep(keep)
    check_callable("progress", progress)
    app_state = {} if app_state is None else app_state
    if not isinstance(app_state, dict):
        raise FieldError("app_state", "a JSON object (dict)", type(app_state).__name__)
    lay = cache.layout
    if pages_per_chunk is None:
        pages_per_chunk = default_pages_per_chunk(lay.page_bytes)
    check_int("pages_per_chunk", pages_per_chunk, 1)
    try:
        encode_manifest(Manifest(name, 1, "{}", lay.page_bytes, pages_per_chunk, 0, ((),) * lay.num_layers, app_state))
    except FormatError as exc:  # the caller's app_state, which no manifest can hold
        raise FieldError(exc.field, exc.expected, exc.got) from None
    return app_state, pages_per_chunk


@dataclass(frozen=True)
class _Reuse:
    """What a save keeps from its ledger's last save (or restore) of its name."""

    chunks: int
    """Leading chunks of every group whose pages are all unchanged: kept as they are, not read back."""
    refs: tuple[tuple[ChunkRef, ...], ...]
    """Per group, the refs of the last save's chunks (the first ``chunks`` are kept)."""
    known: frozenset[str]
    """The chunk keys the last save's manifest uses: in the store, and intact as far as the ledger knows."""
    starts: dict[tuple[int, int], HashState]
    """Per (chunk, group) that grew since then, the SHA-256 state over its unchanged full pages."""


async def _nothing() -> None:
    return None


async def _bytes_of(store: "Store", key: str) -> bytes | None:
    """The manifest under ``key``; None if there is none or it cannot be one (too long, a FIFO, ...)."""
    try:
        return await store.get(key, max_bytes=MAX_MANIFEST_BYTES)
    except FormatError:
        return None


async def _reusable(store: "Store", ledger: Ledger, cache: "PagedKVCache", seq_id: int, name: str, ppc: int,
                    num_chunks: int) -> tuple[list[tuple[str, int, str]], _Reuse, Saved | None]:
    """The manifest keys of ``name`` (listed under the lock the save holds), what the save can keep from
    ``ledger``'s last save of it: chunks whose pages are all unchanged, if the store still holds that save's
    manifest (read while the manifests are listed) and the ledger still trusts each chunk it uses; and that
    generation if the store still holds its manifest as the ledger knows it."""
    lay = cache.layout
    prev = ledger.last_saved(name)
    if prev is not None and (prev.page_bytes, prev.pages_per_chunk, len(prev.chunks)) != (lay.page_bytes, ppc,
                                                                                            lay.num_layers):
        prev = None
    existing, kept = await asyncio.gather(manifest_keys(store, name),
                                          _bytes_of(store, prev.key) if prev is not None else _nothing())
    known = prev if prev is not None and kept == prev.envelope else None
    if known is None or not ledger.trusts_all(known.chunk_keys):
        # nothing to go by, its chunks may be gone, or a restore or verify found one of them damaged since
        return existing, _Reuse(0, ((),) * lay.num_layers, frozenset(), {}), known
    unchanged_pages = cache.unchanged_prefix(seq_id, prev.state) // lay.page_size
    reuse = min(unchanged_pages // ppc, len(prev.chunks[0]), num_chunks)
    # a chunk that grew since then: its digest continues from the state over its unchanged full pages
    starts = {(i, g): start for g, (i, start) in prev.tails.items()
              if reuse <= i < num_chunks and i * ppc + start.nbytes // lay.page_bytes <= unchanged_pages}
    return existing, _Reuse(reuse, prev.chunks, prev.chunk_keys, starts), known


async def _check_conversation(store: "Store", name: str, existing: list[tuple[str, int, str]],
                              app_state: dict[str, Any], known: Saved | None) -> None:
    """Refuse a save whose ``app_state`` records a conversation (FORMAT.md section 4) unless ``name`` holds no
    generation (``existing``, listed under the save's lock) or its newest readable one records the same: a
    generation is committed only on top of its own conversation's, never another writer's. The newest is not
    read again if it is ``known`` (a generation whose stored manifest was just found as the ledger knows it).
    ConflictError naming the name, the conversation expected and the one found."""
    if "conversation" not in app_state or not existing:
        return
    ours = app_state["conversation"]
    if known is not None and known.key == existing[-1][2] and known.conversation == ours:
        return
    newest = await newest_readable(store, name, existing)
    theirs = None if newest is None else newest.app_state.get("conversation")
    if theirs == ours:
        return
    got = (f"none of its {len(existing)} generations readable" if newest is None else
           f"generation {newest.generation} of conversation {_conversation_id(theirs)}")
    raise ConflictError(f"save {name!r}: expected the newest generation of {name!r} in {store.location} to be of this "
                        f"save's conversation {_conversation_id(ours)}, got {got} (another writer's); nothing was "
                        "written")


def _conversation_id(value: Any) -> str:
    """The id a ``conversation`` value of an app_state records, for a message."""
    cid = value.get("id") if isinstance(value, dict) else None
    return repr(cid) if isinstance(cid, str) else "(none)"


async def _write_chunks(store: "Store", name: str, ledger: Ledger, cache: "PagedKVCache", seq_id: int,
                        plan: list[tuple[int, int]], ppc: int, reuse: _Reuse, keeps: dict[tuple[int, int], int],
                        table: list[list[ChunkRef | None]], progress: Progress | None
                        ) -> tuple[int, list[str], dict[int, tuple[int, HashState]]]:
    """Read back, hash and store every chunk past the reused ones, all in one ``store.batch()``, filling ``table``
    with their refs, renewing the claim of ``name`` before each write (a save may outlast a lease); the chunks it stored, those it found damaged and rewrote, and the hash states over the
    last chunks' full pages that ``keeps`` asked for."""
    lay = cache.layout
    num_groups = lay.num_layers
    column_bytes = ppc * lay.page_bytes * num_groups
    per_batch = max(1, READ_BATCH_BYTES // column_bytes)
    batches = [list(range(c, min(c + per_batch, len(plan)))) for c in range(reuse.chunks, len(plan), per_batch)]
    claimed: set[str] = set()
    repaired: list[str] = []
    counts = {"written": 0, "done": reuse.chunks * num_groups}
    total_chunks = len(plan) * num_groups
    # Many chunks to store: one listing answers every "is it there already?" (the lock keeps it true).
    present = (set(await store.list_prefix(CHUNKS))
               if (len(plan) - reuse.chunks) * num_groups > LIST_THRESHOLD else None)

    async def put(b: int, i: int, g: int) -> None:
        try:
            data, digest = await mapped.chunk(b, i, g)
            key = chunk_key(digest)
            table[g][i] = ChunkRef(g, plan[i][0], plan[i][1], len(data), digest)
            if key not in reuse.known and key not in claimed:
                claimed.add(key)
                await store.renew_claim(name)
                if present is None:
                    stored = await store.set_if_absent(key, data)
                elif key not in present:
                    stored = await store.set_if_absent(key, data)  # another writer may have stored it since
                else:
                    stored = False
                if not stored and not ledger.trusts(key) and await _rewrite_if_damaged(store, key, data):
                    repaired.append(key)
                    stored = True
                ledger.trust((key,))
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
    async with cache.lock("slots"):  # the staging slots serve one save at a time
        mapped = MappedBatches(cache, seq_id, plan, batches, reuse.starts, keeps)
        try:
            async with store.batch():  # every chunk durable before the manifest is written
                await run_bounded(jobs, IO_CONCURRENCY)
        finally:
            await mapped.close()
    return counts["written"], repaired, mapped.kept


async def _rewrite_if_damaged(store: "Store", key: str, data: memoryview) -> bool:
    """Make the chunk under ``key`` hold ``data`` (the bytes its name says): read it back and, if it is missing or
    differs, store ``data`` over it; whether it had to."""
    stored = bytearray(len(data))
    if await store.get_into(key, memoryview(stored)) == len(data) and stored == data:
        return False
    await store.set(key, data)
    return True
