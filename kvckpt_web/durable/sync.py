"""Sync: the newest generation of checkpoints copied from one store to another (a directory, object storage, a
store ``kvckpt serve`` serves), moving only the chunks the destination lacks.

Per name, under the destination's claim of the name and its writer lock, as a save writes: the chunks the
destination lacks (each read no longer than its ref says and checked against its SHA-256 before it is written),
then the manifest, create-only, then the generation's prefix index records. A crash or a lost connection at any
point leaves the destination with its last committed generation and some unreferenced chunks; a rerun moves only
what is still missing. Nothing is ever overwritten.

Whether the source's copy of a name continues the destination's is decided on their tokens (see
:func:`continues`). A copy that continues it is copied under the name; one the destination's continues (the
destination went on further) is a conflict: nothing is copied. A copy that went apart from the destination's
(another history, or another conversation, under the name) is kept beside it under a name of its own (see
:func:`apart_name`), and the result says so (:attr:`~.results.SyncResult.kept_apart`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

from ..checks import check_callable, check_each
from ..errors import ConflictError, CorruptionError, FormatError, KVCkptError, NotFoundError
from ..stores.base import check_store
from ..threads import offload
from .catalog import decode_at, load_manifest, manifest_keys
from .container import MAX_MANIFEST_BYTES, ChunkRef, Manifest, check_chunk_digest, check_chunk_size, encode_manifest
from .keys import CHUNKS, PREFIXES, chunk_digest, validate_name
from .pipeline import IO_CONCURRENCY, run_bounded
from .prefix_records import (MAX_RECORD_BYTES, decode_record, encode_record, manifest_of, parse_record_key,
                             record_key)
from .results import Progress, SyncResult
from .save import LIST_THRESHOLD

if TYPE_CHECKING:
    from ..stores.base import Store

__all__ = ["APART", "apart_name", "continues", "sync"]

APART = ".apart-"
"""What joins a name and the short id of a copy kept beside it: ``<name>.apart-<8 hex digits>``."""
_ID_DIGITS = 8
_MAX_NAME = 128


async def sync(src: "Store", dst: "Store", *, names: Iterable[str] | None = None,
               progress: Progress | None = None) -> SyncResult:
    """Copy the newest generation of each name of ``src`` (``names``: only those, a collection; NotFoundError for
    one ``src`` does not hold) into ``dst``, unless ``dst`` holds it already.

    A name whose copy went apart from the one ``dst`` holds is copied under a name of its own (listed in
    ``kept_apart``); a name ``dst`` holds further on than ``src`` is not copied and is listed in ``conflicts``
    (the caller decides whether that is an error); the other names are copied all the same. A damaged newest
    manifest in ``src`` raises (CorruptionError or FormatError naming its key). ``progress`` is called with
    ``("sync", chunks done, chunks to check)`` per name.
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
            raise NotFoundError(f"names: no checkpoint named {', '.join(map(repr, missing))} in {src.location}")
    written_before = dst.bytes_written
    totals = {"sent": 0, "present": 0, "records": 0}
    copied: list[str] = []
    current: list[str] = []
    conflicts: list[str] = []
    apart: dict[str, str] = {}
    for name in chosen:
        manifest, envelope = await load_manifest(src, name)
        try:
            async with AsyncExitStack() as held:
                await _claim(held, dst, name)
                await held.enter_async_context(dst.lock())
                target, needed = await _target(src, dst, manifest, envelope)
                if target.name != name:
                    await _claim(held, dst, target.name)
                    apart[name] = target.name
                await _copy(src, dst, manifest, envelope, target, needed, totals, progress)
        except ConflictError as exc:
            conflicts.append(str(exc))
            continue
        (copied if needed else current).append(target.key)
    return SyncResult(tuple(copied), tuple(current), tuple(conflicts), totals["sent"], totals["present"],
                      totals["records"], dst.bytes_written - written_before, time.perf_counter() - started, apart)


async def _claim(held: AsyncExitStack, dst: "Store", name: str) -> None:
    """Hold ``dst``'s claim of ``name`` until ``held`` closes; ConflictError naming the name and the store if another
    writer holds it."""
    try:
        await held.enter_async_context(dst.claim(name))
    except ConflictError:
        raise ConflictError(f"{name}: being written in {dst.location} (a reply under way there, or another tab, "
                            "process or sync): not copied") from None


