"""An engine keeps what it knows of its store's checkpoints in its own Ledger and gives it to every save, restore,
resume and deletion: its next turn reads back from the GPU only what changed, and another engine (a restarted
process) on the same store object starts knowing nothing.
"""

from __future__ import annotations

import pytest

from kvckpt_web import MemoryStore
from kvckpt_web.durable.ledger import Ledger
from kvckpt_web.generation import generator

from support.kvmodel import run

GREEDY = {"temperature": 0.0, "max_tokens": 12}
FIRST = [{"role": "user", "content": "hello there, who are you? tell me about the sea and the wind."}]


@pytest.fixture
def saves(monkeypatch):
    """The SaveResult of every save an engine's replies make, in order."""
    results = []
    real = generator.save

    async def recording(*args, **kwargs):
        results.append(await real(*args, **kwargs))
        return results[-1]

    monkeypatch.setattr(generator, "save", recording)
    return results


def test_an_engines_next_turn_reads_back_only_the_pages_its_last_save_left(make_engine, saves):
    engine = make_engine(store=MemoryStore())

    async def body():
        reply = await engine.chat(FIRST, **GREEDY)
        saves.clear()
        await engine.chat(FIRST + [{"role": "assistant", "content": reply.text},
                                   {"role": "user", "content": "and the sky?"}], **GREEDY)
        return reply.usage.prompt_tokens + reply.usage.completion_tokens - 1  # the K/V of the first turn

    history = run(body())
    chunk_tokens = engine.config.pages_per_chunk * engine.config.page_size
    history_pages = history // chunk_tokens * engine.config.pages_per_chunk  # in chunks no later save changes
    assert saves and history_pages >= 2 * engine.config.pages_per_chunk
    for result in saves:
        pages = -(-result.seq_length // engine.config.page_size)
        assert result.pages_read <= pages - history_pages  # never the history's chunks


def test_an_engine_keeps_what_it_knows_in_its_own_ledger_and_a_second_engine_starts_with_nothing(make_engine):
    store = MemoryStore()
    first, second = make_engine(store=store), make_engine(store=store)

    async def body():
        reply = await first.chat(FIRST, **GREEDY)
        name = reply.conversation
        stream = await second.chat(FIRST + [{"role": "assistant", "content": reply.text},
                                            {"role": "user", "content": "and the sky?"}],
                                   stream=True, **GREEDY)  # restores the history from the store
        async for chunk in stream:
            if chunk.token_ids and not chunk.finish_reason:
                second.interrupt()
        await second.close()
        third = make_engine(store=store)
        await third.resume(name)
        return name, third

    name, third = run(body())
    ledgers = [first.ledger, second.ledger, third.ledger]
    assert len({id(ledger) for ledger in ledgers}) == 3
    keys = [ledger.last_saved(name).key for ledger in ledgers]
    assert keys == sorted(set(keys))  # each knows its own saves only: the first's is the oldest
    assert all(ledger.trusted for ledger in ledgers)
    own = Ledger.of(store)  # no call of any engine fell back on the store object's own ledger
    assert own.last_saved(name) is None and own.trusted == frozenset()


def test_a_restarted_engines_first_save_of_a_stored_conversations_next_turn_reads_back_only_new_pages(make_engine,
                                                                                                       saves):
    store = MemoryStore()
    reply = run(make_engine(store=store).chat(FIRST, **GREEDY))
    engine = make_engine(store=store)
    saves.clear()
    again = run(engine.chat(FIRST + [{"role": "assistant", "content": reply.text},
                                     {"role": "user", "content": "and the sky?"}], **GREEDY))
    history = again.usage.cached_tokens  # restored from the store
    chunk_tokens = engine.config.pages_per_chunk * engine.config.page_size
    history_pages = history // chunk_tokens * engine.config.pages_per_chunk
    assert saves and history_pages >= 2 * engine.config.pages_per_chunk
    first = saves[0]
    assert first.pages_read <= -(-first.seq_length // engine.config.page_size) - history_pages
