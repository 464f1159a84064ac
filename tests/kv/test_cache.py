"""PagedKVCache: sequences, forward passes, appends and reading K/V back."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from kvckpt_web import (CapacityError, CheckpointStateError, HostTensor, MemoryStore, PagedKVCache, SequenceError,
                        TensorError, restore, save)
from kvckpt_web.gpu.device import Clear, Usage

from support.kvmodel import run, small_layout, small_limits

P = 4  # page size of the small layout


def state(model) -> tuple:
    """Everything observable: sequence ids and lengths, free pages, and every sequence's stored K/V bytes."""
    cache = model.cache
    seqs = {s: cache.get_sequence_length(s) for s in cache.sequence_ids()}
    data = {}
    for s in seqs:
        k, v = run(cache.debug_get_kv(s, 0, seqs[s]))
        data[s] = (k.data, v.data)
    return seqs, cache.get_num_available_pages(), data


def assert_no_forward(cache) -> None:
    with pytest.raises(CheckpointStateError, match="append_kv"):
        cache.append_kv(0, b"", b"")


# ----- construction and sequences ----------------------------------------------------------------------


def test_new_cache_has_no_sequences_and_every_page_free(make_cache):
    cache = make_cache(limits=small_limits(max_total_seq_len=30))  # ceil(30 / 4) + 1 pages
    assert cache.sequence_ids() == []
    assert cache.num_total_pages == 9
    assert cache.get_num_available_pages() == 9


def test_new_cache_clears_its_layer_arenas_on_the_queue_at_once(device, monkeypatch):
    submitted: list[list] = []
    real_submit = device.submit
    monkeypatch.setattr(device, "submit", lambda commands: (submitted.append(list(commands)), real_submit(commands)))
    cache = PagedKVCache(device, small_layout(), small_limits())
    try:
        arenas = list({id(layer.buffer): layer.buffer for layer in cache.layers}.values())
        assert submitted == [[Clear(arena, 0, arena.size) for arena in arenas]]
    finally:
        cache.close()


def test_unknown_transfer_path_is_refused(device):
    with pytest.raises(TensorError) as info:
        PagedKVCache(device, small_layout(), small_limits(), transfer="dma")
    assert (info.value.field, info.value.got) == ("transfer", "dma")


def test_mapped_transfer_is_refused_where_storage_does_not_map(unmapped_device):
    with pytest.raises(TensorError, match="map in place") as info:
        PagedKVCache(unmapped_device, small_layout(), small_limits(), transfer="mapped")
    assert (info.value.field, info.value.got) == ("transfer", "mapped")


def test_auto_transfer_maps_pages_in_place_exactly_where_storage_maps(device, unmapped_device):
    for dev in (device, unmapped_device):
        cache = PagedKVCache(dev, small_layout(), small_limits())
        try:
            assert cache.maps_pages == dev.info.maps_storage
            assert bool(cache.layers[0].buffer.usage & Usage.MAP_READ) == dev.info.maps_storage
            assert (cache.host_path() == "mapped") == dev.info.maps_storage
        finally:
            cache.close()


def test_sequence_ids_are_listed_ascending(make_cache):
    cache = make_cache()
    for s in (5, 0, 3):
        cache.add_sequence(s)
    assert cache.sequence_ids() == [0, 3, 5]


def test_add_sequence_refuses_an_id_in_use(make_cache):
    cache = make_cache()
    cache.add_sequence(1)
    with pytest.raises(SequenceError, match="already exists"):
        cache.add_sequence(1)


@pytest.mark.parametrize("bad", [-1, True, "0"])
def test_add_sequence_refuses_ids_that_are_not_non_negative_integers(make_cache, bad):
    with pytest.raises(SequenceError):
        make_cache().add_sequence(bad)


def test_remove_sequence_frees_its_pages(make_model):
    model = make_model()
    model.add(0, 9)  # 3 pages
    model.add(1, 1)
    assert model.cache.get_num_available_pages() == 17 - 4
    model.remove(0)
    assert model.cache.get_num_available_pages() == 17 - 1
    assert model.cache.sequence_ids() == [1]
    model.assert_holds(1)


