"""A step cancelled part-way (Ctrl-C reaches ``asyncio.run``'s task as a cancellation wherever it waits): once its
forward ran, the sequence holds K/V that no picked token follows, so the generator fails and saves nothing; its
last checkpoint resumes to the uninterrupted tokens.

The model is the test double of ``lm_double.py``; its logits raise CancelledError where the test says.
"""

from __future__ import annotations

import asyncio

import pytest

from kvckpt_web.errors import CheckpointStateError
from kvckpt_web.generation.autosave import Autosave
from kvckpt_web.generation.resume import resume
from kvckpt_web.stores.memory import MemoryStore

from lm_double import DoubleLM, DoubleLogits
from runs import TEXT, TOP_P, start, uninterrupted
from support.kvmodel import run


@pytest.fixture
def cancelled_pick(monkeypatch):
    """``cancelled_pick(n)``: the n-th pick of a token from logits (counted from 1) is cancelled."""

    def arm(n: int) -> None:
        real, calls = DoubleLogits.top_k, [0]

        async def top_k(self, k):
            calls[0] += 1
            if calls[0] == n:
                monkeypatch.setattr(DoubleLogits, "top_k", real)
                raise asyncio.CancelledError
            return await real(self, k)

        monkeypatch.setattr(DoubleLogits, "top_k", top_k)

    return arm


def cancelled(make_cache, cancelled_pick):
    """A top-p generation autosaving into a MemoryStore, its 9th pick cancelled: (generator, store, model)."""
    store, model = MemoryStore(), DoubleLM()
    gen = start(model, make_cache(model), TOP_P, autosave=Autosave(store, "chat", 5))
    cancelled_pick(9)
    with pytest.raises(asyncio.CancelledError):
        run(gen.run())
    return gen, store, model


def test_a_step_cancelled_while_its_token_is_picked_fails_the_generator_and_saves_nothing(make_cache, cancelled_pick):
    gen, store, _ = cancelled(make_cache, cancelled_pick)
    assert gen.failed and gen.kv_length == len(gen.tokens)  # the K/V of every token, and no token after them
    saved = dict(store._data)
    with pytest.raises(CheckpointStateError, match="a step failed"):
        run(gen.save())
    assert store._data == saved
    run(gen.close())


def test_the_last_checkpoint_of_a_step_cancelled_while_its_token_is_picked_resumes_to_the_same_tokens(make_cache,
                                                                                                    cancelled_pick):
    want = uninterrupted(make_cache, TOP_P)
    gen, store, model = cancelled(make_cache, cancelled_pick)
    run(gen.close())
    again = run(resume(store, "chat", model, make_cache(model), decode=TEXT.decode))
    assert run(again.run()).generated_tokens == want.generated_tokens
    run(again.close())
