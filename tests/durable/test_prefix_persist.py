"""Prefix index records beside checkpoints: committed by save after the manifest, deleted after it by
retention, gc and delete_name, and reported by verify (FORMAT.md section 7)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from kvckpt_web.durable import prefix_records
from kvckpt_web.durable.ledger import Ledger
from kvckpt_web.durable.prefix_index import PrefixIndex
from kvckpt_web.durable.prefix_records import (PrefixKey, decode_record, encode_record, prefix_record, record_key,
                                               scope_id)
from kvckpt_web.durable.restore import restore
from kvckpt_web.durable.retention import delete_name, gc
from kvckpt_web.durable.save import save
from kvckpt_web.durable.verify import verify
from kvckpt_web.errors import FieldError, StoreError
from kvckpt_web.stores.memory import MemoryStore

from support.kvmodel import KVModel, run

SCOPE = "model-a|layout|kernels"
PAGE = 4  # the small layout's page size


@pytest.fixture
def model(make_model: Callable[..., KVModel]) -> KVModel:
    return make_model(seed=3)


def tokens(n: int, start: int = 100) -> list[int]:
    return list(range(start, start + n))


def saved(model: KVModel, store: MemoryStore, name: str, seq: int = 0, **kwargs: Any):
    ids = kwargs.pop("ids", tokens(model.length(seq)))
    return run(save(model.cache, seq, store, name, pages_per_chunk=2, prefix=PrefixKey(SCOPE, ids), **kwargs))


def records(store: MemoryStore) -> list[str]:
    return sorted(k for k in store._data if k.startswith("prefixes/"))


def key(name: str, generation: int) -> str:
    return record_key(scope_id(SCOPE), name, generation)


class Ordered(MemoryStore):
    """A store that logs each set and delete, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, str]] = []

    async def _set(self, key: str, data: memoryview) -> None:
        self.log.append(("set", key))
        await super()._set(key, data)

    async def _delete(self, key: str) -> None:
        self.log.append(("delete", key))
        await super()._delete(key)


def test_save_writes_the_record_last_after_the_manifest(model):
    model.add(0, 21)
    store = Ordered()
    result = saved(model, store, "a")
    sets = [k for op, k in store.log if op == "set"]
    assert sets[-2:] == [result.key, key("a", 1)]
    assert decode_record(key("a", 1), store._data[key("a", 1)]) == result.prefix_record
    assert result.prefix_record.pages and result.prefix_record.tokens == 21 and result.warnings == ()


def test_a_save_without_a_prefix_writes_no_record(model):
    model.add(0, 21)
    store = MemoryStore()
    result = run(save(model.cache, 0, store, "a"))
    assert records(store) == [] and result.prefix_record is None


def test_save_refuses_a_prefix_of_another_length_before_writing_anything(model):
    model.add(0, 21)
    store = MemoryStore()
    with pytest.raises(FieldError, match=r"prefix.tokens: expected 21 token ids.*got '20 ids'"):
        saved(model, store, "a", ids=tokens(20))
    with pytest.raises(FieldError, match="prefix"):
        run(save(model.cache, 0, store, "a", prefix=tokens(21)))
    assert store._data == {}


class FailingRecords(MemoryStore):
    async def _set(self, key: str, data: memoryview) -> None:
        if key.startswith("prefixes/"):
            raise StoreError(f"set {key!r}: the process died here")
        await super()._set(key, data)


def test_a_record_lost_after_the_manifest_costs_a_miss_and_a_warning(model, make_cache):
    model.add(0, 21)
    store = FailingRecords()
    result = saved(model, store, "a")
    assert result.prefix_record is None and records(store) == []
    assert len(result.warnings) == 1 and "prefix index record not written" in result.warnings[0]
    index = PrefixIndex(store, SCOPE, PAGE)
    run(index.refresh())
    assert index.lookup(tokens(21)) == []
    target = make_cache()
    run(restore(store, "a", target))
    assert [bytes(g) for g in run(target.export_groups(0))] == model.expected_groups(0)


def test_rebuild_writes_the_record_a_save_lost_as_the_save_would_have(model):
    model.add(0, 21)
    store = MemoryStore()
    saved(model, store, "a")
    want = store._data.pop(key("a", 1))
    index = PrefixIndex(store, SCOPE, PAGE)
    run(index.refresh())
    assert [r.key for r in run(index.rebuild([("a", 1, tokens(21))]))] == [key("a", 1)]
    assert store._data[key("a", 1)] == want
    assert [(h.name, h.generation) for h in index.lookup(tokens(21))] == [("a", 1)]