def test_remove_unknown_sequence_is_refused(make_cache):
    with pytest.raises(SequenceError):
        make_cache().remove_sequence(4)


# ----- begin_forward validation ------------------------------------------------------------------------


@pytest.fixture
def busy(make_model):
    """Sequences 0 (5 tokens), 1 (2 tokens), 2 (empty); prefill_chunk_size 8, reserved_num_seqs 2, 4 pages, 1 free."""
    model = make_model(limits=small_limits(reserved_num_seqs=2, prefill_chunk_size=8, max_total_seq_len=12))
    model.add(0, 5)
    model.add(1, 2)
    model.cache.add_sequence(2)
    model.ref[2] = model.empty()
    return model


BAD_FORWARDS = {
    "mismatched_lengths": ([0, 1], [1], SequenceError, "one per seq_id"),
    "duplicate_ids": ([0, 0], [1, 1], SequenceError, "distinct"),
    "too_many_sequences": ([0, 1, 2], [1, 1, 1], CapacityError, "reserved_num_seqs=2"),
    "too_many_tokens": ([0, 1], [4, 5], CapacityError, "prefill_chunk_size=8"),
    "zero_length": ([0, 1], [1, 0], SequenceError, "append_lengths\\[1\\]"),
    "negative_length": ([0], [-1], SequenceError, "append_lengths\\[0\\]"),
    "bool_length": ([0], [True], SequenceError, "append_lengths\\[0\\]"),
    "unknown_sequence": ([0, 9], [1, 1], SequenceError, "existing sequence"),
    "cache_full": ([0, 1], [4, 4], CapacityError, "KV cache is full"),  # needs 2 new pages, 1 is free
}


@pytest.mark.parametrize("name", BAD_FORWARDS)
def test_rejected_begin_forward_changes_nothing(busy, name):
    ids, lengths, error, match = BAD_FORWARDS[name]
    before = state(busy)
    with pytest.raises(error, match=match):
        busy.cache.begin_forward(ids, lengths)
    assert state(busy) == before
    assert_no_forward(busy.cache)


def test_begin_forward_accepts_exactly_the_limits(busy):
    busy.append({0: 3, 1: 5})  # 8 tokens = prefill_chunk_size, 2 sequences = reserved_num_seqs, last free page
    assert busy.cache.get_num_available_pages() == 0
    busy.assert_holds(0)
    busy.assert_holds(1)


def test_begin_forward_during_a_forward_is_refused(busy):
    busy.cache.begin_forward([0], [1])
    with pytest.raises(CheckpointStateError, match="end_forward first"):
        busy.cache.begin_forward([1], [1])
    assert busy.cache.get_sequence_length(1) == 2


def test_end_forward_without_a_forward_is_refused(make_cache):
    with pytest.raises(CheckpointStateError, match="end_forward"):
        make_cache().end_forward()


