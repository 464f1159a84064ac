"""Reads of a store are bounded by what its manifests (or the format) say, and what is no value where a chunk or
a manifest should be (a FIFO, a device) is damage of that key: verify reports it and checks the rest, gc,
restore and save go on, none of them hangs.

The stores are FileStores in a temporary directory; a file grown to gigabytes is sparse (no disk space), and
``bytes_read`` fails a test before any read of more than :data:`READ_LIMIT` bytes starts.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvckpt_web.durable.catalog import list_generations
from kvckpt_web.durable.restore import restore
from kvckpt_web.durable.retention import gc
from kvckpt_web.durable.save import save
from kvckpt_web.durable.verify import verify
from kvckpt_web.errors import CorruptionError
from kvckpt_web.stores.file import FileStore

from support.kvmodel import KVModel, run, small_limits

PPC = 4
LIMITS = small_limits(max_total_seq_len=256, prefill_chunk_size=256)
READ_LIMIT = 1 << 20
"""More than any value of these tests' stores holds (their chunks are 1 KiB)."""
HUGE = 8 << 30


@pytest.fixture
def model(make_model: Callable[..., KVModel]) -> KVModel:
    return make_model(limits=LIMITS, seed=5)


@pytest.fixture
def store(model: KVModel, tmp_path: Path) -> FileStore:
    """Two generations of "s" (40 and 49 tokens), each with chunks of its own."""
    store = FileStore(tmp_path / "store")
    model.add(0, 40)
    run(save(model.cache, 0, store, "s", pages_per_chunk=PPC))
    model.append({0: 9})
    run(save(model.cache, 0, store, "s", pages_per_chunk=PPC))
    return store


@pytest.fixture
def bytes_read(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """``[n]``: the bytes FileStores read from their files from now on; a read of more than READ_LIMIT bytes
    fails before it starts."""
    total = [0]
    real_read, real_read_into = FileStore._read, FileStore._read_into

    def regular_size(store: FileStore, key: str) -> int:
        try:
            st = os.stat(store._path(key))
        except OSError:
            return 0
        return st.st_size if stat.S_ISREG(st.st_mode) else 0

    def count(nbytes: int) -> None:
        if nbytes > READ_LIMIT:
            raise AssertionError(f"a read of {nbytes} bytes")
        total[0] += nbytes

    def read(self: FileStore, key: str, max_bytes: int | None = None) -> bytes | None:
        size = regular_size(self, key)
        count(size if max_bytes is None or size <= max_bytes else 0)
        return real_read(self, key, max_bytes)

    def read_into(self: FileStore, key: str, out: memoryview) -> int | None:
        count(len(out) if regular_size(self, key) == len(out) else 0)
        return real_read_into(self, key, out)

    monkeypatch.setattr(FileStore, "_read", read)
    monkeypatch.setattr(FileStore, "_read_into", read_into)
    return total


def own_chunk(store: FileStore, generation: int) -> tuple[str, int]:
    """A chunk key only ``generation`` of "s" uses, and its size."""
    infos = {i.generation: dict(zip(i.chunk_keys, i.chunk_nbytes)) for i in run(list_generations(store, "s"))}
    others = {key for g, chunks in infos.items() if g != generation for key in chunks}
    key = sorted(set(infos[generation]) - others)[0]
    return key, infos[generation][key]


def path_of(store: FileStore, key: str) -> Path:
    return Path(store.directory, *key.split("/"))


def fifo_in_place_of(store: FileStore, key: str, unblock_fifo: Callable[[Any], None]) -> None:
    path_of(store, key).unlink()
    unblock_fifo(path_of(store, key))


# ----- verify -------------------------------------------------------------------------------------------------


def test_verify_reports_a_chunk_grown_to_8_gib_by_its_size_without_reading_it(store, bytes_read):
    key, nbytes = own_chunk(store, 2)
    os.truncate(path_of(store, key), HUGE)
    report = run(verify(store))
    assert [p for p in report.problems if key in p and f"nbytes expected {nbytes}, got {HUGE}" in p], report.problems
    assert len(report.problems) == 1
    assert bytes_read[0] < READ_LIMIT


def test_verify_leaves_unread_a_file_named_like_a_chunk_larger_than_any_chunk_of_the_store(store, bytes_read):
    key = "chunks/" + "ab" * 32
    run(store.set(key, b"x"))
    os.truncate(path_of(store, key), 1 << 30)
    report = run(verify(store))
    assert report.ok, report.problems
    assert key in report.unreferenced_chunks
    assert bytes_read[0] < READ_LIMIT


def test_verify_reports_a_fifo_in_place_of_a_chunk_and_checks_every_other_chunk(store, unblock_fifo):
    key, _ = own_chunk(store, 2)
    fifo_in_place_of(store, key, unblock_fifo)
    report = run(verify(store))
    assert len(report.problems) == 1 and key in report.problems[0] and "FIFO" in report.problems[0]
    assert report.chunks_checked == len(run(store.list_prefix("chunks/")))


def test_verify_reports_a_fifo_named_like_a_chunk_no_manifest_uses(store, unblock_fifo):
    key = "chunks/" + "cd" * 32
    unblock_fifo(path_of(store, key))
    report = run(verify(store))
    assert report.problems == [f"{key}: expected a regular file ({path_of(store, key)}), got a FIFO"]


# ----- gc, restore, save --------------------------------------------------------------------------------------


def test_gc_counts_a_generation_whose_chunk_is_a_fifo_as_damaged_and_keeps_the_older_one(store, unblock_fifo):
    key, _ = own_chunk(store, 2)
    fifo_in_place_of(store, key, unblock_fifo)
    result = run(gc(store, keep=1))
    assert result.deleted_manifests == ()
    assert result.kept_reasons["manifests/s/00000000000000000002"].startswith("damaged")
    assert "FIFO" in result.kept_reasons["manifests/s/00000000000000000002"]


def test_gc_deletes_no_chunk_while_a_manifest_is_a_fifo(store, unblock_fifo):
    run(store.set("chunks/" + "ef" * 32, b"orphan"))
    fifo_in_place_of(store, "manifests/s/00000000000000000001", unblock_fifo)
    result = run(gc(store, keep=2))
    assert result.damaged_manifests == ("manifests/s/00000000000000000001",)
    assert result.deleted_chunks == 0 and run(store.exists("chunks/" + "ef" * 32))


def test_a_restore_from_a_chunk_that_is_a_fifo_is_corruption_naming_it(store, make_cache, unblock_fifo):
    key, _ = own_chunk(store, 2)
    fifo_in_place_of(store, key, unblock_fifo)
    with pytest.raises(CorruptionError, match=f"{key}.*FIFO"):
        run(restore(store, "s", make_cache(limits=LIMITS)))


def test_a_save_whose_last_manifest_became_a_fifo_saves_in_full(store, model, make_cache, unblock_fifo):
    fifo_in_place_of(store, "manifests/s/00000000000000000002", unblock_fifo)
    model.append({0: 2})
    result = run(save(model.cache, 0, store, "s", pages_per_chunk=PPC))
    assert result.generation == 3 and result.pages_read == model.cache.layout.num_logical_pages(51)
    target = make_cache(limits=LIMITS)
    run(restore(store, "s", target))
    assert [bytes(g) for g in run(target.export_groups(0))] == model.expected_groups(0)
