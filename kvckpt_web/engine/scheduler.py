"""Continuous batching: the replies an engine generates, stepped together (:class:`Scheduler`).

Each reply asks for its next step (:meth:`Scheduler.step`) when its reader wants the next token. The scheduler
waits until every running reply asks (or no more come while the event loop runs what is ready: a reader that
holds its reply does not stall the others), then, holding the cache, runs in one forward (``forward_batch``; a few
when their tokens pass the cache's prefill chunk) the pending token of every reply that decodes and at most one
prefill chunk (of the reply that asked first), so that the replies running go on streaming while a new prompt is
prefilled chunk by chunk. It hands each reply its logits (each picks its token) and answers each reply whose step
saves nothing; then it runs the autosaves that came due, one after the other, each after every token of the step
was picked, and answers their replies (a reply's token is out once its checkpoint is). A request is admitted, a
restore or a placement run, between two steps: they take the cache lock too.

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
            raise

    async def _run(self) -> None:
        while self._waiting:
            await self._gather()
            batch = self._batch()
            try:
                async with self.cache_lock.hold():
                    outcomes = await self._take(batch)
                    # each reply whose step saves nothing has its token while the others' saves run
                    _answer(batch, outcomes, lambda gen: not gen.save_due)
                    await self._save(outcomes)
            except BaseException:
                for future in batch.values():
                    if not future.done():
                        future.cancel()
                raise
            self.steps += 1
            _answer(batch, outcomes, lambda gen: True)

    async def _gather(self) -> None:
        """Let the event loop run until every running reply waits for its step, or :data:`IDLE_PASSES` passes in a
        row bring no more."""
        idle = 0
        while len(self._waiting) < len(self._running) and idle < IDLE_PASSES:
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

    @staticmethod
    async def _save(outcomes: dict[Generator, TokenEvent | None | BaseException]) -> None:
        """The autosaves due after a step, one reply after the other (a save's failure is its reply's outcome)."""
        for gen, outcome in outcomes.items():
            if isinstance(outcome, BaseException):
                continue
            try:
                await gen.save_if_due()
            except Exception as exc:
                outcomes[gen] = exc

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