def test_rebuild_leaves_alone_a_checkpoint_indexed_in_another_scope(model):
    model.add(0, 21)
    store = MemoryStore()
    saved(model, store, "a")  # its writer's scope: SCOPE
    index = PrefixIndex(store, "model-a|layout|other-kernels", PAGE)
    assert run(index.rebuild([("a", 1, tokens(21))])) == []
    assert records(store) == [key("a", 1)] and index.lookup(tokens(21)) == []


def test_a_record_over_the_size_cap_is_a_warning_and_none_is_written(model, monkeypatch):
    model.add(0, 21)
    monkeypatch.setattr(prefix_records, "MAX_RECORD_BYTES", 64)
    store = MemoryStore()
    result = saved(model, store, "a")
    assert records(store) == [] and "length" in result.warnings[0]


def test_retention_deletes_the_records_of_dropped_generations_after_their_manifests(model):
    model.add(0, 9)
    store = Ordered()
    saved(model, store, "a", keep=1)
    model.append({0: 4})
    saved(model, store, "a", keep=1)
    assert records(store) == [key("a", 2)]
    deletes = [k for op, k in store.log if op == "delete"]
    assert deletes.index("manifests/a/00000000000000000001") < deletes.index(key("a", 1))


def test_delete_name_deletes_its_records_after_its_manifests(model):
    model.add(0, 9)
    model.add(1, 13)
    store = Ordered()
    saved(model, store, "a")
    model.append({0: 4})
    saved(model, store, "a")
    saved(model, store, "b", seq=1)
    result = run(delete_name(store, "a"))
    assert records(store) == [key("b", 1)] and result.deleted_records == 2
    deletes = [k for op, k in store.log if op == "delete"]
    assert max(deletes.index(k) for k in result.deleted_manifests) < min(deletes.index(key("a", g)) for g in (1, 2))


def damaged(kind: str, name: str, generation: int) -> tuple[str, bytes]:
    """A record a reader ignores, under the key of ``name`` generation ``generation``."""
    k = key(name, generation)
    good = json.loads(encode_record(prefix_record(PrefixKey(SCOPE, tuple(tokens(9))), name, generation, 9, PAGE)))
    if kind == "damaged":
        return k, b'{"format":"kvckpt.pre'
    if kind == "oversize":
        return k, b" " * (prefix_records.MAX_RECORD_BYTES + 1)
    if kind == "another version":
        return k, json.dumps({**good, "version": 2, "new": True}).encode()
    return k, json.dumps({**good, "name": "zz"}).encode()  # mismatched key


KINDS = ["damaged", "oversize", "another version", "mismatched key"]


@pytest.mark.parametrize("kind", KINDS)
def test_gc_deletes_an_ignored_record_whose_manifest_is_gone_and_keeps_one_whose_manifest_exists(model, kind):
    model.add(0, 9)
    store = MemoryStore()
    run(save(model.cache, 0, store, "a"))  # no record of its own
    kept, kept_data = damaged(kind, "a", 1)
    gone, gone_data = damaged(kind, "a", 7)
    store._data.update({kept: kept_data, gone: gone_data})
    result = run(gc(store))
    assert records(store) == [kept] and result.deleted_records == 1


def test_gc_deletes_no_record_whose_manifest_exists_and_leaves_other_keys_alone(model):
    model.add(0, 9)
    model.add(1, 13)
    store = MemoryStore()
    saved(model, store, "a")
    saved(model, store, "b", seq=1)
    store._data[key("b", 1).replace("/00000000000000000001", "/x")] = b"not a record key"
    before = records(store)
    assert run(gc(store)).deleted_records == 0
    assert records(store) == before


def test_verify_reports_ignored_and_orphaned_records_as_warnings_not_damage(model):
    model.add(0, 9)
    store = MemoryStore()
    saved(model, store, "a")
    for kind, generation in (("damaged", 5), ("another version", 6)):
        k, data = damaged(kind, "a", generation)
        store._data[k] = data
    orphan = prefix_record(PrefixKey(SCOPE, tuple(tokens(9))), "a", 4, 9, PAGE)
    store._data[orphan.key] = encode_record(orphan)
    report = run(verify(store))
    assert report.ok and report.problems == []
    assert [w.split(":")[0] for w in report.warnings] == [key("a", 4), key("a", 5), key("a", 6)]
    assert "no longer stored" in report.warnings[0] and "version" in report.warnings[2]


def test_an_index_finds_a_checkpoint_a_new_process_saved_and_the_one_it_noted(model):
    model.add(0, 9)
    model.add(1, 13)
    store = MemoryStore()
    saved(model, store, "a")
    index = PrefixIndex(store, SCOPE, PAGE)
    run(index.refresh())
    Ledger.of(store).forget()
    result = saved(model, store, "b", seq=1, ids=tokens(13, start=100))
    index.note(result.prefix_record)
    hits = index.lookup(tokens(13))
    assert [(h.name, h.pages, h.tokens) for h in hits] == [("b", 3, 13), ("a", 2, 9)]