def _history(app_state: Mapping[str, Any]) -> tuple[list[Any], int] | None:
    """Every token id a generation saved (``prompt_tokens`` then ``generated_tokens``, generation/APP_STATE.md) and how
    many of them a continuation starts with: all, or all but the pending end-of-sequence id of a reply that ended
    at one (``finish_reason`` "eos": the template's end of turn stands in its place). None if it saved none."""
    prompt, generated = app_state.get("prompt_tokens"), app_state.get("generated_tokens")
    if not isinstance(prompt, list) or not isinstance(generated, list):
        return None
    tokens = prompt + generated
    kept = app_state.get("kv_length") if app_state.get("finish_reason") == "eos" else len(tokens)
    if type(kept) is not int or not 0 <= kept <= len(tokens):
        return None
    return tokens, kept


def continues(newer: Mapping[str, Any], older: Mapping[str, Any]) -> bool:
    """Whether the generation whose ``app_state`` is ``newer`` continues the one whose ``app_state`` is ``older``:
    the same conversation (``conversation``, FORMAT.md section 4), and its tokens start with all of the older
    one's (but a pending end-of-sequence id, see :func:`_history`). Decided on tokens alone, never on chunks;
    a generation that saved no tokens continues none and none continues it."""
    if newer.get("conversation") != older.get("conversation"):
        return False
    new, old = _history(newer), _history(older)
    if new is None or old is None:
        return False
    tokens, (known, kept) = new[0], old
    return tokens[:kept] == known[:kept]


def apart_name(name: str, envelope: bytes) -> str:
    """The name a copy of ``name`` that went apart from the destination's is kept under:
    ``<name>.apart-<the first 8 hex digits of the SHA-256 of its manifest envelope>`` (``name`` cut short to keep
    it within 128 characters). The same copy always gets the same name, so a rerun finds it there."""
    return f"{_apart_stem(name)}{chunk_digest(envelope)[:_ID_DIGITS]}"


def _apart_stem(name: str) -> str:
    return f"{name[:_MAX_NAME - len(APART) - _ID_DIGITS]}{APART}"


def _renamed(manifest: Manifest, name: str) -> Manifest:
    return manifest if name == manifest.name else dataclasses.replace(manifest, name=name)


async def _goes_on(newer: Manifest, newer_store: "Store", older: Manifest, older_envelope: bytes) -> bool:
    """Whether ``newer`` (held by ``newer_store``) is a later generation than ``older`` that continues it: its
    tokens go on from older's (:func:`continues`), or, of the same conversation, ``newer_store`` holds ``older``
    itself, byte for byte (its own history: a checkpoint that saved no tokens, a reply regenerated there)."""
    if newer.generation <= older.generation:
        return False
    if continues(newer.app_state, older.app_state):
        return True
    return (newer.app_state.get("conversation") == older.app_state.get("conversation")
            and await newer_store.get(older.key, max_bytes=MAX_MANIFEST_BYTES) == older_envelope)


async def _newest(dst: "Store", name: str) -> tuple[Manifest, bytes] | None:
    """The newest manifest of ``name`` in ``dst`` and its bytes; None if it holds none; a damaged one raises."""
    keys = await manifest_keys(dst, name)
    if not keys:
        return None
    key = keys[-1][2]
    data = await dst.get(key, max_bytes=MAX_MANIFEST_BYTES)
    return decode_at(key, data), data


async def _target(src: "Store", dst: "Store", manifest: Manifest, envelope: bytes) -> tuple[Manifest, bool]:
    """The manifest ``dst`` is to hold for the source's newest ``manifest`` of its name, and whether ``dst`` lacks
    it: ``manifest`` itself if ``dst`` lacks the name, holds it, or holds a generation it continues; the same
    checkpoint under a name of its own (:func:`_kept_apart`) if the two went apart. ConflictError if ``dst``'s
    generation continues it (``dst`` went on further: nothing to copy)."""
    try:
        newest = await _newest(dst, manifest.name)
    except KVCkptError:  # a damaged newest generation there: nothing says the source's continues it
        return await _kept_apart(src, dst, manifest, envelope)
    if newest is None or newest[1] == envelope:
        return manifest, newest is None
    held, held_envelope = newest
    if await _goes_on(manifest, src, held, held_envelope):
        return manifest, True
    if await _goes_on(held, dst, manifest, envelope):
        raise ConflictError(f"{manifest.name}: {dst.location} holds generation {held.generation}, which goes on from "
                            f"the source's generation {manifest.generation}: not copied (sync the other way to bring "
                            "the source up to date)")
    return await _kept_apart(src, dst, manifest, envelope)


