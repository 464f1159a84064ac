"""OpenAI request bodies: the standard parameters a client sends with a value that changes nothing are accepted,
any other value of them refused naming the key."""

from __future__ import annotations

import pytest

from kvckpt_web.engine.request import ChatRequest, CompletionRequest
from kvckpt_web.errors import FieldError

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}

NEUTRAL_CHAT = {"logprobs": False, "top_logprobs": 0, "response_format": {"type": "text"}, "tools": [],
                "tool_choice": "none", "parallel_tool_calls": True, "metadata": {"tag": "a"}, "logit_bias": {}}


@pytest.mark.parametrize("key", NEUTRAL_CHAT)
def test_a_standard_parameter_that_changes_nothing_is_accepted(key):
    assert ChatRequest.from_openai({**CHAT, key: NEUTRAL_CHAT[key]}) == ChatRequest.from_openai(CHAT)


@pytest.mark.parametrize("key", NEUTRAL_CHAT)
def test_a_standard_parameter_given_as_null_is_accepted(key):
    assert ChatRequest.from_openai({**CHAT, key: None}) == ChatRequest.from_openai(CHAT)


CANNOT_HONOUR = [("top_logprobs", False), ("tools", [{"type": "function"}]),
                 ("tool_choice", "auto"), ("parallel_tool_calls", "yes"), ("metadata", "tag"),
                 ("logit_bias", {"42": 5}), ("store", "no")]


@pytest.mark.parametrize("key, value", CANNOT_HONOUR, ids=[f"{k}={v}" for k, v in CANNOT_HONOUR])
def test_a_value_the_engine_cannot_honour_is_refused_naming_the_key(key, value):
    with pytest.raises(FieldError) as info:
        ChatRequest.from_openai({**CHAT, key: value})
    assert info.value.field == key


def test_a_completions_neutral_values_are_accepted_and_others_refused_naming_the_key():
    body = {"model": "m", "prompt": "Paris is", "max_tokens": 4}
    neutral = {"echo": False, "best_of": 1, "logprobs": None, "suffix": None}
    assert CompletionRequest.from_openai({**body, **neutral}) == CompletionRequest.from_openai(body)
    for key, value in {"echo": True, "best_of": 2, "suffix": "!"}.items():
        with pytest.raises(FieldError) as info:
            CompletionRequest.from_openai({**body, key: value})
        assert info.value.field == key


def test_presence_and_frequency_penalties_are_read_from_chat_and_completion_bodies():
    penalties = {"presence_penalty": 0.5, "frequency_penalty": -1}
    chat = ChatRequest.from_openai({**CHAT, **penalties})
    completion = CompletionRequest.from_openai({"model": "m", "prompt": "Paris is", **penalties})
    for request in (chat, completion):
        assert (request.presence_penalty, request.frequency_penalty) == (0.5, -1.0)
        assert request.settings_json()["frequency_penalty"] == -1.0


@pytest.mark.parametrize("key", ["presence_penalty", "frequency_penalty"])
@pytest.mark.parametrize("value", [2.5, -2.1, "1", True])
def test_a_penalty_outside_minus_2_to_2_is_refused_naming_the_key(key, value):
    with pytest.raises(FieldError) as info:
        ChatRequest.from_openai({**CHAT, key: value})
    assert info.value.field == key


def test_chat_logprobs_with_top_logprobs_ask_for_that_many_alternatives():
    assert ChatRequest.from_openai({**CHAT, "logprobs": True, "top_logprobs": 3}).logprobs == 3
    assert ChatRequest.from_openai({**CHAT, "logprobs": True}).logprobs == 0
    assert ChatRequest.from_openai({**CHAT, "logprobs": False, "top_logprobs": 0}).logprobs is None


@pytest.mark.parametrize("body, key", [
    ({"top_logprobs": 2}, "top_logprobs"), ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"logprobs": 1}, "logprobs"), ({"logprobs": "yes"}, "logprobs"),
], ids=["top-without-logprobs", "top-21", "logprobs-1", "logprobs-str"])
def test_chat_logprobs_the_engine_cannot_give_are_refused_naming_the_key(body, key):
    with pytest.raises(FieldError) as info:
        ChatRequest.from_openai({**CHAT, **body})
    assert info.value.field == key


def test_a_completions_logprobs_count_is_read_and_bounded():
    body = {"model": "m", "prompt": "Paris is"}
    assert CompletionRequest.from_openai({**body, "logprobs": 2}).logprobs == 2
    with pytest.raises(FieldError) as info:
        CompletionRequest.from_openai({**body, "logprobs": 21})
    assert info.value.field == "logprobs"


def test_a_developer_message_is_accepted():
    request = ChatRequest.from_openai({"messages": [{"role": "developer", "content": "Be brief."},
                                                    {"role": "user", "content": "hi"}]})
    assert request.messages[0].role == "developer"


def test_a_json_response_format_is_kept_and_text_is_none():
    assert ChatRequest.from_openai({**CHAT, "response_format": {"type": "json_object"}}).response_format == {
        "type": "json_object"}
    assert ChatRequest.from_openai({**CHAT, "response_format": {"type": "text"}}).response_format is None


def test_a_schema_keyword_not_held_to_is_refused_naming_it():
    schema = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 3}}}
    with pytest.raises(FieldError) as info:
        ChatRequest.from_openai({**CHAT, "response_format": {"type": "json_schema",
                                                             "json_schema": {"name": "a", "schema": schema}}})
    assert info.value.field == "response_format.json_schema.schema.properties.n.maximum"


def test_a_json_response_format_with_a_prefill_is_refused():
    body = {**CHAT, "messages": [*CHAT["messages"], {"role": "assistant", "content": "{"}],
            "response_format": {"type": "json_object"}}
    with pytest.raises(FieldError) as info:
        ChatRequest.from_openai(body)
    assert info.value.field == "response_format"


@pytest.mark.parametrize("value, stored", [(True, True), (None, True), (False, False)])
def test_store_says_whether_the_reply_is_written_to_the_store(value, stored):
    assert ChatRequest.from_openai({**CHAT, "store": value}).store is stored


def test_store_false_with_a_named_conversation_is_refused_naming_store():
    with pytest.raises(FieldError) as error:
        ChatRequest.from_openai({**CHAT, "store": False, "conversation": "mine"})
    assert error.value.field == "store"
