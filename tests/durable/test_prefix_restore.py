"""restore(..., length=n): the first n tokens of a checkpoint, from only the chunks that hold their pages."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from support.counting_store import CountingStore, count
from kvckpt_web.durable.catalog import load_manifest
from kvckpt_web.durable.container import decode_manifest
from kvckpt_web.durable.ledger import Ledger
from kvckpt_web.durable.restore import restore
from kvckpt_web.durable.save import save
from kvckpt_web.errors import CorruptionError, FieldError
from kvckpt_web.stores.memory import MemoryStore
from kvckpt_web.tvm.metadata import write_metadata

from support.kvmodel import KVModel, run, small_limits

LENGTH = 37  # 10 pages of 4 tokens
PPC = 2  # pages per chunk: 5 chunks per group, the last of 2 pages (pages 8-9)
SEQ = 2  # the sequence restored into, in the target cache


class CountingChunkReads(MemoryStore):
    """A view of a store that logs the chunk keys read."""

    def __init__(self, data: dict[str, bytes]) -> None:
        super().__init__(data)
        self.chunks_read: list[str] = []

    async def _get_into(self, key: str, out: memoryview) -> int | None:
        self.chunks_read.append(key)
        return await super()._get_into(key, out)


@pytest.fixture
def source(make_model: Callable[..., KVModel]) -> tuple[KVModel, dict[str, bytes]]:
    """A model whose sequence 0 of LENGTH tokens is saved as 'a', and the store's data."""
    model = make_model(seed=5)
    model.add(0, LENGTH)
    store = MemoryStore()
    run(save(model.cache, 0, store, "a", pages_per_chunk=PPC))
    return model, store._data


@pytest.fixture
def target(make_model: Callable[..., KVModel]) -> KVModel:
    """Another cache whose sequence SEQ holds 6 tokens of its own."""
    model = make_model(seed=6)
    model.add(SEQ, 6)
    return model


def chunks_of(data: dict[str, bytes], pages: int) -> set[str]:
    manifest = decode_manifest(data["manifests/a/00000000000000000001"])
    return {ref.key for ref in manifest.chunk_refs() if ref.first_page < pages}


@pytest.mark.parametrize("n", [12, 14, 16, 1, LENGTH],
                         ids=["page-boundary-mid-chunk", "mid-page", "chunk-boundary", "one-token", "everything"])
def test_a_prefix_restore_loads_the_first_n_tokens_from_only_the_chunks_holding_them(source, target, n):
    model, data = source
    store = CountingChunkReads(data)
    result = run(restore(store, "a", target.cache, seq_id=SEQ, length=n))
    pages = -(-n // 4)
    assert sorted(store.chunks_read) == sorted(chunks_of(data, pages))
    assert (result.seq_length, target.cache.get_sequence_length(SEQ)) == (n, n)
    assert result.num_chunks == len(chunks_of(data, pages)) == 2 * -(-pages // PPC)
    k, v = run(target.cache.debug_get_kv(SEQ, 0, n))
    np.testing.assert_array_equal(np.frombuffer(k.data, np.uint16).reshape(k.shape), model.ref[0][0][:, :n])
    np.testing.assert_array_equal(np.frombuffer(v.data, np.uint16).reshape(v.shape), model.ref[0][1][:, :n])
    assert target.cache.get_checkpoint_metadata(SEQ) == write_metadata(target.layout, target.cache.limits, SEQ, n)


@pytest.mark.parametrize("n", [0, -1, LENGTH + 1, True, 2.0, "3"])
def test_a_prefix_restore_of_a_length_the_checkpoint_cannot_give_is_refused_and_changes_nothing(source, target, n):
    _, data = source
    store = CountingChunkReads(data)
    with pytest.raises(FieldError, match="length"):
        run(restore(store, "a", target.cache, seq_id=SEQ, length=n))
    assert store.chunks_read == []
    assert target.cache.sequence_ids() == [SEQ]
    target.assert_holds(SEQ)


def test_a_prefix_restore_needs_room_only_for_the_prefix(source, make_cache):
    model, data = source
    small = make_cache(limits=small_limits(max_total_seq_len=16))  # 5 pages: the whole checkpoint needs 10
    run(restore(MemoryStore(data), "a", small, length=16))
    assert small.get_sequence_length(0) == 16


def test_a_damaged_chunk_past_the_prefix_does_not_matter(source, target):
    model, data = source
    for key in chunks_of(data, 10) - chunks_of(data, 4):
        data[key] = bytes(len(data[key]))
    run(restore(MemoryStore(data), "a", target.cache, seq_id=SEQ, length=16))
    assert target.cache.get_sequence_length(SEQ) == 16


def test_a_damaged_chunk_of_the_prefix_fails_the_restore_and_leaves_the_cache_as_it_was(source, target):
    _, data = source
    key = sorted(chunks_of(data, 4) - chunks_of(data, 2))[0]  # holds pages 2-3: the prefix needs page 2 only
    data[key] = bytes(len(data[key]))
    with pytest.raises(CorruptionError, match=key):
        run(restore(MemoryStore(data), "a", target.cache, seq_id=SEQ, length=9))
    assert target.cache.sequence_ids() == [SEQ]
    target.assert_holds(SEQ)


def test_a_prefix_restore_is_not_remembered_as_the_last_save_but_its_chunks_are_trusted(source, target):
    _, data = source
    store: Any = MemoryStore(data)
    run(restore(store, "a", target.cache, seq_id=SEQ, length=9))
    assert Ledger.of(store).last_saved("a") is None
    assert Ledger.of(store).trusted == chunks_of(data, 3)


def test_a_restore_given_the_manifest_read_already_reads_only_chunks(source, target):
    model, data = source
    store = CountingStore(data)
    loaded = run(load_manifest(store, "a", 1))
    store.reset()
    run(restore(store, "a", target.cache, seq_id=SEQ, generation=1, length=16, manifest=loaded))
    assert count(store.calls, "get", "manifests/") == count(store.calls, "list") == 0
    assert count(store.calls, "get", "chunks/") == len(chunks_of(data, 4))
    k, _ = run(target.cache.debug_get_kv(SEQ, 0, 16))
    np.testing.assert_array_equal(np.frombuffer(k.data, np.uint16).reshape(k.shape), model.ref[0][0][:, :16])


@pytest.mark.parametrize("generation", [None, 2], ids=["newest", "another-generation"])
def test_a_restore_given_a_manifest_of_another_generation_is_refused_and_changes_nothing(source, target, generation):
    _, data = source
    loaded = run(load_manifest(MemoryStore(data), "a", 1))
    with pytest.raises(FieldError, match="manifest"):
        run(restore(MemoryStore(data), "a", target.cache, seq_id=SEQ, generation=generation, manifest=loaded))
    assert target.cache.sequence_ids() == [SEQ]
    target.assert_holds(SEQ)


def test_a_prefix_restore_of_every_token_is_remembered_as_the_last_save(source, target):
    _, data = source
    store: Any = MemoryStore(data)
    run(restore(store, "a", target.cache, seq_id=SEQ, length=LENGTH))
    assert Ledger.of(store).last_saved("a").key == "manifests/a/00000000000000000001"
