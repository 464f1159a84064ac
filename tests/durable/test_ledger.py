"""What a process knows of a store's checkpoints lives in a Ledger: given to each call, or the store object's own.

A second ledger on the same store, like a second store object on the same storage, knows nothing of the
first's saves, as a new process does: its first save of a name reads every page back from the GPU.
"""

from __future__ import annotations

import gc as garbage
import weakref
from collections.abc import Callable
from typing import Any

import pytest

from kvckpt_web.durable.ledger import Ledger
from kvckpt_web.durable.restore import restore
from kvckpt_web.durable.retention import delete_name
from kvckpt_web.durable.save import save
from kvckpt_web.durable.verify import verify
from kvckpt_web.stores.memory import MemoryStore

from support.kvmodel import KVModel, run

PPC = 4  # pages per chunk: 16 tokens with the small layout
TOKENS = 4 * PPC * 3 + 1  # three full chunks and one holding a partial page only
PAGES = 4 * 3 + 1


@pytest.fixture
def model(make_model: Callable[..., KVModel]) -> KVModel:
    made = make_model(seed=3)
    made.add(0, TOKENS)
    return made


def saved(model: KVModel, store: MemoryStore, ledger: Ledger | None = None, name: str = "s") -> Any:
    return run(save(model.cache, 0, store, name, pages_per_chunk=PPC, ledger=ledger))


def test_a_ledger_saves_a_name_again_reading_back_only_the_pages_that_changed(model):
    store = MemoryStore()
    ledger = Ledger(store)
    assert saved(model, store, ledger).pages_read == PAGES
    model.append({0: 1})
    assert saved(model, store, ledger).pages_read == 1  # the partial last page, one token longer


def test_a_second_ledger_on_the_same_store_knows_nothing_of_the_firsts_saves(model):
    store = MemoryStore()
    first, second = Ledger(store), Ledger(store)
    saved(model, store, first)
    assert second.last_saved("s") is None and second.trusted == frozenset()
    result = saved(model, store, second)
    assert result.pages_read == PAGES and result.chunks_written == 0  # read and hashed again; nothing rewritten
    assert first.last_saved("s").key != second.last_saved("s").key


def test_a_second_store_object_on_the_same_storage_starts_with_nothing(model):
    data: dict[str, bytes] = {}
    store = MemoryStore(data)
    saved(model, store)
    saved(model, store)
    other = MemoryStore(data)
    assert Ledger.of(other) is not Ledger.of(store)
    assert Ledger.of(other).last_saved("s") is None and Ledger.of(other).trusted == frozenset()
    assert saved(model, other).pages_read == PAGES


def test_without_a_ledger_saves_through_one_store_object_are_incremental(model):
    store = MemoryStore()
    saved(model, store)
    model.append({0: 1})
    assert saved(model, store).pages_read == 1
    assert Ledger.of(store).last_saved("s").key == "manifests/s/00000000000000000002"


def test_a_stores_own_ledger_lives_and_dies_with_the_store_object(model):
    store = MemoryStore()
    saved(model, store)
    own = weakref.ref(Ledger.of(store))
    held = weakref.ref(store)
    del store
    garbage.collect()
    assert held() is None and own() is None


def test_a_restore_is_remembered_by_its_ledger_for_the_next_save_of_the_name(model, make_cache):
    store = MemoryStore()
    saved(model, store)
    target = make_cache(limits=model.cache.limits)
    ledger = Ledger(store)
    run(restore(store, "s", target, ledger=ledger))
    assert ledger.last_saved("s") is not None and Ledger.of(store).last_saved("s").key == ledger.last_saved("s").key
    result = run(save(target, 0, store, "s", pages_per_chunk=PPC, ledger=ledger))
    assert result.pages_read == 1 and result.chunks_written == 0  # its partial last page only


def test_verify_makes_its_ledger_distrust_a_damaged_chunk(model):
    store = MemoryStore()
    ledger = Ledger(store)
    saved(model, store, ledger)
    damaged = sorted(ledger.trusted)[0]
    store._data[damaged] = bytes(len(store._data[damaged]))
    report = run(verify(store, ledger=ledger))
    assert report.problems and not ledger.trusts(damaged)
    assert ledger.trusted == frozenset(k for k in store._data if k.startswith("chunks/")) - {damaged}


def test_delete_name_makes_its_ledger_forget_the_name_and_its_chunks(model):
    store = MemoryStore()
    ledger = Ledger(store)
    saved(model, store, ledger)
    run(delete_name(store, "s", ledger=ledger))
    assert ledger.last_saved("s") is None and ledger.trusted == frozenset()
