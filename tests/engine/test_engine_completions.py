"""Plain completions on the engine: a raw prompt's turn, with a chat's machinery: a conversation saved and
listed, the K/V of the longest prefix reused from the cache or the store, an interrupted completion resumed with
the tokens of an uninterrupted one; a base model refuses chat.

The model is the K/V-honest double (``tests/model/lm_double.py``) but for the base model's refusal, which runs the
tiny random llama written without a chat template, and the persistent prefix index's scope, which runs it beside a
tiny random gemma3 on one store.
"""

from __future__ import annotations

import pytest

from kvckpt_web import FileStore, MemoryStore
from kvckpt_web.engine import PRESETS, ChatChunk, ChatCompletion, Engine
from kvckpt_web.errors import ContextFullError, FieldError
from kvckpt_web.model.loader import load_model

from lm_double import DoubleText
from tiny_archs import write_tiny_arch
from support.kvmodel import run

PROMPT = "once upon a time"
GREEDY = {"temperature": 0.0, "max_tokens": 12}


def test_a_completion_continues_its_raw_prompt_and_answers_a_text_completion(make_engine):
    reply = run(make_engine().complete(PROMPT, **GREEDY))
    assert isinstance(reply, ChatCompletion) and reply.id.startswith("cmpl-")
    assert reply.usage.prompt_tokens == len(DoubleText().encode_text(PROMPT))
    assert reply.usage.completion_tokens == len(reply.token_ids) >= 1
    wire = reply.to_openai()
    assert wire["object"] == "text_completion" and wire["id"] == reply.id
    assert wire["choices"] == [{"text": reply.text, "index": 0, "logprobs": None,
                                "finish_reason": reply.finish_reason}]
    assert wire["usage"]["total_tokens"] == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_a_streamed_completion_is_the_same_completion_in_text_completion_chunks(make_engine):
    whole = run(make_engine().complete(PROMPT, **GREEDY))

    async def streamed():
        return [c async for c in await make_engine().complete(PROMPT, stream=True, **GREEDY)]

    chunks = run(streamed())
    assert all(isinstance(c, ChatChunk) and c.to_openai()["object"] == "text_completion" for c in chunks)
    assert "".join(c.to_openai()["choices"][0]["text"] for c in chunks) == whole.text
    assert chunks[-1].finish_reason == whole.finish_reason and chunks[-1].to_openai()["usage"] is not None


def test_a_completion_stops_at_a_stop_string_it_leaves_out(make_engine):
    whole = run(make_engine().complete(PROMPT, **{**GREEDY, "max_tokens": 30}))
    stop = whole.text[3:5]
    reply = run(make_engine().complete(PROMPT, stop=stop, **{**GREEDY, "max_tokens": 30}))
    assert reply.finish_reason == "stop" and reply.text == whole.text[:whole.text.index(stop)]


def test_a_completion_is_saved_as_a_conversation_that_lists_its_prompt(make_engine):
    engine = make_engine(store=MemoryStore())

    async def body():
        reply = await engine.complete(PROMPT, **GREEDY)
        return reply, await engine.conversation(reply.conversation)

    reply, info = run(body())
    assert reply.conversation.startswith("completion-") and info.finished
    assert info.prompt == PROMPT and info.title == PROMPT
    assert [m.to_json() for m in info.messages] == [{"role": "assistant", "content": reply.text}]
    assert info.to_json()["prompt"] == PROMPT


def test_a_longer_prompt_reuses_the_k_v_of_the_completion_it_extends_from_the_store(make_engine, tmp_path):
    async def body():
        first = await make_engine(store=FileStore(tmp_path / "s")).complete(PROMPT, **GREEDY)
        again = make_engine(store=FileStore(tmp_path / "s"))  # a restarted process
        return first, await again.complete(PROMPT + first.text + " and then", **GREEDY)

    first, second = run(body())
    assert second.usage.cached_tokens >= len(DoubleText().encode_text(PROMPT)) - 4  # whole pages of 4 tokens
    assert second.conversation == first.conversation  # its tokens continue that conversation's


def test_a_prefix_one_model_saved_never_serves_another_model_on_the_same_store(tiny_base_path, device, tmp_path):
    gemma3, _, _ = write_tiny_arch(tmp_path / "gemma3.gguf", "gemma3")
    prompt = "the sea and its ships sail on and on under the wind"

    def complete(path):
        engine = Engine(load_model(path, device), device, store=FileStore(tmp_path / "s"),
                        config=PRESETS["desktop"].replace(sequences=1, page_size=4, prefill_chunk=8))
        try:
            return run(engine.complete(prompt, **GREEDY))
        finally:
            run(engine.close())

    first = complete(tiny_base_path)
    other = complete(gemma3)  # another model (and architecture): none of the llama's K/V
    assert other.usage.cached_tokens == 0 and other.usage.timings.restore_s == 0
    assert other.conversation != first.conversation
    again = complete(tiny_base_path)  # the same model again: its prefix comes from the store
    assert again.usage.cached_tokens >= first.usage.prompt_tokens - 4


def test_an_interrupted_completion_resumes_with_the_tokens_of_an_uninterrupted_one(make_engine, tmp_path):
    whole = run(make_engine(store=MemoryStore()).complete(PROMPT, **GREEDY))

    async def cut():
        engine = make_engine(store=FileStore(tmp_path / "s"))
        async for chunk in await engine.complete(PROMPT, stream=True, **GREEDY):
            if chunk.token_ids and not chunk.finish_reason:
                engine.interrupt()
        await engine.close()
        again = make_engine(store=FileStore(tmp_path / "s"))
        (info,) = await again.unfinished()
        return info, await again.resume(info.name)

    info, resumed = run(cut())
    assert info.prompt == PROMPT
    assert resumed.token_ids == whole.token_ids and resumed.to_openai()["object"] == "text_completion"


def test_a_prompt_of_no_token_is_refused_naming_the_prompt(make_engine):
    with pytest.raises(FieldError, match="prompt: expected a text of at least one token"):
        run(make_engine().complete(""))


def test_a_prompt_the_context_cannot_answer_is_refused_naming_the_prompt(make_engine):
    with pytest.raises(ContextFullError, match="prompt: expected a prompt of at most 767 tokens"):
        run(make_engine().complete("a" * 800))


@pytest.mark.parametrize("settings", [{"max_tokens": 0}, {"temperature": 3}, {"prompt": 7}])
def test_bad_settings_are_refused_naming_the_field(make_engine, settings):
    field = next(iter(settings))
    with pytest.raises(FieldError, match=f"^{field}: "):
        run(make_engine().complete(settings.pop("prompt", PROMPT), **settings))


def test_chat_on_a_base_model_is_refused_in_one_line_saying_so(tiny_base_path, device):
    engine = Engine(load_model(tiny_base_path, device), device, model_name="base")
    try:
        with pytest.raises(FieldError) as info:
            run(engine.chat([{"role": "user", "content": "hi"}]))
        assert info.value.field == "messages" and len(str(info.value).splitlines()) == 1
        assert "a base model" in str(info.value) and "completion" in str(info.value)
        assert run(engine.complete("the sea", max_tokens=2)).usage.completion_tokens >= 1
    finally:
        run(engine.close())
