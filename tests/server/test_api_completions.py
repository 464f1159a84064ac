"""``POST /v1/completions``, OpenAI's legacy completions, through the official ``openai`` client: a raw prompt
continued, plain and streamed, with usage, stop strings and errors in OpenAI's shape; a completion is saved as a
conversation; a base model (no chat template) answers completions and refuses chat in one line.

The engine runs the tiny random llama on its own thread (``make_worker``); the server listens on a free port.
"""

from __future__ import annotations

import openai
import pytest
from api_helpers import api_serving, client, error_of, raw

from kvckpt_web import FileStore
from kvckpt_web.engine import PRESETS, Engine
from kvckpt_web.model.loader import load_model
from kvckpt_web.server.worker import EngineWorker

PROMPT = "the theory of the thing is that"
GREEDY = {"temperature": 0, "seed": 1, "max_tokens": 12}


@pytest.fixture
def url(make_worker, tmp_path):
    with api_serving(make_worker(store=FileStore(tmp_path / "store"))) as url:
        yield url


def complete(url, **body):
    return client(url).completions.create(**{"model": "tiny", "prompt": PROMPT, **GREEDY, **body})


def test_a_completion_is_openais_text_completion_with_usage_and_the_conversation(url):
    reply = complete(url)
    assert reply.object == "text_completion" and reply.model == "tiny" and reply.id.startswith("cmpl-")
    (choice,) = reply.choices
    assert choice.index == 0 and choice.finish_reason in ("stop", "length") and choice.logprobs is None
    assert isinstance(choice.text, str)
    assert reply.usage.completion_tokens == len(reply.kvckpt["token_ids"]) >= 1
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    assert reply.kvckpt["conversation"].startswith("completion-")


def test_a_streamed_completion_is_the_same_completion_in_chunks(url, make_worker):
    whole = complete(url)
    with api_serving(make_worker()) as fresh:  # the same request, from nothing again
        chunks = list(complete(fresh, stream=True))
    assert all(c.object == "text_completion" and c.id == chunks[0].id for c in chunks)
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert [t for c in chunks for t in c.kvckpt["token_ids"]] == whole.kvckpt["token_ids"]
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert all(c.choices[0].finish_reason is None and c.usage is None for c in chunks[:-1])


def test_a_completions_logprobs_are_the_legacy_lists(url):
    reply = complete(url, logprobs=3)
    logprobs = reply.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(reply.kvckpt["token_ids"])
    # tokens of the same text are one key of a legacy top_logprobs object
    assert all(1 <= len(top) <= 3 for top in logprobs.top_logprobs) and logprobs.text_offset[0] == 0


def test_include_usage_adds_a_last_chunk_with_no_choices_and_the_usage(url):
    *replies, last = list(complete(url, stream=True, stream_options={"include_usage": True}))
    assert last.choices == [] and last.usage.completion_tokens == sum(len(c.kvckpt["token_ids"]) for c in replies)


def test_max_tokens_defaults_to_openais_16(url):
    assert complete(url, max_tokens=None, temperature=1, seed=3).usage.completion_tokens <= 16


def test_a_stop_string_ends_the_completion_and_is_left_out(url):
    whole = complete(url, max_tokens=30)
    text = whole.choices[0].text
    stop = text[len(text) // 2:len(text) // 2 + 2]
    reply = complete(url, max_tokens=30, stop=[stop])
    assert reply.choices[0].finish_reason == "stop" and reply.choices[0].text == text[:text.index(stop)]


def test_a_completion_is_listed_as_a_conversation_with_its_prompt(url):
    reply = complete(url)
    info = client(url).get(f"/kvckpt/conversations/{reply.kvckpt['conversation']}", cast_to=object)
    assert info["prompt"] == PROMPT and info["messages"] == [{"role": "assistant", "content": reply.choices[0].text}]


@pytest.mark.parametrize("body, param", [
    ({"max_tokens": 0}, "max_tokens"),
    ({"prompt": None}, "prompt"),
    ({"prompt": [1, 2, 3]}, "prompt"),
    ({"echo": True}, "echo"),
    ({"extra_body": {"messages": []}}, "messages"),
    ({"temperature": 3}, "temperature"),
], ids=["max_tokens", "no prompt", "token ids", "echo", "messages", "temperature"])
def test_a_bad_field_is_a_400_naming_it(url, body, param):
    with pytest.raises(openai.APIStatusError) as caught:
        complete(url, **body)
    error = caught.value
    assert error.status_code == 400 and error.body["param"] == param
    assert error.body["type"] == "invalid_request_error" and error.body["message"].startswith(param + ": expected")


def test_a_prompt_the_context_cannot_hold_is_a_400_context_length_exceeded(make_worker):
    with api_serving(make_worker(context=64)) as url:
        status, _, body = raw(url, "POST", "/v1/completions", b'{"prompt": "' + b"the sea " * 80 + b'"}')
    assert status == 400 and error_of(body)["code"] == "context_length_exceeded"
    assert error_of(body)["param"] == "prompt"


@pytest.fixture
def base_url(tiny_base_path, device):
    worker = EngineWorker(lambda: Engine(load_model(tiny_base_path, device), device, model_name="tiny",
                                         config=PRESETS["desktop"]))
    try:
        with api_serving(worker) as url:
            yield url
    finally:
        worker.close()


def test_a_base_model_answers_completions(base_url):
    assert complete(base_url).usage.completion_tokens >= 1


def test_a_base_model_refuses_chat_with_a_400_saying_so_in_one_line(base_url):
    status, _, body = raw(base_url, "POST", "/v1/chat/completions",
                          b'{"messages": [{"role": "user", "content": "hi"}]}')
    error = error_of(body)  # one line
    assert status == 400 and error["param"] == "messages" and error["type"] == "invalid_request_error"
    assert "a base model" in error["message"] and "/v1/completions" in error["message"]
