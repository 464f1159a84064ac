"""One owner of the cache: a restore that yields to the event loop half-way (as the browser's uploads do) and a
reply being generated beside it both finish, with the tokens each gives alone."""

from __future__ import annotations

import asyncio

import pytest

from kvckpt_web import MemoryStore

from support.kvmodel import run

GREEDY = {"temperature": 0.0, "max_tokens": 10}
A = [{"role": "user", "content": "tell me about the sea."}]
B = [{"role": "user", "content": "what is a boat?"}]


@pytest.fixture
def yielding_device(unmapped_device, monkeypatch):
    """The unmapped device (uploads go through staging, as on a GPU or in the browser), whose every upload
    yields to the event loop a few times before it runs, as the browser's awaited map does; and the list
    of the uploads started."""
    real = unmapped_device.upload
    uploads = []

    async def upload(*args, **kwargs):
        uploads.append(args)
        for _ in range(5):
            await asyncio.sleep(0)
        return await real(*args, **kwargs)

    monkeypatch.setattr(unmapped_device, "upload", upload)
    return unmapped_device, uploads


def test_a_restore_that_yields_and_a_reply_in_progress_both_finish_with_their_own_tokens(make_engine,
                                                                                         yielding_device):
    device, uploads = yielding_device
    store = MemoryStore()

    async def alone():
        engine = make_engine(on=device)
        first = await engine.chat(A, **GREEDY)
        again = await engine.chat([*A, {"role": "assistant", "content": first.text}, *B], **GREEDY)
        b = await engine.chat(B, **GREEDY)
        return again.token_ids, b.token_ids

    async def together():
        writer = make_engine(store=store, on=device)
        first = await writer.chat(A, **GREEDY)  # conversation A committed to the store
        await writer.close()
        engine = make_engine(store=store, on=device)  # a restarted process: A's K/V come back from the store
        stream = await engine.chat(B, stream=True, **GREEDY)
        b_ids, again, during = [], None, 0
        async for chunk in stream:
            b_ids += chunk.token_ids
            if again is None:  # B is mid-reply: restore A (uploads that yield) beside it
                started = len(uploads)
                again = asyncio.ensure_future(
                    engine.chat([*A, {"role": "assistant", "content": first.text}, *B], **GREEDY))
                while len(uploads) == started:  # B's next step comes while A's import is half-way through
                    await asyncio.sleep(0)
                during = len(b_ids)
        reply = await again
        return reply, tuple(b_ids), during

    want_again, want_b = run(alone())
    reply, b_ids, during = run(together())
    assert len(b_ids) > during  # B stepped on while A's restore was uploading
    assert reply.usage.cached_tokens > 0 and reply.usage.timings.restore_s > 0
    assert reply.token_ids == want_again and b_ids == want_b
