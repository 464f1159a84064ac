"""The prefix index in a store: records committed after their manifests, deleted after them, checked, counted,
and looked up by the token ids of a prompt (FORMAT.md section 7; the records themselves are
:mod:`.prefix_records`).

A save writes a generation's record after the manifest, under the same lock; retention deletes it after the
manifest. A writer killed between the two leaves a checkpoint without a record: :meth:`PrefixIndex.rebuild`
writes it later from what its manifest saved. A record is only a hint. A reader ignores a record it cannot use
(that is a miss), and the caller checks a hit against the tokens the checkpoint saved before it uses the hit.
:class:`PrefixIndex` keeps one scope's records in memory and answers lookups without reading the store.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..checks import check_int
from ..errors import FieldError, FormatError, KVCkptError, StoreError
from .catalog import manifest_keys
from .keys import PREFIXES, manifest_key, manifest_prefix
from .pipeline import IO_CONCURRENCY, run_bounded
from .prefix_records import (HASH_BYTES, MAX_RECORD_BYTES, PrefixKey, PrefixRecord, chain_hashes, check_page_size,
                             checked_tokens, decode_record, encode_record, manifest_of, parse_record_key, prefix_record,
                             record_key, scope_hash)

if TYPE_CHECKING:
    from ..stores.base import Store

__all__ = ["PrefixHit", "PrefixIndex", "check_records", "commit_record", "count_records", "drop_records"]


# -- the writer's side: save and retention -------------------------------------------------------------------


async def commit_record(store: "Store", record: PrefixRecord | None) -> tuple[PrefixRecord | None, list[str]]:
    """Write ``record`` once its checkpoint's manifest is committed. Returns the record, or None and a warning if
    it could not be written: the checkpoint stays committed and lookups miss it."""
    if record is None:
        return None, []
    try:
        await store.set_if_absent(record.key, encode_record(record))  # written once, as its manifest
    except KVCkptError as exc:
        return None, [f"{record.key}: prefix index record not written; the checkpoint is committed, lookups miss it "
                      f"({exc})"]
    return record, []


async def drop_records(store: "Store", dropped: Collection[str] | None = None) -> int:
    """Delete the records of the manifests ``dropped``, whose deletion must already be durable. With None,
    delete every record whose manifest the store does not hold. Returns how many it deleted. Records are
    listed before manifests: a record written after that listing has its manifest in the second listing, so
    it is never taken for an orphan. Keys under ``prefixes/`` that are no record key are left alone."""
    listed = await store.list_prefix(PREFIXES)
    if not listed:
        return 0
    if dropped is None:
        present = {key for _, _, key in await manifest_keys(store)}
        doomed = [key for key in listed if (m := manifest_of(key)) is not None and m not in present]
    else:
        gone = set(dropped)
        doomed = [key for key in listed if manifest_of(key) in gone]
    async with store.batch():
        await run_bounded(((lambda k=k: store.delete(k)) for k in doomed), IO_CONCURRENCY)
    return len(doomed)


# -- the readers' side: verify, inspect ------------------------------------------------------------------------


async def check_records(store: "Store", name: str | None = None) -> list[str]:
    """Warnings about the records in ``store`` (only those of ``name`` if it is given): keys that are no record
    key, records a reader ignores, and records whose checkpoint is gone. None of these is damage to a
    checkpoint."""
    listed = await store.list_prefix(PREFIXES)
    present = {key for _, _, key in await manifest_keys(store, name)}
    warnings: list[str] = []

    async def check(key: str) -> None:
        manifest = manifest_of(key)
        if manifest is None:
            if name is None:
                warnings.append(f"{key}: not a prefix index record key (prefix lookups ignore it)")
            return
        if name is not None and not manifest.startswith(manifest_prefix(name)):
            return
        try:
            data = await store.get(key, max_bytes=MAX_RECORD_BYTES)
            if data is None:  # deleted since it was listed
                return
            decode_record(key, data)
        except FormatError as exc:
            warnings.append(f"{exc} (prefix lookups ignore it)")
            return
        if manifest not in present:
            warnings.append(f"{key}: prefix index record of a checkpoint no longer stored (kvckpt gc removes it)")

    await run_bounded(((lambda k=k: check(k)) for k in listed), IO_CONCURRENCY)
    return sorted(warnings)


async def count_records(store: "Store") -> dict[str, int]:
    """Counts of the store's records, found from their keys (nothing read): ``records``, ``scopes``,
    ``without_checkpoint`` (records whose manifest is gone) and ``other_keys`` (keys that are no record key)."""
    listed = await store.list_prefix(PREFIXES)
    present = {key for _, _, key in await manifest_keys(store)}
    manifests = [manifest_of(key) for key in listed]
    records = [key for key, m in zip(listed, manifests) if m is not None]
    return {"records": len(records), "scopes": len({key.split("/")[1] for key in records}),
            "without_checkpoint": sum(1 for m in manifests if m is not None and m not in present),
            "other_keys": len(listed) - len(records)}


# -- lookups -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PrefixHit:
    """A checkpoint whose record matches the first ``pages`` full pages of a prompt."""

    name: str
    generation: int
    pages: int
    """Full pages of the prompt that match the record's leading pages."""
    tokens: int
    """How many tokens the record says the checkpoint's K/V hold."""
    page_size: int

    @property
    def matched_tokens(self) -> int:
        """Tokens of the prompt covered by the matched pages (``pages * page_size``)."""
        return self.pages * self.page_size


