"""Where a turn's conversation and K/V come from: the identity of the conversation a name holds, and a slot of the
cache holding the longest prefix of the prompt whose K/V can be had (from the slot itself, a fork of another or
a checkpoint in the store), passing over checkpoints whose K/V cannot be used with a warning."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..errors import CapacityError, ConflictError, FieldError, KVCkptError
from ..generation.conversation import Conversation
from .slots import UNUSABLE_KV, PrefixSource, Slot, Slots
from .sources import Sources

if TYPE_CHECKING:
    from ..stores.base import Store

__all__ = ["Placement"]


class Placement:
    """How an engine of model ``identity`` finds a turn's conversation and K/V in its ``slots`` and through its
    ``sources`` (of ``store``, if it has one)."""

    def __init__(self, slots: Slots, sources: Sources, store: "Store | None", identity: str) -> None:
        self.slots = slots
        self.sources = sources
        self.store = store
        self.identity = identity

    async def kv_for(self, name: str, tokens: list[int], cache_prompt: bool, max_tokens: int, warnings: list[str]
                     ) -> tuple[Slot, PrefixSource, float]:
        """A slot for conversation ``name`` with room for ``tokens`` and ``max_tokens`` more, holding the longest
        prefix of them (all but the last; none without ``cache_prompt``) whose K/V can be had: the slot, where
        its K/V came from, and the seconds spent restoring them from the store."""
        n = len(tokens)
        restore_begin = time.perf_counter()
        slot, source = await self._place(name, tokens[:n - 1] if cache_prompt else [], n + max_tokens, warnings)
        restore_s = time.perf_counter() - restore_begin if source.record is not None else 0.0
        return slot, source, restore_s

    async def _place(self, name: str, tokens: list[int], room: int, warnings: list[str]) -> tuple[Slot, PrefixSource]:
        """A slot for conversation ``name`` (room for ``room`` tokens) holding the longest prefix of ``tokens``
        whose K/V can be had. Where the only idle slot is the one holding that prefix, it is evicted and the next
        longest prefix used. A checkpoint whose K/V cannot be used (a damaged or missing chunk or manifest) is
        passed over for the next longest prefix, or none (the prompt is prefilled): ``warnings`` says so."""
        unusable: dict[tuple[str, int], KVCkptError] = {}
        while True:
            source = await self.sources.longest_prefix(tokens, skip=unusable) if tokens else PrefixSource(0)
            try:
                slot = await self.slots.place(name, source, room)
            except CapacityError:
                held = source.slot
                if held is None or held.busy or not held.committed:
                    raise
                await self.slots.drop(held)  # the one sequence to be had holds the prefix: take it, prefix or not
                continue
            except UNUSABLE_KV as exc:
                if source.record is None:
                    raise
                unusable[(source.record.name, source.record.generation)] = exc
                self.sources.forget(source.record.name)  # what was read of it may be stale
                continue
            break
        if unusable:
            instead = (f"restored {source.length} tokens of {source.record.name!r} generation "
                       f"{source.record.generation} instead" if source.record is not None
                       else f"reused {source.length} tokens held in the cache instead" if source.slot is not None
                       else "prefilled the prompt instead")
            warnings += [f"the K/V of {other!r} generation {generation} cannot be used ({exc}); {instead}"
                         for (other, generation), exc in unusable.items()]
        return slot, source

    async def conversation_of(self, name: str, warnings: list[str]) -> Conversation | None:
        """The identity of conversation ``name`` if it exists (None: a new one), from its newest generation that
        can be read (``warnings`` says when newer ones cannot); refuses a name another model's conversation, or
        checkpoints none of which is a chat's that can be read, hold."""
        own = self.slots.of_conversation(name)
        if own is not None and own.gen is not None:
            return own.gen.conversation
        if self.store is None:
            return None
        view = await self.sources.view(name)
        if not view.generations:
            return None
        record = view.record
        if record is None:
            raise ConflictError(f"conversation: expected a chat conversation named {name!r} or a new name, got "
                                "checkpoints none of which is a chat's that can be read: pass another name")
        newest = view.generations[-1]
        if newest != record.generation:
            warnings.append(f"conversation {name!r}: generation {newest} cannot be read (damaged, or not a chat's); "
                            f"continued from generation {record.generation}, the newest that can")
        if record.saved.model != self.identity:
            raise FieldError("conversation", f"a conversation of this model ({self.identity[:16]}...)",
                             name, f"it was written by model {record.saved.model[:16]}...")
        return record.saved.conversation

