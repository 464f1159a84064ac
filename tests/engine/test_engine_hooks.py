"""What a page needs of the engine beyond chat: hearing of every commit and failed autosave, and letting go of a
conversation so that another tab's engine may continue it.

The model is the K/V-honest double (``tests/model/lm_double.py``), or the tiny llama where its GPU kernels
matter; a second engine on the same store is another tab or process.
"""

from __future__ import annotations


import pytest

from kvckpt_web import MemoryStore
from kvckpt_web.durable.catalog import manifest_keys
from kvckpt_web.errors import ConflictError, FieldError, NotFoundError

from support.kvmodel import run
from support.stores_that_fail import FullAfter
from tiny_llama import write_tiny_llama

MESSAGES = [{"role": "user", "content": "tell me about the sea."}]
GREEDY = {"temperature": 0.0, "max_tokens": 16}


async def cut_after_first_token(engine):
    """A reply interrupted after its first token: its conversation's name."""
    name = None
    async for chunk in await engine.chat(MESSAGES, stream=True, **GREEDY):
        name = chunk.conversation
        engine.interrupt()
    return name


def test_every_committed_checkpoint_is_reported_with_its_conversation(make_engine):
    heard = []
    engine = make_engine(store=MemoryStore(), on_save=lambda name, result: heard.append((name, result)))
    reply = run(engine.chat(MESSAGES, **GREEDY))
    assert heard and {name for name, _ in heard} == {reply.conversation}
    assert [r.generation for _, r in heard] == sorted(r.generation for _, r in heard)
    assert heard[-1][1].seq_length == reply.usage.prompt_tokens + len(reply.token_ids) - 1


def test_an_autosave_that_fails_in_the_store_is_reported_and_the_reply_goes_on(make_engine):
    failed = []
    engine = make_engine(store=FullAfter(ok=1), on_save_error=lambda name, exc: failed.append((name, exc)))
    want = run(make_engine(store=MemoryStore()).chat(MESSAGES, **GREEDY))
    reply = run(engine.chat(MESSAGES, **GREEDY))
    assert failed and all(name == reply.conversation for name, _ in failed)
    assert all(isinstance(exc, OSError) for _, exc in failed)
    assert reply.token_ids == want.token_ids


@pytest.mark.parametrize("hook", ["on_save", "on_save_error"])
def test_a_hook_that_is_not_callable_is_refused_naming_it(make_engine, hook):
    with pytest.raises(FieldError, match=hook):
        make_engine(store=MemoryStore(), **{hook: "print"})


def test_a_released_unfinished_conversation_is_continued_by_another_engine_to_the_same_tokens(make_engine):
    store = MemoryStore()
    want = run(make_engine(store=MemoryStore()).chat(MESSAGES, **GREEDY))
    first, second = make_engine(store=store), make_engine(store=store)
    name = run(cut_after_first_token(first))
    with pytest.raises(ConflictError):  # the first engine holds the unfinished reply
        run(second.resume(name))
    run(first.release(name))
    got = run(second.resume(name))
    assert got.token_ids == want.token_ids
    assert name not in {s.conversation for s in first.slots}


def test_releasing_a_conversation_whose_reply_is_being_generated_is_refused(make_engine):
    engine = make_engine(store=MemoryStore())

    async def body():
        stream = await engine.chat(MESSAGES, stream=True, **GREEDY)
        chunk = await anext(stream)
        try:
            with pytest.raises(ConflictError, match="being generated"):
                await engine.release(chunk.conversation)
        finally:
            await stream.aclose()

    run(body())


def test_releasing_a_conversation_the_engine_does_not_hold_does_nothing(make_engine):
    engine = make_engine(store=MemoryStore())
    run(engine.release("chat-elsewhere"))
    assert len(engine.slots) == 0


def test_a_reply_whose_newest_checkpoint_cannot_be_read_continues_from_the_generation_before(make_engine):
    store = MemoryStore()
    want = run(make_engine(store=MemoryStore()).chat(MESSAGES, **GREEDY))

    async def cut_after(engine, n):
        async for chunk in await engine.chat(MESSAGES, stream=True, **GREEDY):
            n -= len(chunk.token_ids)
            if n <= 0:
                engine.interrupt()
        await engine.close()  # as a crashed tab lets go of the name
        return chunk.conversation

    name = run(cut_after(make_engine(store=store), 8))
    keys = run(manifest_keys(store, name))
    run(store.set(keys[-1][2], b"not a manifest"))
    again = make_engine(store=store)
    with pytest.raises(NotFoundError):
        run(again.resume(name))
    got = run(again.resume(name, generation=keys[-2][1]))
    assert got.token_ids == want.token_ids


def test_a_generation_that_is_no_positive_integer_is_refused_naming_it(make_engine):
    with pytest.raises(FieldError, match="generation"):
        run(make_engine(store=MemoryStore()).resume("chat-x", generation=0))


def test_a_turns_messages_are_committed_before_its_prefill_so_a_crash_during_it_keeps_and_continues_them(
        make_engine):
    want = run(make_engine(store=MemoryStore()).chat(MESSAGES, **GREEDY))
    store = MemoryStore()
    engine = make_engine(store=store)

    async def crash_before_the_prefill():
        await engine.chat(MESSAGES, stream=True, **GREEDY)  # the turn began; none of its prompt ran
        await engine.close()  # as a crashed tab lets go of the name

    run(crash_before_the_prefill())
    again = make_engine(store=store)
    [cut] = run(again.unfinished())
    got = run(again.resume(cut.name))
    assert [m.to_json() for m in cut.messages] == MESSAGES and not cut.finished
    assert got.token_ids == want.token_ids


def test_a_warm_up_runs_a_short_prompt_and_a_prompt_chunk_each_with_a_token_after_it_and_leaves_the_cache_as_it_was(
        make_engine):
    want = run(make_engine(store=MemoryStore()).chat(MESSAGES, **GREEDY))
    engine = make_engine(store=MemoryStore())
    free = engine.cache.get_num_available_pages()
    run(engine.warm_up())
    assert engine.model.forwards == [2, 1, engine.prefill_chunk, 1]
    assert engine.cache.sequence_ids() == [] and engine.cache.get_num_available_pages() == free
    assert run(engine.chat(MESSAGES, **GREEDY)).token_ids == want.token_ids


def test_after_a_warm_up_no_turn_builds_a_kernel(tmp_path):
    import wgpu

    from kvckpt_web.engine import Engine, EngineConfig
    from kvckpt_web.gpu.wgpu_native import WgpuDevice
    from kvckpt_web.model.loader import load_model

    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    device = WgpuDevice(adapter, adapter.request_device_sync())  # its own: no kernel built by another test
    engine = Engine(load_model(write_tiny_llama(tmp_path / "tiny.gguf"), device), device, store=MemoryStore(),
                    config=EngineConfig(context=512, prefill_chunk=64, autosave_every=8))
    try:
        run(engine.warm_up())
        built = len(device._kernels)
        long = [{"role": "user", "content": "tell me about the sea, " * 12}]  # more than a prefill chunk
        first = run(engine.chat(long, max_tokens=24, temperature=0.8, seed=1))
        run(engine.chat([*long, {"role": "assistant", "content": first.text}, {"role": "user", "content": "more"}],
                        max_tokens=8, temperature=0.0))
        run(engine.chat([{"role": "user", "content": "hi"}], max_tokens=24, temperature=0.0))
    finally:
        run(engine.close())
    assert first.usage.prompt_tokens > engine.prefill_chunk and len(device._kernels) == built
