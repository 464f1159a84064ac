"""Continuous batching: replies generated together give the tokens each gives alone, share the engine's steps, and
stop one by one (an interrupt of their name, their reader going away, their stop sequence); a running reply's
slot is never evicted. A sampled reply's tokens and log probabilities on the tiny llama (the GPU's picks from each
run's row of a batched forward) are those it has alone."""

from __future__ import annotations

import asyncio

import pytest

from kvckpt_web import MemoryStore
from kvckpt_web.errors import CapacityError, FieldError
from kvckpt_web.model.loader import load_model

from support.kvmodel import run
from support.stores_that_fail import FullAfter

GREEDY = {"temperature": 0.0}
SEEDED = {"temperature": 0.9, "top_p": 0.9, "seed": 7}
QUESTIONS = ["tell me about the sea.", "what is a boat?", "how far is the moon?", "name a colour.",
             "why is grass green?", "count to five.", "who sails ships?", "where do rivers go?"]


def request(i):
    """The ``i``-th conversation's messages and settings: greedy and seeded samples in turn, replies of other
    lengths so that they end at other steps."""
    return [{"role": "user", "content": QUESTIONS[i]}], {**(GREEDY if i % 2 == 0 else SEEDED), "max_tokens": 6 + 3 * i}


def alone(make_engine, n):
    async def body():
        ids = []
        for i in range(n):
            messages, settings = request(i)
            ids.append((await make_engine(sequences=8).chat(messages, **settings)).token_ids)
        return ids

    return run(body())


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_concurrent_replies_give_the_tokens_each_gives_alone(make_engine, n):
    engine = make_engine(sequences=8)

    async def together():
        replies = await asyncio.gather(*(engine.chat(messages, **settings)
                                         for messages, settings in map(request, range(n))))
        return [r.token_ids for r in replies]

    assert run(together()) == alone(make_engine, n)


def test_concurrent_replies_decode_in_shared_steps(make_engine):
    engine = make_engine(sequences=8)

    async def together():
        replies = await asyncio.gather(*(engine.chat(messages, **{**settings, "max_tokens": 30})
                                         for messages, settings in map(request, range(4))))
        return replies

    run(together())  # one at a time, each forward (a prefill chunk or a token) would be a step of its own
    assert engine.scheduler.steps < len(engine.model.forwards) * 2 / 3


async def _streams(engine, n):
    streams = []
    for i in range(n):
        messages, settings = request(i)
        streams.append(await engine.chat(messages, stream=True, **{**settings, "max_tokens": 40}))
    return streams


async def _read(stream, after_chunk=None):
    chunks = []
    async for chunk in stream:
        chunks.append(chunk)
        if after_chunk is not None:
            after_chunk(len(chunks))
    return chunks


def test_interrupting_one_conversation_by_name_stops_its_reply_alone(make_engine):
    engine = make_engine(store=MemoryStore(), sequences=4)

    async def body():
        a, b = await _streams(engine, 2)
        name = {}

        def stop_a(count):
            if count == 2:
                engine.interrupt(name["a"])

        first = await anext(a)
        name["a"] = first.conversation
        rest_a, rest_b = await asyncio.gather(_read(a, stop_a), _read(b))
        return [first, *rest_a], rest_b, [u.name for u in await engine.unfinished()]

    a, b, unfinished = run(body())
    assert a[-1].finish_reason == "abort" and b[-1].finish_reason == "length"
    assert unfinished == [a[0].conversation]


def test_a_reader_that_goes_away_stops_its_own_reply_alone(make_engine):
    engine = make_engine(store=MemoryStore(), sequences=4)

    async def body():
        a, b = await _streams(engine, 2)
        reading_b = asyncio.ensure_future(_read(b))
        await anext(a)
        await anext(a)
        await a.aclose()
        return await reading_b, [u.name for u in await engine.unfinished()]

    b, unfinished = run(body())
    assert b[-1].finish_reason == "length" and sum(len(c.token_ids) for c in b) == 40
    assert len(unfinished) == 1 and unfinished[0] != b[0].conversation


