"""Durable checkpoints (kvckpt_web.durable): save, restore, incremental saves, retention, gc, verify.

Every restore is checked byte for byte against the numpy model of what the
sequence held when it was saved.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable
from typing import Any

import pytest

from kvckpt_web import CapacityError, CheckpointStateError, LayoutHashMismatch
from kvckpt_web.durable import chunk_reads, pipeline
from kvckpt_web.durable import restore as restoring
from kvckpt_web.durable import save as saving
from kvckpt_web.durable.catalog import list_generations, list_names
from kvckpt_web.durable.container import decode_manifest
from kvckpt_web.durable.keys import chunk_digest
from kvckpt_web.durable.ledger import Ledger
from kvckpt_web.durable.restore import restore
from kvckpt_web.durable.retention import delete_name, gc
from kvckpt_web.durable.save import DEFAULT_CHUNK_BYTES, save
from kvckpt_web.durable.verify import verify
from kvckpt_web.errors import ConflictError, FieldError, NotFoundError, StoreError
from kvckpt_web.stores.base import Store
from kvckpt_web.stores.file import FileStore
from kvckpt_web.stores.memory import MemoryStore

from support.kvmodel import KVModel, run, small_limits
from support.store_suite import needs_direct_io, spy_writes

PPC = 4  # pages per chunk in these tests: 16 tokens, 1 KiB per chunk with the small layout
BIG = small_limits(max_total_seq_len=2 * 4160 + 64, prefill_chunk_size=4096)


@pytest.fixture
def model(make_model: Callable[..., KVModel]) -> KVModel:
    return make_model(limits=BIG, seed=1)


@pytest.fixture
def target(make_cache: Callable[..., Any]) -> Any:
    """An empty second cache of the same layout to restore into."""
    return make_cache(limits=BIG)


def saved(model: KVModel, store: Store, name: str = "s", seq: int = 0, **kwargs: Any):
    return run(save(model.cache, seq, store, name, pages_per_chunk=kwargs.pop("pages_per_chunk", PPC), **kwargs))


def restored(store: Store, cache: Any, name: str = "s", **kwargs: Any) -> tuple[Any, list[bytes]]:
    result = run(restore(store, name, cache, **kwargs))
    return result, [bytes(g) for g in run(cache.export_groups(result.seq_id))]


def chunk_keys(store: MemoryStore) -> set[str]:
    return set(run(store.list_prefix("chunks/")))


def manifest_bytes(store: Store, name: str, generation: int) -> int:
    return len(run(store.get(f"manifests/{name}/{generation:020d}")))


# ----- save and restore --------------------------------------------------------------------------------


def test_restore_gives_back_the_saved_kv_and_app_state(model, target, hashing):
    model.add(0, 37)
    store = MemoryStore()
    saved(model, store, app_state={"tokens": [1, 2, 3], "rng": "abc"})
    result, groups = restored(store, target)
    assert groups == model.expected_groups(0)
    assert result.app_state == {"tokens": [1, 2, 3], "rng": "abc"}
    assert (result.seq_id, result.seq_length, result.generation) == (0, 37, 1)
    assert target.get_sequence_length(0) == 37


def test_restore_into_another_seq_id_keeps_the_other_sequences(model):
    model.add(0, 21)
    model.add(1, 9)
    store = MemoryStore()
    saved(model, store)
    result, groups = restored(store, model.cache, seq_id=5)
    assert result.seq_id == 5 and groups == model.expected_groups(0)
    model.assert_holds(0)
    model.assert_holds(1)


def test_restore_replaces_an_existing_sequence_and_nothing_else(model):
    model.add(0, 30)
    model.add(1, 11)
    store = MemoryStore()
    saved(model, store)
    expected = model.expected_groups(0)
    model.append({0: 5})
    model.popn(0, 20)
    _, groups = restored(store, model.cache)
    assert groups == expected
    model.assert_holds(1)


def test_a_sequence_of_any_id_round_trips(model, target):
    model.add(3, 13)
    store = MemoryStore()
    saved(model, store, seq=3)
    result, groups = restored(store, target)
    assert result.seq_id == 3 and groups == model.expected_groups(3)


def test_an_empty_sequence_round_trips(model, target):
    model.add(0)
    store = MemoryStore()
    result = saved(model, store)
    assert result.num_chunks == 0
    restored_result, groups = restored(store, target)
    assert restored_result.seq_length == 0 and groups == [b"", b""]


def test_restore_works_from_a_read_only_store(model, target, tmp_path):
    model.add(0, 19)
    saved(model, FileStore(tmp_path))
    _, groups = restored(FileStore(tmp_path, read_only=True), target)
    assert groups == model.expected_groups(0)


def test_generations_count_up_from_one_per_name(model):
    model.add(0, 5)
    store = MemoryStore()
    assert [saved(model, store, "a").generation for _ in range(3)] == [1, 2, 3]
    assert saved(model, store, "b").generation == 1


def test_restore_picks_an_older_generation_on_request(model, target):
    model.add(0, 10)
    store = MemoryStore()
    saved(model, store)
    first = model.expected_groups(0)
    model.append({0: 10})
    saved(model, store)
    result, groups = restored(store, target, generation=1)
    assert result.generation == 1 and groups == first


def test_app_state_must_be_a_json_object(model):
    model.add(0, 5)
    with pytest.raises(FieldError, match="app_state"):
        saved(model, MemoryStore(), app_state=[1, 2])


def test_an_app_state_json_cannot_hold_is_refused_before_anything_is_written(model):
    model.add(0, 5)
    store = MemoryStore()
    for bad in ({"x": float("nan")}, {"x": object()}):
        with pytest.raises(FieldError):
            saved(model, store, app_state=bad)
    assert store.bytes_written == 0


def test_default_chunks_hold_about_one_mib(model):
    model.add(0, 5)
    store = MemoryStore()
    run(save(model.cache, 0, store, "s"))
    manifest = decode_manifest(run(store.get("manifests/s/00000000000000000001")))
    assert manifest.pages_per_chunk == DEFAULT_CHUNK_BYTES // model.layout.page_bytes


# ----- incremental saves -------------------------------------------------------------------------------


def test_saving_64_more_tokens_after_4096_writes_only_the_changed_chunks(model, target, hashing):
    model.add(0, 4096)
    store = MemoryStore()
    first = saved(model, store)
    gen1 = model.expected_groups(0)
    model.append({0: 64})
    before = store.bytes_written
    second = saved(model, store)
    chunk_bytes = PPC * model.layout.page_bytes
    new_chunks = 64 // (PPC * model.layout.page_size) * model.layout.num_layers
    assert second.chunks_written == new_chunks
    assert store.bytes_written - before == new_chunks * chunk_bytes + manifest_bytes(store, "s", 2)
    assert second.pages_read == 64 // model.layout.page_size
    assert first.chunks_written == 4096 // (PPC * model.layout.page_size) * model.layout.num_layers
    _, groups = restored(store, target, generation=2)
    assert groups == model.expected_groups(0)
    target.remove_sequence(0)
    _, groups = restored(store, target, generation=1)
    assert groups == gen1


def test_a_partial_last_page_is_rewritten_with_its_chunk_only(model, target):
    model.add(0, 4 * PPC * 3 + 5)  # 3 full chunks + a chunk with a partial page
    store = MemoryStore()
    saved(model, store)
    model.append({0: 1})
    result = saved(model, store)
    assert result.chunks_written == model.layout.num_layers  # the last chunk of each group
    assert result.pages_read == 2  # the last chunk's pages: one full, one partial
    _, groups = restored(store, target)
    assert groups == model.expected_groups(0)


def hashed_bytes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Bytes each chunk digest hashes from now on (what a continued digest does not take from a kept state)."""
    counted: list[int] = []
    real = pipeline.continued_digest

    def counting(data, start=None, keep=None):
        counted.append(len(data) - (start.nbytes if start is not None else 0))
        return real(data, start, keep)

    monkeypatch.setattr(pipeline, "continued_digest", counting)
    return counted


