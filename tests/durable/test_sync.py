"""Sync: the newest generation of each name copied between stores, only the chunks the destination lacks moving,
manifests after their chunks, records after their manifests; resumable; never overwriting or going behind."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kvckpt_web.durable.catalog import load_manifest, manifest_keys
from kvckpt_web.durable.prefix_records import PrefixKey
from kvckpt_web.durable.restore import restore
from kvckpt_web.durable.retention import DEFAULT_KEEP
from kvckpt_web.durable.save import save
from kvckpt_web.durable.sync import apart_name, sync
from kvckpt_web.errors import CorruptionError, FieldError, NotFoundError
from kvckpt_web.stores.file import FileStore
from kvckpt_web.stores.memory import MemoryStore

from support.kvmodel import KVModel, run
from support.store_suite import Clock, try_claim

SCOPE = "model-a|layout|kernels"


@pytest.fixture
def model(make_model: Callable[..., KVModel]) -> KVModel:
    return make_model(seed=11)


def saved(model: KVModel, store: Any, name: str = "chat", seq: int = 0, *, tokens: list[int] | None = None,
          keep: int | None = DEFAULT_KEEP, **app_state: Any) -> Any:
    """Save ``seq`` as ``name``'s next generation, its ``app_state`` recording the tokens whose K/V it holds (by
    default 100, 101, ...: one more per token a sequence grew by) as a generation does."""
    ids = list(range(100, 100 + model.length(seq))) if tokens is None else tokens
    state = {"prompt_tokens": ids, "generated_tokens": [], **app_state}
    return run(save(model.cache, seq, store, name, pages_per_chunk=2, app_state=state, keep=keep,
                    prefix=PrefixKey(SCOPE, ids)))


def chunk_bytes(store: Any, keys: set[str]) -> int:
    return sum(len(run(store.get(k))) for k in keys)


def generation_bytes(store: Any, name: str = "chat") -> tuple[set[str], int]:
    """The chunk keys of ``name``'s newest manifest, and the bytes of that manifest and its records."""
    manifest, envelope = run(load_manifest(store, name))
    records = [k for k in run(store.list_prefix("prefixes/")) if k.endswith(manifest.key.partition("/")[2])]
    return set(manifest.chunk_keys()), len(envelope) + sum(len(run(store.get(k))) for k in records)


def test_a_sync_moves_the_newest_generations_chunks_once_then_its_manifest_and_record(model, make_cache, tmp_path):
    src, dst = FileStore(tmp_path / "src"), MemoryStore()
    model.add(0, 37)
    saved(model, src)
    model.append({0: 9})
    saved(model, src)
    result = run(sync(src, dst))
    chunks, other = generation_bytes(src)
    assert result.copied == ("manifests/chat/00000000000000000002",)
    assert (result.chunks_sent, result.chunks_present, result.records_sent) == (len(chunks), 0, 1)
    assert result.bytes_sent == chunk_bytes(src, chunks) + other == dst.bytes_written
    assert sorted(k for k in run(dst.list_prefix("manifests/"))) == ["manifests/chat/00000000000000000002"]
    target = make_cache()
    run(restore(dst, "chat", target))
    assert [bytes(g) for g in run(target.export_groups(0))] == model.expected_groups(0)


def test_a_second_sync_after_one_more_turn_moves_only_the_new_chunks(model, tmp_path):
    src, dst = FileStore(tmp_path / "src"), MemoryStore()
    model.add(0, 40)
    saved(model, src)
    run(sync(src, dst))
    before, _ = generation_bytes(src)
    model.append({0: 13})
    saved(model, src)
    after, other = generation_bytes(src)
    result = run(sync(src, dst))
    assert (result.chunks_sent, result.chunks_present) == (len(after - before), len(after & before))
    assert result.bytes_sent == chunk_bytes(src, after - before) + other


def test_a_store_in_sync_moves_nothing(model):
    src, dst = MemoryStore(), MemoryStore()
    model.add(0, 20)
    saved(model, src)
    run(sync(src, dst))
    result = run(sync(src, dst))
    assert (result.copied, result.up_to_date, result.bytes_sent) == ((), ("manifests/chat/00000000000000000001",), 0)


class FailsAfter(MemoryStore):
    """A store whose writes fail once ``budget`` of them succeeded (a connection lost mid-sync)."""

    def __init__(self, data: dict[str, bytes], budget: int) -> None:
        super().__init__(data)
        self.budget = budget

    async def _set(self, key: str, data: memoryview) -> None:
        if self.budget == 0:
            raise ConnectionError("lost")
        self.budget -= 1
        await super()._set(key, data)


