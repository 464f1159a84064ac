"""The OpenAI-compatible API, used through the official ``openai`` client as a user would: completions plain and
streamed, a multi-turn chat reusing its history, the models, and the conversations a store keeps.

The engine runs the tiny random llama on its own thread (``make_worker``); the server listens on a free port.
"""

from __future__ import annotations

import pytest
from api_helpers import SEEDED, USER, api_serving, client, raw

from kvckpt_web import FileStore


@pytest.fixture
def url(make_worker, tmp_path):
    with api_serving(make_worker(store=FileStore(tmp_path / "store"))) as url:
        yield url


def test_a_completion_is_openais_chat_completion_with_the_cached_tokens_and_the_conversation(url):
    reply = client(url).chat.completions.create(model="tiny", messages=[USER], **SEEDED)
    assert reply.object == "chat.completion" and reply.model == "tiny" and reply.id.startswith("chatcmpl-")
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    assert reply.usage.completion_tokens == len(reply.kvckpt["token_ids"]) >= 1
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    assert reply.usage.prompt_tokens_details.cached_tokens == 0
    assert reply.kvckpt["conversation"].startswith("chat-")


def test_a_streamed_completion_is_the_same_reply_in_chunks_without_usage(url, make_worker):
    whole = client(url).chat.completions.create(model="tiny", messages=[USER], **SEEDED)
    with api_serving(make_worker()) as fresh:  # the same request, from nothing again
        chunks = list(client(fresh).chat.completions.create(model="tiny", messages=[USER], stream=True, **SEEDED))
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
    assert [t for c in chunks for t in c.kvckpt["token_ids"]] == whole.kvckpt["token_ids"]
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    assert all(c.usage is None and "usage" not in c.model_dump(exclude_unset=True) for c in chunks)


def test_logprobs_come_in_openais_shape_whole_and_in_each_streamed_chunk(url, make_worker):
    body = {"model": "tiny", "messages": [USER], "logprobs": True, "top_logprobs": 2, **SEEDED}
    whole = client(url).chat.completions.create(**body)
    content = whole.choices[0].logprobs.content
    assert len(content) == len(whole.kvckpt["token_ids"])
    assert all(e.logprob <= 0 and len(e.top_logprobs) == 2 for e in content)
    assert all(e.top_logprobs[0].logprob >= max(e.top_logprobs[1].logprob, e.logprob) for e in content)
    with api_serving(make_worker()) as fresh:
        chunks = list(client(fresh).chat.completions.create(stream=True, **body))
    streamed = [e for c in chunks if c.choices[0].logprobs is not None for e in c.choices[0].logprobs.content]
    assert [(e.token, e.bytes) for e in streamed] == [(e.token, e.bytes) for e in content]
    assert [e.logprob for e in streamed] == [e.logprob for e in content]


def test_include_usage_adds_a_last_chunk_with_no_choices_and_the_usage(url):
    chunks = list(client(url).chat.completions.create(model="tiny", messages=[USER], stream=True,
                                                      stream_options={"include_usage": True}, **SEEDED))
    *replies, last = chunks
    assert last.choices == [] and last.usage.completion_tokens == sum(len(c.kvckpt["token_ids"]) for c in replies)
    assert last.usage.prompt_tokens > 0 and last.usage.timings["prefill_s"] > 0
    assert replies[-1].choices[0].finish_reason is not None
    assert all("usage" in c.model_dump(exclude_unset=True) and c.usage is None for c in replies)


def test_a_body_without_max_tokens_is_answered_with_at_most_the_servers_default(make_worker):
    with api_serving(make_worker(max_tokens=5)) as url:
        reply = client(url).chat.completions.create(model="tiny", messages=[USER], temperature=0.9, seed=7)
    assert reply.usage.completion_tokens == 5 and reply.choices[0].finish_reason == "length"


def test_the_events_are_data_lines_ending_with_done(url):
    body = b'{"messages": [{"role": "user", "content": "hi"}], "stream": true, "max_tokens": 3}'
    status, headers, events = raw(url, "POST", "/v1/chat/completions", body)
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    lines = events.decode().split("\n\n")
    assert lines[-2:] == ["data: [DONE]", ""] and all(line.startswith("data: {") for line in lines[:-2])


def test_the_second_turn_of_a_chat_reports_its_history_as_cached_tokens(url):
    api = client(url)
    messages = [USER]
    first = api.chat.completions.create(model="tiny", messages=messages, **SEEDED)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "and the wind?"}]
    second = api.chat.completions.create(model="tiny", messages=messages, **SEEDED)
    history = first.usage.prompt_tokens + first.usage.completion_tokens - 1  # the last token is pending
    assert second.usage.prompt_tokens_details.cached_tokens == history
    assert second.kvckpt["conversation"] == first.kvckpt["conversation"]


def test_a_turn_that_names_no_conversation_is_not_saved_into_the_one_a_turn_named(url):
    api = client(url)
    messages = [USER]
    named = api.chat.completions.create(model="tiny", messages=messages, extra_body={"conversation": "mine"}, **SEEDED)
    messages += [{"role": "assistant", "content": named.choices[0].message.content},
                 {"role": "user", "content": "and the wind?"}]
    unnamed = api.chat.completions.create(model="tiny", messages=messages, **SEEDED)  # its tokens continue "mine"
    assert named.kvckpt["conversation"] == "mine" and unnamed.kvckpt["conversation"] != "mine"
    assert unnamed.usage.prompt_tokens_details.cached_tokens > 0  # on the K/V of the history it shares
    mine = api.get("/kvckpt/conversations/mine", cast_to=object)
    assert [m["content"] for m in mine["messages"]] == [USER["content"], named.choices[0].message.content]


def test_models_lists_the_one_served_model(url):
    models = client(url).models.list()
    assert [(m.id, m.object, m.owned_by) for m in models.data] == [("tiny", "model", "kvckpt")]
    assert client(url).models.retrieve("tiny").id == "tiny"


def test_conversations_list_the_store_and_one_can_be_read_and_deleted(url):
    reply = client(url).chat.completions.create(model="tiny", messages=[USER], **SEEDED)
    name = reply.kvckpt["conversation"]
    listed = client(url).get("/kvckpt/conversations", cast_to=object)
    assert [c["name"] for c in listed["data"]] == [name] and listed["data"][0]["finished"]
    one = client(url).get(f"/kvckpt/conversations/{name}", cast_to=object)
    assert one["messages"] == [USER, {"role": "assistant", "content": reply.choices[0].message.content}]
    assert client(url).delete(f"/kvckpt/conversations/{name}", cast_to=object)["deleted"]
    assert client(url).get("/kvckpt/conversations", cast_to=object)["data"] == []
