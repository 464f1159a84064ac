"""Checkpoints in object storage (moto's S3 server) with several writers and no shared lock: a writer killed with
SIGKILL mid-save, two writers of one name, gc beside a writer (FORMAT.md section 8)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvckpt_web import PagedKVCache
from kvckpt_web.bench.soak import LAYOUT, LIMITS, NAME, PAGES_PER_CHUNK, SEQ, STAGES, apply_stage
from kvckpt_web.durable.catalog import list_generations
from kvckpt_web.durable.restore import restore
from kvckpt_web.durable.retention import gc
from kvckpt_web.durable.save import save
from kvckpt_web.durable.verify import verify
from kvckpt_web.errors import ConflictError, CorruptionError, NotFoundError

from support.kvmodel import run

pytest.importorskip("obstore")
from kvckpt_web.stores.objects import ObjectStore  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
WORKER = r"""
import asyncio, os, signal, sys
from kvckpt_web.bench.soak import LAYOUT, LIMITS, NAME, PAGES_PER_CHUNK, SEQ, STAGES, apply_stage
from kvckpt_web.durable.save import save
from kvckpt_web.gpu.open import open_device
from kvckpt_web.kv.cache import PagedKVCache
from kvckpt_web.stores.objects import ObjectStore

url, seed, kill_step = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
steps = [0]

def fault(step):
    steps[0] += 1
    if steps[0] == kill_step:
        os.kill(os.getpid(), signal.SIGKILL)

async def main():
    cache = PagedKVCache(open_device(), LAYOUT, LIMITS)
    store = ObjectStore.from_url(url)  # endpoint and credentials from the AWS_* environment variables
    for stage in range(1, STAGES + 1):
        apply_stage(cache, seed, stage)
        store.fault = fault if stage == STAGES else None
        await save(cache, SEQ, store, NAME, app_state={"stage": stage}, keep=2, pages_per_chunk=PAGES_PER_CHUNK)
    print("DONE", flush=True)