@dataclass(frozen=True)
class _Entry:
    name: str
    generation: int
    tokens: int
    hashes: bytes
    """The record's page hashes back to back, :data:`HASH_BYTES` each."""


class PrefixIndex:
    """The records of one scope of one store, held in memory for lookups by the token ids of a prompt.

    :meth:`refresh` reads the records it has not read yet. A record key is written once, so each one is read
    once. :meth:`lookup` reads nothing: it hashes the prompt's full pages once and probes one dictionary, which
    holds every record under each of its chained page hashes (a hash names the whole prefix up to its page, as in
    vLLM's block pool), so a lookup costs the hits it returns, not the records that share a first page.
    Records of another page size, and those a reader ignores, are listed in :attr:`ignored`.
    """

    def __init__(self, store: "Store", scope: str, page_size: int) -> None:
        self.store = store
        self.page_size = check_page_size(page_size)
        self.scope = scope
        self._h0 = scope_hash(scope)
        self.scope_id = self._h0[:HASH_BYTES].hex()
        self._entries: dict[str, _Entry] = {}
        # the entries by each of their chained page hashes: those under a prompt's n-th share its first n pages
        self._by_page: dict[bytes, dict[str, _Entry]] = {}
        self._ignored: dict[str, str] = {}

    def __len__(self) -> int:
        """The number of records a lookup can return."""
        return len(self._entries)

    @property
    def ignored(self) -> dict[str, str]:
        """Why each record of this scope that a lookup cannot use is ignored, by key."""
        return dict(self._ignored)

    async def refresh(self) -> int:
        """List this scope's records, read those not read yet and forget those no longer listed. Returns how many
        it read. A record that cannot be used goes to :attr:`ignored`. One that cannot be read now (a store
        error) is tried again at the next refresh."""
        listed = set(await self.store.list_prefix(f"{PREFIXES}{self.scope_id}/"))
        for key in [k for k in self._entries if k not in listed]:
            self._forget(key)
        for key in [k for k in self._ignored if k not in listed]:
            del self._ignored[key]
        new = sorted(listed - self._entries.keys() - self._ignored.keys())
        read = [0]

        async def load(key: str) -> None:
            try:
                parse_record_key(key)
                data = await self.store.get(key, max_bytes=MAX_RECORD_BYTES)
                read[0] += 1
                if data is not None:  # else deleted since it was listed
                    self._add(decode_record(key, data))
            except FormatError as exc:
                self._ignored[key] = str(exc)
            except StoreError:
                pass  # not readable now: the next refresh tries again

        await run_bounded(((lambda k=k: load(k)) for k in new), IO_CONCURRENCY)
        return read[0]

    def holds(self, name: str, generation: int) -> bool:
        """Whether this index has read a record of generation ``generation`` of ``name`` (one it uses or ignores)."""
        key = record_key(self.scope_id, name, generation)
        return key in self._entries or key in self._ignored

    async def rebuild(self, missing: Sequence[tuple[str, int, Sequence[int]]]) -> list[PrefixRecord]:
        """Write the records of checkpoints committed without one (their writer killed between the manifest and
        the record, FORMAT.md section 7): ``missing`` names each by name and generation with the token ids its
        K/V hold, which the caller read from its manifest and found of this scope's model and layout. Under the
        writer lock, a checkpoint that has a record in any scope by then (its writer's: K/V of other kernels are
        not this scope's), or whose manifest is gone, is left alone. Returns the records written, which lookups
        find from now on. Raises :class:`StoreError` if the lock cannot be had or the store cannot be listed."""
        written: list[PrefixRecord] = []
        if not missing:
            return written
        async with self.store.lock():
            indexed = {manifest_of(key) for key in await self.store.list_prefix(PREFIXES)}
            present = {key for _, _, key in await manifest_keys(self.store)}
            for name, generation, tokens in missing:
                key = manifest_key(name, generation)
                if key in indexed or key not in present:
                    continue
                record = prefix_record(PrefixKey(self.scope, tuple(tokens)), name, generation, len(tokens),
                                       self.page_size)
                if (await commit_record(self.store, record))[0] is not None:  # else it stays a miss
                    self.note(record)
                    written.append(record)
        return written

    def note(self, record: PrefixRecord) -> None:
        """Add ``record``, which the caller has just committed (``SaveResult.prefix_record``), without reading it
        back. Raises :class:`FieldError` for a record of another scope or page size."""
        if not isinstance(record, PrefixRecord):
            raise FieldError("record", "a PrefixRecord", type(record).__name__)
        for field, expected in (("scope_id", self.scope_id), ("page_size", self.page_size)):
            if getattr(record, field) != expected:
                raise FieldError(f"record.{field}", expected, getattr(record, field))
        self._ignored.pop(record.key, None)
        self._add(record)

    def _add(self, record: PrefixRecord) -> None:
        key = record.key
        if record.page_size != self.page_size:
            self._ignored[key] = f"{key}: page_size {record.page_size}, this index hashes pages of {self.page_size}"
            return
        if key in self._entries:
            return
        entry = _Entry(record.name, record.generation, record.tokens, bytes.fromhex("".join(record.pages)))
        self._entries[key] = entry
        for page in _pages(entry.hashes):
            self._by_page.setdefault(page, {})[key] = entry

    def _forget(self, key: str) -> None:
        entry = self._entries.pop(key)
        for page in _pages(entry.hashes):
            group = self._by_page.get(page)
            if group is not None:
                group.pop(key, None)
                if not group:
                    del self._by_page[page]

    def lookup(self, tokens: Sequence[int], limit: int | None = None) -> list[PrefixHit]:
        """The checkpoints whose records share at least one full leading page with ``tokens``: longest match
        first, then newest generation, then name; only the first ``limit`` if it is given. These are hints:
        confirm a hit against the tokens the checkpoint saved before using it."""
        if limit is not None:
            check_int("limit", limit, 1)
        hashes = _pages(chain_hashes(self._h0, checked_tokens(tokens, "tokens"), self.page_size))
        hits: list[PrefixHit] = []
        seen: set[str] = set()
        for pages in range(len(hashes), 0, -1):  # an entry under the n-th hash is under every one before it
            if limit is not None and len(hits) >= limit:
                break
            group = self._by_page.get(hashes[pages - 1])
            if not group:
                continue
            level = [PrefixHit(e.name, e.generation, pages, e.tokens, self.page_size)
                     for key, e in group.items() if key not in seen]
            level.sort(key=lambda h: (-h.generation, h.name))
            hits += level
            seen.update(group)
        return hits[:limit]


def _pages(hashes: bytes) -> list[bytes]:
    """``hashes`` (back to back, :data:`HASH_BYTES` each) one by one."""
    return [hashes[i:i + HASH_BYTES] for i in range(0, len(hashes), HASH_BYTES)]
