"""Verify: every manifest and chunk of a store (or of one name) checked, and optionally loaded into a GPU cache.

Takes no lock: damage found in a manifest, or in a chunk it uses, is reported only if that manifest still
holds the bytes verify read once it is done, so a generation another process collects meanwhile is not.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from ..checks import check_callable, check_instance
from ..errors import CorruptionError, KVCkptError
from ..gpu.device import Device
from ..kv.cache import PagedKVCache
from ..tvm.layout import CacheLimits
from ..threads import offload
from ..tvm.metadata import layout_from_metadata, limits_from_metadata, parse_metadata
from .catalog import decode_at, manifest_keys
from .chunk_reads import read_chunk, stored_size
from .container import MAX_MANIFEST_BYTES, ChunkRef, Manifest
from .keys import CHUNKS, chunk_digest, chunk_key, is_chunk_key, validate_name
from .ledger import Ledger, ledger_for
from .pipeline import IO_CONCURRENCY, run_bounded
from .prefix_index import check_records
from .restore import check_fits, restore_into
from .results import Progress, VerifyReport

if TYPE_CHECKING:
    from ..stores.base import Store

__all__ = ["verify"]

#: Each problem found, and the keys of the manifests it concerns (none: it stands anyway).
Found = list[tuple[str, list[str]]]


async def verify(store: "Store", *, name: str | None = None, device: "Device | None" = None,
                 progress: Progress | None = None, ledger: Ledger | None = None) -> VerifyReport:
    """Check everything in ``store`` (or only the manifests of ``name`` and their chunks).

    Decodes every manifest and checks it against its key and its TVM metadata; re-hashes every chunk
    (all of them when ``name`` is None, also those no manifest uses but none larger than the manifests'
    chunks), reading none longer than its manifest says and reporting no value where one should be (a
    FIFO, a device) as damage of that key; with a ``device``, restores
    every intact generation into a fresh GPU cache of its layout and checks that it reads back
    byte-identical. Never raises for damage: it is listed in ``problems``; prefix index records that
    lookups ignore, or whose checkpoint is gone, are listed in ``warnings``. Takes no lock: damage
    found in a manifest, or in a chunk it uses, is reported only if that manifest still holds the
    bytes verify read once it is done, so a generation another process collects meanwhile is not.
    ``ledger`` (default: the store object's own) no longer trusts the chunks found damaged.
    """
    ledger = ledger_for(store, ledger)
    if name is not None:
        validate_name(name)
    if device is not None:
        check_instance("device", device, Device, "a Device (open_device()) or None")
    check_callable("progress", progress)
    report = VerifyReport()
    envelopes: dict[str, bytes] = {}
    found: Found = []
    manifests = await _check_manifests(store, name, report, envelopes, found)
    bad = await _check_chunks(store, ledger, name, manifests, report, found, progress)
    if device is not None:
        intact = [(key, m) for key, m in manifests if not any(ref.key in bad for ref in m.chunk_refs())]
        await _check_loads(store, ledger, device, intact, report, found, progress)
    report.problems = await _standing(store, found, envelopes)
    report.warnings = await check_records(store, name)  # prefix index records are hints, not checkpoints
    return report


def _naming(key: str, exc: KVCkptError) -> str:
    """The message of ``exc`` with ``key`` in front, unless it starts with it."""
    return str(exc) if str(exc).startswith(key) else f"{key}: {exc}"


async def _check_manifests(store: "Store", name: str | None, report: VerifyReport, envelopes: dict[str, bytes],
                           found: Found) -> list[tuple[str, Manifest]]:
    """The manifests (of ``name``) that decode, match their key and fit their TVM metadata; each one read goes
    into ``envelopes``, and what is wrong with the others into ``found``."""
    manifests: list[tuple[str, Manifest]] = []
    for _, _, key in await manifest_keys(store, name):
        try:
            data = await store.get(key, max_bytes=MAX_MANIFEST_BYTES)
        except KVCkptError as exc:  # longer than any manifest can be, no value (a FIFO, a device), unreadable
            report.manifests_checked.append(key)
            found.append((_naming(key, exc), []))
            continue
        if data is None:  # deleted since it was listed
            continue
        envelopes[key] = data
        report.manifests_checked.append(key)
        try:
            m = decode_at(key, data)
            meta = parse_metadata(m.tvm_metadata)
            check_fits(m, m.tvm_metadata, layout_from_metadata(meta), limits_from_metadata(meta), meta.get("seq_id"),
                       key)
        except KVCkptError as exc:
            found.append((_naming(key, exc), [key]))
            continue
        manifests.append((key, m))
    return manifests


async def _check_chunks(store: "Store", ledger: Ledger, name: str | None, manifests: list[tuple[str, Manifest]],
                        report: VerifyReport, found: Found, progress: Progress | None) -> set[str]:
    """Re-hash every chunk ``manifests`` use against their refs and, with no ``name``, every other chunk against
    its own key; the damaged ones, which ``ledger`` no longer trusts.

    A chunk is read only once its stored size is the one its ref says; a chunk no manifest uses only if it
    is no larger than the chunks these manifests are cut into (a larger one is no chunk of theirs: gc
    removes it unread). What is no value where a chunk should be (a FIFO, a device) is damage of that key.
    """
    refs: dict[str, ChunkRef] = {}
    users: dict[str, list[str]] = {}
    for key, m in manifests:
        for ref in m.chunk_refs():
            refs.setdefault(ref.key, ref)
            users.setdefault(ref.key, []).append(key)
    listed = set(await store.list_prefix(CHUNKS)) if name is None else set()
    todo = sorted(set(refs) | {k for k in listed if is_chunk_key(k)})
    largest = max((m.pages_per_chunk * m.page_bytes for _, m in manifests), default=0)
    bad: set[str] = set()
    done = [0]

    async def check(ckey: str) -> None:
        ref = refs.get(ckey)
        try:
            if ref is None:
                report.unreferenced_chunks.append(ckey)
                await _check_unreferenced(store, ckey, largest, report)
            else:
                report.bytes_checked += len(await read_chunk(store, ref, verify=True))
        except KVCkptError as exc:
            bad.add(ckey)
            ledger.distrust((ckey,))
            found.append((f"{exc} (used by {', '.join(users[ckey])})", users[ckey]) if ref is not None
                         else (_naming(ckey, exc), []))  # the ref's messages name the chunk and its pages
        report.chunks_checked += 1
        done[0] += 1
        if progress is not None:
            progress("verify chunks", done[0], len(todo))

    await run_bounded(((lambda k=k: check(k)) for k in todo), IO_CONCURRENCY)
    report.unreferenced_chunks.sort()
    return bad


async def _check_unreferenced(store: "Store", ckey: str, largest: int, report: VerifyReport) -> None:
    """Re-hash the chunk ``ckey`` no manifest uses against its key if it is at most ``largest`` bytes;
    CorruptionError if it is not the bytes its key says, or no value."""
    size = await stored_size(store, ckey)
    if size is None or size > largest:
        return
    data = memoryview(bytearray(size))
    if await store.get_into(ckey, data) != size:
        return  # replaced since: another writer's
    report.bytes_checked += size
    digest = await offload(chunk_digest, data)
    if chunk_key(digest) != ckey:
        raise CorruptionError(f"{ckey}: unreferenced chunk: sha256 expected {ckey[len(CHUNKS):]}, got {digest}")


async def _check_loads(store: "Store", ledger: Ledger, device: "Device", intact: list[tuple[str, Manifest]],
                       report: VerifyReport, found: Found, progress: Progress | None) -> None:
    """Restore each of ``intact`` into a fresh GPU cache of its layout and check that it reads back identical."""
    for i, (key, m) in enumerate(intact):
        meta = parse_metadata(m.tvm_metadata)
        layout = layout_from_metadata(meta)
        pages = max(1, m.num_logical_pages)
        limits = limits_from_metadata(meta)
        cache = PagedKVCache(device, layout, CacheLimits(1, pages * layout.page_size, limits.prefill_chunk_size))
        try:
            result = await restore_into(store, ledger, m.name, cache, None, m.generation, None, record=False)
            back = await cache.read_pages(result.seq_id, 0, m.num_logical_pages)
            for ref in m.chunk_refs():
                lo = ref.first_page * m.page_bytes
                if chunk_digest(back[ref.group][lo:lo + ref.nbytes]) != ref.sha256:
                    raise CorruptionError(f"{key}: {ref.describe()} reads back different from the GPU cache")
            report.loaded.append(key)
        except KVCkptError as exc:
            found.append((_naming(key, exc), [key]))
        finally:
            cache.close()
        if progress is not None:
            progress("verify load", i + 1, len(intact))


async def _standing(store: "Store", found: Found, envelopes: dict[str, bytes]) -> list[str]:
    """The problems of ``found`` that stand: a manifest deleted or replaced since it was read was collected by
    another writer, not damaged."""
    concerned = sorted({key for _, keys in found for key in keys})
    current = dict(zip(concerned, await asyncio.gather(*(_bytes_now(store, key) for key in concerned))))
    return [text for text, keys in found if not keys or any(current[k] == envelopes[k] for k in keys)]


async def _bytes_now(store: "Store", key: str) -> bytes | None:
    """The manifest under ``key`` now; None if there is none, or none that can be read."""
    try:
        return await store.get(key, max_bytes=MAX_MANIFEST_BYTES)
    except KVCkptError:
        return None
