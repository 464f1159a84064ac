"""Deleting several names at once (``durable.retention.delete_names``): every manifest of each first, then one pass
over the store's chunks for all of them; the chunks another name uses stay, and a name another writer holds or
that holds nothing is left."""

from __future__ import annotations

import pytest

from kvckpt_web.durable.catalog import list_names
from kvckpt_web.durable.restore import restore
from kvckpt_web.durable.retention import delete_names
from kvckpt_web.durable.save import save
from kvckpt_web.errors import FieldError
from kvckpt_web.stores.file import FileStore

from support.counting_store import CountingStore, count
from support.kvmodel import KVModel, run


@pytest.fixture
def model(make_model) -> KVModel:
    model = make_model(seed=1)
    model.add(0, 16)
    return model


def saved(model: KVModel, store, *names: str) -> None:
    for name in names:
        run(save(model.cache, 0, store, name, pages_per_chunk=4))


def test_several_names_are_deleted_with_one_pass_over_the_chunks_and_the_shared_chunks_stay(model, make_model):
    store = CountingStore()
    saved(model, store, "keep", "a", "b", "c")
    store.reset()
    assert run(delete_names(store, ["a", "b", "c", "missing"])) == ["a", "b", "c"]
    assert count(store.calls, "list", "chunks/") == 1 and run(list_names(store)) == ["keep"]
    assert run(restore(store, "keep", make_model(seed=2).cache)).seq_length == 16


def test_a_name_another_writer_holds_is_left_and_the_others_deleted(model, tmp_path):
    store = FileStore(tmp_path)
    saved(model, store, "held", "gone")

    async def delete_while_claimed() -> list[str]:
        async with FileStore(tmp_path).claim("held"):  # another writer of the name
            return await delete_names(store, ["held", "gone"])

    assert run(delete_while_claimed()) == ["gone"] and run(list_names(store)) == ["held"]


def test_nothing_is_read_when_no_name_is_deleted(model):
    store = CountingStore()
    saved(model, store, "keep")
    store.reset()
    assert run(delete_names(store, ["missing"])) == [] and count(store.calls, "list", "chunks/") == 0


def test_a_bare_string_of_names_is_refused_naming_the_field(model):
    store = CountingStore()
    saved(model, store, "keep")
    with pytest.raises(FieldError, match="names"):
        run(delete_names(store, "keep"))
    assert run(list_names(store)) == ["keep"]
