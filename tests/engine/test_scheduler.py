"""The scheduler on its own: a reply's token does not wait for another reply's autosave in the same step."""

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
