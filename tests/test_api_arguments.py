"""Every public call refuses an argument of the wrong type or out of its range with a KVCkptError naming it,
before it changes anything: no cache, store or file is touched.

One row per call: what it is called with, and the field its error must name (a FieldError's ``field``; the
start of the message for the errors that carry none, such as SequenceError). The generation API's arguments
are specified beside its other tests, in ``tests/generation/test_generator.py``; KVLayout's and CacheLimits' in
``tests/tvm/test_layout.py``.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kvckpt_web import (DeviceArray, FieldError, FileStore, HostTensor, IndexedDBStore, KVCkptError, Ledger,
                        MemoryStore, OPFSStore, PagedKVCache, PageGroups, gc, list_generations, list_names,
                        read_tvm_export, restore, save, verify, write_tvm_export)
from kvckpt_web.durable.catalog import load_manifest
from kvckpt_web.durable.retention import delete_name
from kvckpt_web.gpu.device import Buffer, Usage

from support.kvmodel import KVModel, names_field, run


@dataclass
class World:
    """What the calls act on: a cache holding sequences 0 and 1, a store holding two generations each of the
    names "chat" and "c", and a directory holding a TVM export and a FileStore."""

    model: KVModel
    store: MemoryStore
    data: dict[str, bytes]
    files: Path
    metadata: str

    @property
    def cache(self) -> PagedKVCache:
        return self.model.cache


@pytest.fixture
def world(make_model: Callable[..., KVModel], tmp_path: Path) -> World:
    model = make_model()
    model.add(0, 5)
    model.add(1, 3)
    data: dict[str, bytes] = {}
    store = MemoryStore(data)
    for name in ("chat", "chat", "c", "c"):
        run(save(model.cache, 0, store, name))
    metadata = model.cache.get_checkpoint_metadata(0)
    write_tvm_export(tmp_path / "export", metadata, model.expected_groups(0))
    FileStore(tmp_path / "store")
    return World(model, store, data, tmp_path, metadata)


def snapshot(w: World) -> tuple[Any, ...]:
    """Everything a refused call must leave as it was: the cache's sequences (which objects, lengths, pops), free
    pages and K/V; the store's keys and bytes; the files under the directory."""
    cache = w.cache
    sequences = [(s, cache.sequence_state(s)) for s in cache.sequence_ids()]
    kv = [[bytes(g) for g in run(cache.export_groups(s))] for s in cache.sequence_ids()]
    files = {str(p.relative_to(w.files)): p.read_bytes() if p.is_file() else None for p in w.files.rglob("*")}
    return sequences, cache.get_num_available_pages(), kv, dict(w.data), files


def groups(w: World) -> list[bytes]:
    return w.model.expected_groups(0)


