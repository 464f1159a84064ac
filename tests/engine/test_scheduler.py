"""The scheduler on its own: a reply's token does not wait for another reply's autosave, in the same step or after."""

from __future__ import annotations

import asyncio

from kvckpt_web import MemoryStore
from kvckpt_web.engine.cache_lock import CacheLock
from kvckpt_web.engine.scheduler import Scheduler
from kvckpt_web.generation.autosave import Autosave
from kvckpt_web.generation.generator import Generator
from kvckpt_web.model.caches import new_cache
from kvckpt_web.model.sampler import SamplingSettings

from lm_double import DoubleLM, DoubleText
from support.kvmodel import run

STALLED_S = 120
"""Seconds after which a step that does not come is taken for a stalled batch."""

PROMPT = DoubleText().encode_chat([{"role": "user", "content": "tell me about the sea."}])


def test_a_reply_that_saves_nothing_has_its_token_while_another_replys_autosave_of_that_step_runs(device):
    model = DoubleLM(max_context=256)
    cache = new_cache(model, device, max_tokens=256, prefill_chunk=8, page_size=4, num_seqs=2)

    async def body():
        saving = await Generator.start(model, cache, PROMPT, SamplingSettings(), seq_id=0,
                                       autosave=Autosave(MemoryStore(), "saving", every=1000))  # at its first token
        plain = await Generator.start(model, cache, PROMPT, SamplingSettings(), seq_id=1)
        held, release, save = asyncio.Event(), asyncio.Event(), saving.save

        async def held_save():
            held.set()
            await release.wait()
            return await save()

        saving.save = held_save
        scheduler = Scheduler(model, cache, CacheLock())
        for gen in (saving, plain):
            scheduler.admit(gen)
        while not plain.generated_tokens:  # decoding, so that it is in every step of the other's prefill
            await scheduler.step(plain)

        async def until_first_token():
            while not saving.generated_tokens:
                await scheduler.step(saving)

        first, holding = asyncio.ensure_future(until_first_token()), asyncio.ensure_future(held.wait())
        answered_while_held = False
        while not answered_while_held and not holding.done():
            step = asyncio.ensure_future(scheduler.step(plain))
            await asyncio.wait([step, holding], return_when=asyncio.FIRST_COMPLETED)
            answered_while_held = step.done() and held.is_set() and not first.done()
        release.set()
        await asyncio.gather(first, step)
        return answered_while_held, saving.last_save

    answered_while_held, saved = run(body())
    assert answered_while_held and saved is not None
    cache.close()


class HeldCommits(MemoryStore):
    """A store whose manifest writes (a save's commit) wait until the test sets ``release``."""

    def __init__(self) -> None:
        super().__init__()
        self.held, self.release = asyncio.Event(), asyncio.Event()

    async def _set_if_absent(self, key, data):
        if key.startswith("manifests/"):
            self.held.set()
            await self.release.wait()
        return await super()._set_if_absent(key, data)


def test_a_reply_streams_on_while_another_replys_save_waits_for_its_commit(device):
    model = DoubleLM(max_context=256)
    cache = new_cache(model, device, max_tokens=256, prefill_chunk=8, page_size=4, num_seqs=2)
    streamed_while_held = 5

    async def body():
        store = HeldCommits()
        saving = await Generator.start(model, cache, PROMPT, SamplingSettings(), seq_id=0,
                                       autosave=Autosave(store, "saving", every=1000))  # at its first token
        plain = await Generator.start(model, cache, PROMPT, SamplingSettings(), seq_id=1)
        scheduler = Scheduler(model, cache, CacheLock())
        for gen in (saving, plain):
            scheduler.admit(gen)

        async def until_first_token():
            while not saving.generated_tokens:
                await scheduler.step(saving)

        async def plain_step():  # the time limit guards against a stalled batch, it synchronises nothing
            await asyncio.wait_for(scheduler.step(plain), STALLED_S)

        first = asyncio.ensure_future(until_first_token())
        while not store.held.is_set():
            await plain_step()
        held_at = len(plain.generated_tokens)
        for _ in range(streamed_while_held):
            await plain_step()
        streamed = len(plain.generated_tokens) - held_at
        answered_while_held = first.done()
        store.release.set()
        await first
        while len(saving.generated_tokens) < len(plain.generated_tokens):
            await scheduler.step(saving)
        return streamed, answered_while_held, saving, plain

    streamed, answered_while_held, saving, plain = run(body())
    assert streamed == streamed_while_held and not answered_while_held
    assert saving.last_save is not None and saving.last_save.generation == 1
    assert saving.generated_tokens == plain.generated_tokens
    cache.close()


def test_a_batched_forward_that_fails_part_way_fails_the_step_of_every_reply_in_it(device):
    model = DoubleLM(max_context=256)
    cache = new_cache(model, device, max_tokens=256, prefill_chunk=8, page_size=4, num_seqs=2)
    real = model.forward_batch

    async def failing(cache, runs):
        await real(cache, runs)
        raise RuntimeError("device lost")

    async def body():
        gens = [await Generator.start(model, cache, [1, 5, 6], SamplingSettings(), seq_id=i) for i in range(2)]
        scheduler = Scheduler(model, cache, CacheLock())
        for gen in gens:
            scheduler.admit(gen)
        await asyncio.gather(*(scheduler.step(gen) for gen in gens))  # each prompt is one chunk: both decode now
        model.forward_batch = failing
        return await asyncio.gather(*(scheduler.step(gen) for gen in gens), return_exceptions=True), gens

    outcomes, gens = run(body())
    assert [type(o) for o in outcomes] == [RuntimeError, RuntimeError] and all(gen.failed for gen in gens)
    cache.close()