asyncio.run(main())
"""


def stage_bytes(device: Any, seed: int) -> tuple[dict[int, list[bytes]], list[str]]:
    """The exported page groups after each stage of trial ``seed``, and the fault steps of the last save."""
    cache = PagedKVCache(device, LAYOUT, LIMITS)
    steps: list[str] = []
    store = ObjectStore(__import__("obstore").store.MemoryStore())
    try:
        out = {}
        for stage in range(1, STAGES + 1):
            apply_stage(cache, seed, stage)
            store.fault = steps.append if stage == STAGES else None
            run(save(cache, SEQ, store, NAME, keep=2, pages_per_chunk=PAGES_PER_CHUNK))
            out[stage] = [bytes(g) for g in run(cache.export_groups(SEQ))]
        return out, steps
    finally:
        cache.close()


def restored(device: Any, store: Any, generation: int | None = None) -> tuple[Any, list[bytes]]:
    target = PagedKVCache(device, LAYOUT, LIMITS)
    try:
        result = run(restore(store, NAME, target, generation=generation))
        return result, [bytes(g) for g in run(target.export_groups(SEQ))]
    finally:
        target.close()


SEED = 7


@pytest.fixture(scope="module")
def reference(device):
    return stage_bytes(device, SEED)


def kill_points(steps: list[str]) -> list[int]:
    """Kill points (1-based fault steps) of the last save: its first chunk, a middle chunk, its manifest (the last
    put before retention's deletes), its first delete, and past the end (the save completes)."""
    manifest = max(i for i, step in enumerate(steps) if step == "put")  # the record's put follows the manifest's
    puts = [i for i, step in enumerate(steps) if step == "put"]
    first_delete = steps.index("delete")
    return sorted({1, len(puts) // 2, puts[-2] + 1, manifest + 1, first_delete + 1, len(steps) + 1})


def test_a_writer_killed_at_any_point_of_a_save_leaves_the_previous_or_the_new_generation(device, s3_server, reference):
    expected, steps = reference
    assert steps.count("delete") > 0  # keep=2: the third save drops generation 1
    for point in kill_points(steps):
        url = s3_server.new_url()
        proc = subprocess.run([sys.executable, "-c", WORKER, url, str(SEED), str(point)],
                              env={**os.environ, **s3_server.env, "PYTHONPATH": str(REPO)},
                              capture_output=True, text=True, timeout=300)
        completed = proc.returncode == 0 and "DONE" in proc.stdout
        assert completed or proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
        store = s3_server.store(url)
        result, groups = restored(device, store)
        stage = result.app_state["stage"]
        assert stage in (STAGES - 1, STAGES), f"kill at step {point}"
        assert stage == STAGES or not completed
        assert groups == expected[stage], f"kill at step {point}"
        assert run(verify(store)).ok, f"kill at step {point}"
        older = [g.generation for g in run(list_generations(store)) if g.generation < result.generation]
        assert older, f"kill at step {point}: the generation before the newest is kept"
        assert restored(device, store, older[-1])[1] == expected[stage - 1]


class PausedBeforeCommit(ObjectStore):
    """An ObjectStore whose writer stops before it writes a manifest, until the test lets it go on."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reached = asyncio.Event()
        self.go_on = asyncio.Event()

    async def _put(self, key: str, data: memoryview, mode: str) -> bool:
        if key.startswith("manifests/"):
            self.reached.set()
            await self.go_on.wait()
        return await super()._put(key, data, mode)


async def stopped_before_commit(writer: PausedBeforeCommit, cache: PagedKVCache) -> "asyncio.Task[Any]":
    """A save of ``cache`` through ``writer``, started and stopped before its commit (its chunks written)."""
    saving = asyncio.create_task(save(cache, SEQ, writer, NAME, pages_per_chunk=PAGES_PER_CHUNK))
    await writer.reached.wait()
    return saving


def filled(device: Any, seed: int, stages: int) -> PagedKVCache:
    cache = PagedKVCache(device, LAYOUT, LIMITS)
    for stage in range(1, stages + 1):
        apply_stage(cache, seed, stage)
    return cache


def test_of_two_writers_of_one_generation_the_second_gets_a_conflict_and_nothing_is_lost(device, s3_server):
    url = s3_server.new_url()
    first, second = filled(device, 1, 2), filled(device, 2, 2)
    base = filled(device, 1, 1)
    try:
        run(save(base, SEQ, s3_server.store(url), NAME, app_state={"by": "base"}, pages_per_chunk=PAGES_PER_CHUNK))
        paused = PausedBeforeCommit(s3_server.obstore(url), url=url)

        async def race() -> None:
            late = await stopped_before_commit(paused, second)  # it chose generation 2 and wrote its chunks
            await save(first, SEQ, s3_server.store(url), NAME, app_state={"by": "first"},
                       pages_per_chunk=PAGES_PER_CHUNK)
            paused.go_on.set()
            with pytest.raises(ConflictError, match="generation 2 was committed by another writer"):
                await late

        run(race())
        store = s3_server.store(url)
        result, groups = restored(device, store)
        assert (result.generation, result.app_state["by"]) == (2, "first")  # not the second writer's
        assert groups == [bytes(g) for g in run(first.export_groups(SEQ))]
        assert restored(device, store, 1)[0].app_state["by"] == "base"
        assert run(verify(store)).ok
    finally:
        for cache in (first, second, base):
            cache.close()


def gc_beside_a_paused_writer(device: Any, s3_server: Any, grace_seconds: float) -> Any:
    """A writer stopped before its commit while gc (another store object, ``grace_seconds``) runs to its end; the
    store afterwards."""
    url = s3_server.new_url()
    cache = filled(device, 3, 2)
    try:
        writer = PausedBeforeCommit(s3_server.obstore(url), url=url)

        async def beside() -> None:
            saving = await stopped_before_commit(writer, cache)
            await gc(s3_server.store(url, grace_seconds=grace_seconds), keep=1)
            writer.go_on.set()
            await saving

        run(beside())
        return s3_server.store(url), [bytes(g) for g in run(cache.export_groups(SEQ))]
    finally:
        cache.close()


def test_gc_beside_a_writer_leaves_the_chunks_its_next_manifest_names(device, s3_server):
    store, expected = gc_beside_a_paused_writer(device, s3_server, grace_seconds=3600)
    assert restored(device, store)[1] == expected
    assert run(verify(store)).ok


def test_without_a_grace_period_gc_beside_a_writer_would_delete_the_chunks_of_its_commit(device, s3_server):
    store, _ = gc_beside_a_paused_writer(device, s3_server, grace_seconds=0)
    with pytest.raises((CorruptionError, NotFoundError)):
        restored(device, store)


def test_gc_collects_the_chunks_of_a_writer_that_never_committed_once_they_settled(device, s3_server):
    url = s3_server.new_url()
    cache = filled(device, 4, 2)
    try:
        writer = PausedBeforeCommit(s3_server.obstore(url), url=url)

        async def abandoned() -> None:
            saving = await stopped_before_commit(writer, cache)
            saving.cancel()  # the writer is gone before its commit
            with pytest.raises(asyncio.CancelledError):
                await saving

        run(abandoned())
        store = s3_server.store(url)
        assert run(gc(store)).deleted_chunks == 0  # young: the writer might still commit
        assert run(gc(s3_server.store(url, grace_seconds=0))).deleted_chunks > 0
        assert run(store.list_prefix("chunks/")) == []
    finally:
        cache.close()