#: (id, the call, the field its error names)
CALLS: list[tuple[str, Callable[[World], Any], str]] = [
    # ----- durable: save, restore, verify, gc, delete_name, the catalog, TVM export directories
    ("save cache=None", lambda w: save(None, 0, w.store, "chat"), "cache"),
    ("save seq_id=str", lambda w: save(w.cache, "0", w.store, "chat"), "seq_id"),
    ("save store=None", lambda w: save(w.cache, 0, None, "chat"), "store"),
    ("save name=int", lambda w: save(w.cache, 0, w.store, 7), "name"),
    ("save keep=float", lambda w: save(w.cache, 0, w.store, "chat", keep=1.0), "keep"),
    ("save keep=0", lambda w: save(w.cache, 0, w.store, "chat", keep=0), "keep"),
    ("save pages_per_chunk=str", lambda w: save(w.cache, 0, w.store, "chat", pages_per_chunk="4"), "pages_per_chunk"),
    ("save app_state=list", lambda w: save(w.cache, 0, w.store, "chat", app_state=[1]), "app_state"),
    ("save app_state key=int", lambda w: save(w.cache, 0, w.store, "chat", app_state={1: "one"}), "app_state key 1"),
    ("save app_state nested key=None",
     lambda w: save(w.cache, 0, w.store, "chat", app_state={"turns": [{"ids": {None: 0}}]}),
     "app_state.turns[0].ids key None"),
    ("save progress=int", lambda w: save(w.cache, 0, w.store, "chat", progress=1), "progress"),
    ("save ledger=str", lambda w: save(w.cache, 0, w.store, "chat", ledger="mine"), "ledger"),
    ("save ledger of another store", lambda w: save(w.cache, 0, w.store, "chat", ledger=Ledger(MemoryStore())),
     "ledger"),
    ("restore store=None", lambda w: restore(None, "chat", w.cache), "store"),
    ("restore name=None", lambda w: restore(w.store, None, w.cache), "name"),
    ("restore cache=None", lambda w: restore(w.store, "chat", None), "cache"),
    ("restore seq_id=str", lambda w: restore(w.store, "chat", w.cache, seq_id="2"), "seq_id"),
    ("restore seq_id=-1", lambda w: restore(w.store, "chat", w.cache, seq_id=-1), "seq_id"),
    ("restore generation=str", lambda w: restore(w.store, "chat", w.cache, generation="1"), "generation"),
    ("restore progress=int", lambda w: restore(w.store, "chat", w.cache, seq_id=2, progress=1), "progress"),
    ("restore manifest=bytes", lambda w: restore(w.store, "chat", w.cache, generation=1, manifest=b"{}"), "manifest"),
    ("restore ledger of another store",
     lambda w: restore(w.store, "chat", w.cache, seq_id=2, ledger=Ledger(MemoryStore(w.data))), "ledger"),
    ("verify store=None", lambda w: verify(None), "store"),
    ("verify name=int", lambda w: verify(w.store, name=1), "name"),
    ("verify device=int", lambda w: verify(w.store, device=1), "device"),
    ("verify progress=int", lambda w: verify(w.store, progress=1), "progress"),
    ("verify ledger=int", lambda w: verify(w.store, ledger=1), "ledger"),
    ("gc store=None", lambda w: gc(None, keep=1), "store"),
    ("gc names=str", lambda w: gc(w.store, keep=1, names="chat"), "names"),
    ("gc names=bytes", lambda w: gc(w.store, keep=1, names=b"chat"), "names"),
    ("gc names=int", lambda w: gc(w.store, keep=1, names=1), "names"),
    ("gc names=[int]", lambda w: gc(w.store, keep=1, names=["chat", 1]), "names[1]"),
    ("gc keep=0", lambda w: gc(w.store, keep=0), "keep"),
    ("gc progress=int", lambda w: gc(w.store, keep=1, progress=1), "progress"),
    ("gc ledger of another store", lambda w: gc(w.store, keep=1, ledger=Ledger(MemoryStore(w.data))), "ledger"),
    ("delete_name store=None", lambda w: delete_name(None, "chat"), "store"),
    ("delete_name name=list", lambda w: delete_name(w.store, ["chat"]), "name"),
    ("delete_name progress=int", lambda w: delete_name(w.store, "chat", progress=1), "progress"),
    ("delete_name ledger=str", lambda w: delete_name(w.store, "chat", ledger="mine"), "ledger"),
    ("Ledger store=None", lambda w: Ledger(None), "store"),
    ("list_names store=None", lambda w: list_names(None), "store"),
    ("list_generations store=None", lambda w: list_generations(None), "store"),
    ("list_generations name=int", lambda w: list_generations(w.store, 1), "name"),
    ("load_manifest store=None", lambda w: load_manifest(None, "chat"), "store"),
    ("load_manifest generation=float", lambda w: load_manifest(w.store, "chat", 1.0), "generation"),
    ("read_tvm_export path=None", lambda w: read_tvm_export(None), "path"),
    ("write_tvm_export path=None", lambda w: write_tvm_export(None, w.metadata, groups(w)), "path"),
    ("write_tvm_export groups=None",
     lambda w: write_tvm_export(w.files / "export", w.metadata, None, overwrite=True), "groups"),
    ("write_tvm_export groups=str",
     lambda w: write_tvm_export(w.files / "export", w.metadata, "ab", overwrite=True), "groups"),
    ("write_tvm_export groups=[int]",
     lambda w: write_tvm_export(w.files / "export", w.metadata, [groups(w)[0], 1], overwrite=True), "groups[1]"),
    ("write_tvm_export overwrite=str",
     lambda w: write_tvm_export(w.files / "export", w.metadata, groups(w), overwrite="yes"), "overwrite"),
    # ----- stores
    ("FileStore directory=None", lambda w: FileStore(None), "directory"),
    ("FileStore directory=int", lambda w: FileStore(3), "directory"),
    ("FileStore lock_timeout=nan", lambda w: FileStore(w.files / "new", lock_timeout=math.nan), "lock_timeout"),
    ("FileStore lock_timeout=-1", lambda w: FileStore(w.files / "new", lock_timeout=-1), "lock_timeout"),
    ("FileStore lock_timeout=inf", lambda w: FileStore(w.files / "new", lock_timeout=math.inf), "lock_timeout"),
    ("FileStore lock_timeout=None", lambda w: FileStore(w.files / "new", lock_timeout=None), "lock_timeout"),
    ("FileStore lock_timeout=str", lambda w: FileStore(w.files / "new", lock_timeout="5"), "lock_timeout"),
    ("FileStore read_only=str", lambda w: FileStore(w.files / "store", read_only="no"), "read_only"),
    ("FileStore fault=int", lambda w: FileStore(w.files / "new", fault=1), "fault"),
    ("FileStore unnamed_files=int", lambda w: FileStore(w.files / "new", unnamed_files=0), "unnamed_files"),
    ("FileStore direct_io=None", lambda w: FileStore(w.files / "new", direct_io=None), "direct_io"),
    ("FileStore.check_directory tops=str",
     lambda w: FileStore.check_directory(w.files / "store", "chunks"), "tops"),
    ("MemoryStore data=list", lambda w: MemoryStore([]), "data"),
    ("MemoryStore lock_timeout=nan", lambda w: MemoryStore(w.data, lock_timeout=math.nan), "lock_timeout"),
    ("MemoryStore read_only=int", lambda w: MemoryStore(w.data, read_only=1), "read_only"),
    ("IndexedDBStore.open lock_timeout=-1", lambda w: IndexedDBStore.open("kv", lock_timeout=-1), "lock_timeout"),
    ("IndexedDBStore.open name=None", lambda w: IndexedDBStore.open(None), "name"),
    ("OPFSStore.open persist=str", lambda w: OPFSStore.open("kv", persist="yes"), "persist"),
    ("store.lock timeout=nan", lambda w: w.store.lock(math.nan), "timeout"),
    ("store.lock timeout=-1", lambda w: w.store.lock(-1), "timeout"),
    ("store.lock timeout=str", lambda w: w.store.lock("1"), "timeout"),
    ("store.get max_bytes=-1", lambda w: w.store.get("manifests/chat/00000000000000000001", max_bytes=-1),
     "max_bytes"),
    ("store.get max_bytes=str", lambda w: w.store.get("manifests/chat/00000000000000000001", max_bytes="9"),
     "max_bytes"),
    # ----- the cache
    ("PagedKVCache device=None", lambda w: PagedKVCache(None, w.cache.layout), "device"),
    ("PagedKVCache layout=None", lambda w: PagedKVCache(w.cache.device, None), "layout"),
    ("PagedKVCache limits=int", lambda w: PagedKVCache(w.cache.device, w.cache.layout, 64), "limits"),
    ("PagedKVCache.from_metadata device=None", lambda w: PagedKVCache.from_metadata(None, w.metadata), "device"),
    ("begin_forward seq_ids=int", lambda w: w.cache.begin_forward(0, 5), "seq_ids"),
    ("begin_forward seq_ids=str", lambda w: w.cache.begin_forward("0", [5]), "seq_ids"),
    ("begin_forward seq_ids=[None]", lambda w: w.cache.begin_forward([None], [5]), "seq_ids[0]"),
    ("begin_forward seq_ids=[list]", lambda w: w.cache.begin_forward([[0]], [5]), "seq_ids[0]"),
    ("begin_forward append_lengths=int", lambda w: w.cache.begin_forward([0], 5), "append_lengths"),
    ("load_checkpoint groups=None", lambda w: w.cache.load_checkpoint(w.metadata, None, exclusive=False), "groups"),
    ("load_checkpoint groups=str", lambda w: w.cache.load_checkpoint(w.metadata, "ab", exclusive=False), "groups"),
    ("load_checkpoint exclusive=str",
     lambda w: w.cache.load_checkpoint(w.metadata, groups(w), seq_id=2, exclusive="no"), "exclusive"),
    ("prepare_import exclusive=None", lambda w: w.cache.prepare_import(0, w.metadata, exclusive=None), "exclusive"),
    ("remove_sequence seq_id=list", lambda w: w.cache.remove_sequence([0]), "seq_id"),
    ("fork_sequence parent_id=list", lambda w: w.cache.fork_sequence([0], 2), "seq_id"),
    ("popn seq_id=list", lambda w: w.cache.popn([0], 1), "seq_id"),
    ("page_table seq_id=list", lambda w: w.cache.page_table([0]), "seq_id"),
    ("sequence_state seq_id=list", lambda w: w.cache.sequence_state([0]), "seq_id"),
    ("get_sequence_length seq_id=list", lambda w: w.cache.get_sequence_length([0]), "seq_id"),
    ("get_checkpoint_metadata seq_id=list", lambda w: w.cache.get_checkpoint_metadata([0]), "seq_id"),
    ("unchanged_prefix since=None", lambda w: w.cache.unchanged_prefix(0, None), "since"),
    ("empty_group num_logical_pages=-1", lambda w: w.cache.empty_group(-1), "num_logical_pages"),
    ("empty_group num_logical_pages=str", lambda w: w.cache.empty_group("2"), "num_logical_pages"),
    ("host_groups num_logical_pages=-1", lambda w: w.cache.host_groups(-1), "num_logical_pages"),
    ("read_pages page_begin=str", lambda w: w.cache.read_pages(0, "0"), "page_begin"),
    ("read_pages out=int", lambda w: w.cache.read_pages(0, out=1), "out"),
    ("export_groups out=bytes", lambda w: w.cache.export_groups(0, out=bytes(4096)), "out"),
    ("host_nbytes page_begin=None", lambda w: w.cache.host_nbytes(0, None), "page_begin"),
    ("map_pages page_end=str", lambda w: w.cache.map_pages(0, 0, "1"), "page_end"),
    ("debug_get_kv start=float", lambda w: w.cache.debug_get_kv(0, 0.0, 2), "start"),
    # ----- host and device tensors
    ("PageGroups host=None", lambda w: PageGroups(None, 4, 1), "PageGroups.host"),
    ("PageGroups group_bytes=str", lambda w: PageGroups(memoryview(bytearray(8)), "4", 2), "PageGroups.group_bytes"),
    ("PageGroups.zeros count=None", lambda w: PageGroups.zeros(None, 4), "PageGroups.count"),
    ("DeviceArray buffer=None", lambda w: DeviceArray(None, (1, 1, 2, 2, 4, 8), "float16"), "buffer"),
    ("DeviceArray offset=-4", lambda w: DeviceArray(Buffer(16, Usage.STORAGE, None), (1,), "float16", -4), "offset"),
    ("HostTensor shape=int", lambda w: HostTensor(b"\0\0", 1, "float16"), "shape"),
    ("HostTensor data=str", lambda w: HostTensor("ab", (1,), "float16"), "data"),
]


