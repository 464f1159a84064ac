"""What an engine tells its caller beside the reply: prefill progress, each save and each failed save of a
conversation, how a resumed reply's K/V came back; and resuming a given generation of a conversation, or by an
engine of another prefill chunk (saved with the reply: a resume splits its prompt as the reply's engine did).

The model is the K/V-honest double (tests/model/lm_double.py); a second engine on the same store is a restarted
process.
"""

from __future__ import annotations

import pytest

from kvckpt_web import MemoryStore
from kvckpt_web.durable.catalog import manifest_keys
from kvckpt_web.errors import FieldError, NotFoundError, StoreError

from support.kvmodel import run

GREEDY = {"temperature": 0.0, "max_tokens": 12}
HELLO = [{"role": "user", "content": "hello there, tell me about the sea."}]


async def interrupted(engine, after: int = 7) -> str:
    """Start a reply to HELLO, stop it after ``after`` tokens (it is saved unfinished) and close ``engine`` (as
    a process that ends does); the reply's conversation."""
    stream = await engine.chat(HELLO, stream=True, **GREEDY)
    count = 0
    async for chunk in stream:
        count += len(chunk.token_ids)
        if count >= after:
            engine.interrupt()
    await engine.close()
    return chunk.conversation


def whole(chunks) -> list[int]:
    return [t for c in chunks for t in c.token_ids]


async def chunks_of(stream) -> list:
    return [c async for c in stream]


def test_progress_hears_each_prefill_chunk_of_a_prompt(make_engine):
    heard = []
    engine = make_engine(prefill_chunk=8, progress=lambda phase, done, total: heard.append((phase, done, total)))
    reply = run(engine.chat(HELLO, **GREEDY))
    n = reply.usage.prompt_tokens
    assert heard == [("prefill", min(done, n), n) for done in range(8, n + 8, 8)]


def test_on_save_hears_every_save_of_the_conversation_in_order(make_engine):
    saves = []
    store = MemoryStore()
    engine = make_engine(store=store, autosave_every=5, on_save=lambda name, result: saves.append((name, result)))
    reply = run(engine.chat(HELLO, **GREEDY))
    assert {name for name, _ in saves} == {reply.conversation}
    generations = [result.generation for _, result in saves]
    assert len(generations) >= 3 and generations == sorted(generations)
    assert run(manifest_keys(store, reply.conversation))[-1][1] == generations[-1]


class FullDisk(MemoryStore):
    """A store whose manifest writes numbered in ``failing`` (from 1) fail as a full disk does."""

    def __init__(self, failing: set[int]) -> None:
        super().__init__()
        self.failing, self.count = failing, 0

    async def _set(self, key, data):
        if key.startswith("manifests/"):
            self.count += 1
            if self.count in self.failing:
                raise StoreError(f"set {key!r}: cannot write it ([Errno 28] No space left on device)")
        await super()._set(key, data)


def test_a_failed_autosave_is_reported_with_its_conversation_and_the_reply_goes_on(make_engine):
    failed = []
    want = run(make_engine(store=MemoryStore(), autosave_every=3).chat(HELLO, **GREEDY))
    engine = make_engine(store=FullDisk({2}), autosave_every=3, on_save_error=lambda name, exc: failed.append((name, exc)))
    reply = run(engine.chat(HELLO, **GREEDY))
    assert reply.token_ids == want.token_ids
    assert [(name, type(exc)) for name, exc in failed] == [(reply.conversation, StoreError)]
    assert "No space left" in str(failed[0][1])


def test_a_callback_that_is_not_callable_is_refused(make_engine):
    with pytest.raises(FieldError) as caught:
        make_engine(on_save="print")
    assert caught.value.field == "on_save"


def test_a_reply_resumed_from_the_store_says_its_kv_were_imported(make_engine):
    store = MemoryStore()
    want = run(make_engine(store=MemoryStore()).chat(HELLO, **GREEDY))
    name = run(interrupted(make_engine(store=store)))
    chunks = run(chunks_of(run(make_engine(store=store).resume(name, stream=True))))
    report = chunks[0].resumed
    assert report is not None and report.kv_restored and report.reason is None and report.restore_s > 0
    assert all(c.resumed is None for c in chunks[1:])
    assert whole(chunks) == list(want.token_ids)