def test_a_grown_chunk_is_hashed_from_where_the_last_save_left_it(model, target, monkeypatch, hashing):
    pb = model.layout.page_bytes
    model.add(0, 4 * PPC * 3 + 6)  # the last chunk: one full page and one partial
    store = MemoryStore()
    saved(model, store)
    model.append({0: 5})  # the partial page fills up and one more partial one starts
    counted = hashed_bytes(monkeypatch)
    result = saved(model, store)
    assert result.pages_read == 3
    assert counted == [2 * pb] * model.layout.num_layers  # the full page hashed last time is not hashed again
    assert restored(store, target)[1] == model.expected_groups(0)  # restore re-hashes every chunk in full


def test_a_chunk_whose_kept_pages_were_popped_is_hashed_in_full(model, target, monkeypatch):
    pb = model.layout.page_bytes
    model.add(0, 4 * PPC * 3 + 6)
    store = MemoryStore()
    saved(model, store)
    model.popn(0, 4)  # into the full page the save kept the hash of
    model.append({0: 9})
    counted = hashed_bytes(monkeypatch)
    saved(model, store)
    assert counted == [3 * pb] * model.layout.num_layers
    assert restored(store, target)[1] == model.expected_groups(0)


def test_autosaves_among_random_appends_and_pops_restore_exactly(model, target, monkeypatch, hashing):
    rng = random.Random(7)
    model.add(0, 30)
    backing: dict[str, bytes] = {}
    store, reader = MemoryStore(backing), MemoryStore(backing)  # restoring through `store` would replace
    counted = hashed_bytes(monkeypatch)  # its memory of the last save, as a restore in this process does
    read = hashed = 0
    for step in range(60):
        if model.length(0) > 8 and rng.random() < 0.3:
            model.popn(0, rng.randint(1, 8))
        model.append({0: rng.randint(1, 9)})
        counted.clear()
        result = saved(model, store)
        read += result.pages_read * model.layout.page_bytes * model.layout.num_layers
        hashed += sum(counted)
        if 0 in target.sequence_ids():
            target.remove_sequence(0)
        assert restored(reader, target)[1] == model.expected_groups(0), f"step {step}, generation {result.generation}"
    assert run(verify(store)).ok
    assert hashed < 0.8 * read  # most rewritten chunks continued from the state their last save kept


def test_a_pop_rewrites_the_chunks_from_the_popped_page_on(model, target):
    model.add(0, 200)  # 50 pages, chunks of 4 pages: 13 chunks per group
    store = MemoryStore()
    saved(model, store)
    model.popn(0, 100)  # to 100 tokens: page 25, in chunk 6
    model.append({0: 100})  # the same length again, different K/V
    result = saved(model, store)
    assert result.pages_read == 50 - 6 * PPC
    assert result.chunks_written == (13 - 6) * model.layout.num_layers
    _, groups = restored(store, target)
    assert groups == model.expected_groups(0)


def test_a_save_to_a_file_store_counts_every_chunk_it_writes_at_once(model, tmp_path):
    model.add(0, 4 * PPC * 5)  # 5 chunks per group: few enough to ask the store about each
    store = FileStore(tmp_path)
    result = saved(model, store)
    written = result.num_chunks
    assert written <= saving.LIST_THRESHOLD and result.chunks_written == written
    assert len(run(store.list_prefix("chunks/"))) == written


@needs_direct_io
def test_a_save_writes_chunks_of_whole_blocks_to_the_disk_directly(make_model, tmp_path, monkeypatch):
    model = make_model(limits=BIG, transfer="mapped")  # pages copied into its page-aligned host buffers
    ppc = 16  # 4 KiB chunks with the small layout: whole blocks for O_DIRECT
    model.add(0, 4 * ppc * 3)  # 3 chunks per group
    store = FileStore(tmp_path)
    writes = spy_writes(monkeypatch)
    result = saved(model, store, pages_per_chunk=ppc)
    assert result.chunks_written == 6
    assert [direct for nbytes, direct in writes if nbytes == 4096] == [True] * 6  # past the page cache
    assert restored(store, make_model(limits=BIG).cache)[1] == model.expected_groups(0)