def test_current_forward_gives_each_tokens_position_and_slot_in_batch_order(make_model):
    model = make_model()
    model.add(0, 5)
    model.add(1, 2)
    cache = model.cache
    cache.begin_forward([0, 1], [2, 3])
    fwd = cache.current_forward()
    assert (fwd.seq_ids, fwd.lengths, fwd.num_tokens) == ((0, 1), (2, 3), 5)
    assert fwd.positions == (5, 6, 2, 3, 4)
    tables = [cache.page_table(0)] * 2 + [cache.page_table(1)] * 3
    assert fwd.slots == tuple(table[p // 4] * 4 + p % 4 for table, p in zip(tables, fwd.positions))


def test_current_forward_without_a_forward_is_refused(make_cache):
    with pytest.raises(CheckpointStateError, match="begin_forward"):
        make_cache().current_forward()


def test_page_table_lists_a_sequences_pages_in_order_and_a_fork_shares_its_full_pages(make_model):
    model = make_model()
    model.add(0, 9)
    model.fork(0, 1, 8)
    parent, child = model.cache.page_table(0), model.cache.page_table(1)
    assert len(parent) == 3 and len(child) == 2
    assert child == parent[:2]
    assert len(set(parent)) == 3


def test_page_table_of_an_unknown_sequence_is_refused(make_cache):
    with pytest.raises(SequenceError):
        make_cache().page_table(0)


# ----- append_kv validation ----------------------------------------------------------------------------


@pytest.fixture
def forward(make_model):
    """A model in a forward pass of 3 tokens on sequence 0, and a valid K/V for one layer."""
    model = make_model()
    model.cache.add_sequence(0)
    model.cache.begin_forward([0], [3])
    good = np.zeros((3, 2, 8), np.float16)
    return model.cache, good


def test_append_kv_without_a_forward_is_refused(make_cache):
    with pytest.raises(CheckpointStateError, match="begin_forward"):
        make_cache().append_kv(0, np.zeros((1, 2, 8), np.float16), np.zeros((1, 2, 8), np.float16))


def test_append_kv_after_end_forward_is_refused(forward):
    cache, good = forward
    cache.end_forward()
    with pytest.raises(CheckpointStateError):
        cache.append_kv(0, good, good)


@pytest.mark.parametrize("layer", [2, -1, True, 1.0])
def test_append_kv_refuses_a_layer_outside_the_cache(forward, layer):
    cache, good = forward
    with pytest.raises(TensorError) as info:
        cache.append_kv(layer, good, good)
    assert (info.value.field, info.value.got) == ("layer", layer)


@pytest.mark.parametrize("which", ["k", "v"])
def test_append_kv_refuses_another_dtype(forward, which):
    cache, good = forward
    wrong = good.astype(np.float32)
    with pytest.raises(TensorError) as info:
        cache.append_kv(0, *((wrong, good) if which == "k" else (good, wrong)))
    assert (info.value.field, info.value.expected, info.value.got) == (f"{which}.dtype", "float16", "float32")


@pytest.mark.parametrize("tokens", [2, 4])
def test_append_kv_refuses_another_token_count(forward, tokens):
    cache, good = forward
    wrong = np.zeros((tokens, 2, 8), np.float16)
    with pytest.raises(TensorError) as info:
        cache.append_kv(0, wrong, good)
    assert (info.value.field, info.value.expected, info.value.got) == ("k.nbytes", 96, tokens * 32)


def test_append_kv_refuses_a_non_contiguous_array(forward):
    cache, good = forward
    with pytest.raises(TensorError) as info:
        cache.append_kv(0, good, np.asfortranarray(good))
    assert info.value.field == "v"


def test_append_kv_refuses_a_python_list(forward):
    cache, good = forward
    with pytest.raises(TensorError) as info:
        cache.append_kv(0, good.tolist(), good)
    assert info.value.field == "k"


def test_append_kv_accepts_raw_bytes(make_model):
    model = make_model()
    model.cache.add_sequence(0)
    model.ref[0] = model.empty()
    k, v = model.random_kv(3)
    model.cache.begin_forward([0], [3])
    for layer in range(2):
        model.cache.append_kv(layer, k[layer].tobytes(), bytearray(v[layer].tobytes()))
    model.cache.end_forward()
    model.ref[0] = (k, v)
    model.assert_holds(0)


# ----- appending and reading back ----------------------------------------------------------------------


def test_appended_kv_reads_back_unchanged(make_model):
    model = make_model()
    model.add(0, 11)
    model.assert_holds(0)


def test_one_forward_appends_each_sequence_its_tokens_in_batch_order(make_model):
    model = make_model()
    for s in (0, 1, 2):
        model.add(s, s)  # lengths 0, 1, 2
    model.append({2: 3, 0: 5, 1: 1})
    for s in (0, 1, 2):
        model.assert_holds(s)


def test_appends_across_forwards_accumulate(make_model):
    model = make_model()
    model.add(0)
    for n in (1, 3, 4, 2, 7):
        model.append({0: n})
    assert model.length(0) == 17
    model.assert_holds(0)


def test_interleaved_sequences_keep_their_own_data(make_model):
    model = make_model()
    model.add(0)
    model.add(1)
    for n in (3, 2, 5, 1):
        model.append({0: n})
        model.append({1: n + 1})
    model.assert_holds(0)
    model.assert_holds(1)


def test_token_by_token_appends_with_odd_head_dim_keep_neighbouring_values(make_model):
    model = make_model(qk_head_dim=33)  # 16-bit rows straddle u32 words
    model.add(0)
    model.add(1)
    for _ in range(6):
        model.append({0: 1, 1: 1})
    model.assert_holds(0)
    model.assert_holds(1)


def test_debug_get_kv_returns_host_tensors_of_layers_tokens_heads_dims(make_model):
    model = make_model()
    model.add(0, 6)
    k, v = run(model.cache.debug_get_kv(0, 1, 5))
    assert isinstance(k, HostTensor) and isinstance(v, HostTensor)
    assert k.shape == v.shape == (2, 4, 2, 8)
    assert k.dtype == v.dtype == "float16"
    np.testing.assert_array_equal(k.numpy().view(np.uint16), model.ref[0][0][:, 1:5])


RANGES = [(0, 0), (0, 1), (1, 3), (3, 5), (4, 8), (2, 11), (0, 11), (10, 11), (11, 11), (8, 8)]


@pytest.mark.parametrize("start, end", RANGES, ids=[f"{a}-{b}" for a, b in RANGES])
def test_debug_get_kv_returns_exactly_the_requested_tokens(make_model, start, end):
    model = make_model()
    model.add(0, 11)
    k, v = run(model.stored_kv(0, start, end))
    np.testing.assert_array_equal(k, model.ref[0][0][:, start:end])
    np.testing.assert_array_equal(v, model.ref[0][1][:, start:end])


@pytest.mark.parametrize("start, end", [(-1, 2), (3, 2), (0, 12), (12, 12)])
def test_debug_get_kv_refuses_ranges_outside_the_sequence(make_model, start, end):
    model = make_model()
    model.add(0, 11)
    with pytest.raises(TensorError) as info:
        run(model.cache.debug_get_kv(0, start, end))
    assert (info.value.field, info.value.got) == ("token range", (start, end))


def test_debug_get_kv_of_an_unknown_sequence_is_refused(make_cache):
    with pytest.raises(SequenceError):
        run(make_cache().debug_get_kv(3, 0, 0))


# ----- fork and popn -----------------------------------------------------------------------------------


@pytest.mark.parametrize("pos", [-1, 0, 3, 4, 6, 8, 9])
def test_forked_child_holds_the_parents_prefix(make_model, pos):
    model = make_model()
    model.add(0, 9)
    model.fork(0, 1, pos)
    model.assert_holds(1)
    model.assert_holds(0)


@pytest.mark.parametrize("pos", [-1, 3, 4, 6, 8])
def test_appends_after_a_fork_do_not_leak_between_parent_and_child(make_model, pos):
    model = make_model()
    model.add(0, 9)
    model.fork(0, 1, pos)
    model.append({1: 5})
    model.append({0: 3})
    model.assert_holds(0)
    model.assert_holds(1)


def test_popn_into_a_shared_page_leaves_the_other_sequence_unchanged(make_model):
    model = make_model()
    model.add(0, 8)  # two full pages
    model.fork(0, 1)  # shared by both
    model.popn(1, 2)  # child's last page is now partial: it must get its own copy
    model.append({1: 2})  # overwrite slots 6, 7 in the child
    model.assert_holds(0)
    model.assert_holds(1)


def test_popn_then_append_rewrites_the_popped_positions(make_model):
    model = make_model()
    model.add(0, 10)
    model.popn(0, 3)
    model.append({0: 4})
    model.assert_holds(0)


def test_fork_of_an_unknown_parent_is_refused(make_cache):
    with pytest.raises(SequenceError):
        make_cache().fork_sequence(0, 1)


def test_popn_more_than_the_sequence_is_refused(make_model):
    model = make_model()
    model.add(0, 3)
    with pytest.raises(SequenceError):
        model.cache.popn(0, 4)
    model.assert_holds(0)


def test_fork_with_no_free_page_for_the_partial_page_changes_nothing(make_model):
    model = make_model(limits=small_limits(max_total_seq_len=4))  # 2 pages
    model.add(0, 6)
    before = state(model)
    with pytest.raises(CapacityError):
        model.cache.fork_sequence(0, 1)
    assert state(model) == before


# ----- 16-bit elements whose rows are not word-aligned ---------------------------------------------------

ODD = {"float16-heads3-dim7": dict(dtype="float16", num_kv_heads=3, num_qo_heads=3, qk_head_dim=7),
       "bfloat16-heads3-dim7": dict(dtype="bfloat16", num_kv_heads=3, num_qo_heads=3, qk_head_dim=7),
       "float16-heads2-dim33": dict(dtype="float16", qk_head_dim=33)}


@pytest.mark.parametrize("name", ODD)
@pytest.mark.parametrize("tokens", [1, 2, 3])
def test_appends_of_an_odd_count_of_16bit_elements_read_back(make_model, name, tokens):
    model = make_model(**ODD[name])  # 3 heads x 7 dims x odd tokens: K and V are not whole 4-byte words
    model.add(0, tokens)
    model.append({0: tokens})
    model.assert_holds(0)


@pytest.mark.parametrize("name", ODD)
def test_unaligned_appends_into_reused_pages_replace_every_stale_value(make_model, name):
    model = make_model(**ODD[name])
    model.add(0, 3 * P)  # fill pages 0-2 with random bits
    model.remove(0)
    model.add(1)  # same pages again
    for n in (1, 2, 1, 3, 1):
        model.append({1: n})
    assert model.cache.seqs.get(1).pages == [0, 1]
    model.assert_holds(1)
    assert model.export(1) == model.expected_groups(1)


@pytest.mark.parametrize("tokens", [0, 23])
def test_a_restore_into_a_closed_cache_is_a_checkpoint_state_error(device, make_model, tokens):
    model = make_model()
    model.add(0, tokens)
    store = MemoryStore()
    asyncio.run(save(model.cache, 0, store, "a"))
    closed = PagedKVCache(device, model.layout, model.cache.limits)
    closed.close()
    with pytest.raises(CheckpointStateError, match="closed"):
        asyncio.run(restore(store, "a", closed))


def test_a_closed_cache_exports_nothing(make_model):
    model = make_model()
    model.add(0, 5)
    model.cache.close()
    with pytest.raises(CheckpointStateError, match="closed"):
        model.cache.get_checkpoint_metadata(0)


@pytest.mark.parametrize("transfer", ["kernel", "copy", "mapped"])
def test_restores_into_fresh_caches_that_are_closed_leave_no_device_memory_behind(device, make_model, transfer):
    model = make_model(transfer=transfer)
    model.add(0, 23)
    store = MemoryStore()
    run(save(model.cache, 0, store, "a"))
    before = device.live_resources, device.live_bytes
    for _ in range(3):
        fresh = PagedKVCache(device, model.layout, model.cache.limits, transfer=transfer)
        run(restore(store, "a", fresh))
        run(fresh.debug_get_kv(0, 0, 23))
        fresh.close()
        assert (device.live_resources, device.live_bytes) == before


CLOSED_USES = {
    "add_sequence": lambda cache: cache.add_sequence(1),
    "remove_sequence": lambda cache: cache.remove_sequence(0),
    "fork_sequence": lambda cache: cache.fork_sequence(0, 1),
    "popn": lambda cache: cache.popn(0, 1),
    "begin_forward": lambda cache: cache.begin_forward([0], [1]),
    "read_pages": lambda cache: run(cache.debug_get_kv(0, 0, 5)),
}


@pytest.mark.parametrize("use", CLOSED_USES)
def test_a_closed_cache_refuses_use_and_allocates_nothing(device, make_model, use):
    model = make_model()
    model.add(0, 5)
    model.cache.close()
    before = device.live_resources
    with pytest.raises(CheckpointStateError, match=f"{use}: expected an open cache, got a closed one"):
        CLOSED_USES[use](model.cache)
    assert device.live_resources == before


def test_closing_a_cache_again_does_nothing(device, make_model):
    model = make_model()
    model.add(0, 5)
    model.cache.close()
    before = device.live_resources
    model.cache.close()
    assert model.cache.closed and device.live_resources == before
