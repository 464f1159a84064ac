"""Readers beside writers: restore, verify and inspect report no damage while other processes save and collect.

A saver process commits a new generation of one name again and again, keeping one (so each save's
retention deletes the generation before it), and a gc process collects the same store in a loop. This
process meanwhile restores the newest generation, verifies the store and describes it, through a
read-only and a writable FileStore, for a few seconds. The store is intact all along, so every
restore must succeed and every verify and description must find nothing wrong.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvckpt_web import PagedKVCache
from kvckpt_web.cli.store_commands import describe_store
from kvckpt_web.durable.catalog import list_generations
from kvckpt_web.durable.restore import restore
from kvckpt_web.durable.verify import verify
from kvckpt_web.tvm.layout import CacheLimits
from kvckpt_web.bench.soak import LAYOUT
from kvckpt_web.stores.file import FileStore

from support.kvmodel import run

SECONDS = 4.0
"""How long the writers run once the first generation is there."""

LIMITS = CacheLimits(reserved_num_seqs=2, max_total_seq_len=1024, prefill_chunk_size=256)
"""The saver's sequence: 600 to 1000 tokens, 150 to 250 one-page chunks per layer, the last one new in each
generation (so each save's retention deletes it from the generation before)."""

WRITER = r"""
import asyncio, os, sys, time
from kvckpt_web import PagedKVCache, open_device
from kvckpt_web.durable.retention import gc
from kvckpt_web.durable.save import save
from kvckpt_web.tvm.layout import CacheLimits
from kvckpt_web.bench.soak import LAYOUT
from kvckpt_web.stores.file import FileStore

LIMITS = CacheLimits(reserved_num_seqs=2, max_total_seq_len=1024, prefill_chunk_size=256)

async def main(directory, role, seconds):
    store = FileStore(directory)
    count = 0
    if role == "gc":
        while not os.path.exists(os.path.join(directory, "manifests")):
            await asyncio.sleep(0.01)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            await gc(store, keep=1)
            count += 1
            await asyncio.sleep(0.02)  # the saver polls for the lock: a gc in a tight loop would starve it
    else:
        cache = PagedKVCache(open_device(), LAYOUT, LIMITS)
        cache.add_sequence(0)
        token = LAYOUT.num_kv_heads * LAYOUT.head_dim * LAYOUT.elem_bytes
        deadline = None
        while deadline is None or time.monotonic() < deadline:
            length = cache.get_sequence_length(0)
            if length > 1000:
                cache.popn(0, length - 600)
            n = 3 if length >= 600 else 200  # grown to 600 tokens, then 3 per save: its last page changes
            cache.begin_forward([0], [n])
            for layer in range(LAYOUT.num_layers):
                cache.append_kv(layer, os.urandom(n * token), os.urandom(n * token))
            cache.end_forward()
            await save(cache, 0, store, "live", keep=1, pages_per_chunk=1)
            count += 1
            await asyncio.sleep(0.02)  # as the gc does: writers poll for the lock, so a tight loop starves the other
            if deadline is None and n == 3:
                print("ready", flush=True)
                deadline = time.monotonic() + seconds
    print(role, count, flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
"""


def start(directory: Path, role: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", WRITER, str(directory), role, str(SECONDS)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str], role: str) -> int:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, f"{role} process failed:\n{err[-3000:]}"
    return int(out.split()[-1])


@pytest.mark.parametrize("read_only", [True, False], ids=["read-only", "writable"])
def test_readers_beside_a_saver_and_a_gc_in_other_processes_report_nothing(device, tmp_path, read_only):
    directory = tmp_path / "store"
    saver, collector = start(directory, "save"), start(directory, "gc")
    try:
        assert saver.stdout.readline().strip() == "ready", saver.stderr.read()[-3000:]
        store = FileStore(directory, read_only=read_only)
        target = PagedKVCache(device, LAYOUT, LIMITS)
        wrong: list[str] = []
        counts = {"restore": 0, "verify": 0, "inspect": 0}
        while saver.poll() is None or collector.poll() is None:
            try:
                run(restore(store, "live", target, seq_id=1))
                target.remove_sequence(1)
            except Exception as exc:  # noqa: BLE001 - every failure is a false report here
                wrong.append(f"restore: {type(exc).__name__}: {exc}")
            counts["restore"] += 1
            report = run(verify(store))
            wrong += [f"verify: {p}" for p in report.problems]
            counts["verify"] += 1
            info = run(describe_store(directory))
            wrong += [f"inspect: damaged {key}" for key in info["damaged_manifests"]]
            wrong += [f"list: {i.key}: {i.error}" for i in run(list_generations(store)) if i.error is not None]
            counts["inspect"] += 1
        target.close()
    finally:
        for proc in (saver, collector):
            if proc.poll() is None:
                proc.kill()
    saves, collections = finish(saver, "save"), finish(collector, "gc")
    assert not wrong, f"{len(wrong)} false reports in {counts} reads beside {saves} saves and {collections} gc runs:\n" \
        + "\n".join(wrong[:20])
    assert saves > 5 and collections > 1 and counts["restore"] > 10, (saves, collections, counts)
    assert run(verify(FileStore(directory, read_only=True))).ok
