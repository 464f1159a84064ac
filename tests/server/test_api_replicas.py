"""Replicas of ``kvckpt serve --api`` on one object store (moto's S3 server): any replica answers any
conversation's next turn from the stored prefix, and uses the prefix index records the others write."""

from __future__ import annotations

import os

import pytest
from api_helpers import SEEDED, USER, client, serving_api

pytest.importorskip("obstore")

SECOND = {"role": "user", "content": "and the wind?"}


@pytest.fixture
def replica(s3_server, tiny_llama_path):
    """``replica(url, *flags)``: ``kvckpt serve --api`` of the tiny llama on store ``url`` of the S3 server, as a
    context manager (its base URL and process)."""
    env = {**os.environ, **s3_server.env}

    def serve(url: str, *flags: str):
        return serving_api("--model", str(tiny_llama_path), "--model-name", "tiny", "--store", url, *flags, env=env)

    return serve


def chat(url, messages, **kwargs):
    return client(url).chat.completions.create(model="tiny", messages=messages, **{**SEEDED, "max_tokens": 12},
                                               **kwargs)


def test_a_turn_written_by_one_replica_is_continued_by_another_from_the_records_it_wrote_since(s3_server, replica):
    store = s3_server.new_url()
    with replica(store) as (a, _), replica(store) as (b, _):
        chat(b, [{"role": "user", "content": "hello"}])  # B has read the prefix index, which held nothing then
        first = chat(a, [USER])
        messages = [USER, {"role": "assistant", "content": first.choices[0].message.content}, SECOND]
        second = chat(b, messages)
    assert second.kvckpt["conversation"] == first.kvckpt["conversation"]
    history = first.usage.prompt_tokens + first.usage.completion_tokens  # A's reply ended without an EOS
    assert first.choices[0].finish_reason == "length"
    assert second.usage.prompt_tokens_details.cached_tokens == history - 1  # its last token has no K/V yet
    assert second.usage.timings["restore_s"] > 0  # from A's checkpoint in the store, found by A's index record