def test_a_sequence_removed_and_added_again_is_read_again_in_full(model, target):
    model.add(0, 40)
    store = MemoryStore()
    saved(model, store)
    model.remove(0)
    model.add(0, 40)
    result = saved(model, store)
    assert result.pages_read == 10
    _, groups = restored(store, target)
    assert groups == model.expected_groups(0)


def test_a_new_process_reads_every_page_but_stores_only_the_manifest(model):
    model.add(0, 64)
    store = MemoryStore()
    saved(model, store)
    Ledger.of(store).forget()  # what a new process knows
    before = store.bytes_written
    result = saved(model, store)
    assert result.pages_read == 16 and result.chunks_written == 0
    assert store.bytes_written - before == manifest_bytes(store, "s", 2)


@pytest.mark.parametrize("other_writer", ["wiped the store", "wiped it and saved another generation 1"])
def test_a_save_trusts_no_chunk_of_a_previous_save_the_store_no_longer_holds(model, make_model, target, other_writer):
    backing: dict[str, bytes] = {}
    store = MemoryStore(backing)
    model.add(0, 64)
    saved(model, store)
    backing.clear()  # another process, which this one knows nothing of
    if other_writer.endswith("generation 1"):
        other = make_model(limits=BIG, seed=2)
        other.add(0, 32)
        saved(other, MemoryStore(backing))
    model.append({0: 8})
    result = saved(model, store)
    assert result.generation == (2 if other_writer.endswith("generation 1") else 1)
    assert result.chunks_written == result.num_chunks  # its memory of the first save is not trusted
    assert restored(store, target)[1] == model.expected_groups(0)


def test_a_save_after_restore_is_incremental(model, target):
    model.add(0, 64)
    store = MemoryStore()
    saved(model, store)
    restored(store, target)
    moved = KVModel(target)
    moved.ref[0] = model.ref[0]
    moved.append({0: 3})
    result = run(save(target, 0, store, "s", pages_per_chunk=PPC))
    assert result.pages_read == 1 and result.chunks_written == 2
    _, groups = restored(store, model.cache, seq_id=7)
    assert groups == moved.expected_groups(0)


def test_concurrent_saves_and_restores_on_one_cache_do_not_interfere(model, target, hashing):
    model.add(0, 40)
    model.add(1, 33)
    first, second = MemoryStore(), MemoryStore()

    async def saves() -> None:
        await asyncio.gather(save(model.cache, 0, first, "x", pages_per_chunk=1),
                             save(model.cache, 1, second, "y", pages_per_chunk=1))

    async def restores() -> None:
        await asyncio.gather(restore(first, "x", target), restore(second, "y", target))

    run(saves())
    run(restores())
    assert [bytes(g) for g in run(target.export_groups(0))] == model.expected_groups(0)
    assert [bytes(g) for g in run(target.export_groups(1))] == model.expected_groups(1)


def test_a_sequence_changed_during_its_save_is_not_committed(model):
    model.add(0, 40)

    class Meddling(MemoryStore):
        async def _set(self, key: str, data: bytes) -> None:
            if key.startswith("chunks/") and model.length(0) == 40:
                model.append({0: 1})
            await super()._set(key, data)

    store = Meddling()
    with pytest.raises(CheckpointStateError, match="changed while it was being saved"):
        saved(model, store)
    assert run(list_generations(store)) == []


def test_a_save_while_a_forward_pass_is_open_is_refused_and_commits_nothing(model):
    model.add(0, 30)
    store = MemoryStore()
    saved(model, store)
    model.cache.begin_forward([0], [3])
    k, v = model.random_kv(3)
    model.cache.append_kv(0, model.as_input(k[0]), model.as_input(v[0]))  # layer 1 has no new K/V yet
    with pytest.raises(CheckpointStateError, match="forward pass in progress"):
        saved(model, store)
    assert [g.generation for g in run(list_generations(store))] == [1]


# ----- one conversation per name ----------------------------------------------------------------------


def conversation(letter: str) -> dict[str, Any]:
    """The app_state of a save that records conversation ``letter * 32``."""
    return {"conversation": {"id": letter * 32, "created_ms": 1_700_000_000_000}}


def keys_and_values(store: Store) -> dict[str, bytes | None]:
    return {key: run(store.get(key)) for key in run(store.list_prefix(""))}


@pytest.mark.parametrize("kind", ["one MemoryStore", "two FileStore objects"])
def test_a_save_on_top_of_another_conversations_generation_is_refused_and_writes_nothing(model, tmp_path, kind):
    first = MemoryStore() if kind == "one MemoryStore" else FileStore(tmp_path)
    second = first if kind == "one MemoryStore" else FileStore(tmp_path)  # another process's store object
    model.add(0, 20)
    model.add(1, 30)
    saved(model, first, "chat", app_state=conversation("a"), keep=None)
    for _ in range(2):  # the two writers interleave their saves: only the first one's are committed
        before = keys_and_values(first)
        with pytest.raises(ConflictError) as info:
            saved(model, second, "chat", seq=1, app_state=conversation("b"), keep=None)
        message = str(info.value)
        assert "'chat'" in message and f"conversation {'b' * 32!r}" in message
        assert f"of conversation {'a' * 32!r}" in message and "nothing was written" in message
        assert keys_and_values(first) == before
        saved(model, first, "chat", app_state=conversation("a"), keep=None)
    assert [info.app_state for info in run(list_generations(first, "chat"))] == [conversation("a")] * 3


