"""Where an engine finds K/V and replies it made before: its cache's slots, and its store's checkpoints found
through the persistent prefix index.

Both are searched the same way, so a process that restarted finds in the store exactly what one that never
stopped finds in its cache (every slot it could use is committed there), and reuses the same prefix: the
prompt is then run in the same forward calls and the reply has the same tokens. A prefix shorter than a page is
not reused from either (the index holds only full pages).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..durable.catalog import load_manifest, manifest_keys
from ..durable.prefix_index import PrefixIndex
from ..errors import KVCkptError
from ..tvm.metadata import parse_metadata
from .record import ChatRecord
from .slots import PrefixSource, Slots, common_prefix

if TYPE_CHECKING:
    from ..durable.container import Manifest
    from ..stores.base import Store

__all__ = ["ConversationView", "Sources", "continues"]

RECORDS_KEPT = 256
"""Checkpoints whose records a :class:`Sources` keeps decoded (a manifest never changes under its key)."""
HITS_TRIED = 4
"""Index candidates whose tokens are compared with a prompt, longest match first."""


def continues(known: Sequence[int], kv_length: int, finish_reason: str | None, tokens: Sequence[int]) -> bool:
    """Whether ``tokens`` go on from a conversation that holds ``known`` (its K/V the first ``kv_length``):
    they start with all of it, or, when its reply ended at an end-of-sequence id, with all but that pending
    id (the template's end of turn stands in its place in the next prompt)."""
    n = kv_length if finish_reason == "eos" else len(known)
    return common_prefix(known[:n], tokens) == n


@dataclass(frozen=True)
class ConversationView:
    """What the store holds of one conversation, as a request sees it: its generations listed once, and the newest
    that can be read, decoded once."""

    name: str
    generations: tuple[int, ...]
    """Every generation the store holds, oldest first (empty: a new conversation)."""
    record: ChatRecord | None
    """The newest generation whose chat record can be read; None if none can."""


class Sources:
    """The slots and the store an engine reuses K/V and replies from: only checkpoints of ``model`` (an identity)."""

    def __init__(self, slots: Slots, store: "Store | None", index: PrefixIndex | None, page_size: int,
                 decode_reply: Callable[[Sequence[int]], str], model: str) -> None:
        self.slots = slots
        self.model = model
        self.store = store
        self.index = index
        self.page_size = page_size
        self._decode_reply = decode_reply
        self._records: "OrderedDict[tuple[str, int], tuple[ChatRecord, Manifest, bytes] | None]" = OrderedDict()
        self._views: dict[str, ConversationView] = {}  # this request's, by name (see :meth:`begin`)
        self._refreshed = False  # this request read the index's new records already
        self._examined: set[tuple[str, int]] = set()  # generations :meth:`reindex` read and need nothing more

    async def record(self, name: str, generation: int | None = None) -> ChatRecord | None:
        """The chat record of ``name``'s generation (newest if None); None if it is missing, damaged, or not a
        chat generation."""
        if self.store is None:
            return None
        if generation is None:
            keys = await manifest_keys(self.store, name)
            if not keys:
                return None
            generation = keys[-1][1]
        read = await self._read(name, generation)
        return read[0] if read is not None else None

    def loaded(self, record: ChatRecord) -> "tuple[Manifest, bytes] | None":
        """The manifest ``record`` was read from and its envelope bytes, as read (None if no longer kept)."""
        read = self._records.get((record.name, record.generation))
        return read[1:] if read is not None and read[0] is record else None

    async def _read(self, name: str, generation: int) -> "tuple[ChatRecord, Manifest, bytes] | None":
        """``name``'s generation read and decoded once (kept, as a manifest never changes under its key)."""
        key = (name, generation)
        if key in self._records:
            self._records.move_to_end(key)
            return self._records[key]
        try:
            manifest, envelope = await load_manifest(self.store, name, generation)
            read = (ChatRecord.from_app_state(name, generation, manifest.created_ms, manifest.app_state), manifest,
                    envelope)
        except KVCkptError:
            read = None
        self._records[key] = read
        while len(self._records) > RECORDS_KEPT:
            self._records.popitem(last=False)
        return read

    def begin(self) -> None:
        """Start a request: the conversations it views are listed again (once each) from now on, and the prefix
        index is read again at its first miss."""
        self._views.clear()
        self._refreshed = False

    async def view(self, name: str) -> ConversationView:
        """This request's view of conversation ``name``: its generations listed once, and the newest one whose chat
        record can be read (one beside a damaged newest), as a writer decides whose a name is, decoded once."""
        if name in self._views:
            return self._views[name]
        keys = await manifest_keys(self.store, name) if self.store is not None else []
        view = ConversationView(name, tuple(generation for _, generation, _ in keys), None)
        for _, generation, _ in reversed(keys):
            read = await self._read(name, generation)
            if read is not None:
                view = ConversationView(name, view.generations, read[0])
                break
        self._views[name] = view
        return view

    def forget(self, name: str) -> None:
        """Drop what is kept of ``name``'s records (it was deleted, or holds other tokens now)."""
        for key in [k for k in self._records if k[0] == name]:
            del self._records[key]
        self._views.pop(name, None)

    async def refresh(self) -> bool:
        """Read the index records other writers committed since the last refresh, at most once per request (at a
        miss: a lookup that finds nothing, or a reply of the prompt no source holds). Whether it read them now."""
        if self.index is None or self._refreshed:
            return False
        self._refreshed = True
        await self.index.refresh()
        return True

    async def reindex(self, model: str, layout_hash: str) -> int:
        """Rebuild the prefix index records that the newest generation of a conversation of ``model`` whose K/V
        are of ``layout_hash`` was committed without (its writer killed between its manifest and its record), from
        what its manifest saved, so that its replies are recognised and its K/V reused again. Returns how many it
        wrote. Each generation is tried once, unless the writer lock could not be had (then at the next miss)."""
        if self.index is None or self.store is None:
            return 0
        newest = {name: generation for name, generation, _ in await manifest_keys(self.store)}
        missing = []
        for name, generation in newest.items():
            if (name, generation) in self._examined or self.index.holds(name, generation):
                continue
            try:
                manifest, _ = await load_manifest(self.store, name, generation)
                record = ChatRecord.from_app_state(name, generation, manifest.created_ms, manifest.app_state)
                metadata = parse_metadata(manifest.tvm_metadata)
            except KVCkptError:
                self._examined.add((name, generation))
                continue
            saved = record.saved
            if (saved.model, metadata.get("layout_hash"), metadata.get("seq_length")) == (model, layout_hash,
                                                                                           saved.kv_length):
                missing.append((name, generation, record.tokens[:saved.kv_length]))
            else:
                self._examined.add((name, generation))
        try:
            written = await self.index.rebuild(missing)
        except KVCkptError:
            return 0
        self._examined.update((name, generation) for name, generation, _ in missing)
        return len(written)

    async def _candidates(self, tokens: Sequence[int]) -> list[ChatRecord]:
        """The store's records whose K/V share the most full pages with ``tokens``, best first: this model's only (an
        index record may point at another model's checkpoint, whose K/V are no prefix of this one's)."""
        if self.index is None:
            return []
        hits = self.index.lookup(tokens, HITS_TRIED)
        if not hits and len(tokens) >= self.page_size and await self.refresh():
            hits = self.index.lookup(tokens, HITS_TRIED)
        out = []
        for hit in hits:
            read = await self._read(hit.name, hit.generation)
            if read is not None and read[0].saved.model == self.model:
                out.append(read[0])
        return out

    async def longest_prefix(self, tokens: Sequence[int], skip: Collection[tuple[str, int]] = ()) -> PrefixSource:
        """The longest prefix of ``tokens`` whose K/V a slot or a checkpoint holds (at least a page, else
        nothing), leaving out the checkpoints ``skip`` names (``(name, generation)``: found unusable); a slot wins
        a tie, as it costs no reading."""
        slot, n = self.slots.best_prefix(tokens)
        best = PrefixSource(n, slot=slot) if n >= self.page_size else PrefixSource(0)
        for record in await self._candidates(tokens):
            if (record.name, record.generation) in skip:
                continue
            m = common_prefix(record.tokens[:record.saved.kv_length], tokens)
            if m > best.length and m >= self.page_size:
                best = PrefixSource(m, record=record, manifest=self.loaded(record))
        return best

    async def continued(self, tokens: Sequence[int]) -> str | None:
        """The conversation that ``tokens`` go on from (see :func:`continues`), if its newest readable generation is
        in the store (one beside a damaged newest counts) or its slot is idle, and no request named it
        (:attr:`ChatExtra.named`): the conversation the reply to a request that names none continues. Of several,
        the one used last (a slot), else the newest saved."""
        for slot in sorted(self.slots, key=lambda s: -s.used):
            reason = slot.gen.finish_reason if slot.gen is not None else None
            if (slot.conversation and not slot.busy and not slot.named
                    and continues(slot.tokens, slot.kv_length, reason, tokens)):
                return slot.conversation
        for record in sorted(await self._candidates(tokens), key=lambda r: -(r.created_ms or 0)):
            newest = (await self.view(record.name)).record
            if (newest is not None and newest.generation == record.generation and not newest.chat.named
                    and continues(record.tokens, record.saved.kv_length, record.saved.finish_reason, tokens)):
                return record.name
        return None

    async def known_reply(self, prefix: list[int], text: str) -> tuple[list[int], int] | None:
        """The ids of an assistant's turn that followed exactly ``prefix`` and reads ``text``, from a slot or a
        checkpoint, and how many of them came before its generated ids (the prefill a reply continued: the ids
        after ``prefix`` up to the first reply's generated ids); None if no source holds one."""
        spans: list[tuple[list[int], list[tuple[int, int]]]] = [(s.tokens, s.replies) for s in self.slots]
        spans += [(r.tokens, r.replies) for r in await self._candidates(prefix)]
        for tokens, replies in spans:
            start, end = next(((a, b) for a, b in replies if a >= len(prefix)), (-1, -1))
            if start >= 0 and tokens[:len(prefix)] == prefix:
                ids = tokens[len(prefix):end]
                if self._decode_reply(ids) == text:
                    return ids, start - len(prefix)
        return None