def test_an_interrupted_sync_leaves_the_last_committed_generation_and_a_rerun_moves_only_what_is_missing(model):
    src, backing = MemoryStore(), {}
    model.add(0, 40)
    saved(model, src, turn=1)
    run(sync(src, MemoryStore(backing)))
    model.append({0: 20})
    saved(model, src, turn=2)
    chunks, other = generation_bytes(src)
    with pytest.raises(ConnectionError):
        run(sync(src, FailsAfter(backing, budget=2)))
    dst = MemoryStore(backing)
    assert run(load_manifest(dst, "chat"))[0].app_state["turn"] == 1  # the last committed generation
    moved = {k for k in backing if k.startswith("chunks/")}
    result = run(sync(src, dst))
    assert result.chunks_sent == len(chunks - moved) and result.chunks_sent < len(chunks)
    assert result.bytes_sent == chunk_bytes(src, chunks - moved) + other
    assert run(load_manifest(dst, "chat"))[0].app_state["turn"] == 2


def test_a_manifest_is_never_written_before_its_chunks(model):
    src = MemoryStore()
    model.add(0, 30)
    saved(model, src)
    dst = FailsAfter({}, budget=1)  # one chunk goes in, then the connection is lost
    with pytest.raises(ConnectionError):
        run(sync(src, dst))
    assert run(dst.list_prefix("manifests/")) == []


def test_a_destination_that_went_on_further_is_a_conflict_and_stays(model):
    src, dst = MemoryStore(), MemoryStore()
    model.add(0, 30)
    saved(model, src)
    run(sync(src, dst))
    model.append({0: 4})
    saved(model, dst)  # another device went on with it
    result = run(sync(src, dst))
    assert result.copied == () and result.kept_apart == {} and len(result.conflicts) == 1
    assert result.conflicts[0] == ("chat: memory holds generation 2, which goes on from the source's generation 1: "
                                   "not copied (sync the other way to bring the source up to date)")
    assert [g for _, g, _ in run(manifest_keys(dst))] == [1, 2]


def kept_copy(store: Any, name: str = "chat") -> str:
    """The name under which a sync keeps ``store``'s newest generation of ``name`` where it went apart."""
    return apart_name(name, run(load_manifest(store, name))[1])


def test_another_checkpoint_under_the_same_generation_is_kept_beside_under_a_name_of_its_own(model):
    src, dst = MemoryStore(), MemoryStore()
    model.add(0, 30)
    saved(model, src, by="src")
    saved(model, dst, by="dst")
    result = run(sync(src, dst))
    kept = kept_copy(src)
    assert result.kept_apart == {"chat": kept} and result.copied == (f"manifests/{kept}/00000000000000000001",)
    assert run(load_manifest(dst, "chat"))[0].app_state["by"] == "dst"
    assert run(load_manifest(dst, kept))[0].app_state["by"] == "src"


def go_apart(model: KVModel, more: int) -> tuple[list[int], list[int]]:
    """Sequence 1 forked from sequence 0, then each ``more`` tokens longer, K/V and ids of its own (two devices
    that went on from one conversation each its own way); the token ids of 0 and of 1."""
    common = list(range(100, 100 + model.length(0)))
    model.fork(0, 1)
    model.append({0: more, 1: more})
    return common + [7] * more, common + [8] * more


def test_a_conversation_shorter_than_a_chunk_that_went_apart_is_kept_beside_and_not_pulled_over(model, make_cache):
    server, device = MemoryStore(), MemoryStore()
    model.add(0, 3)
    saved(model, server)
    run(sync(server, device))
    theirs, mine = go_apart(model, 2)  # 5 tokens: 2 of the 2 pages of each group's one chunk
    saved(model, device, seq=1, tokens=mine)
    for _ in range(2):  # the other device saved more often: a higher generation, and only the newest is kept
        saved(model, server, seq=0, tokens=theirs, keep=1)
    result = run(sync(server, device))  # a pull
    kept = kept_copy(server)
    assert result.kept_apart == {"chat": kept} and result.copied == (f"manifests/{kept}/00000000000000000003",)
    assert run(load_manifest(device, "chat"))[0].app_state["prompt_tokens"] == mine  # its own copy stays
    target = make_cache()
    run(restore(device, kept, target))
    assert [bytes(g) for g in run(target.export_groups(0))] == model.expected_groups(0)


