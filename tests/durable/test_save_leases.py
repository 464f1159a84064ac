"""A save under a claim held as a lease (object storage): it keeps its lease for as long as it writes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kvckpt_web.durable.save import save

from support.kvmodel import KVModel, run, small_limits
from support.store_suite import LEASE_RUN_OUT, Clock, try_claim

obstore = pytest.importorskip("obstore")
from kvckpt_web.stores.leases import DEFAULT_LEASE_SECONDS  # noqa: E402
from kvckpt_web.stores.objects import ObjectStore  # noqa: E402


@pytest.fixture
def model(make_model: Callable[..., KVModel]) -> KVModel:
    return make_model(limits=small_limits(max_total_seq_len=256), seed=11)


def test_a_save_whose_chunk_writes_outlast_its_lease_keeps_the_name_until_it_commits(model):
    clock, backing, asked = Clock(), obstore.store.MemoryStore(), []

    class Slow(ObjectStore):
        async def set_if_absent(self, key: str, data: Any) -> bool:
            if key.startswith("chunks/"):
                clock.offset += DEFAULT_LEASE_SECONDS / 40  # 16 at once: the 126 writes take 3 leases
                if not asked and clock.offset > LEASE_RUN_OUT:  # other writers ask, mid-save (a few at once)
                    asked.append(await try_claim(ObjectStore(backing, clock=clock), "chat"))
            return await super().set_if_absent(key, data)

    model.add(0, 50)
    for _ in range(4):
        model.append({0: 50})  # 250 tokens: 63 pages of 2 layers, a chunk each
    store = Slow(backing, clock=clock)

    async def body() -> None:
        async with store.claim("chat"):
            await save(model.cache, 0, store, "chat", pages_per_chunk=1)

    run(body())
    assert clock.offset > 2 * LEASE_RUN_OUT and asked and set(asked) == {"refused"}