def test_a_save_goes_on_from_its_conversations_newest_readable_generation_past_a_damaged_one(model):
    store = MemoryStore()
    model.add(0, 20)
    saved(model, store, "chat", app_state=conversation("a"))
    saved(model, store, "chat", app_state=conversation("a"))
    run(store.set("manifests/chat/00000000000000000002", b"damaged"))
    with pytest.raises(ConflictError, match="got generation 1 of conversation 'a"):
        saved(model, store, "chat", app_state=conversation("b"))
    assert saved(model, store, "chat", app_state=conversation("a")).generation == 3


def test_a_save_recording_a_conversation_is_refused_on_a_name_none_of_whose_generations_can_be_read(model):
    store = MemoryStore()
    model.add(0, 20)
    saved(model, store, "chat", app_state=conversation("a"))
    run(store.set("manifests/chat/00000000000000000001", b"damaged"))
    with pytest.raises(ConflictError, match="'chat'.*none of its 1 generations readable"):
        saved(model, store, "chat", app_state=conversation("a"))


# ----- names, retention, sharing, gc -------------------------------------------------------------------


def test_names_in_one_store_are_independent(model, target):
    model.add(0, 20)
    model.add(1, 33)
    store = MemoryStore()
    saved(model, store, "first", seq=0)
    saved(model, store, "second", seq=1)
    assert run(list_names(store)) == ["first", "second"]
    _, groups = restored(store, target, "second")
    assert groups == model.expected_groups(1)
    _, groups = restored(store, target, "first")
    assert groups == model.expected_groups(0)


def test_a_save_keeps_the_newest_k_generations(model, target):
    model.add(0, 8)
    store = MemoryStore()
    expected = {}
    for generation in range(1, 6):
        model.append({0: 7})
        saved(model, store, keep=3)
        expected[generation] = model.expected_groups(0)
    assert [g.generation for g in run(list_generations(store, "s"))] == [3, 4, 5]
    for generation in (3, 4, 5):
        if 0 in target.sequence_ids():
            target.remove_sequence(0)
        assert restored(store, target, generation=generation)[1] == expected[generation]


def test_a_save_with_keep_none_keeps_every_generation_and_every_chunk(model):
    model.add(0, 20)
    store = MemoryStore()
    for _ in range(4):
        model.popn(0, 10)  # each generation holds chunks of its own
        model.append({0: 10})
        saved(model, store, keep=None)
    infos = run(list_generations(store, "s"))
    assert [i.generation for i in infos] == [1, 2, 3, 4]
    assert chunk_keys(store) == set().union(*(i.chunk_keys for i in infos)) and len(chunk_keys(store)) > 2


def test_retention_deletes_exactly_the_chunks_no_kept_manifest_uses(model):
    model.add(0, 50)
    store = MemoryStore()
    for _ in range(4):
        model.popn(0, 30)  # rewrite most chunks each time
        model.append({0: 30})
        saved(model, store, keep=2)
    used = set()
    for info in run(list_generations(store)):
        used |= set(info.chunk_keys)
    assert chunk_keys(store) == used


def test_forked_sequences_share_their_common_chunks(model, target):
    model.add(0, 64)
    model.fork(0, 1, 48)
    model.append({1: 20})
    store = MemoryStore()
    parent = saved(model, store, "parent", seq=0)
    child = saved(model, store, "child", seq=1)
    assert parent.chunks_written == 8
    assert child.chunks_written == 2 * 2  # 68 tokens = 17 pages: chunks 3 and 4 differ from the parent's
    infos = {i.name: set(i.chunk_keys) for i in run(list_generations(store))}
    assert len(infos["parent"] & infos["child"]) == 3 * 2
    _, groups = restored(store, target, "child")
    assert groups == model.expected_groups(1)


def test_gc_never_removes_a_chunk_a_committed_manifest_uses(model, target):
    model.add(0, 64)
    model.fork(0, 1, 40)
    store = MemoryStore()
    saved(model, store, "child", seq=1)
    child = model.expected_groups(1)
    for _ in range(3):  # the parent moves on; its old chunks, shared with the child, lose its references
        model.popn(0, 60)
        model.append({0: 60})
        saved(model, store, "parent", seq=0, keep=1)
    run(gc(store, keep=1))
    report = run(verify(store))
    assert report.ok and not report.unreferenced_chunks
    _, groups = restored(store, target, "child")
    assert groups == child
    target.remove_sequence(1)
    _, groups = restored(store, target, "parent")
    assert groups == model.expected_groups(0)


def test_gc_removes_the_chunks_of_interrupted_saves(model):
    model.add(0, 16)
    store = MemoryStore()
    saved(model, store)
    used = chunk_keys(store)
    orphan = "chunks/" + "ab" * 32
    run(store.set(orphan, b"left by a save that never committed"))
    result = run(gc(store))
    assert result.deleted_chunks == 1 and chunk_keys(store) == used


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_gc_reports_the_bytes_it_freed(model, tmp_path, kind):
    model.add(0, 16)
    store = MemoryStore() if kind == "memory" else FileStore(tmp_path / "store")
    saved(model, store)
    for i, size in enumerate((5, 7000)):
        run(store.set("chunks/" + f"{i:02x}" * 32, bytes(size)))
    result = run(gc(store))
    assert (result.deleted_chunks, result.freed_bytes) == (2, 7005)


def test_gc_keeps_every_chunk_while_a_manifest_is_damaged(model):
    model.add(0, 16)
    store = MemoryStore()
    saved(model, store, "a")
    saved(model, store, "b")
    run(store.set("chunks/" + "cd" * 32, b"orphan"))
    run(store.set("manifests/b/00000000000000000001", b"garbage"))
    before = chunk_keys(store)
    result = run(gc(store))
    assert result.damaged_manifests == ("manifests/b/00000000000000000001",)
    assert result.deleted_chunks == 0 and chunk_keys(store) == before