@pytest.mark.parametrize("call, field", [row[1:] for row in CALLS], ids=[row[0] for row in CALLS])
def test_a_wrong_argument_is_refused_naming_it_before_anything_changes(world, call, field):
    before = snapshot(world)
    with pytest.raises(KVCkptError) as info:
        result = call(world)
        if inspect.isawaitable(result):
            run(result)
    assert names_field(info.value, field), f"{type(info.value).__name__}: {info.value}"
    assert snapshot(world) == before


def test_the_refusal_of_a_bare_string_of_names_keeps_the_generations_of_its_letters(world):
    before = run(list_generations(world.store, "c"))
    with pytest.raises(FieldError, match="a bare str is one value, not a collection"):
        run(gc(world.store, keep=1, names="chat"))
    assert [g.key for g in run(list_generations(world.store, "c"))] == [g.key for g in before]


def test_a_collection_of_names_is_any_iterable_of_them(world):
    result = run(gc(world.store, keep=1, names=(n for n in ["c"])))
    assert result.deleted_manifests == ("manifests/c/00000000000000000001",)


@pytest.mark.parametrize("make", [lambda path: FileStore(path, lock_timeout=0),
                                  lambda path: MemoryStore(lock_timeout=3)],
                         ids=["FileStore lock_timeout=0", "MemoryStore lock_timeout=int"])
def test_a_lock_timeout_of_zero_or_an_integer_is_accepted(tmp_path, make):
    async def lock_once(store: Any) -> None:
        async with store.lock(timeout=0):
            pass

    run(lock_once(make(tmp_path)))
