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


CANNOT_HONOUR = [("logprobs", True), ("top_logprobs", 2), ("top_logprobs", False),
                 ("tools", [{"type": "function"}]),
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
    for key, value in {"echo": True, "best_of": 2, "logprobs": 0, "suffix": "!"}.items():
        with pytest.raises(FieldError) as info:
            CompletionRequest.from_openai({**body, key: value})
        assert info.value.field == key


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