def test_gc_keep_applies_per_name(model):
    model.add(0, 4)
    store = MemoryStore()
    for name in ("a", "a", "a", "b", "b"):
        saved(model, store, name, keep=5)
    result = run(gc(store, keep=1))
    assert result.kept_manifests == ("manifests/a/00000000000000000003", "manifests/b/00000000000000000002")


def test_delete_name_removes_every_generation_of_the_name_and_only_the_chunks_no_other_name_uses(model, target):
    model.add(0, 16)
    store = MemoryStore()
    saved(model, store, "keep")
    kept = chunk_keys(store)
    model.append({0: 16})
    saved(model, store, "gone", keep=5)
    saved(model, store, "gone", keep=5)
    result = run(delete_name(store, "gone"))
    assert result.deleted_manifests == (key_of("gone", 1), key_of("gone", 2))
    assert result.kept_manifests == (key_of("keep", 1),) and chunk_keys(store) == kept
    assert run(restore(store, "keep", target)).seq_length == 16


def test_delete_name_of_a_name_not_stored_raises_not_found_and_deletes_nothing(model):
    model.add(0, 16)
    store = MemoryStore()
    saved(model, store, "keep")
    run(store.set("chunks/" + "ab" * 32, b"orphan"))
    before = {key: run(store.get(key)) for key in run(store.list_prefix(""))}
    with pytest.raises(NotFoundError, match="'other'"):
        run(delete_name(store, "other"))
    assert {key: run(store.get(key)) for key in run(store.list_prefix(""))} == before


def test_delete_name_refuses_a_name_another_writer_holds_and_deletes_nothing(model, tmp_path):
    model.add(0, 16)
    store = FileStore(tmp_path)
    saved(model, store, "chat")
    before = {key: run(store.get(key)) for key in run(store.list_prefix(""))}

    async def delete_while_claimed() -> None:
        async with FileStore(tmp_path).claim("chat"):  # another writer of the name, as a generation holds it
            await delete_name(store, "chat")

    with pytest.raises(ConflictError, match="'chat'"):
        run(delete_while_claimed())
    assert {key: run(store.get(key)) for key in run(store.list_prefix(""))} == before
    run(delete_name(store, "chat"))  # once released
    assert run(list_names(store)) == []


def key_of(name: str, generation: int) -> str:
    return f"manifests/{name}/{generation:020d}"


