"""Retention counts only generations whose chunks verify: after a save as in gc, and gc judges without the lock.

A generation whose chunk was bit-flipped (same size) must never count as restorable, whoever wrote it; a
chunk a restore found damaged is no longer trusted. gc reads and hashes chunks without holding the store's
lock, and what it then deletes under the lock is judged again on the store as it is then: the test stores
here run a save, or a deletion, at the moment gc asks for the lock (between its two phases).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from kvckpt_web.durable.catalog import list_generations
from kvckpt_web.durable.ledger import Ledger
from kvckpt_web.durable.restore import restore
from kvckpt_web.durable.retention import gc
from kvckpt_web.durable.save import save
from kvckpt_web.durable.verify import verify
from kvckpt_web.errors import CorruptionError
from kvckpt_web.stores.memory import MemoryStore

from support.kvmodel import KVModel, run, small_limits

PPC = 4  # pages per chunk: 16 tokens per chunk with the small layout
LIMITS = small_limits(max_total_seq_len=256, prefill_chunk_size=256)


@pytest.fixture
def model(make_model: Callable[..., KVModel]) -> KVModel:
    return make_model(limits=LIMITS, seed=3)


@pytest.fixture
def target(make_cache: Callable[..., Any]) -> Any:
    return make_cache(limits=LIMITS)


def saved(model: KVModel, store: MemoryStore, **kwargs: Any) -> Any:
    return run(save(model.cache, 0, store, "s", pages_per_chunk=PPC, **kwargs))


def restored(store: MemoryStore, cache: Any, **kwargs: Any) -> list[bytes]:
    result = run(restore(store, "s", cache, **kwargs))
    return [bytes(g) for g in run(cache.export_groups(result.seq_id))]


def key_of(generation: int) -> str:
    return f"manifests/s/{generation:020d}"


def chunks_of(store: MemoryStore) -> dict[int, set[str]]:
    return {info.generation: set(info.chunk_keys) for info in run(list_generations(store, "s"))}


def flip_a_byte(store: MemoryStore, key: str) -> None:
    """Damage that keeps the size: one bit of the value under ``key`` flipped."""
    raw = bytearray(store._data[key])
    raw[len(raw) // 2] ^= 0x01
    store._data[key] = bytes(raw)


# ----- retention after a save ---------------------------------------------------------------------------------


@pytest.mark.parametrize("process", ["same", "new"])
def test_a_save_after_resuming_from_a_bit_flipped_chunk_keeps_the_older_intact_generation(model, target, process):
    model.add(0, 40)  # 2 full chunks and a partial one per group
    store = MemoryStore()
    saved(model, store)
    first = model.expected_groups(0)
    model.append({0: 4})
    saved(model, store)  # generation 2: the partial chunks grew, the full ones are shared with generation 1
    flip_a_byte(store, sorted(chunks_of(store)[2] - chunks_of(store)[1])[0])
    if process == "new":
        Ledger.of(store).forget()
    with pytest.raises(CorruptionError):
        run(restore(store, "s", target))  # the resume finds the damage and replays: the cache holds the K/V
    model.append({0: 20})
    result = saved(model, store, keep=2)
    assert result.generation == 3 and result.deleted_manifests == ()
    assert any(w.startswith(f"{key_of(2)}: damaged, kept as evidence") for w in result.warnings), result.warnings
    assert restored(store, target, generation=1) == first
    target.remove_sequence(0)
    assert restored(store, target) == model.expected_groups(0)


def test_a_save_does_not_reuse_a_chunk_a_restore_found_damaged_unread(model, target):
    model.add(0, 40)
    store = MemoryStore()
    saved(model, store)
    shared = sorted(chunks_of(store)[1])[0]  # a full chunk: the next save would keep it without reading it
    flip_a_byte(store, shared)
    with pytest.raises(CorruptionError, match=shared):
        run(restore(store, "s", target))
    model.append({0: 3})
    result = saved(model, store)
    assert any(w.startswith(shared) and "rewritten" in w for w in result.warnings), result.warnings
    assert restored(store, target) == model.expected_groups(0)


def test_retention_reads_each_chunk_it_verified_once(model):
    store = BetweenPhases()
    generations_saved(model, store)
    Ledger.of(store).forget()  # a new process: it trusts none of the stored chunks
    store.reads.clear()
    for _ in range(2):
        model.append({0: 5})
        saved(model, store, keep=2)
    keys = [key for key, _ in store.reads]
    assert keys and len(keys) == len(set(keys)), keys


# ----- gc: judged without the lock, collected under it --------------------------------------------------------


def generations_saved(model: KVModel, store: MemoryStore) -> dict[int, list[bytes]]:
    """Generations 1 to 3 of "s", 5 tokens apart (each with chunks of its own), all kept; what each holds."""
    model.add(0, 40)
    expected = {}
    for generation in (1, 2, 3):
        model.append({0: 5})
        saved(model, store, keep=10)
        expected[generation] = model.expected_groups(0)
    return expected


class BetweenPhases(MemoryStore):
    """A store that runs ``hook`` once, the first time its lock is asked for (by gc: after it judged, before
    it collects), and records each chunk read."""

    def __init__(self) -> None:
        super().__init__()
        self.hook: Callable[[], Awaitable[None]] | None = None
        self.reads: list[tuple[str, bool]] = []
        """Each chunk read (not a size asked for), and whether the lock was held then."""

    def lock(self, timeout: float | None = None) -> Any:
        hook, self.hook = self.hook, None
        inner = super().lock(timeout)
        if hook is None:
            return inner

        @asynccontextmanager
        async def after_hook() -> Any:
            await hook()
            async with inner:
                yield

        return after_hook()

    async def _get_into(self, key: str, out: memoryview) -> int | None:
        if key.startswith("chunks/") and len(out):
            self.reads.append((key, self._lock_flag.held))
        return await super()._get_into(key, out)


def test_gc_reads_and_hashes_chunks_without_holding_the_store_lock(model):
    store = BetweenPhases()
    generations_saved(model, store)
    store.reads.clear()
    result = run(gc(store, keep=1))
    assert result.deleted_manifests == (key_of(1), key_of(2))
    assert store.reads and not any(locked for _, locked in store.reads)


def test_a_save_committed_while_gc_judges_keeps_every_chunk_its_manifest_names(model, target):
    model.add(0, 24)
    store = BetweenPhases()
    saved(model, store)
    model.append({0: 30})
    real_set = store._set

    async def no_manifests(key: str, data: memoryview) -> None:
        if key.startswith("manifests/"):
            raise OSError(28, "No space left on device")
        await real_set(key, data)

    store._set = no_manifests  # type: ignore[method-assign]
    with pytest.raises(OSError):
        saved(model, store)  # its chunks stay behind, unreferenced
    store._set = real_set  # type: ignore[method-assign]
    orphans = set(run(store.list_prefix("chunks/"))) - chunks_of(store)[1]
    assert orphans

    async def the_save_again() -> None:
        await save(model.cache, 0, store, "s", pages_per_chunk=PPC)

    store.hook = the_save_again  # commits generation 2, which names the orphans, between gc's two phases
    result = run(gc(store, keep=1))
    assert orphans <= chunks_of(store)[2]
    assert result.deleted_chunks == 0 and set(result.kept_manifests) == {key_of(1), key_of(2)}
    assert result.kept_reasons[key_of(2)] == "committed while gc ran (not judged)"
    assert restored(store, target) == model.expected_groups(0)
    assert run(verify(store)).ok


def test_gc_drops_nothing_of_a_name_whose_counted_generation_went_while_it_judged(model, target):
    store = BetweenPhases()
    expected = generations_saved(model, store)

    async def another_writer_deletes_the_newest() -> None:
        await store.delete(key_of(3))

    store.hook = another_writer_deletes_the_newest  # gc counted generation 3 and would drop 1 and 2
    result = run(gc(store, keep=1))
    assert result.deleted_manifests == ()
    assert result.kept_reasons[key_of(2)].startswith("not collected: a generation counted as restorable changed")
    assert restored(store, target) == expected[2]
