"""A damaged chunk or manifest in the store never blocks a turn: the engine passes over K/V it cannot use for
an older generation's, else prefills the prompt, continues the conversation from its newest generation that
can be read, and says so in the reply's ``warnings``; the reply has the tokens of an undamaged run. A prefix
index record lost (its writer killed after the manifest) is rebuilt from the manifest: the next turn is the
turn it would have been.

The model is the K/V-honest double (tests/model/lm_double.py): K/V restored wrongly change the tokens. A
second engine on the same store is a restarted process.
"""

from __future__ import annotations

import pytest

from kvckpt_web import MemoryStore
from kvckpt_web.durable.catalog import load_manifest, manifest_keys
from kvckpt_web.durable.prefix_records import record_key, scope_id

from lm_double import DoubleLM
from support.kvmodel import run

GREEDY = {"temperature": 0.0, "max_tokens": 12}
TURNS = ["hello there, tell me about the sea.", "and the wind?", "why is the sky blue?"]
SYSTEM = {"role": "system", "content": "you are a helpful assistant who answers briefly and kindly, always."}


async def converse(engine, turns, messages=(), **settings):
    """Chat ``turns`` turn by turn; the replies and the messages at the end."""
    messages, replies = list(messages), []
    for text in turns:
        messages.append({"role": "user", "content": text})
        replies.append(await engine.chat(messages, **GREEDY, **settings))
        messages.append({"role": "assistant", "content": replies[-1].text})
    return replies, messages


def damage(store: MemoryStore, keys) -> None:
    for key in keys:
        data = bytearray(store._data[key])
        data[-1] ^= 0xFF
        store._data[key] = bytes(data)


def chunks_of(store: MemoryStore, name: str, generation: int) -> set[str]:
    manifest, _ = run(load_manifest(store, name, generation))
    return {ref.key for ref in manifest.chunk_refs()}


def test_a_damaged_chunk_of_the_newest_generation_is_passed_over_for_an_older_generation_and_said_so(make_engine):
    want = run(converse(make_engine(store=MemoryStore()), TURNS))[0][-1]
    store = MemoryStore()
    (first, _), messages = run(converse(make_engine(store=store), TURNS[:2]))
    name = first.conversation
    (_, older, _), (_, newest, _) = run(manifest_keys(store, name))[-2:]
    damage(store, chunks_of(store, name, newest) - chunks_of(store, name, older))
    reply = run(make_engine(store=store).chat([*messages, {"role": "user", "content": TURNS[2]}], **GREEDY))
    assert reply.token_ids == want.token_ids and reply.conversation == name
    assert 0 < reply.usage.cached_tokens < want.usage.cached_tokens
    assert len(reply.warnings) == 1
    assert f"generation {newest} cannot be used" in reply.warnings[0]
    assert f"generation {older} instead" in reply.warnings[0]
    assert reply.to_openai()["kvckpt"]["warnings"] == list(reply.warnings)


def test_without_an_intact_generation_the_prompt_is_prefilled_to_the_tokens_of_a_cold_run_and_said_so(make_engine):
    want = run(converse(make_engine(store=MemoryStore()), TURNS))[0][-1]
    store = MemoryStore()
    (first, _), messages = run(converse(make_engine(store=store), TURNS[:2]))
    damage(store, [key for key in store._data if key.startswith("chunks/")])
    stream = run(make_engine(store=store).chat([*messages, {"role": "user", "content": TURNS[2]}], stream=True,
                                               **GREEDY))

    async def chunks():
        return [c async for c in stream]

    got = run(chunks())
    assert [t for c in got for t in c.token_ids] == list(want.token_ids)
    assert got[-1].conversation == first.conversation and got[-1].usage.cached_tokens == 0
    assert got[0].warnings and all("prefilled the prompt instead" in w for w in got[0].warnings)
    assert all(not c.warnings for c in got[1:])


def test_a_damaged_prefix_shared_with_another_conversation_does_not_break_that_one(make_engine):
    other = [SYSTEM, {"role": "user", "content": "count to five."}]
    cold = make_engine(store=MemoryStore())
    run(cold.chat(other, **GREEDY))
    want = run(converse(cold, TURNS[:2], [SYSTEM]))[0][-1]
    store = MemoryStore()
    engine = make_engine(store=store)
    shared = run(engine.chat(other, **GREEDY))
    ([first], messages) = run(converse(engine, TURNS[:1], [SYSTEM]))
    assert first.usage.cached_tokens > 0  # its prompt took the shared prefix of the other's
    damage(store, chunks_of(store, shared.conversation, run(manifest_keys(store, shared.conversation))[-1][1])
           & chunks_of(store, first.conversation, run(manifest_keys(store, first.conversation))[-1][1]))
    reply = run(make_engine(store=store).chat([*messages, {"role": "user", "content": TURNS[1]}], **GREEDY))
    assert reply.token_ids == want.token_ids and reply.conversation == first.conversation
    assert reply.warnings


@pytest.mark.parametrize("named", [True, False])
def test_a_damaged_newest_manifest_continues_the_conversation_from_the_newest_that_can_be_read(make_engine, named):
    store = MemoryStore()
    (first, _), messages = run(converse(make_engine(store=store), TURNS[:2]))
    name = first.conversation
    (_, older, _), (_, newest, newest_key) = run(manifest_keys(store, name))[-2:]
    store._data[newest_key] = store._data[newest_key][:30]
    reply = run(make_engine(store=store).chat([*messages, {"role": "user", "content": TURNS[2]}],
                                              **({"conversation": name} if named else {}), **GREEDY))
    assert reply.conversation == name and reply.token_ids
    assert any(f"generation {newest} cannot be read" in w and f"generation {older}" in w for w in reply.warnings)
    assert run(manifest_keys(store, name))[-1][1] > newest


# ----- a prefix index record lost ---------------------------------------------------------------------------


@pytest.mark.parametrize("named", [False, True])
def test_a_turn_after_the_newest_record_was_lost_is_the_turn_it_would_have_been(make_engine, named):
    def third_turn(drop_record: bool):
        store = MemoryStore()
        engine = make_engine(store=store)
        (first, _), messages = run(converse(engine, TURNS[:2]))
        name, newest = first.conversation, run(manifest_keys(store, first.conversation))[-1][1]
        key = record_key(scope_id(engine.scope), name, newest)
        if drop_record:  # as a writer killed between the manifest and its record leaves it
            del store._data[key]
        settings = {"conversation": name} if named else {}
        reply = run(make_engine(store=store).chat([*messages, {"role": "user", "content": TURNS[2]}], **settings,
                                                  **GREEDY))
        assert reply.conversation == name
        return reply

    want, got = third_turn(False), third_turn(True)
    assert got.token_ids == want.token_ids
    assert got.usage.cached_tokens == want.usage.cached_tokens  # the same K/V reused: the same forward calls


def test_a_lost_record_of_another_models_conversation_is_not_rebuilt(make_engine):
    store = MemoryStore()
    other = make_engine(store=store, model=DoubleLM(max_context=1024, name="other"))
    (first, _), messages = run(converse(other, TURNS[:2]))
    newest = run(manifest_keys(store, first.conversation))[-1][1]
    del store._data[record_key(scope_id(other.scope), first.conversation, newest)]
    engine = make_engine(store=store)
    reply = run(engine.chat([*messages, {"role": "user", "content": TURNS[2]}], **GREEDY))
    assert reply.conversation != first.conversation and reply.usage.cached_tokens == 0
    assert not any(key.endswith(f"/{first.conversation}/{newest:020d}") for key in store._data
                   if key.startswith("prefixes/"))