def damage(store: MemoryStore, key: str, how: str) -> None:
    """One kind of damage to the value under ``key``: truncated, one byte flipped, or emptied."""
    raw = bytearray(store._data[key])
    if how == "truncated":
        raw = raw[:len(raw) // 2]
    elif how == "flipped":
        raw[len(raw) // 3] ^= 0x10
    else:
        raw = bytearray()
    store._data[key] = bytes(raw)


def generations_saved(model: KVModel, store: MemoryStore, count: int) -> dict[int, list[bytes]]:
    """``count`` generations of "s", each after more appends and a pop (so each has chunks of its own)."""
    expected = {}
    for generation in range(1, count + 1):
        model.popn(0, min(model.length(0), 20))
        model.append({0: 30})
        saved(model, store, keep=10)
        expected[generation] = model.expected_groups(0)
    return expected


@pytest.mark.parametrize("how", ["truncated", "flipped", "emptied"])
def test_gc_keep_1_keeps_the_older_generation_when_the_newest_manifest_is_damaged(model, target, how):
    model.add(0, 10)
    store = MemoryStore()
    expected = generations_saved(model, store, 2)
    damage(store, key_of("s", 2), how)
    result = run(gc(store, keep=1))
    assert result.kept_manifests == (key_of("s", 1), key_of("s", 2))
    assert result.kept_reasons[key_of("s", 1)] == "restorable, 1 of the newest 1 that are"
    assert result.kept_reasons[key_of("s", 2)].startswith("damaged, kept as evidence and not counted: " + key_of("s", 2))
    assert restored(store, target, generation=1)[1] == expected[1]


def test_gc_with_the_default_keep_skips_two_damaged_newest_manifests(model, target):
    model.add(0, 10)
    store = MemoryStore()
    expected = generations_saved(model, store, 4)
    damage(store, key_of("s", 4), "truncated")
    damage(store, key_of("s", 3), "flipped")
    result = run(gc(store))
    assert result.kept_manifests == tuple(key_of("s", g) for g in (1, 2, 3, 4))  # 1 and 2 are the two that restore
    assert result.damaged_manifests == (key_of("s", 3), key_of("s", 4))
    for generation in (1, 2):
        assert restored(store, target, generation=generation)[1] == expected[generation]
        target.remove_sequence(0)


@pytest.mark.parametrize("how", ["flipped", "emptied"])
def test_gc_does_not_count_a_manifest_whose_own_chunk_is_damaged(model, target, how):
    model.add(0, 10)
    store = MemoryStore()
    expected = generations_saved(model, store, 2)
    infos = {i.generation: set(i.chunk_keys) for i in run(list_generations(store))}
    only_newest = sorted(infos[2] - infos[1])
    damage(store, only_newest[0], how)
    result = run(gc(store, keep=1))
    assert result.deleted_manifests == ()
    assert result.kept_reasons[key_of("s", 2)].startswith("damaged")
    assert restored(store, target, generation=1)[1] == expected[1]


def test_gc_drops_what_is_older_than_the_newest_restorable_ones(model):
    model.add(0, 10)
    store = MemoryStore()
    generations_saved(model, store, 4)
    damage(store, key_of("s", 1), "truncated")
    damage(store, key_of("s", 3), "truncated")
    result = run(gc(store, keep=1))
    assert result.deleted_manifests == (key_of("s", 1), key_of("s", 2), key_of("s", 3))
    assert result.kept_manifests == (key_of("s", 4),)
    assert run(verify(store)).ok


def test_a_save_after_a_damaged_newest_manifest_keeps_the_last_restorable_one(model, target):
    model.add(0, 10)
    store = MemoryStore()
    expected = generations_saved(model, store, 2)
    damage(store, key_of("s", 2), "truncated")
    model.append({0: 5})
    result = saved(model, store, keep=2)
    assert result.generation == 3 and result.deleted_manifests == ()
    assert result.warnings[0].startswith(f"{key_of('s', 2)}: damaged, kept as evidence")
    assert restored(store, target, generation=1)[1] == expected[1]
    target.remove_sequence(0)
    assert restored(store, target)[1] == model.expected_groups(0)


# ----- chunks already in the store are reused only once known to be intact ----------------------------


def reads_of_chunks(store: Store) -> list[str]:
    """The chunk keys read from ``store`` from now on (not the sizes asked for)."""
    keys: list[str] = []
    real_get, real_get_into = store.get, store.get_into

    async def get(key, **bound):
        if key.startswith("chunks/"):
            keys.append(key)
        return await real_get(key, **bound)

    async def get_into(key, out):
        if key.startswith("chunks/") and len(out):
            keys.append(key)
        return await real_get_into(key, out)

    store.get, store.get_into = get, get_into
    return keys


@pytest.mark.parametrize("tokens", [64, 4 * PPC * 20], ids=["asked-chunk-by-chunk", "listed-at-once"])
@pytest.mark.parametrize("how", ["flipped", "emptied"])
def test_a_save_rewrites_a_damaged_chunk_it_would_reuse_from_the_cache(model, target, tmp_path, tokens, how):
    model.add(0, tokens)
    store = MemoryStore()
    saved(model, store)
    rotten = sorted(chunk_keys(store))[1]
    damage(store, rotten, how)
    Ledger.of(store).forget()  # a new process: it did not write these chunks
    result = saved(model, store)
    assert result.chunks_written == 1
    assert result.warnings == (f"{rotten}: stored bytes differed from the chunk its name says; rewritten from the "
                               "cache",)
    assert restored(store, target)[1] == model.expected_groups(0)
    assert run(verify(store)).ok


def test_saves_after_a_chunk_rots_never_leave_only_generations_that_use_it(model, target):
    model.add(0, 64)
    store = MemoryStore()
    saved(model, store)
    damage(store, sorted(chunk_keys(store))[0], "flipped")
    for step in range(3):  # new processes saving on: retention deletes the first generation
        Ledger.of(store).forget()
        model.append({0: 2})
        saved(model, store, keep=2)
        if 0 in target.sequence_ids():
            target.remove_sequence(0)
        assert restored(store, target)[1] == model.expected_groups(0), f"save {step}"
    assert run(verify(store)).ok


def test_a_new_process_reads_back_each_stored_chunk_it_reuses_once(model, monkeypatch):
    model.add(0, 64)
    store = MemoryStore()
    saved(model, store)
    stored = chunk_keys(store)
    Ledger.of(store).forget()
    reads = reads_of_chunks(store)
    saved(model, store)
    assert sorted(reads) == sorted(stored)
    reads.clear()
    model.append({0: 4})
    Ledger.of(store).forget("s")  # even with every page read again, chunks it has read back are not read again
    saved(model, store)
    assert reads == []


def test_a_save_reads_back_none_of_the_chunks_its_process_wrote(model, monkeypatch):
    model.add(0, 64)
    store = MemoryStore()
    saved(model, store)
    reads = reads_of_chunks(store)
    model.popn(0, 40)
    model.append({0: 40})  # the same tokens again: its chunks come out as the ones stored before
    saved(model, store)
    assert reads == []


def test_a_failure_after_the_commit_is_a_warning_not_a_failed_save(model, target):
    model.add(0, 12)

    class NoDeletes(MemoryStore):
        async def _delete(self, key: str) -> None:
            from kvckpt_web.errors import StoreError
            raise StoreError(f"delete {key!r}: permission denied")

    store = NoDeletes()
    saved(model, store, keep=1)
    model.append({0: 9})
    result = saved(model, store, keep=1)
    assert result.generation == 2 and result.deleted_manifests == ()
    assert "retention after the commit failed" in result.warnings[0]
    _, groups = restored(store, target)
    assert groups == model.expected_groups(0)


def test_keep_must_be_at_least_one(model):
    model.add(0, 4)
    with pytest.raises(FieldError, match="keep"):
        saved(model, MemoryStore(), keep=0)


def test_a_failed_manifest_write_commits_nothing_and_deletes_nothing(model, target):
    model.add(0, 24)

    class FailingManifests(MemoryStore):
        fail = False

        async def _set(self, key: str, data: bytes) -> None:
            if self.fail and key.startswith("manifests/"):
                raise OSError("disk full")
            await super()._set(key, data)

    store = FailingManifests()
    saved(model, store, keep=1)
    expected = model.expected_groups(0)
    before = dict(store._data)
    model.popn(0, 20)
    model.append({0: 30})
    store.fail = True
    with pytest.raises(OSError):
        saved(model, store, keep=1)
    assert set(before) <= set(store._data)  # nothing deleted; only new chunks added
    assert all(store._data[k] == v for k, v in before.items())
    _, groups = restored(store, target)
    assert groups == expected


@pytest.fixture(params=["inline", "threads"])
def hashing(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Saves hash their chunks on the event loop (small saves) or on the hash threads (large ones)."""
    monkeypatch.setattr(pipeline, "INLINE_HASH_BYTES", 1 << 40 if request.param == "inline" else -1)
    return request.param


def test_a_small_save_hashes_on_the_loop_and_a_large_one_on_the_hash_threads(model, monkeypatch):
    model.add(0, 40)
    queued: list[int] = []
    real = pipeline.Hasher.digest
    monkeypatch.setattr(pipeline.Hasher, "digest",
                        lambda self, data, *how: queued.append(len(data)) or real(self, data, *how))
    nbytes = model.layout.num_layers * model.layout.num_logical_pages(40) * model.layout.page_bytes
    checkpoints = []
    for limit in (nbytes, nbytes - 1):
        monkeypatch.setattr(pipeline, "INLINE_HASH_BYTES", limit)
        store = MemoryStore()
        saved(model, store)
        checkpoints.append({k: run(store.get(k)) for k in run(store.list_prefix("chunks/"))})
        assert sum(queued) == (0 if limit == nbytes else nbytes)
    assert checkpoints[0] == checkpoints[1]


def test_a_restore_from_a_file_store_hashes_each_chunk_on_the_thread_that_read_it(model, target, tmp_path,
                                                                                   monkeypatch):
    model.add(0, 40)
    store = FileStore(tmp_path / "store")
    saved(model, store)
    last_reader: dict[int, str] = {}  # id of a buffer -> the thread that last read into it
    hashed: list[tuple[str, str]] = []  # (thread that read the bytes, thread that hashed them)
    read_into = store._read_into

    def recorded_read(key: str, out: memoryview) -> int | None:
        last_reader[id(out)] = threading.current_thread().name
        return read_into(key, out)

    def recorded_digest(data: memoryview) -> str:
        hashed.append((last_reader[id(data)], threading.current_thread().name))
        return chunk_digest(data)

    monkeypatch.setattr(store, "_read_into", recorded_read)
    monkeypatch.setattr(chunk_reads, "chunk_digest", recorded_digest)
    _, groups = restored(store, target)
    assert groups == model.expected_groups(0)
    assert len(hashed) == len(run(store.list_prefix("chunks/")))
    assert all(reader == hasher and hasher.startswith("kvckpt-filestore") for reader, hasher in hashed)


@pytest.fixture
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Saves map one chunk column per batch, two batches at a time: slots are reused within one save."""
    monkeypatch.setattr(saving, "READ_BATCH_BYTES", 1)
    monkeypatch.setattr(pipeline, "READ_SLOTS", 2)


def test_a_save_in_many_batches_through_reused_slots_round_trips(model, target, small_batches, hashing):
    model.add(0, 40 * 4 + 3)
    store = MemoryStore()
    result = saved(model, store)
    assert result.chunks_written == -(-41 // PPC) * model.layout.num_layers
    _, groups = restored(store, target)
    assert groups == model.expected_groups(0)


@pytest.mark.parametrize("fail_at", [1, 7, 15])
def test_a_chunk_write_failing_mid_save_commits_nothing_and_leaves_the_cache_usable(model, target, small_batches,
                                                                                      hashing, fail_at):
    model.add(0, 40 * 4 + 3)

    class FailingChunks(MemoryStore):
        writes = 0

        async def _set(self, key: str, data: bytes) -> None:
            if key.startswith("chunks/"):
                self.writes += 1
                if self.writes == fail_at:
                    raise OSError("disk full")
            await super()._set(key, data)

    store = FailingChunks()
    with pytest.raises(OSError):
        saved(model, store)
    assert run(store.list_prefix("manifests/")) == []
    model.append({0: 5})  # the staging slots were unmapped: forward passes and saves go on
    good = MemoryStore()
    saved(model, good)
    _, groups = restored(good, target)
    assert groups == model.expected_groups(0)


def test_a_cancelled_save_commits_nothing_and_releases_the_store_and_the_cache(model, target, small_batches, hashing):
    model.add(0, 40 * 4 + 3)
    store = MemoryStore()
    saved(model, store)
    before = run(list_generations(store))
    model.append({0: 40})
    stalled, release = asyncio.Event(), asyncio.Event()

    class Stalling(MemoryStore):
        async def _set(self, key: str, data: bytes) -> None:
            if key.startswith("chunks/"):
                stalled.set()
                await release.wait()  # a slow write: the cancelled save waits for the ones in flight
            await super()._set(key, data)

    stalling = Stalling(store._data)

    async def cancel_mid_save() -> None:
        task = asyncio.ensure_future(save(model.cache, 0, stalling, "s", pages_per_chunk=PPC))
        await stalled.wait()
        task.cancel()
        await asyncio.sleep(0)
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(cancel_mid_save())
    assert run(list_generations(store)) == before  # nothing committed, nothing dropped
    result = saved(model, store)  # the lock and the cache's slots are free again
    assert result.generation == 2
    _, groups = restored(store, target)
    assert groups == model.expected_groups(0)


# ----- readers beside another writer's retention -------------------------------------------------------


class SavingMidRead(MemoryStore):
    """A read-only view of a store where reading the last chunk of any layer of the newest generation first
    lets another writer save ``model``'s sequence again, one token longer, keeping ``keep`` generations (with
    one, the chunk being read is deleted). That happens ``saves`` times."""

    def __init__(self, data: dict[str, bytes], model: KVModel, saves: int = 1, keep: int = 1) -> None:
        super().__init__(data, read_only=True)
        self.model, self.writer, self.saves, self.keep = model, MemoryStore(data), saves, keep
        self.trigger = self.last_chunks()

    def last_chunks(self) -> set[str]:
        newest = max(k for k in self._data if k.startswith("manifests/"))
        return {group[-1].key for group in decode_manifest(self._data[newest]).chunks}

    async def _meddle(self, key: str) -> None:
        if key in self.trigger and self.saves:
            self.saves -= 1
            self.trigger = set()
            self.model.append({0: 1})
            await save(self.model.cache, 0, self.writer, "s", pages_per_chunk=PPC, keep=self.keep)
            self.trigger = self.last_chunks()

    async def _get_into(self, key: str, out: memoryview) -> int | None:
        await self._meddle(key)
        return await super()._get_into(key, out)

    async def _get(self, key: str) -> bytes | None:
        await self._meddle(key)
        return await super()._get(key)


@pytest.mark.parametrize("collections", [1, restoring.READ_ATTEMPTS - 1])
def test_a_restore_of_the_newest_collected_while_it_is_read_restores_the_newest_there_is_then(model, target,
                                                                                               collections):
    model.add(0, 33)
    backing: dict[str, bytes] = {}
    saved(model, MemoryStore(backing), keep=1)
    result, groups = restored(SavingMidRead(backing, model, collections), target)
    assert result.generation == 1 + collections and groups == model.expected_groups(0)


def test_a_restore_reads_again_only_the_chunks_of_the_newer_generation_it_does_not_hold(model, target):
    model.add(0, 33)
    backing: dict[str, bytes] = {}
    saved(model, MemoryStore(backing), keep=1)
    store = SavingMidRead(backing, model)
    reads = reads_of_chunks(store)
    result, groups = restored(store, target)
    assert result.generation == 2 and groups == model.expected_groups(0)
    chunks_per_group = -(-model.layout.num_logical_pages(34) // PPC)
    # the first attempt stops at its first read that fails; the second reads each layer's last chunk only
    assert len(reads) - len(set(reads)) <= model.layout.num_layers
    assert len(reads) < 2 * chunks_per_group * model.layout.num_layers


def test_a_restore_of_the_newest_gives_up_with_a_store_error_if_it_is_collected_every_time(model, target):
    model.add(0, 33)
    backing: dict[str, bytes] = {}
    saved(model, MemoryStore(backing), keep=1)
    with pytest.raises(StoreError, match=f"{restoring.READ_ATTEMPTS} times in a row"):
        restored(SavingMidRead(backing, model, restoring.READ_ATTEMPTS), target)
    assert target.sequence_ids() == []


def test_a_restore_of_a_generation_collected_while_it_is_read_raises_not_found(model, target):
    model.add(0, 33)
    backing: dict[str, bytes] = {}
    saved(model, MemoryStore(backing), keep=1)
    with pytest.raises(NotFoundError, match="manifests/s/00000000000000000001: deleted by another writer"):
        restored(SavingMidRead(backing, model), target, generation=1)
    assert target.sequence_ids() == []


def test_verify_does_not_report_the_chunks_of_a_generation_collected_while_it_runs(model):
    model.add(0, 33)
    backing: dict[str, bytes] = {}
    saved(model, MemoryStore(backing), keep=1)
    store = SavingMidRead(backing, model)
    report = run(verify(store))
    assert store.saves == 0 and report.ok, report.problems
    assert report.manifests_checked == ["manifests/s/00000000000000000001"]


def test_verify_still_reports_a_damaged_chunk_of_a_generation_that_is_still_there(model):
    model.add(0, 33)
    backing: dict[str, bytes] = {}
    saved(model, MemoryStore(backing))
    store = SavingMidRead(backing, model, keep=2)
    damaged = sorted(store.trigger)[0]  # a chunk of generation 1 only, which the save in the middle keeps
    backing[damaged] = backing[damaged][:-1]
    report = run(verify(store))
    assert store.saves == 0
    assert any(p.startswith(f"chunk {damaged}") for p in report.problems), report.problems


# ----- restore refuses what does not fit, before touching the cache ------------------------------------


def cache_snapshot(cache: Any) -> tuple:
    return (tuple((s, cache.sequence_state(s)) for s in cache.sequence_ids()), cache.get_num_available_pages())


def test_restore_into_another_layout_raises_layout_hash_mismatch_and_changes_nothing(model, make_cache):
    model.add(0, 12)
    store = MemoryStore()
    saved(model, store)
    other = make_cache(limits=BIG, num_kv_heads=1, num_qo_heads=2)
    other.add_sequence(0)
    before = cache_snapshot(other)
    with pytest.raises(LayoutHashMismatch, match="manifests/s/00000000000000000001: tvm_metadata.layout_hash"):
        run(restore(store, "s", other))
    assert cache_snapshot(other) == before
    other.begin_forward([0], [1])  # still usable: no import left pending
    other.end_forward()


def test_restore_without_room_raises_capacity_error_and_changes_nothing(model, make_cache):
    model.add(0, 40)
    store = MemoryStore()
    saved(model, store)
    small = make_cache(limits=small_limits(max_total_seq_len=48))
    small.add_sequence(0)
    small.begin_forward([0], [30])
    small.end_forward()
    before = cache_snapshot(small)
    with pytest.raises(CapacityError):
        run(restore(store, "s", small, seq_id=1))
    assert cache_snapshot(small) == before


def test_restore_of_an_unknown_name_or_generation_raises_not_found(model, target):
    model.add(0, 4)
    store = MemoryStore()
    saved(model, store)
    with pytest.raises(NotFoundError, match="no checkpoint named 'nope'"):
        run(restore(store, "nope", target))
    with pytest.raises(NotFoundError, match="no generation 7 of 's'"):
        run(restore(store, "s", target, generation=7))
    assert target.sequence_ids() == []


# ----- listing and verify ------------------------------------------------------------------------------


def test_list_generations_describes_each_manifest(model):
    model.add(2, 21)
    store = MemoryStore()
    saved(model, store, app_state={"step": 1}, seq=2)
    (info,) = run(list_generations(store))
    assert (info.name, info.generation, info.seq_id, info.seq_length, info.error) == ("s", 1, 2, 21, None)
    assert info.num_logical_pages == 6 and len(info.chunk_keys) == 2 * 2
    assert info.nbytes == 2 * 6 * model.layout.page_bytes and info.app_state == {"step": 1}


def test_verify_passes_an_intact_store_and_loads_every_generation(model, device):
    model.add(0, 30)
    store = MemoryStore()
    saved(model, store)
    model.append({0: 3})
    saved(model, store)
    report = run(verify(store, device=device))
    assert report.ok, report.problems
    assert report.loaded == ["manifests/s/00000000000000000001", "manifests/s/00000000000000000002"]


def test_verify_reports_a_damaged_chunk_no_manifest_uses(model):
    model.add(0, 8)
    store = MemoryStore()
    saved(model, store)
    key = "chunks/" + "ef" * 32
    run(store.set(key, b"not what its name says"))
    report = run(verify(store))
    assert not report.ok and report.unreferenced_chunks == [key]
    assert any(p.startswith(key) for p in report.problems)