def test_a_resumed_reply_says_before_its_first_chunk_whether_its_kv_came_from_the_store(make_engine):
    store = MemoryStore()
    name = run(interrupted(make_engine(store=store)))
    engine = make_engine(store=store)
    stream = run(engine.resume(name, stream=True))
    assert stream.resumed is not None and stream.resumed.kv_restored
    run(chunks_of(stream))
    assert run(engine.chat(HELLO, **GREEDY)).resumed is None


def test_a_whole_resumed_reply_says_how_its_kv_came_back(make_engine):
    store = MemoryStore()
    name = run(interrupted(make_engine(store=store)))
    assert run(make_engine(store=store).resume(name)).resumed.kv_restored


def test_a_reply_whose_kv_are_damaged_is_resumed_by_running_its_tokens_again_to_the_same_tokens(make_engine):
    store = MemoryStore()
    want = run(make_engine(store=MemoryStore()).chat(HELLO, **GREEDY))
    name = run(interrupted(make_engine(store=store)))
    for key in [k for k in store._data if k.startswith("chunks/")]:
        damaged = bytearray(store._data[key])
        damaged[-1] ^= 0xFF
        store._data[key] = bytes(damaged)
    chunks = run(chunks_of(run(make_engine(store=store).resume(name, stream=True))))
    report = chunks[0].resumed
    assert not report.kv_restored and report.reason == "corrupt" and report.replay_s > 0
    assert whole(chunks) == list(want.token_ids)


def test_resume_continues_an_older_generation_beside_a_damaged_newest(make_engine):
    store = MemoryStore()
    want = run(make_engine(store=MemoryStore()).chat(HELLO, **GREEDY))
    name = run(interrupted(make_engine(store=store, autosave_every=3)))
    (_, older, _), (_, _, newest_key) = run(manifest_keys(store, name))[-2:]
    store._data[newest_key] = store._data[newest_key][:30]
    again = make_engine(store=store)
    with pytest.raises(NotFoundError):
        run(again.resume(name))
    chunks = run(chunks_of(run(again.resume(name, generation=older, stream=True))))
    assert chunks[0].resumed.generation == older
    assert whole(chunks) == list(want.token_ids)


def test_resume_of_a_generation_not_stored_is_not_found(make_engine):
    store = MemoryStore()
    name = run(interrupted(make_engine(store=store)))
    with pytest.raises(NotFoundError, match="generation 99"):
        run(make_engine(store=store).resume(name, generation=99))


@pytest.mark.parametrize("generation", [0, -1, "2", True])
def test_resume_refuses_a_generation_that_is_no_integer_from_1(make_engine, generation):
    with pytest.raises(FieldError) as caught:
        run(make_engine(store=MemoryStore()).resume("chat", generation=generation))
    assert caught.value.field == "generation"


def test_a_reply_resumed_by_an_engine_of_a_larger_prefill_chunk_gives_the_uninterrupted_tokens(make_engine):
    want = run(make_engine(store=MemoryStore(), prefill_chunk=4).chat(HELLO, **GREEDY))
    store = MemoryStore()
    name = run(interrupted(make_engine(store=store, prefill_chunk=4, autosave_every=3)))
    again = run(make_engine(store=store, prefill_chunk=32).resume(name))
    assert again.token_ids == want.token_ids


def test_a_reply_resumed_by_an_engine_of_a_smaller_prefill_chunk_is_refused_naming_it(make_engine):
    store = MemoryStore()
    name = run(interrupted(make_engine(store=store, prefill_chunk=16, autosave_every=3)))
    before = dict(store._data)
    with pytest.raises(FieldError) as caught:
        run(make_engine(store=store, prefill_chunk=8).resume(name))
    assert (caught.value.field, caught.value.got) == ("prefill_chunk", 16)
    assert store._data == before