async def _kept_apart(src: "Store", dst: "Store", manifest: Manifest, envelope: bytes) -> tuple[Manifest, bool]:
    """``manifest`` under the name a copy that went apart from ``dst``'s is kept under, and whether ``dst`` lacks
    it: a name of :func:`apart_name`'s form that holds it, or a generation it continues, already (the same
    history kept apart by an earlier sync), else its own :func:`apart_name`. ConflictError if that name holds
    another checkpoint."""
    stem = _apart_stem(manifest.name)
    for other in sorted({n for n, _, _ in await manifest_keys(dst) if n.startswith(stem)}):
        renamed = _renamed(manifest, other)
        try:
            newest = await _newest(dst, other)
        except KVCkptError:
            continue
        if newest is not None and (newest[0] == renamed or await _goes_on(renamed, src, *newest)):
            return renamed, newest[0] != renamed
    renamed = _renamed(manifest, apart_name(manifest.name, envelope))
    if await manifest_keys(dst, renamed.name):
        raise ConflictError(f"{manifest.name}: the source's generation {manifest.generation} went apart from the one "
                            f"{dst.location} holds, and the name it would be kept under there, {renamed.name}, holds "
                            "another checkpoint: not copied")
    return renamed, True


async def _copy(src: "Store", dst: "Store", manifest: Manifest, envelope: bytes, target: Manifest, needed: bool,
                totals: dict[str, int], progress: Progress | None) -> None:
    """Copy the source's ``manifest`` (chunks, manifest, records) as ``target`` (itself or renamed) unless ``dst``
    holds it (``needed`` False: only its missing records)."""
    if needed:
        refs = {ref.key: ref for ref in target.chunk_refs()}
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

        ordered = list(refs.values())
        try:
            async with dst.batch():  # every chunk durable before the manifest is written
                for at in range(0, len(ordered), IO_CONCURRENCY):
                    await dst.renew_claim(target.name)  # a long copy keeps its lease: nobody takes the name over
                    await run_bounded((lambda r=r: copy(r) for r in ordered[at:at + IO_CONCURRENCY]), IO_CONCURRENCY)
        except CorruptionError as exc:
            raise CorruptionError(f"{manifest.name}: generation {manifest.generation} in {src.location} is damaged and "
                                  f"was not copied ({exc})") from None
        data = envelope if target is manifest else encode_manifest(target, metadata_is_valid=True)
        await dst.renew_claim(target.name)  # still this sync's name as it commits
        if not await dst.set_if_absent(target.key, data):
            if await dst.get(target.key, max_bytes=MAX_MANIFEST_BYTES) != data:
                raise ConflictError(f"{manifest.name}: another writer committed generation {target.generation} of "
                                    f"{target.name} in {dst.location} while this sync ran: not overwritten")
    await _copy_records(src, dst, manifest.key, target.name, totals)


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


async def _copy_records(src: "Store", dst: "Store", key: str, name: str, totals: dict[str, int]) -> None:
    """Copy the prefix index records of the manifest ``key`` that ``dst`` lacks (after the manifest), as records of
    ``name`` (the name the copy is held under in ``dst``)."""
    for record in [k for k in await src.list_prefix(PREFIXES) if manifest_of(k) == key]:
        scope, own, generation = parse_record_key(record)
        there = record if name == own else record_key(scope, name, generation)
        if await dst.exists(there):
            continue
        data = await src.get(record, max_bytes=MAX_RECORD_BYTES)
        if data is not None and name != own:
            try:
                data = encode_record(dataclasses.replace(decode_record(record, data), name=name))
            except FormatError:  # a record readers ignore: a miss, not copied
                continue
        if data is not None and await dst.set_if_absent(there, data):
            totals["records"] += 1
