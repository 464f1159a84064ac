"""The chat engine: OpenAI-shaped replies, prefix reuse in the cache and from the store, a conversation that
survives restarts and interrupts with the tokens of an uninterrupted run.

The model is the K/V-honest double (``tests/model/lm_double.py``): its logits depend on every byte of the K/V it
reads back, so a prefix reused wrongly changes the tokens. A second engine on the same store is a restarted
process; real ``kill -9`` of processes is in ``test_engine_crash.py``.
"""

from __future__ import annotations

import pytest

from kvckpt_web import FileStore, MemoryStore
from kvckpt_web.durable.catalog import manifest_keys
from kvckpt_web.durable.prefix_records import PrefixKey, encode_record, prefix_record
from kvckpt_web.engine import ChatChunk, ChatCompletion
from kvckpt_web.errors import ContextFullError, FieldError, KVCkptError, NotFoundError

from lm_double import EOS, DoubleLM, DoubleText
from support.kvmodel import run

USER_TURNS = ["hello there, who are you?", "tell me about the sea.", "and the wind?", "why is the sky blue?",
              "count to five.", "what is a boat?", "say something nice.", "goodbye!"]
GREEDY = {"temperature": 0.0, "max_tokens": 12}
SEEDED = {"temperature": 0.9, "top_p": 0.9, "seed": 7, "max_tokens": 12}


def snapshot(store: MemoryStore) -> dict[str, bytes]:
    return {key: bytes(value) for key, value in store._data.items()}


async def converse(engine, turns, settings, messages=None):
    """Chat turn by turn; the replies (ChatCompletion) and the messages at the end."""
    messages = list(messages or [])
    replies = []
    for text in turns:
        messages.append({"role": "user", "content": text})
        reply = await engine.chat(messages, **settings)
        replies.append(reply)
        messages.append({"role": "assistant", "content": reply.text})
    return replies, messages


# ----- one reply ------------------------------------------------------------------------------------


