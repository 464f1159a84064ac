"""``kvckpt serve --api``'s policy for conversations nobody named: enforced when the server starts and at the end
of a reply once ``check_every_s`` seconds passed since it last was, and listed by ``GET /v1/kvckpt/retention``.
The server's clock is the test's, which also dates the checkpoints."""

from __future__ import annotations

import asyncio
import json

import pytest
from api_helpers import USER, GatedModel, api_serving, client, raw
from serve_helpers import PATIENCE

from kvckpt_web import ChatCompletion, ChatRequest, FileStore
from kvckpt_web.durable.keys import CHUNKS, manifest_prefix
from kvckpt_web.engine.unnamed import UnnamedRetention
from kvckpt_web.server.api import Api

from support.clocks import WallClock
from support.counting_store import CountingStore

HOUR = 3600.0
SHORT = {"temperature": 0.0, "max_tokens": 3}


@pytest.fixture
def clock(monkeypatch):
    return WallClock.dating_checkpoints(monkeypatch)


def got(url: str, path: str) -> dict:
    status, _, body = raw(url, "GET", path)
    assert status == 200, body
    return json.loads(body)


def names(url: str) -> list[str]:
    return [c["name"] for c in got(url, "/v1/kvckpt/conversations")["data"]]


def ask(url: str, text: str = USER["content"], **settings) -> str:
    return client(url).chat.completions.create(model="tiny", messages=[{"role": "user", "content": text}], **SHORT,
                                               **settings).kvckpt["conversation"]


def test_after_a_reply_unnamed_conversations_older_than_the_ttl_are_deleted(make_worker, tmp_path, clock):
    with api_serving(make_worker(store=FileStore(tmp_path / "s")), retention=UnnamedRetention(ttl_s=HOUR),
                     clock=clock) as url:
        old = ask(url)
        mine = ask(url, extra_body={"conversation": "mine"})
        clock.now += 2 * HOUR
        new = ask(url, "what is a boat?")
        assert sorted(names(url)) == sorted([mine, new]) and old not in names(url)


def test_the_retention_call_lists_the_policy_and_what_it_keeps_and_why(make_worker, tmp_path, clock):
    policy = UnnamedRetention(ttl_s=HOUR, max_bytes=10 << 20)
    with api_serving(make_worker(store=FileStore(tmp_path / "s")), retention=policy, clock=clock) as url:
        old = ask(url)
        ask(url, extra_body={"conversation": "mine"})
        clock.now += 2 * HOUR
        listing = got(url, "/v1/kvckpt/retention")
    assert listing["object"] == "kvckpt.retention" and listing["policy"] == {"ttl_s": HOUR, "max_bytes": 10 << 20,
                                                                                     "check_every_s": 60.0}
    rows = {row["name"]: row for row in listing["data"]}
    assert rows[old]["keep"] is False and "more than 3600 s ago" in rows[old]["reason"]
    assert rows["mine"]["keep"] is True and rows["mine"]["named"] is True and rows["mine"]["bytes"] > 0


def test_when_the_server_starts_it_deletes_what_the_policy_does_not_keep(make_worker, tmp_path, clock):
    store = tmp_path / "s"
    with api_serving(make_worker(store=FileStore(store))) as url:
        old = ask(url)
        assert names(url) == [old]
    clock.now += 2 * HOUR
    with api_serving(make_worker(store=FileStore(store)), retention=UnnamedRetention(ttl_s=HOUR),
                     clock=clock) as url:
        assert names(url) == []


def test_many_expired_conversations_at_start_cost_one_pass_over_the_chunks(make_worker, clock):
    store = CountingStore()
    with api_serving(make_worker(store=store)) as url:
        for text in ("tell me about the sea.", "what is a boat?", "and the wind?"):
            ask(url, text)
    clock.now += 2 * HOUR
    store.reset()
    with api_serving(make_worker(store=store), retention=UnnamedRetention(ttl_s=HOUR), clock=clock) as url:
        assert store.calls["list", CHUNKS] == 1 and names(url) == []


def test_a_reply_within_the_interval_after_the_last_check_reads_no_manifest_for_the_policy(make_worker, clock):
    store = CountingStore()
    with api_serving(make_worker(store=store), retention=UnnamedRetention(ttl_s=HOUR, check_every_s=60),
                     clock=clock) as url:
        # a completion no chat continues: only the policy reads its manifests during a chat's reply
        other = client(url).completions.create(model="tiny", prompt="zebra quartz", **SHORT).kvckpt["conversation"]
        ask(url)
        clock.now += 59
        store.reset()
        ask(url, "what is a boat?")
        assert store.calls["list", manifest_prefix(other)] == 0
        clock.now += 1
        store.reset()
        ask(url, "and the wind?")
        assert store.calls["list", manifest_prefix(other)] > 0


def test_with_no_interval_the_end_of_every_reply_checks_the_policy(make_worker, tmp_path, clock):
    policy = UnnamedRetention(ttl_s=0, check_every_s=0)
    with api_serving(make_worker(store=FileStore(tmp_path / "s")), retention=policy, clock=clock) as url:
        old = ask(url)
        clock.now += 1
        new = ask(url, "what is a boat?")
        assert names(url) == [new] and old != new


def test_a_request_waiting_in_the_queue_keeps_the_unnamed_conversation_it_continues(make_worker, tiny_llama,
                                                                                    tmp_path, clock):
    gated = GatedModel(tiny_llama.model, after=1 << 30, blocking=False)
    api = Api(make_worker(store=FileStore(tmp_path / "s"), model=gated, sequences=1),
              retention=UnnamedRetention(ttl_s=HOUR, check_every_s=0), clock=clock)

    async def replied(job):
        await job.result()
        return ChatCompletion.from_chunks([chunk async for chunk in job.items()])

    async def body():
        first = await replied(api.submit_reply(ChatRequest(messages=[USER], **SHORT)))
        clock.now += 2 * HOUR
        gated.after = gated.forwards
        running = api.submit_reply(ChatRequest(messages=[USER], conversation="mine", **SHORT))
        await asyncio.to_thread(gated.reached.wait, PATIENCE)  # the only sequence is taken
        retention = api.retain()  # queued first: it runs while the request after it waits
        following = api.submit_reply(ChatRequest(messages=[USER, {"role": "assistant", "content": first.text},
                                                           {"role": "user", "content": "and the wind?"}], **SHORT))
        gated.open()
        await replied(running)
        return first, await retention.result(), await replied(following)

    first, judged, following = asyncio.run(body())
    [retained] = [r for r in judged if r.name == first.conversation]
    assert retained.keep and retained.reason == "a request waiting in the queue continues it"
    assert following.conversation == first.conversation and following.usage.cached_tokens > 0