def test_a_copy_that_went_apart_within_the_last_partial_chunk_is_kept_beside(model):
    server, device = MemoryStore(), MemoryStore()
    model.add(0, 16)
    saved(model, server)
    run(sync(server, device))
    theirs, mine = go_apart(model, 2)  # 18 tokens, 5 pages: 2 whole chunks of 2 pages and a partial one of 1
    saved(model, device, seq=1, tokens=mine)
    for _ in range(2):
        saved(model, server, seq=0, tokens=theirs, keep=1)
    result = run(sync(server, device))
    assert result.kept_apart == {"chat": kept_copy(server)}
    assert run(load_manifest(device, "chat"))[0].app_state["prompt_tokens"] == mine


def pushed_then_apart(model: Any) -> tuple[MemoryStore, MemoryStore, list[int], list[int]]:
    """A device's conversation pushed to a server, after which another device pushed a turn of its own there:
    (device, server, this device's tokens to go on with, the server's tokens)."""
    device, server = MemoryStore(), MemoryStore()
    model.add(0, 3)
    saved(model, device)
    run(sync(device, server))
    mine, theirs = go_apart(model, 2)
    saved(model, server, seq=1, tokens=theirs)
    return device, server, mine, theirs


def test_a_push_of_a_higher_generation_that_went_apart_never_replaces_the_servers_copy(model):
    device, server, mine, theirs = pushed_then_apart(model)  # another device's turn: the server's generation 2
    for _ in range(3):
        saved(model, device, seq=0, tokens=mine, keep=1)  # this device's generation 4 went its own way
    result = run(sync(device, server, names=["chat"]))  # a push
    kept = kept_copy(device)
    assert result.kept_apart == {"chat": kept} and result.conflicts == ()
    assert run(load_manifest(server, "chat"))[0].app_state["prompt_tokens"] == theirs
    assert run(load_manifest(server, kept))[0].app_state["prompt_tokens"] == mine


def test_a_copy_kept_apart_is_up_to_date_on_a_rerun_and_its_continuation_goes_under_the_same_name(model):
    device, server, mine, theirs = pushed_then_apart(model)
    saved(model, device, seq=0, tokens=mine)
    kept = run(sync(device, server)).kept_apart["chat"]
    again = run(sync(device, server))
    assert again.kept_apart == {"chat": kept} and again.up_to_date == (f"manifests/{kept}/00000000000000000002",)
    model.append({0: 2})
    saved(model, device, seq=0, tokens=[*mine, 9, 9])
    later = run(sync(device, server))
    assert later.kept_apart == {"chat": kept} and later.copied == (f"manifests/{kept}/00000000000000000003",)
    assert {n for n, _, _ in run(manifest_keys(server))} == {"chat", kept}


def test_a_copy_kept_apart_carries_its_prefix_index_record_under_its_own_name(model):
    src, dst = MemoryStore(), MemoryStore()
    model.add(0, 12)
    saved(model, src, by="src")
    saved(model, dst, by="dst")
    result = run(sync(src, dst))
    kept = result.kept_apart["chat"]
    assert result.records_sent == 1
    assert [k.split("/")[2:] for k in run(dst.list_prefix("prefixes/")) if kept in k] == [[kept, "0" * 19 + "1"]]


def test_other_names_are_copied_beside_a_conflict(model):
    src, dst = MemoryStore(), MemoryStore()
    model.add(0, 30)
    saved(model, src, "a")
    run(sync(src, dst))
    saved(model, dst, "a")
    saved(model, src, "b")
    result = run(sync(src, dst))
    assert result.copied == ("manifests/b/00000000000000000001",) and len(result.conflicts) == 1


def test_only_the_names_asked_for_are_copied(model):
    src, dst = MemoryStore(), MemoryStore()
    model.add(0, 30)
    saved(model, src, "a")
    saved(model, src, "b")
    assert run(sync(src, dst, names=["b"])).copied == ("manifests/b/00000000000000000001",)
    assert run(manifest_keys(dst)) == [("b", 1, "manifests/b/00000000000000000001")]


def test_a_name_the_source_does_not_hold_is_not_found(model):
    with pytest.raises(NotFoundError, match="'nope'"):
        run(sync(MemoryStore(), MemoryStore(), names=["nope"]))


def test_names_must_be_a_collection_of_names():
    with pytest.raises(FieldError):
        run(sync(MemoryStore(), MemoryStore(), names="chat"))