def test_a_stop_sequence_ends_its_own_reply_alone(make_engine):
    engine = make_engine(sequences=4)
    free = alone(make_engine, 1)[0]
    stop_text = engine.codec.decode(free[2:4])

    async def body():
        messages, settings = request(0)
        other, settings_b = request(1)
        return await asyncio.gather(engine.chat(messages, **{**settings, "stop": [stop_text]}),
                                    engine.chat(other, **settings_b))

    stopped, other = run(body())
    assert stopped.finish_reason == "stop" and len(stopped.token_ids) < len(free)
    assert other.token_ids == alone(make_engine, 2)[1]


def test_a_running_reply_is_never_evicted_for_another_request(make_engine):
    engine = make_engine(store=MemoryStore(), sequences=2)

    async def body():
        a, b = await _streams(engine, 2)
        with pytest.raises(CapacityError):
            await engine.chat(*request(2)[:1], **request(2)[1])
        return await asyncio.gather(_read(a), _read(b))

    a, b = run(body())
    assert [c.finish_reason for c in (a[-1], b[-1])] == ["length", "length"]


def test_a_request_whose_prefix_is_in_the_only_idle_slot_takes_that_slot_beside_a_running_reply(make_engine):
    engine = make_engine(sequences=2)
    messages, settings = request(0)

    async def body():
        first = await engine.chat(messages, **settings)
        other, other_settings = request(1)
        running = await engine.chat(other, stream=True, **other_settings)
        again = await engine.chat(messages, **settings)  # its prompt's K/V are in the idle slot of `first`
        return first, again, await _read(running)

    first, again, running = run(body())
    assert again.token_ids == first.token_ids and running[-1].finish_reason is not None


def test_interrupt_refuses_a_name_that_is_not_a_string_naming_it(make_engine):
    with pytest.raises(FieldError) as raised:
        make_engine().interrupt(7)
    assert raised.value.field == "name"


def test_a_full_cache_saves_an_idle_reply_whose_save_failed_before_it_evicts_it(make_engine):
    store = FullAfter(0)  # every commit fails until the disk has room again
    engine = make_engine(store=store, sequences=2)

    async def body():
        (cut,) = await _streams(engine, 1)
        name = (await anext(cut)).conversation
        await cut.aclose()  # its reader went away and its save failed: its state is in the cache alone
        store.ok = 100
        other, settings = request(1)
        running = await engine.chat(other, stream=True, **{**settings, "max_tokens": 40})
        third = await engine.chat(*request(2)[:1], **request(2)[1])  # needs the cut reply's sequence
        return name, third, await _read(running), [u.name for u in await engine.unfinished()]

    name, third, running, unfinished = run(body())
    assert third.finish_reason is not None and running[-1].finish_reason == "length"
    assert name in unfinished


@pytest.fixture(scope="module")
def tiny(device, tiny_llama_path):
    loaded = load_model(tiny_llama_path, device)
    yield loaded
    loaded.model.close()


def test_a_sampled_reply_and_its_logprobs_beside_three_others_on_the_gpu_are_those_it_has_alone(make_engine, tiny):
    """Its picks (top_p 0.9 at temperature 1, drawn from the shortlist of its row of the logits) and log
    probabilities are the same values whether it ran alone or in steps with 3 other replies, in any row."""
    sampled = {"temperature": 1.0, "top_p": 0.9, "seed": 11, "max_tokens": 12, "logprobs": 3, "cache_prompt": False}
    others = [{"temperature": 0.0, "max_tokens": 16, "cache_prompt": False},
              {"temperature": 0.8, "top_k": 5, "seed": 3, "max_tokens": 9, "cache_prompt": False},
              {"temperature": 1.0, "seed": 5, "presence_penalty": 0.5, "max_tokens": 14, "cache_prompt": False}]

    def engine():
        return make_engine(model=tiny.model, text=tiny.text, sequences=4)

    def reply(result):
        return result.token_ids, result.to_openai()["choices"][0]["logprobs"]["content"]

    want = reply(run(engine().chat(request(0)[0], **sampled)))
    asks = [(request(i)[0], settings) for i, settings in enumerate(others, 1)]
    for place in range(4):  # the sampled reply asks first, second, ...: its run takes each row of the batches
        batch = engine()

        async def together():
            order = [*asks[:place], (request(0)[0], sampled), *asks[place:]]
            return await asyncio.gather(*(batch.chat(messages, **settings) for messages, settings in order))

        replies = run(together())
        assert reply(replies[place]) == want, f"asked in place {place}"
        assert batch.scheduler.steps < sum(len(r.token_ids) for r in replies)  # the replies shared steps
