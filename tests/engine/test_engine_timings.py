"""Where a turn's time went (``usage.timings``): the restore, the prefill, the saves and the decode, told apart and
adding up to what the caller waited.

The clock is the test's (``time.perf_counter``, which the engine and its saves read, replaced): every reading is a
millisecond of work, a manifest's commit takes what the store says, and the device's work (the double's forwards)
takes what the test says, paid by whichever reads the device first, as a queued GPU's is.
"""

from __future__ import annotations

import pytest

from kvckpt_web import MemoryStore

from lm_double import DoubleLM, DoubleLogits
from support.kvmodel import run

GREEDY = {"temperature": 0.0, "max_tokens": 12}
HISTORY = [{"role": "user", "content": "tell me about the sea, the wind and the ships on it."}]
COMMIT_S = 10.0
"""Seconds each manifest's commit takes."""
FORWARD_S = 100.0
"""Seconds of device work each forward queues."""


class Clock:
    """``time.perf_counter`` of the test: every reading is a millisecond of work; ``queued`` device seconds are
    paid by the next reading of the device (:meth:`device_read`)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.queued = 0.0

    def __call__(self) -> float:
        self.now += 0.001
        return self.now

    def device_read(self) -> None:
        self.now += self.queued
        self.queued = 0.0


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr("time.perf_counter", clock)
    return clock


def slow_store(clock: Clock) -> MemoryStore:
    """A store whose manifest commits take :data:`COMMIT_S`, and whose chunk writes read the device (a save maps
    the pages it stores, waiting for the work queued before)."""

    class Slow(MemoryStore):
        async def _set(self, key, data):
            if key.startswith("manifests/"):
                clock.now += COMMIT_S
            else:
                clock.device_read()
            await super()._set(key, data)

    return Slow()


def queued_model(clock: Clock) -> DoubleLM:
    """The double, each forward pass queueing :data:`FORWARD_S` of device work that reading its logits waits for."""

    class Logits(DoubleLogits):
        async def argmax(self):
            clock.device_read()
            return await super().argmax()

        async def top_k(self, k):
            clock.device_read()
            return await super().top_k(k)

    class Queued(DoubleLM):
        async def forward_batch(self, cache, runs):
            batch = await super().forward_batch(cache, runs)
            clock.queued += FORWARD_S
            return [Logits(logits.values) for logits in batch]

    return Queued(max_context=1024)


def test_restore_prefill_saves_and_decode_add_up_to_the_time_the_caller_waited(make_engine, clock):
    store = slow_store(clock)
    first = run(make_engine(store=store).chat(HISTORY, **GREEDY))
    engine = make_engine(store=store)  # a restarted process: the history comes back from the store
    began = clock()
    reply = run(engine.chat([*HISTORY, {"role": "assistant", "content": first.text},
                             {"role": "user", "content": "and the wind?"}], **GREEDY))
    waited = clock() - began
    timings = reply.usage.timings
    assert timings.restore_s > 0 and timings.prefill_s > 0 and timings.decode_s > 0 and timings.save_s > COMMIT_S
    assert timings.restore_s + timings.prefill_s + timings.save_s + timings.decode_s == pytest.approx(waited,
                                                                                                     abs=0.02)


def test_each_save_is_timed_apart_from_the_device_work_queued_before_it(make_engine, clock):
    saves = []
    engine = make_engine(store=slow_store(clock), model=queued_model(clock),
                         on_save=lambda name, result: saves.append(result))
    reply = run(engine.chat(HISTORY, **GREEDY))
    timings = reply.usage.timings
    forwards = len(engine.model.forwards)
    prefill_forwards = forwards - (len(reply.token_ids) - 1)
    assert len(saves) > 3 and prefill_forwards > 3  # saves during the prefill, each after a prompt chunk
    assert timings.save_s == pytest.approx(COMMIT_S * len(saves), abs=0.1)  # none waited for a forward
    assert timings.prefill_s == pytest.approx(FORWARD_S * prefill_forwards, abs=0.2)
    assert timings.decode_s == pytest.approx(FORWARD_S * (forwards - prefill_forwards), abs=0.2)
