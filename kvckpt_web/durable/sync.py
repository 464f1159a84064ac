"""Sync: the newest generation of checkpoints copied from one store to another (a directory, object storage, a
store ``kvckpt serve`` serves), moving only the chunks the destination lacks.

Per name, under the destination's claim of the name and its writer lock, as a save writes: the chunks the
destination lacks (each read no longer than its ref says and checked against its SHA-256 before it is written),
then the manifest, create-only, then the generation's prefix index records. A crash or a lost connection at any
point leaves the destination with its last committed generation and some unreferenced chunks; a rerun moves only
what is still missing. A generation is never overwritten, and a destination that holds a newer generation of the
name, or another one under the same number, or an older one of another conversation, is a conflict: that name is
not copied (see :class:`~.results.SyncResult`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..checks import check_callable, check_each
from ..errors import ConflictError, CorruptionError, FormatError, KVCkptError, NotFoundError
from ..stores.base import check_store
from ..threads import offload
from .catalog import load_manifest, manifest_keys
from .container import (CHUNKS, MAX_MANIFEST_BYTES, PREFIXES, ChunkRef, Manifest, check_chunk_digest,
                        check_chunk_size, chunk_digest, decode_manifest, validate_name)
from .pipeline import IO_CONCURRENCY, run_bounded
from .prefix_records import MAX_RECORD_BYTES, manifest_of
from .results import Progress, SyncResult
from .save import LIST_THRESHOLD

if TYPE_CHECKING:
    from ..stores.base import Store

__all__ = ["sync"]


async def sync(src: "Store", dst: "Store", *, names: Iterable[str] | None = None,
               progress: Progress | None = None) -> SyncResult:
    """Copy the newest generation of each name of ``src`` (``names``: only those, a collection; NotFoundError for
    one ``src`` does not hold) into ``dst``, unless ``dst`` holds it already.

    A name whose copy would overwrite or go behind what ``dst`` holds is not copied and is listed in
    ``conflicts`` (the caller decides whether that is an error); the other names are copied all the same. A
    damaged newest manifest in ``src`` raises (CorruptionError or FormatError naming its key). ``progress`` is
    called with ``("sync", chunks done, chunks to check)`` per name.
    """
    check_store(src, "src")
    check_store(dst, "dst")
    check_callable("progress", progress)
    started = time.perf_counter()
    present = sorted({n for n, _, _ in await manifest_keys(src)})
    if names is None:
        chosen = present
    else:
        chosen = check_each("names", names, "a list of checkpoint names", lambda f, n: validate_name(n, f))
        missing = sorted(set(chosen) - set(present))
        if missing:
            raise NotFoundError(f"names: no checkpoint named {', '.join(map(repr, missing))} in {src!r}")
    written_before = dst.bytes_written
    totals = {"sent": 0, "present": 0, "records": 0}
    copied: list[str] = []
    current: list[str] = []
    conflicts: list[str] = []
    for name in chosen:
        manifest, envelope = await load_manifest(src, name)
        try:
            async with dst.claim(name), dst.lock():
                done = await _copy(src, dst, manifest, envelope, totals, progress)
        except ConflictError as exc:
            conflicts.append(str(exc))
            continue
        (copied if done else current).append(manifest.key)
    return SyncResult(tuple(copied), tuple(current), tuple(conflicts), totals["sent"], totals["present"],
                      totals["records"], dst.bytes_written - written_before, time.perf_counter() - started)


async def _check_target(src: "Store", dst: "Store", manifest: Manifest, envelope: bytes) -> bool:
    """Whether ``dst`` lacks ``manifest`` (True) or holds it already (False); ConflictError if copying it would
    overwrite or go behind what ``dst`` holds: a newer generation, this generation with other bytes, or an older
    one that ``src`` holds with other bytes or that records another conversation."""
    keys = await manifest_keys(dst, manifest.name)
    if not keys:
        return True
    newest, key = keys[-1][1], keys[-1][2]
    where = f"{dst!r} holds {key}"
    if newest > manifest.generation:
        raise ConflictError(f"{manifest.name}: {where}, newer than the source's generation {manifest.generation}: "
                            "not overwritten (sync the other way to bring the source up to date)")
    held = await dst.get(key, max_bytes=MAX_MANIFEST_BYTES)
    if newest == manifest.generation:
        if held != envelope:
            raise ConflictError(f"{manifest.name}: {where}, another checkpoint under the same generation: "
                                "two writers continued it; not overwritten")
        return False
    mine = await src.get(key, max_bytes=MAX_MANIFEST_BYTES)
    if mine is not None and mine != held:
        raise ConflictError(f"{manifest.name}: {where}, which differs from the source's generation {newest}: "
                            "the two went apart; not overwritten")
    if mine is None and held is not None and not _continues(held, manifest):
        raise ConflictError(f"{manifest.name}: {where}, which the source's generation {manifest.generation} does "
                            "not continue (another conversation, or the two went apart); not overwritten")
    return True


def _continues(envelope: bytes, newer: Manifest) -> bool:
    """Whether ``newer`` can continue the checkpoint encoded in ``envelope``: the same conversation (as recorded
    in app_state), and the same K/V where the older one's chunks are whole, chunk for chunk (each group's last
    chunk, which a later save grows, is not compared: a history that parted within it is not seen)."""
    try:
        older = decode_manifest(envelope)
    except KVCkptError:
        return False
    if older.app_state.get("conversation") != newer.app_state.get("conversation"):
        return False
    if (older.page_bytes, older.pages_per_chunk, older.num_groups) != (newer.page_bytes, newer.pages_per_chunk,
                                                                       newer.num_groups):
        return False
    return all(len(new) >= len(old) and all(a.sha256 == b.sha256 and a.num_pages == b.num_pages
                                            for a, b in zip(old[:-1], new))
               for old, new in zip(older.chunks, newer.chunks))


async def _copy(src: "Store", dst: "Store", manifest: Manifest, envelope: bytes, totals: dict[str, int],
                progress: Progress | None) -> bool:
    """Copy one generation (chunks, manifest, records) unless ``dst`` holds it; whether its manifest was copied."""
    needed = await _check_target(src, dst, manifest, envelope)
    if needed:
        refs = {ref.key: ref for ref in manifest.chunk_refs()}
        listed = set(await dst.list_prefix(CHUNKS)) if len(refs) > LIST_THRESHOLD else None
        done = [0]

        async def copy(ref: ChunkRef) -> None:
            there = ref.key in listed if listed is not None else await dst.exists(ref.key)
            if not there:
                data = await _read_chunk(src, ref)
                if await dst.set_if_absent(ref.key, data):
                    totals["sent"] += 1
                else:
                    totals["present"] += 1
            else:
                totals["present"] += 1
            done[0] += 1
            if progress is not None:
                progress("sync", done[0], len(refs))

        async with dst.batch():  # every chunk durable before the manifest is written
            await run_bounded((lambda r=r: copy(r) for r in refs.values()), IO_CONCURRENCY)
        if not await dst.set_if_absent(manifest.key, envelope):
            if await dst.get(manifest.key, max_bytes=MAX_MANIFEST_BYTES) != envelope:
                raise ConflictError(f"{manifest.name}: another writer committed {manifest.key} in {dst!r} while "
                                    "this sync ran; not overwritten")
    await _copy_records(src, dst, manifest.key, totals)
    return needed


async def _read_chunk(src: "Store", ref: ChunkRef) -> bytes:
    """The bytes of ``ref`` in ``src``, read in one request no longer than ``ref`` says; CorruptionError naming the
    chunk if they are missing, of another size or another SHA-256."""
    try:
        data = await src.get(ref.key, max_bytes=ref.nbytes)
    except FormatError as exc:
        raise CorruptionError(f"{ref.describe()}: expected {ref.nbytes} bytes, got {exc.got}") from None
    check_chunk_size(ref, None if data is None else len(data))
    check_chunk_digest(ref, await offload(chunk_digest, data))
    return data


async def _copy_records(src: "Store", dst: "Store", key: str, totals: dict[str, int]) -> None:
    """Copy the prefix index records of the manifest ``key`` that ``dst`` lacks (after the manifest)."""
    for record in [k for k in await src.list_prefix(PREFIXES) if manifest_of(k) == key]:
        if await dst.exists(record):
            continue
        data = await src.get(record, max_bytes=MAX_RECORD_BYTES)
        if data is not None and await dst.set_if_absent(record, data):
            totals["records"] += 1

