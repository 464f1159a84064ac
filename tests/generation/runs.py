"""Generations of the test double the generation tests share: its prompt and sampler settings, a run started,
run whole, cut (as a crash would) and resumed.

The model is the test double of ``lm_double.py``: its logits come from the K/V it reads back from the real
cache, so a restore that is wrong anywhere changes the tokens.
"""

from __future__ import annotations

from kvckpt_web.generation.app_state import StopRules
from kvckpt_web.generation.autosave import Autosave
from kvckpt_web.generation.generator import Generator
from kvckpt_web.generation.resume import resume
from kvckpt_web.model.sampler import SamplingSettings

from lm_double import DoubleLM, DoubleText
from support.kvmodel import run

TEXT = DoubleText()
PROMPT = TEXT.encode_chat([{"role": "user", "content": "tell me about the sea, please."}])
GREEDY = SamplingSettings()
TOP_P = SamplingSettings(temperature=0.9, top_p=0.85, seed=11)
TOP_K_PENALTY = SamplingSettings(temperature=0.8, top_k=6, repetition_penalty=1.3, seed=5)


def start(model, cache, settings=GREEDY, *, prompt=PROMPT, stop=StopRules(30), prefill_chunk=8, **kwargs):
    return run(Generator.start(model, cache, prompt, settings, stop=stop, prefill_chunk=prefill_chunk,
                               decode=TEXT.decode, **kwargs))


def uninterrupted(make_cache, settings=GREEDY, **kwargs):
    model = DoubleLM()
    gen = start(model, make_cache(model), settings, **kwargs)

    async def whole():
        async with gen:
            return await gen.run()

    return run(whole())


def interrupted(make_cache, store, settings, produced, *, every=5, **kwargs):
    """Generate with autosave and abandon the generator after ``produced`` tokens, as a crash would (which
    releases its name too)."""
    model = DoubleLM()
    gen = start(model, make_cache(model), settings, autosave=Autosave(store, "chat", every), **kwargs)

    async def some() -> None:
        async for event in gen:
            if event.index + 1 == produced:
                break
        await gen.close()

    run(some())
    return gen


def resumed(make_cache, store, *, model=None, **cache_kwargs):
    model = model or DoubleLM()
    return run(resume(store, "chat", model, make_cache(model, **cache_kwargs), decode=TEXT.decode))