def test_a_reply_carries_its_text_ids_finish_reason_and_usage(make_engine):
    engine = make_engine()
    reply = run(engine.chat([{"role": "user", "content": "hello"}], **GREEDY))
    assert isinstance(reply, ChatCompletion)
    assert reply.finish_reason in ("stop", "length") and 1 <= len(reply.token_ids) <= 12
    assert reply.text == DoubleText().decode([t for t in reply.token_ids if t != 0])
    assert reply.usage.prompt_tokens == len(DoubleText().encode_chat([{"role": "user", "content": "hello"}]))
    assert reply.usage.completion_tokens == len(reply.token_ids) and reply.usage.cached_tokens == 0
    wire = reply.to_openai()
    assert wire["object"] == "chat.completion" and wire["choices"][0]["message"]["role"] == "assistant"
    assert wire["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_a_frequency_penalty_steers_a_greedy_reply_off_the_tokens_it_repeated(make_engine):
    engine = make_engine()
    messages = [{"role": "user", "content": "hello"}]
    plain = run(engine.chat(messages, **GREEDY, cache_prompt=False)).token_ids
    penalized = run(engine.chat(messages, **GREEDY, cache_prompt=False, frequency_penalty=2.0)).token_ids
    assert len(set(plain)) < len(plain) and penalized[0] == plain[0]
    assert penalized != plain and len(set(penalized)) > len(set(plain))


def test_a_streamed_reply_is_the_same_reply_in_chunks(make_engine):
    whole = run(make_engine().chat([{"role": "user", "content": "hello"}], **GREEDY))

    async def streamed():
        chunks = [c async for c in await make_engine().chat([{"role": "user", "content": "hello"}], stream=True,
                                                            **GREEDY)]
        return chunks

    chunks = run(streamed())
    assert all(isinstance(c, ChatChunk) for c in chunks)
    assert chunks[0].first and chunks[0].to_openai()["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c.text for c in chunks) == whole.text
    assert [t for c in chunks for t in c.token_ids] == list(whole.token_ids)
    assert chunks[-1].finish_reason == whole.finish_reason and chunks[-1].usage is not None
    assert all(c.finish_reason is None and c.usage is None for c in chunks[:-1])


# ----- prefix reuse -----------------------------------------------------------------------------------


def test_the_next_turn_prefills_only_its_own_tokens(make_engine):
    engine = make_engine(store=MemoryStore())
    model = engine.model

    async def body():
        replies, messages = await converse(engine, USER_TURNS[:2], GREEDY)
        return replies

    replies = run(body())
    second = replies[1].usage
    history = replies[0].usage.prompt_tokens + replies[0].usage.completion_tokens - 1  # the last token is pending
    assert second.cached_tokens == history
    assert second.timings.prefill_tokens == second.prompt_tokens - history
    assert model.forwards  # the double records every forward's length: none re-ran the history
    assert sum(model.forwards) == (replies[0].usage.prompt_tokens + replies[0].usage.completion_tokens - 1
                                   + second.prompt_tokens - history + second.completion_tokens - 1)


def test_a_restarted_engine_restores_the_history_from_the_store_and_gives_the_same_tokens(make_engine, tmp_path):
    async def body():
        one = make_engine(store=FileStore(tmp_path / "s"))
        want, messages = await converse(one, USER_TURNS[:3], GREEDY)
        again = make_engine(store=FileStore(tmp_path / "s"))
        first, _ = await converse(again, USER_TURNS[:1], GREEDY)
        # the first turn again: the whole prompt was seen, so all but its last token come from the store
        return want, first, messages

    want, first, _ = run(body())
    assert first[0].token_ids == want[0].token_ids


@pytest.mark.parametrize("settings", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_eight_turns_give_the_same_tokens_never_interrupted_and_restarted_after_every_turn(make_engine, tmp_path,
                                                                                           settings):
    async def uninterrupted():
        engine = make_engine(store=MemoryStore())
        replies, _ = await converse(engine, USER_TURNS, settings)
        return [r.token_ids for r in replies], engine.model.forwards

    async def restarted():
        messages, out, forwards = [], [], []
        for i, text in enumerate(USER_TURNS):
            engine = make_engine(store=FileStore(tmp_path / "s"))  # a new process for every turn
            replies, messages = await converse(engine, [text], settings, messages)
            out.append(replies[0].token_ids)
            forwards += engine.model.forwards
            if i:
                assert replies[0].usage.cached_tokens > 0 and replies[0].usage.timings.restore_s > 0
            await engine.close()
        return out, forwards

    # the same tokens, from the same forward calls: the history came back whole from the store every time
    assert run(restarted()) == run(uninterrupted())


@pytest.mark.parametrize("settings", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_eight_turns_interrupted_mid_reply_and_resumed_by_a_new_engine_give_the_same_tokens(make_engine, tmp_path,
                                                                                            settings):
    async def uninterrupted():
        engine = make_engine(store=MemoryStore())
        replies, _ = await converse(engine, USER_TURNS, settings)
        return [r.token_ids for r in replies], engine.model.forwards

    async def cut_every_reply():
        messages, out, forwards = [], [], []
        for text in USER_TURNS:
            messages.append({"role": "user", "content": text})
            engine = make_engine(store=FileStore(tmp_path / "s"))
            stream = await engine.chat(messages, stream=True, **settings)
            async for chunk in stream:
                if chunk.token_ids and not chunk.finish_reason:
                    engine.interrupt()  # stop after the first token: the reply is saved unfinished
            await engine.close()
            again = make_engine(store=FileStore(tmp_path / "s"))
            (info,) = await again.unfinished()
            reply = await again.resume(info.name)
            out.append(reply.token_ids)
            forwards += engine.model.forwards + again.model.forwards
            messages.append({"role": "assistant", "content": reply.text})
            await again.close()
        return out, forwards

    assert run(cut_every_reply()) == run(uninterrupted())


def test_an_interrupted_reply_ends_with_abort_and_is_listed_unfinished(make_engine):
    engine = make_engine(store=MemoryStore())

    async def body():
        stream = await engine.chat([{"role": "user", "content": "hello"}], stream=True, **GREEDY)
        chunks = []
        async for chunk in stream:
            chunks.append(chunk)
            if len(chunks) == 2:
                engine.interrupt()
        return chunks, await engine.unfinished()

    chunks, unfinished = run(body())
    assert chunks[-1].finish_reason == "abort"
    assert [u.name for u in unfinished] == [chunks[0].conversation]


def test_a_resumed_replys_decode_rate_counts_only_the_tokens_generated_after_the_resume(make_engine):
    engine = make_engine(store=MemoryStore())

    async def body():
        stream = await engine.chat([{"role": "user", "content": "hello there, who are you?"}], stream=True,
                                   **GREEDY)
        before = 0
        async for chunk in stream:
            before += len(chunk.token_ids)
            if before == 3:
                engine.interrupt()
        (info,) = await engine.unfinished()
        return before, await engine.resume(info.name)

    before, reply = run(body())
    assert reply.usage.completion_tokens == len(reply.token_ids) > before
    assert reply.usage.timings.decode_tokens == len(reply.token_ids) - before - 1


def test_an_edited_last_message_forks_and_reuses_the_shared_prefix(make_engine):
    engine = make_engine(store=MemoryStore())

    async def body():
        replies, messages = await converse(engine, USER_TURNS[:2], GREEDY)
        edited = messages[:-2] + [{"role": "user", "content": "tell me about the moon."}]
        return replies, await engine.chat(edited, **GREEDY)

    replies, fork = run(body())
    assert fork.conversation != replies[1].conversation  # a new conversation, the old one kept
    assert fork.usage.cached_tokens >= replies[1].usage.cached_tokens  # the history before the edit


@pytest.mark.parametrize("restarted", [False, True], ids=["same-engine", "restarted"])
def test_the_next_turn_after_a_reply_that_ended_at_eos_stays_in_its_conversation(make_engine, restarted):
    store = MemoryStore()
    engine = make_engine(store=store)

    async def body():
        first, messages = await converse(engine, ["and the wind?"], GREEDY)  # the double ends this reply at EOS
        assert first[0].finish_reason == "stop" and first[0].token_ids[-1] == EOS
        nxt = make_engine(store=store) if restarted else engine
        second, _ = await converse(nxt, ["tell me more."], GREEDY, messages)
        return first[0], second[0]

    first, second = run(body())
    assert second.conversation == first.conversation


@pytest.mark.parametrize("named", [False, True], ids=["names-none", "names-it"])
def test_the_next_turn_of_the_second_of_two_conversations_begun_alike_is_saved_into_the_second(make_engine, named):
    engine = make_engine(store=MemoryStore())
    hi = [{"role": "user", "content": "Hi"}]

    async def body():
        first = await engine.chat(hi, **GREEDY)
        second = await engine.chat(hi, **GREEDY)  # New conversation, the same message: the same reply
        assert second.conversation != first.conversation and second.token_ids == first.token_ids
        kept = await engine.conversation(first.conversation)
        messages = [*hi, {"role": "assistant", "content": second.text}, {"role": "user", "content": "What can you do?"}]
        again = await engine.chat(messages, **GREEDY, **({"conversation": second.conversation} if named else {}))
        return second, again, kept, await engine.conversation(first.conversation)

    second, again, kept, first_now = run(body())
    assert again.conversation == second.conversation
    assert first_now.to_json() == kept.to_json()


@pytest.mark.parametrize("restarted", [False, True], ids=["same-engine", "restarted"])
def test_a_request_naming_no_conversation_is_never_saved_into_one_a_request_named(make_engine, restarted):
    store = MemoryStore()
    engine = make_engine(store=store)

    async def body():
        _, messages = await converse(engine, ["hello there"], {**GREEDY, "conversation": "mine"})
        kept = await engine.conversation("mine")
        nxt = make_engine(store=store) if restarted else engine
        other, _ = await converse(nxt, ["tell me more."], GREEDY, messages)  # its tokens continue "mine"
        return other[0], kept, await nxt.conversation("mine")

    other, kept, mine_now = run(body())
    assert other.conversation != "mine" and mine_now.to_json() == kept.to_json()
    assert other.usage.cached_tokens > 0  # a new conversation, on the K/V of the history it shares


@pytest.mark.parametrize("anew", [("tell me about the sky.", 3), ("tell me", 8), None],
                         ids=["written-anew", "written-anew-shorter", "deleted-but-its-index-records"])
def test_a_checkpoint_changed_behind_a_running_engine_is_no_prefix_of_the_tokens_it_held_before(make_engine, anew):
    store = MemoryStore()
    writer, engine = make_engine(store=store), make_engine(store=store)  # two processes; `engine` keeps running
    told = [{"role": "user", "content": "tell me about the sea."}]
    asked = [*told, {"role": "assistant", "content": "waves"}, {"role": "user", "content": "and the wind?"}]
    cold = {"temperature": 0.0, "cache_prompt": False}  # each written alike: generations of the same numbers

    async def generations():
        return [g for _, g, _ in await manifest_keys(store, "x")]

    async def body():
        await writer.chat(told, **cold, max_tokens=3, conversation="x")
        before, records = await generations(), {k: v for k, v in snapshot(store).items() if k.startswith("prefixes/")}
        await engine.chat(asked, **GREEDY, conversation="a")  # its prefix comes from x, whose record it keeps
        await engine.delete("a")
        await writer.delete("x")
        if anew:
            text, max_tokens = anew
            await writer.chat([{"role": "user", "content": text}], **cold, max_tokens=max_tokens, conversation="x")
            assert await generations() == before  # the same names and numbers, other tokens
        else:  # as a crash between the deletion of the manifests and of their index records leaves them
            for key, data in records.items():
                await store.set_if_absent(key, data)
        return await engine.chat(asked, **GREEDY, conversation="b")

    again = run(body())
    assert again.token_ids == run(make_engine().chat(asked, **GREEDY)).token_ids  # a cold prefill's


@pytest.mark.parametrize("anew", [("tell me about the sky.", 3), ("tell me", 8)], ids=["other-tokens", "fewer"])
def test_a_checkpoint_written_anew_behind_a_running_engine_is_passed_over_with_a_warning(make_engine, anew):
    store = MemoryStore()
    writer, engine = make_engine(store=store), make_engine(store=store)  # two processes; `engine` keeps running
    told = [{"role": "user", "content": "tell me about the sea."}]
    asked = [*told, {"role": "assistant", "content": "waves"}, {"role": "user", "content": "and the wind?"}]
    cold = {"temperature": 0.0, "cache_prompt": False}

    async def body():
        await writer.chat(told, **cold, max_tokens=3, conversation="x")
        await engine.chat(asked, **GREEDY, conversation="a")  # its prefix comes from x, whose record it keeps
        await engine.delete("a")
        await writer.delete("x")
        text, max_tokens = anew
        await writer.chat([{"role": "user", "content": text}], **cold, max_tokens=max_tokens, conversation="x")
        return await engine.chat(asked, **GREEDY, conversation="b")

    again = run(body())
    assert len(again.warnings) == 1 and "the K/V of 'x' generation" in again.warnings[0]
    assert "cannot be used" in again.warnings[0]
    assert again.token_ids == run(make_engine().chat(asked, **GREEDY)).token_ids  # a cold prefill's


def test_cache_prompt_false_prefills_everything(make_engine):
    engine = make_engine(store=MemoryStore())

    async def body():
        _, messages = await converse(engine, USER_TURNS[:1], GREEDY)
        messages.append({"role": "user", "content": "more"})
        return await engine.chat(messages, cache_prompt=False, **GREEDY)

    assert run(body()).usage.cached_tokens == 0


def test_a_reply_is_recognised_by_its_text_and_its_generated_ids_are_reused(make_engine):
    class Drifting(DoubleText):
        """Encodes an assistant message's text otherwise than the model wrote it: only the generated ids match."""

        def encode_message(self, role, content, *, previous=None, max_tokens=None):
            return super().encode_message(role, content[::-1] if role == "assistant" else content, max_tokens=max_tokens)

    engine = make_engine(store=MemoryStore(), text=Drifting())

    async def body():
        return await converse(engine, USER_TURNS[:2], GREEDY)

    replies, _ = run(body())
    history = replies[0].usage.prompt_tokens + replies[0].usage.completion_tokens - 1
    assert replies[1].usage.cached_tokens == history


def test_conversations_beyond_the_cache_are_evicted_least_recently_used_and_come_back_from_the_store(make_engine):
    engine = make_engine(store=MemoryStore(), sequences=2, cache_tokens=768)

    async def body():
        threads = {}
        for name in ("a", "b", "c"):
            threads[name] = await converse(engine, [f"hello {name}"], {**GREEDY, "conversation": name})
        _, messages = threads["a"]
        messages.append({"role": "user", "content": "and again"})
        return await engine.chat(messages, **GREEDY, conversation="a")

    again = run(body())
    assert again.usage.cached_tokens > 0 and again.usage.timings.restore_s > 0


# ----- bad input --------------------------------------------------------------------------------------


@pytest.mark.parametrize("messages, field", [
    ([], "messages"), ("hello", "messages"), ([{"role": "robot", "content": "x"}], "messages[0].role"),
    ([{"role": "user"}], "messages[0].content"), ([{"role": "user", "content": 5}], "messages[0].content"),
    ([{"role": "user", "content": "x"}, {"role": "system", "content": "y"}], "messages[1].role"),
    ([{"role": "user", "content": "x", "tool_calls": []}], "messages[0].tool_calls"),
], ids=["empty", "string", "unknown role", "no content", "content not text", "last a system message", "unknown key"])
def test_bad_messages_are_refused_naming_the_field_and_nothing_is_stored(make_engine, messages, field):
    store = MemoryStore()
    engine = make_engine(store=store)
    with pytest.raises(FieldError) as caught:
        run(engine.chat(messages, **GREEDY))
    assert caught.value.field == field
    assert snapshot(store) == {}


def test_a_prompt_the_context_cannot_answer_is_refused_with_the_counts(make_engine):
    store = MemoryStore()
    engine = make_engine(store=store, context=32)
    with pytest.raises(ContextFullError) as caught:
        run(engine.chat([{"role": "user", "content": "x" * 40}], **GREEDY))
    assert "32" in str(caught.value) and "tokens" in str(caught.value)
    assert snapshot(store) == {}


def test_a_huge_message_is_refused_as_too_long_without_encoding_past_the_context(make_engine):
    class Counting(DoubleText):
        budgets = []

        def encode_message(self, role, content, *, previous=None, max_tokens=None):
            self.budgets.append(max_tokens)
            return super().encode_message(role, content, max_tokens=max_tokens)

    text = Counting()
    engine = make_engine(store=MemoryStore(), text=text, context=64)
    with pytest.raises(ContextFullError) as caught:
        run(engine.chat([{"role": "user", "content": "hello " * 20000}], **GREEDY))
    assert caught.value.field == "messages" and "63 tokens" in str(caught.value)
    assert text.budgets and all(b is not None and b <= 63 for b in text.budgets)


def test_any_text_a_reply_may_hold_is_accepted_back_as_a_message(make_engine):
    engine = make_engine()
    reply = run(engine.chat([{"role": "user", "content": "a NUL \x00 and a bell \x07"}], **GREEDY))
    assert reply.usage.prompt_tokens > 0


def test_text_that_is_not_unicode_is_refused_naming_the_message(make_engine):
    with pytest.raises(FieldError) as caught:
        run(make_engine().chat([{"role": "user", "content": "half a pair \ud800"}], **GREEDY))
    assert caught.value.field == "messages[0].content"


def test_a_conversation_of_another_model_is_refused(make_engine):
    store = MemoryStore()
    run(make_engine(store=store).chat([{"role": "user", "content": "hi"}], **GREEDY, conversation="c"))
    before = snapshot(store)
    other = make_engine(store=store, model=DoubleLM(max_context=1024, name="other"))
    with pytest.raises(FieldError) as caught:
        run(other.chat([{"role": "user", "content": "hi"}], **GREEDY, conversation="c"))
    assert caught.value.field == "conversation"
    assert snapshot(store) == before


def test_a_prefix_record_pointing_at_another_models_checkpoint_is_never_used(make_engine):
    store = MemoryStore()
    hello = [{"role": "user", "content": USER_TURNS[0]}]
    run(make_engine(store=store, model=DoubleLM(seed=1, max_context=1024)).chat(hello, **GREEDY, conversation="theirs"))
    engine = make_engine(store=store)
    theirs = run(engine.sources.record("theirs"))  # other weights: K/V of other bits for the same tokens
    held = theirs.tokens[:theirs.saved.kv_length]
    forged = prefix_record(PrefixKey(engine.scope, held), "theirs", theirs.generation, len(held),
                           engine.config.page_size)
    run(store.set_if_absent(forged.key, encode_record(forged)))  # in this model's scope, as a store's writer may

    reply = run(engine.chat(hello, **GREEDY))
    assert reply.usage.cached_tokens == 0
    assert reply.token_ids == run(make_engine().chat(hello, **GREEDY)).token_ids  # a cold prefill's


def test_resuming_a_finished_or_missing_conversation_is_refused(make_engine):
    engine = make_engine(store=MemoryStore())
    reply = run(engine.chat([{"role": "user", "content": "hi"}], **GREEDY))
    with pytest.raises(FieldError):
        run(engine.resume(reply.conversation))
    with pytest.raises(NotFoundError):
        run(engine.resume("nothing-here"))


def test_delete_removes_a_conversation_from_the_store_and_the_cache(make_engine):
    store = MemoryStore()
    engine = make_engine(store=store)
    reply = run(engine.chat([{"role": "user", "content": "hi"}], **GREEDY))
    run(engine.delete(reply.conversation))
    assert run(engine.conversations()) == []
    assert not any(key.startswith("manifests/") for key in store._data)
    assert len(engine.slots) == 0


def test_history_lists_the_messages_and_the_reply(make_engine):
    engine = make_engine(store=MemoryStore())
    replies, messages = run(converse(engine, USER_TURNS[:2], GREEDY))
    info = run(engine.conversation(replies[-1].conversation))
    assert [m.to_json() for m in info.messages] == messages
    assert info.finished and info.title == USER_TURNS[0]


def test_a_kvckpterror_subclass_is_raised_for_a_wrong_request_object(make_engine):
    with pytest.raises(KVCkptError):
        run(make_engine().create({"messages": []}))


def test_a_request_without_max_tokens_stops_at_the_engines_default_max_tokens(make_engine):
    engine = make_engine(store=MemoryStore(), max_tokens=5)
    want = run(engine.chat([{"role": "user", "content": USER_TURNS[0]}], temperature=0.0, max_tokens=6))
    reply = run(engine.chat([{"role": "user", "content": USER_TURNS[0]}], temperature=0.0))
    assert EOS not in want.token_ids  # the reply would have gone on
    assert reply.token_ids == want.token_ids[:5] and reply.finish_reason == "length"


def test_a_reply_with_store_false_writes_nothing_to_the_store_and_its_kv_stay_in_the_cache(make_engine):
    store = MemoryStore()
    engine = make_engine(store=store)
    want = run(make_engine(store=MemoryStore()).chat([{"role": "user", "content": USER_TURNS[0]}], **GREEDY))
    reply = run(engine.chat([{"role": "user", "content": USER_TURNS[0]}], store=False, **GREEDY))
    following = [{"role": "user", "content": USER_TURNS[0]}, {"role": "assistant", "content": reply.text},
                 {"role": "user", "content": USER_TURNS[1]}]
    again = run(engine.chat(following, store=False, **GREEDY))
    assert reply.token_ids == want.token_ids and run(store.list_prefix("")) == []
    assert again.usage.cached_tokens > 0 and again.usage.timings.save_s == 0