def test_a_damaged_chunk_in_the_source_is_not_copied_and_no_manifest_is_written(model):
    src, dst = MemoryStore(), MemoryStore()
    model.add(0, 30)
    saved(model, src)
    key = sorted(k for k in src._data if k.startswith("chunks/"))[0]
    src._data[key] = bytes(len(src._data[key]))
    with pytest.raises(CorruptionError, match=key) as caught:
        run(sync(src, dst))
    assert str(caught.value).startswith("chat: generation 1 in memory is damaged") and "is damaged" in str(caught.value)
    assert run(dst.list_prefix("manifests/")) == []


def test_a_sync_holds_the_destinations_claim_of_each_name(model):
    src, dst = MemoryStore(), MemoryStore()
    model.add(0, 30)
    saved(model, src)

    async def body() -> Any:
        async with dst.claim("chat"):  # an engine writing "chat" in the destination
            return await sync(src, dst)

    result = run(body())
    assert result.copied == () and result.conflicts == ("chat: being written in memory (a reply under way there, or "
                                                        "another tab, process or sync): not copied",)


def test_a_continuation_is_copied_though_the_source_dropped_the_generation_the_destination_holds(model):
    src, dst = MemoryStore(), MemoryStore()
    model.add(0, 30)
    saved(model, src)
    run(sync(src, dst))
    for _ in range(2):
        model.append({0: 9})
        saved(model, src, keep=1)  # generation 1 is gone from src
    result = run(sync(src, dst))
    assert result.copied == ("manifests/chat/00000000000000000003",) and result.conflicts == ()


def test_a_reply_regenerated_at_the_source_after_a_sync_is_copied_under_its_name(model):
    src, dst = MemoryStore(), MemoryStore()
    model.add(0, 30)
    saved(model, src)
    run(sync(src, dst))
    saved(model, src, tokens=[*range(100, 120), *[5] * 10])  # its own history: dst's generation is src's
    result = run(sync(src, dst))
    assert result.copied == ("manifests/chat/00000000000000000002",) and result.kept_apart == {}


def test_an_older_generation_of_another_conversation_is_kept_apart(model):
    src, dst = MemoryStore(), MemoryStore()
    model.add(0, 30)
    saved(model, dst, conversation={"id": "a" * 32, "created_ms": 1})
    for _ in range(2):
        saved(model, src, keep=1, conversation={"id": "b" * 32, "created_ms": 2})
    result = run(sync(src, dst))
    assert result.kept_apart == {"chat": kept_copy(src)}
    assert run(load_manifest(dst, "chat"))[0].app_state["conversation"]["id"] == "a" * 32


def test_a_checkpoint_that_saved_no_tokens_continues_only_its_own_history(model):
    src, dst = MemoryStore(), MemoryStore()
    model.add(0, 30)
    run(save(model.cache, 0, src, "chat", pages_per_chunk=2))
    run(sync(src, dst))
    model.append({0: 9})
    run(save(model.cache, 0, src, "chat", pages_per_chunk=2))
    assert run(sync(src, dst)).copied == ("manifests/chat/00000000000000000002",)
    run(save(model.cache, 0, dst, "chat", pages_per_chunk=2, keep=None))  # dst's generation 3: src holds none
    run(save(model.cache, 0, src, "chat", pages_per_chunk=2, keep=1))
    run(save(model.cache, 0, src, "chat", pages_per_chunk=2, keep=1))
    assert run(sync(src, dst)).kept_apart == {"chat": kept_copy(src)}


def test_a_sync_longer_than_its_lease_renews_it_so_no_other_writer_takes_the_name_over_before_its_commit(model):
    obstore = pytest.importorskip("obstore")
    from kvckpt_web.stores.leases import DEFAULT_LEASE_SECONDS
    from kvckpt_web.stores.objects import ObjectStore

    clock, backing, asked = Clock(), obstore.store.MemoryStore(), []

    class SlowSource(MemoryStore):
        async def get(self, key: str, *, max_bytes: int | None = None) -> bytes | None:
            if key.startswith("chunks/"):
                clock.offset += DEFAULT_LEASE_SECONDS  # each chunk takes a whole lease to read
            return await super().get(key, max_bytes=max_bytes)

    class Destination(ObjectStore):
        async def set_if_absent(self, key: str, data: Any) -> bool:
            if key.startswith("manifests/"):  # as the sync commits, another writer asks for the name
                asked.append(await try_claim(ObjectStore(backing, clock=clock), "chat"))
            return await super().set_if_absent(key, data)

    src = SlowSource()
    model.add(0, 37)
    saved(model, src)
    result = run(sync(src, Destination(backing, clock=clock)))
    assert result.copied == ("manifests/chat/00000000000000000001",) and asked == ["refused"]
