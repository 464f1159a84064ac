"""A chat whose last message is the assistant's: the reply continues that text (OpenAI-style prefill), the answer
holds the continuation only, and the prefill and continuation sent back are a history the next turn reuses."""

from __future__ import annotations

import pytest

from kvckpt_web import MemoryStore

from lm_double import DoubleText
from support.kvmodel import run

GREEDY = {"temperature": 0.0, "max_tokens": 8}
USER = {"role": "user", "content": "tell me about the sea."}
PREFILL = {"role": "assistant", "content": "the sea is"}


def test_the_prompt_ends_with_the_prefill_in_the_open_assistant_turn(make_engine):
    engine = make_engine(store=MemoryStore())
    reply = run(engine.chat([USER, PREFILL], **GREEDY))
    record = run(engine.sources.record(reply.conversation))
    text = DoubleText()
    assert record.saved.prompt == text.encode_message("user", USER["content"]) + text.reply_opening() + \
        text.encode(PREFILL["content"])
    assert reply.usage.prompt_tokens == len(record.saved.prompt)


def test_the_answer_is_the_continuation_only(make_engine):
    engine = make_engine()
    reply = run(engine.chat([USER, PREFILL], **GREEDY))
    assert reply.text == DoubleText().decode(reply.token_ids)
    assert reply.usage.completion_tokens == len(reply.token_ids)
    assert reply.to_openai()["choices"][0]["message"]["content"] == reply.text


class Drifting(DoubleText):
    """Encodes an assistant message's text otherwise than the model wrote it: only the ids the engine recognises
    as its own match."""

    def encode_message(self, role, content, *, previous=None, max_tokens=None):
        return super().encode_message(role, content[::-1] if role == "assistant" else content, max_tokens=max_tokens)


@pytest.mark.parametrize("restarted", [False, True], ids=["same engine", "restarted engine"])
def test_the_prefill_and_its_continuation_sent_back_are_a_history_the_next_turn_reuses(make_engine, restarted):
    store = MemoryStore()
    engine = make_engine(store=store, text=Drifting())

    async def body():
        nonlocal engine
        first = await engine.chat([USER, PREFILL], **GREEDY)
        if restarted:
            await engine.close()
            engine = make_engine(store=store, text=Drifting())
        history = [USER, {"role": "assistant", "content": PREFILL["content"] + first.text},
                   {"role": "user", "content": "and the wind?"}]
        return first, await engine.chat(history, **GREEDY)

    first, second = run(body())
    assert second.conversation == first.conversation
    assert second.usage.cached_tokens == first.usage.prompt_tokens + first.usage.completion_tokens - 1


def test_the_history_shows_the_prefill_continued_as_one_assistant_message(make_engine):
    engine = make_engine(store=MemoryStore())

    async def body():
        reply = await engine.chat([USER, PREFILL], **GREEDY)
        return reply, await engine.conversation(reply.conversation)

    reply, info = run(body())
    assert [m.to_json() for m in info.messages] == [USER, {"role": "assistant",
                                                           "content": PREFILL["content"] + reply.text}]
