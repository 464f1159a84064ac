"""Continuous batching: the replies an engine generates, stepped together (:class:`Scheduler`).

Each reply asks for its next step (:meth:`Scheduler.step`) when its reader wants the next token. The scheduler
waits until every running reply asks (or no more come while the event loop runs what is ready: a reader that
holds its reply does not stall the others), then, holding the cache, runs in one forward (``forward_batch``; a few
when their tokens pass the cache's prefill chunk) the pending token of every reply that decodes and at most one
prefill chunk (of the reply that asked first), so that the replies running go on streaming while a new prompt is
prefilled chunk by chunk. It hands each reply its logits (each picks its token) and answers each reply whose step
saves nothing. A reply whose autosave came due sits out while the save runs as its own task, started once every token
of the step was picked: the other replies go on stepping meanwhile, and its token is out once its checkpoint is
committed (then it asks for its next step again). Its sequence takes no token until then, so the save reads the pages
of that step whatever forwards run beside it (a forward writes only the sequences it runs). A request is admitted, a
restore, an eviction or a placement run, between two steps and once no save runs: they hold the cache lock without
``beside_saves`` (:meth:`CacheLock.hold`), and a reply's clean-up that saves waits for its running save that way.

What overlaps a step on the desktop (wgpu-native, Mesa lavapipe): the store's work (FileStore's writes, fsyncs and
locks run on its threads; a MemoryStore's are instant), the hashing of a save above ``INLINE_HASH_BYTES`` (hash
threads), and, where the cache reads pages through a staging buffer, the wait for its mapping (a worker thread).
What cannot: lavapipe's cache maps its page buffers (``maps_pages``), so a save's readback maps them on the event
loop, waiting until the device has run every forward submitted before, and copies the pages there; a submit waits
for the one before it on lavapipe; a small save's hashing and the manifest's encoding run on the event loop. In the
browser every step of a save runs on the event loop, between the awaits of the forwards.

What one step runs never changes a reply's tokens: each run is the forward its generator would run alone (prefill
chunks at the same multiples), and a row's bits do not depend on the others in the step.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..generation.generator import Generator
from ..generation.results import TokenEvent
from .cache_lock import CacheLock

if TYPE_CHECKING:
    from ..kv.cache import PagedKVCache
    from ..model.protocol import CausalLM

__all__ = ["IDLE_PASSES", "Scheduler"]

IDLE_PASSES = 4
"""Passes of the event loop without a new reply asking after which a step runs without the replies that have not
asked (a reader that holds its reply, or one whose way back to :meth:`Scheduler.step` takes more hops)."""


class Scheduler:
    """Steps the replies of ``model`` on ``cache`` together, each step holding ``cache_lock``."""

    def __init__(self, model: "CausalLM", cache: "PagedKVCache", cache_lock: CacheLock) -> None:
        self.model = model
        self.cache = cache
        self.cache_lock = cache_lock
        self.steps = 0
        """Steps run so far (one forward or a few, see :meth:`_groups`)."""
        self._running: set[Generator] = set()
        self._waiting: dict[Generator, asyncio.Future[TokenEvent | None]] = {}
        self._runner: asyncio.Future[None] | None = None
        self._saving: dict[Generator, asyncio.Future[None]] = {}

    def admit(self, gen: Generator) -> None:
        """``gen``'s reply runs from now on: a step waits for it to ask (until :meth:`retire`)."""
        self._running.add(gen)

    def retire(self, gen: Generator) -> None:
        """``gen``'s reply stopped: steps no longer wait for it."""
        self._running.discard(gen)

    async def step(self, gen: Generator) -> TokenEvent | None:
        """Run ``gen``'s next step with the others' (see the module): the token it produced, if any; raises what
        its forward, pick or save raised (as :meth:`Generator.step`)."""
        future: asyncio.Future[TokenEvent | None] = asyncio.get_running_loop().create_future()
        self._waiting[gen] = future
        if self._runner is None or self._runner.done():
            self._runner = asyncio.ensure_future(self._run())
        try:
            return await future
        except asyncio.CancelledError:
            if self._waiting.get(gen) is future:
                del self._waiting[gen]  # not taken into a step yet: it will not run
            saving = self._saving.get(gen)
            if saving is not None:  # its reader's clean-up (a save, its name's release) comes after the save
                await asyncio.wait([saving])
            raise

    async def _run(self) -> None:
        while self._waiting:
            await self._gather()
            batch = self._batch()
            try:
                async with self.cache_lock.hold(beside_saves=True):
                    outcomes = await self._take(batch)
                    for gen, future in batch.items():
                        if not isinstance(outcomes[gen], BaseException) and gen.save_due:
                            self.cache_lock.save_started()  # before the hold ends: nothing else comes in between
                            self._saving[gen] = asyncio.ensure_future(self._save(gen, future, outcomes[gen]))
            except BaseException:
                for future in batch.values():
                    if not future.done():
                        future.cancel()
                raise
            self.steps += 1
            _answer(batch, outcomes, lambda gen: gen not in self._saving)

    async def _gather(self) -> None:
        """Let the event loop run until every running reply not saving waits for its step, or :data:`IDLE_PASSES`
        passes in a row bring no more."""
        idle = 0
        while len(self._waiting) < len(self._running.difference(self._saving)) and idle < IDLE_PASSES:
            before = len(self._waiting)
            await asyncio.sleep(0)
            idle = 0 if len(self._waiting) > before else idle + 1

    def _batch(self) -> dict[Generator, asyncio.Future[TokenEvent | None]]:
        """The replies the next step runs, taken out of the waiting ones: every one that decodes, and the first that
        prefills."""
        batch, prefill = {}, False
        for gen, future in list(self._waiting.items()):
            prefilling = gen.kv_length < len(gen.prompt_tokens)
            if prefilling and prefill:
                continue
            prefill = prefill or prefilling
            batch[gen] = self._waiting.pop(gen)
        return batch

    async def _take(self, batch: dict[Generator, asyncio.Future[TokenEvent | None]]
                    ) -> dict[Generator, TokenEvent | None | BaseException]:
        """Run ``batch``'s forwards and pick each one's token: what each reply gets (an event, or the exception its
        step raised)."""
        outcomes: dict[Generator, TokenEvent | None | BaseException] = {}
        runs = []
        for gen in batch:
            try:
                tokens = await gen.next_run()
            except Exception as exc:  # closed, failed before, or its name taken over
                outcomes[gen] = exc
                continue
            if tokens:
                runs.append((gen, tokens))
            else:
                outcomes[gen] = None
        for group in self._groups(runs):
            await self._forward(group, outcomes)
        return outcomes

    async def _save(self, gen: Generator, future: asyncio.Future[TokenEvent | None],
                    outcome: TokenEvent | None) -> None:
        """``gen``'s autosave, due after its step whose outcome was ``outcome``; then its step's answer (what the save
        raised instead, if it failed)."""
        result: TokenEvent | None | BaseException = outcome
        try:
            await gen.save_if_due()
        except Exception as exc:
            result = exc
        except BaseException:  # cancelled: the reply gets no token it has not saved
            future.cancel()
            raise
        finally:
            del self._saving[gen]
            self.cache_lock.save_ended()
        _answer({gen: future}, {gen: result}, lambda _: True)

    def _groups(self, runs: list[tuple[Generator, list[int]]]) -> list[list[tuple[Generator, list[int]]]]:
        """``runs`` in forwards of at most the cache's prefill chunk of tokens each, in order."""
        limit = self.cache.limits.prefill_chunk_size
        groups: list[list[tuple[Generator, list[int]]]] = []
        size = limit
        for run in runs:
            if size + len(run[1]) > limit:
                groups.append([])
                size = 0
            groups[-1].append(run)
            size += len(run[1])
        return groups

    async def _forward(self, group: list[tuple[Generator, list[int]]],
                       outcomes: dict[Generator, TokenEvent | None | BaseException]) -> None:
        """Run ``group`` in one :meth:`~kvckpt_web.model.protocol.CausalLM.forward_batch` and hand each generator its
        row's logits (its outcome: the event, or what raised)."""
        before = [self.cache.sequence_state(gen.seq_id) for gen, _ in group]
        try:
            logits = await self.model.forward_batch(self.cache, [(gen.seq_id, tokens) for gen, tokens in group])
        except BaseException as exc:  # cancelled too: each row's sequence may hold part of the forward
            for (gen, _), state in zip(group, before):
                gen.forward_failed(exc, state)
                outcomes[gen] = exc
            if not isinstance(exc, Exception):
                raise
            return
        for (gen, tokens), row in zip(group, logits):
            try:
                outcomes[gen] = await gen.take(tokens, row)
            except Exception as exc:
                outcomes[gen] = exc


def _answer(batch: dict[Generator, asyncio.Future[TokenEvent | None]],
            outcomes: dict[Generator, TokenEvent | None | BaseException], ready: Callable[[Generator], bool]) -> None:
    """Give each reply of ``batch`` not answered yet whose step failed, or which is ``ready``, its outcome."""
    for gen, future in batch.items():
        outcome = outcomes[gen]
        if future.done() or not (isinstance(outcome, BaseException) or ready(gen)):
            continue
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
