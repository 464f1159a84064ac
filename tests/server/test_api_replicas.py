"""Replicas of ``kvckpt serve --api`` on one object store (moto's S3 server): any replica answers any
conversation's next turn from the stored prefix, and uses the prefix index records the others write."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time

import pytest
from api_helpers import SEEDED, USER, client, error_of, raw, serving_api
from serve_helpers import PATIENCE

from kvckpt_web.stores.leases import CLOCK_SKEW_SECONDS, DEFAULT_LEASE_SECONDS

pytest.importorskip("obstore")

SECOND = {"role": "user", "content": "and the wind?"}
THIRD = {"role": "user", "content": "and then?"}


@pytest.fixture
def replica(s3_server, tiny_llama_path):
    """``replica(url, *flags)``: ``kvckpt serve --api`` of the tiny llama on store ``url`` of the S3 server, as a
    context manager (its base URL and process)."""
    env = {**os.environ, **s3_server.env}

    def serve(url: str, *flags: str):
        return serving_api("--model", str(tiny_llama_path), "--model-name", "tiny", "--store", url, *flags, env=env)

    return serve


def chat(url, messages, **kwargs):
    return client(url).chat.completions.create(model="tiny", messages=messages, **{**SEEDED, "max_tokens": 12,
                                                                                   **kwargs})


def test_turns_alternating_between_replicas_come_from_each_others_checkpoints_found_by_index_records(
        s3_server, replica):
    store = s3_server.new_url()
    with replica(store) as (a, _), replica(store) as (b, _):
        chat(b, [{"role": "user", "content": "hello"}])  # B has read the prefix index, which held nothing then
        first = chat(a, [USER])
        messages = [USER, {"role": "assistant", "content": first.choices[0].message.content}, SECOND]
        second = chat(b, messages)
        messages += [{"role": "assistant", "content": second.choices[0].message.content}, THIRD]
        third = chat(a, messages)  # back on A, whose cache holds the first turn: B's turn comes from the store
    assert first.kvckpt["conversation"] == second.kvckpt["conversation"] == third.kvckpt["conversation"]
    assert first.choices[0].finish_reason == second.choices[0].finish_reason == "length"  # no EOS to leave out
    # the history's K/V from the other replica's checkpoint (all but the last token, whose K/V come with the turn)
    assert second.usage.prompt_tokens_details.cached_tokens == first.usage.total_tokens - 1
    assert third.usage.prompt_tokens_details.cached_tokens == second.usage.total_tokens - 1
    assert second.usage.timings["restore_s"] > 0 and third.usage.timings["restore_s"] > 0


def test_a_conversation_one_replica_writes_is_refused_by_another_with_409_naming_it_until_its_reply_ends(
        s3_server, replica):
    store = s3_server.new_url()
    story = {"conversation": "story"}
    with replica(store) as (a, a_process), replica(store) as (b, _):
        stream = chat(a, [USER], stream=True, max_tokens=400, extra_body=story)
        chunks = iter(stream)
        [next(chunks) for _ in range(3)]
        os.kill(a_process.pid, signal.SIGSTOP)  # A, mid-reply, holds the conversation's claim
        try:
            status, headers, body = raw(b, "POST", "/v1/chat/completions",
                                        json.dumps({"model": "tiny", "messages": [USER], **story}).encode())
        finally:
            os.kill(a_process.pid, signal.SIGCONT)
        reply = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        error = error_of(body)
        assert status == 409 and error["code"] == "conflict"
        assert f"'story' of {store}: held by writer '{socket.gethostname()} pid {a_process.pid}'" in error["message"]
        assert re.search(r"until \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ unless renewed", error["message"])
        assert 1 <= int(headers["retry-after"]) <= DEFAULT_LEASE_SECONDS + CLOCK_SKEW_SECONDS
        messages = [USER, {"role": "assistant", "content": reply}, SECOND]
        second = chat(b, messages, extra_body=story)  # A's reply ended: its claim was released
    assert second.kvckpt["conversation"] == "story" and second.usage.prompt_tokens_details.cached_tokens > 0


def test_a_reply_cut_by_kill_9_of_one_replica_is_resumed_by_another_once_its_lease_ran_out(s3_server, replica):
    with replica(s3_server.new_url()) as (url, _):
        want = chat(url, [USER], max_tokens=80)
    assert len(want.kvckpt["token_ids"]) == 80  # the reply outlasts the kill point by far
    store = s3_server.new_url()
    with replica(store, "--lease", "1") as (a, a_process), replica(store, "--lease", "1") as (b, _):
        stream = chat(a, [USER], stream=True, max_tokens=80)
        chunks = iter(stream)
        name = [next(chunks) for _ in range(5)][0].kvckpt["conversation"]
        a_process.kill()  # SIGKILL, mid-reply: no save, no release of its claim
        a_process.wait(PATIENCE)
        stream.response.close()
        status, headers, body = raw(b, "POST", f"/v1/kvckpt/conversations/{name}/resume")
        assert status == 409 and f"pid {a_process.pid}'" in error_of(body)["message"]
        assert int(headers["retry-after"]) <= 1 + CLOCK_SKEW_SECONDS + 1
        time.sleep(int(headers["retry-after"]))  # the lease A no longer renews runs out, as B said
        status, _, body = raw(b, "POST", f"/v1/kvckpt/conversations/{name}/resume")
    resumed = json.loads(body)
    assert status == 200 and resumed["kvckpt"]["token_ids"] == want.kvckpt["token_ids"]
    assert resumed["choices"][0]["message"]["content"] == want.choices[0].message.content
