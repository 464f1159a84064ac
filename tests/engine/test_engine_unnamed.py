"""What a server keeps of the conversations nobody named (``engine/unnamed.py``): deleted once older than the time
to live, then the oldest while they hold more than the bound of bytes; a named conversation and one a reply is
being generated in are kept, and chunks others still use stay.

The clock is the test's: it dates each checkpoint (``time.time_ns``, which the manifests read, replaced) and is the
``now`` the policy is judged at.
"""

from __future__ import annotations

import pytest

from kvckpt_web import ChatRequest, MemoryStore
from kvckpt_web.durable.catalog import list_names
from kvckpt_web.durable.keys import CHUNKS
from kvckpt_web.engine.unnamed import UnnamedRetention, enforce, judge
from kvckpt_web.errors import FieldError

from support.clocks import WallClock
from support.counting_store import CountingStore, count
from support.kvmodel import run

GREEDY = {"temperature": 0.0, "max_tokens": 8}
HOUR = 3600.0


@pytest.fixture
def clock(monkeypatch):
    return WallClock.dating_checkpoints(monkeypatch)


def ask(engine, text, **settings):
    return run(engine.chat([{"role": "user", "content": text}], **GREEDY, **settings)).conversation


def names(engine):
    return run(list_names(engine.store))


def test_unnamed_conversations_older_than_the_ttl_are_deleted_the_others_kept(make_engine, clock):
    engine = make_engine(store=MemoryStore())
    old = ask(engine, "tell me about the sea.")
    clock.now += 2 * HOUR
    new = ask(engine, "what is a boat?")
    clock.now += 0.5 * HOUR
    judged = run(enforce(engine, UnnamedRetention(ttl_s=HOUR), clock.now))
    assert [(r.name, r.keep) for r in judged] == [(old, False), (new, True)]
    assert names(engine) == [new]


def test_the_oldest_unnamed_conversations_are_deleted_while_they_hold_more_than_the_bound(make_engine, clock):
    engine = make_engine(store=MemoryStore())
    made = []
    for text in ("tell me about the sea.", "what is a boat?", "and the wind?"):
        made.append(ask(engine, text))
        clock.now += 60
    sizes = {r.name: r.bytes for r in run(judge(engine, UnnamedRetention(), clock.now))}
    bound = sizes[made[1]] + sizes[made[2]]  # the two newest fit together
    judged = run(enforce(engine, UnnamedRetention(max_bytes=bound), clock.now))
    assert [r.keep for r in judged] == [False, True, True] and names(engine) == sorted(made[1:])
    assert run(engine.chat([{"role": "user", "content": "what is a boat?"}], **GREEDY)).usage.cached_tokens > 0


def test_a_named_conversation_is_kept_however_old(make_engine, clock):
    engine = make_engine(store=MemoryStore())
    ask(engine, "tell me about the sea.", conversation="mine")
    clock.now += 100 * HOUR
    [retained] = run(enforce(engine, UnnamedRetention(ttl_s=HOUR, max_bytes=0), clock.now))
    assert retained.keep and retained.named and retained.reason == "a request named it"
    assert names(engine) == ["mine"]


def test_a_conversation_a_reply_is_being_generated_in_is_kept(make_engine, clock):
    engine = make_engine(store=MemoryStore())

    async def body():
        stream = await engine.chat([{"role": "user", "content": "tell me about the sea."}], stream=True, **GREEDY)
        chunk = await anext(stream)  # the reply is saved and under way
        clock.now += 100 * HOUR
        judged = await enforce(engine, UnnamedRetention(ttl_s=HOUR, max_bytes=0), clock.now)
        rest = [c async for c in stream]
        return chunk.conversation, judged, rest

    name, [retained], rest = run(body())
    assert retained.keep and retained.reason == "a reply is being generated in it"
    assert rest[-1].finish_reason is not None and names(engine) == [name]


def test_a_policy_of_a_negative_ttl_or_bound_is_refused_naming_the_field():
    with pytest.raises(FieldError, match="ttl_s"):
        UnnamedRetention(ttl_s=-1)
    with pytest.raises(FieldError, match="max_bytes"):
        UnnamedRetention(max_bytes=-1)


def test_the_chunks_a_deleted_conversation_shares_with_a_kept_one_stay(make_engine, clock):
    store = MemoryStore()
    engine = make_engine(store=store)
    text = "tell me about the sea, the wind and the ships on it."
    ask(engine, text)
    mine = run(engine.chat([{"role": "user", "content": text}], conversation="mine", cache_prompt=False, **GREEDY))
    clock.now += 2 * HOUR
    run(enforce(engine, UnnamedRetention(ttl_s=HOUR), clock.now))
    following = [{"role": "user", "content": text}, {"role": "assistant", "content": mine.text},
                 {"role": "user", "content": "and the wind?"}]
    want = run(make_engine(store=MemoryStore()).chat(following, **GREEDY))
    again = run(make_engine(store=store).chat(following, conversation="mine", **GREEDY))  # from the store
    assert names(engine) == ["mine"] and again.usage.timings.restore_s > 0 and not again.warnings
    assert again.token_ids == want.token_ids


def test_many_expired_conversations_are_deleted_with_one_pass_over_the_chunks(make_engine, clock):
    store = CountingStore()
    engine = make_engine(store=store)
    made = [ask(engine, text) for text in ("tell me about the sea.", "what is a boat?", "and the wind?")]
    ask(engine, "tell me about the sea.", conversation="mine")
    clock.now += 2 * HOUR
    store.reset()
    judged = run(enforce(engine, UnnamedRetention(ttl_s=HOUR), clock.now))
    assert sorted(r.name for r in judged if not r.keep) == sorted(made) and names(engine) == ["mine"]
    assert count(store.calls, "list", CHUNKS) == 1  # one gc for the three of them
    assert run(engine.chat([{"role": "user", "content": "and the sky?"}], conversation="mine", **GREEDY)).text


def test_a_conversation_a_waiting_request_goes_on_with_is_kept(make_engine, clock):
    engine = make_engine(store=MemoryStore())
    old = ask(engine, "tell me about the sea.")
    clock.now += 100 * HOUR
    [retained] = run(enforce(engine, UnnamedRetention(ttl_s=HOUR, max_bytes=0), clock.now, waiting={old}))
    assert retained.keep and retained.reason == "a request waiting in the queue continues it"
    assert names(engine) == [old]


def test_the_conversation_a_request_would_continue_is_the_unnamed_one_its_messages_go_on_from(make_engine):
    engine = make_engine(store=MemoryStore())
    first = run(engine.chat([{"role": "user", "content": "tell me about the sea."}], **GREEDY))
    following = ChatRequest(messages=[{"role": "user", "content": "tell me about the sea."},
                                      {"role": "assistant", "content": first.text},
                                      {"role": "user", "content": "and the wind?"}], **GREEDY)
    assert run(engine.continued_by(following)) == first.conversation
    assert run(engine.continued_by(ChatRequest(messages=[{"role": "user", "content": "what is a boat?"}]))) is None
    assert run(engine.continued_by(ChatRequest(messages=[{"role": "user", "content": "hi"}], conversation="mine"))
               ) == "mine"
