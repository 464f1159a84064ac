"""Checkpoint primitives: export, import and their state machine, on our own cache.

Ports TVM's checkpoint tests (group validation, all groups + explicit finish) and
adds what TVM's tests do not check: exported bytes against a numpy model for every
kind of page table (short, page-aligned, forked, popped, interleaved, scattered, reused pages),
round trips followed by identical appends, transactional prepare_import, the
extensions (any seq id, exclusive=False, abort_import), every dtype, and every
page transfer ("kernel", "copy", and "mapped" where storage maps in place), which must produce
identical bytes.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from kvckpt_web import (CapacityError, CheckpointStateError, DeviceArray, LayoutHashMismatch, MetadataError,
                        PagedKVCache, PageGroups, SequenceError, TensorError, UnsupportedLayoutError)
from kvckpt_web.kv.scatter import scatter_free_pages
from kvckpt_web.gpu.device import CopyRuns, Usage
from kvckpt_web.kv.transfer import page_runs

from support.kvmodel import device_array_from, read_device_array, read_layer_page, run, small_layout, small_limits

TRANSFERS = ["kernel", "copy", "mapped"]
P = 4  # page size of the small layout


@pytest.fixture(params=TRANSFERS)
def transfer(request, device) -> str:
    if request.param == "mapped" and not device.info.maps_storage:
        pytest.skip(f"{device.info.adapter!r}: storage buffers do not map in place")
    return request.param


# ----- scenarios: ways to arrive at a page table ------------------------------------------------------
# Each builds sequences on a model and returns the ids whose checkpoints the tests check.


def _interleaved(model):
    for s in (0, 1, 2):
        model.add(s)
    for n in (1, 5, 2, 4, 3):
        model.append({0: n})
        model.append({2: n + 2, 1: 1})
    return [0, 1, 2]


def _scattered(model):
    scatter_free_pages(model.cache, first_id=100)  # every page the sequences get stands apart
    for s in (0, 1):
        model.add(s)
    for n in (1, 3, 2):  # 9 tokens each: 6 of the 8 free pages, leaving room for appends after
        model.append({0: n})
        model.append({1: n + 1, 0: 1})
    assert all(b - a > 1 for a, b in zip(model.cache.seqs.get(0).pages, model.cache.seqs.get(0).pages[1:]))
    return [0, 1]


def _reused(model):
    model.add(0, 12)
    model.add(1, 5)
    model.remove(0)  # frees pages 0-2, which still hold seq 0's data
    model.add(2, 7)
    return [1, 2]


def _fork_mid_page(model):
    model.add(0, 10)
    model.fork(0, 1, 6)
    model.append({1: 3})
    model.append({0: 2})
    return [0, 1]


def _fork_at_boundary(model):
    model.add(0, 10)
    model.fork(0, 1, 8)
    model.append({1: 5})
    return [0, 1]


def _popn_into_shared(model):
    model.add(0, 8)
    model.fork(0, 1)
    model.popn(1, 3)
    model.append({1: 2})
    return [0, 1]


SCENARIOS = {
    "len0": lambda m: (m.add(0, 0), [0])[1],
    "len1": lambda m: (m.add(0, 1), [0])[1],
    "len_page-1": lambda m: (m.add(0, P - 1), [0])[1],
    "len_page": lambda m: (m.add(0, P), [0])[1],
    "len_page+1": lambda m: (m.add(0, P + 1), [0])[1],
    "len_3_pages": lambda m: (m.add(0, 3 * P), [0])[1],
    "len_3_pages+2": lambda m: (m.add(0, 3 * P + 2), [0])[1],
    "fork_mid_page": _fork_mid_page,
    "fork_at_page_boundary": _fork_at_boundary,
    "popn_into_shared_page": _popn_into_shared,
    "interleaved": _interleaved,
    "scattered_interleaved": _scattered,
    "reused_pages": _reused,
}


@pytest.fixture(params=list(SCENARIOS))
def scenario(request, make_model, transfer):
    """(model, seq ids) after running one scenario on a cache using ``transfer``."""
    model = make_model(transfer=transfer, seed=7)
    return model, SCENARIOS[request.param](model)


def tokens_of_group(model, group: bytes) -> tuple[np.ndarray, np.ndarray]:
    """K and V rows ``(pages * page_size, H, D)`` of one exported page group."""
    lay = model.layout
    arr = np.frombuffer(group, model.bits).reshape(-1, 2, lay.num_kv_heads, lay.page_size, lay.head_dim)
    kv = arr.transpose(1, 0, 3, 2, 4).reshape(2, -1, lay.num_kv_heads, lay.head_dim)
    return kv[0], kv[1]


def checkpoint(model, seq: int) -> tuple[str, list[bytes]]:
    return model.cache.get_checkpoint_metadata(seq), model.export(seq)


def import_host(cache, seq: int, metadata: str, groups: list[bytes], exclusive: bool = True) -> None:
    cache.prepare_import(seq, metadata, exclusive=exclusive)
    run(cache.import_groups(seq, groups))
    cache.finish_import(seq)


def state(model) -> tuple:
    """Sequence ids and lengths, free pages, and every sequence's K/V bytes."""
    cache = model.cache
    seqs = {s: cache.get_sequence_length(s) for s in cache.sequence_ids()}
    data = {s: tuple(t.data for t in run(cache.debug_get_kv(s, 0, n))) for s, n in seqs.items()}
    return seqs, cache.get_num_available_pages(), data


# ----- export ------------------------------------------------------------------------------------------


def test_export_groups_hold_tvm_page_layout_with_zero_tail(scenario):
    model, seqs = scenario
    for seq in seqs:
        assert model.export(seq) == model.expected_groups(seq)


def test_export_equals_debug_get_kv_page_by_page(scenario):
    model, seqs = scenario
    for seq in seqs:
        n = model.length(seq)
        groups = model.export(seq)
        for page in range(model.layout.num_logical_pages(n)):
            start, end = page * P, min(n, (page + 1) * P)
            k, v = run(model.stored_kv(seq, start, end))
            for layer, group in enumerate(groups):
                gk, gv = tokens_of_group(model, group)
                np.testing.assert_array_equal(gk[start:end], k[layer])
                np.testing.assert_array_equal(gv[start:end], v[layer])


def test_export_page_group_into_a_device_tensor_equals_host_export(scenario):
    model, seqs = scenario
    cache = model.cache
    for seq in seqs:
        npages = model.layout.num_logical_pages(model.length(seq))
        for g in range(model.layout.num_layers):
            dst = cache.empty_group(npages)
            cache.export_page_group(seq, g, dst)
            assert run(read_device_array(cache.device, dst)) == run(cache.export_group_bytes(seq, g))


def test_round_trip_then_identical_appends_give_identical_exports(scenario, make_model, transfer):
    model, seqs = scenario
    for seq in seqs:
        metadata, groups = checkpoint(model, seq)
        twin = make_model(transfer=transfer, limits=small_limits(reserved_num_seqs=8, max_total_seq_len=100))
        import_host(twin.cache, seq, metadata, groups)
        twin.ref[seq] = model.ref[seq]
        assert twin.export(seq) == groups
        twin.assert_holds(seq)
        kv = model.random_kv(6)
        model.append({seq: 6}, {seq: kv})
        twin.append({seq: 6}, {seq: kv})
        assert twin.export(seq) == model.export(seq) == model.expected_groups(seq)


def test_import_page_group_from_device_tensors_equals_host_import(scenario, make_model, transfer):
    model, seqs = scenario
    for seq in seqs:
        metadata, groups = checkpoint(model, seq)
        npages = model.layout.num_logical_pages(model.length(seq))
        target = make_model(transfer=transfer)
        target.cache.prepare_import(seq, metadata)
        for g, data in enumerate(groups):
            target.cache.import_page_group(seq, g, device_array_from(target.cache, data, npages))
        target.cache.finish_import(seq)
        target.ref[seq] = model.ref[seq]
        target.assert_holds(seq)
        assert target.export(seq) == groups


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_kernel_and_copy_paths_export_identical_bytes(make_model, name):
    exports = {}
    for path in TRANSFERS:
        model = make_model(transfer=path, seed=11)
        seqs = SCENARIOS[name](model)
        device_groups = []
        for seq in seqs:
            npages = model.layout.num_logical_pages(model.length(seq))
            for g in range(model.layout.num_layers):
                dst = model.cache.empty_group(npages)
                model.cache.export_page_group(seq, g, dst)
                device_groups.append(run(read_device_array(model.cache.device, dst)))
        exports[path] = ([model.export(s) for s in seqs], device_groups)
    assert exports["kernel"] == exports["copy"]


@pytest.mark.parametrize("tokens", [16 * P, 16 * P - 1])
def test_a_sequence_filling_the_cache_exports_all_layers_in_one_copy(make_model, tokens):
    model = make_model(transfer="copy", num_layers=3)
    model.add(0, tokens)  # 16 of the 17 pages: the layers' runs are one span of the arena
    cache = model.cache
    assert cache.mover.span_stride("copy", cache.layers, cache.seqs.get(0).pages) is not None
    assert model.export(0) == model.expected_groups(0)
    out = memoryview(bytearray(cache.host_nbytes(0)))
    assert [bytes(g) for g in run(cache.export_groups(0, out=out))] == model.expected_groups(0)


def test_runs_of_pages_moved_in_pieces_give_the_same_bytes_both_ways(make_model, monkeypatch):
    model = make_model(limits=small_limits(max_total_seq_len=32 * P, prefill_chunk_size=32 * P), transfer="copy",
                       num_layers=3)
    for _ in range(3):  # appended in turns: placement keeps each sequence's pages one run, apart from the other's
        for seq in (0, 1):
            if seq not in model.ref:
                model.add(seq)
            model.append({seq: 3 * P})
    cache, pb = model.cache, model.layout.page_bytes
    assert [length for _, _, length in page_runs(cache.seqs.get(0).pages)] == [9]
    whole = model.export(0)
    runs: list[int] = []
    real_submit = cache.device.submit

    def spy(commands):
        runs.extend(size for c in commands if isinstance(c, CopyRuns) for _, _, size in c.runs)
        return real_submit(commands)

    monkeypatch.setattr(cache.mover, "copy_piece_pages", 2)
    monkeypatch.setattr(cache.device, "submit", spy)
    assert model.export(0) == whole == model.expected_groups(0)
    assert runs and set(runs) == {2 * pb, pb}  # a run of 9 pages: four copies of two pages and one of one
    metadata, groups = cache.get_checkpoint_metadata(0), run(cache.export_groups(0))
    cache.remove_sequence(0)
    run(cache.load_checkpoint(metadata, groups, seq_id=0, exclusive=False))
    model.assert_holds(0)
    model.assert_holds(1)


def test_one_copy_export_never_lets_other_sequences_bytes_out(make_model):
    model = make_model(limits=small_limits(max_total_seq_len=32 * P, prefill_chunk_size=32 * P), transfer="copy",
                       num_layers=3)
    model.add(0, 30 * P)
    model.add(1, P)  # page 30 of 33, inside the span that one copy of sequence 0 moves
    cache = model.cache
    assert cache.mover.span_stride("copy", cache.layers, cache.seqs.get(0).pages) is not None
    out = memoryview(bytearray(cache.host_nbytes(0)))
    groups = run(cache.export_groups(0, out=out))
    assert [bytes(g) for g in groups] == model.expected_groups(0)
    group = len(groups[0])
    stride = (len(out) - group) // 2
    for g in range(2):
        assert not any(out[g * stride + group:(g + 1) * stride])


def test_export_into_an_out_buffer_too_small_for_one_copy_falls_back_to_dense_groups(make_model):
    model = make_model(transfer="copy", num_layers=3)
    model.add(0, 16 * P)
    group = 16 * model.layout.page_bytes
    out = memoryview(bytearray(3 * group))
    assert [bytes(g) for g in run(model.cache.export_groups(0, out=out))] == model.expected_groups(0)
    with pytest.raises(TensorError) as info:
        run(model.cache.export_groups(0, out=memoryview(bytearray(3 * group - 4))))
    assert (info.value.field, info.value.got) == ("out.nbytes", 3 * group - 4)


@pytest.mark.parametrize("layers", [3, 4])
def test_an_export_in_steps_of_one_layer_gives_the_same_groups(make_model, transfer, layers):
    model = make_model(transfer=transfer, num_layers=layers, seed=3)
    model.add(0, 2)
    model.add(1, 3)
    model.append({0: 9, 1: 6})  # interleaved pages: no one-copy export
    model.cache.mover.batch_bytes = 1
    assert model.export(0) == model.expected_groups(0)
    assert [bytes(g) for g in run(model.cache.export_groups(1))] == model.expected_groups(1)


@pytest.mark.parametrize("exclusive", [True, False])
def test_an_import_in_steps_of_two_layers_restores_every_group(make_model, transfer, exclusive):
    source = make_model(transfer=transfer, num_layers=5, seed=6)
    source.add(0, 3)
    source.add(1, 2)
    source.append({0: 10, 1: 7})
    metadata, groups = checkpoint(source, 0)
    target = make_model(transfer=transfer, num_layers=5)
    target.add(4, 5)
    target.cache.mover.batch_bytes = 1
    run(target.cache.load_checkpoint(metadata, groups, exclusive=exclusive))
    target.ref[0] = source.ref[0]
    target.assert_holds(0)
    if not exclusive:
        target.assert_holds(4)
    target.append({0: 3})  # upload staging went back to the host mapped: the next forward and import work
    run(target.cache.load_checkpoint(metadata, groups, exclusive=False))
    target.ref[0] = source.ref[0]
    target.assert_holds(0)


@pytest.mark.parametrize("pages", [(0, None), (2, 5), (3, 3)])
def test_mapped_pages_equal_the_pages_read_back(make_model, transfer, pages):
    model = make_model(transfer=transfer, num_layers=3)
    model.add(0, 6 * P - 1)
    model.add(1, 3 * P)  # interleave nothing, but keep other pages in use
    cache = model.cache
    read = [bytes(g) for g in run(cache.read_pages(0, *pages))]
    mapped = run(cache.map_pages(0, *pages, slot=1))
    try:
        assert [bytes(g) for g in mapped.groups] == read
    finally:
        mapped.release()


def test_mapping_a_slot_still_mapped_is_refused_and_changes_nothing(make_model, transfer):
    model = make_model(transfer=transfer, num_layers=3)
    model.add(0, 5 * P)
    first = run(model.cache.map_pages(0, slot=2))
    with pytest.raises(CheckpointStateError, match="slot 2 is still mapped"):
        run(model.cache.map_pages(0, 1, 3, slot=2))
    assert [bytes(g) for g in first.groups] == model.expected_groups(0)
    first.release()
    other = run(model.cache.map_pages(0, slot=2))
    other.release()


@pytest.mark.parametrize("slot", [-1, 1.5, "0", True])
def test_map_pages_refuses_a_slot_that_is_not_a_non_negative_integer(make_model, slot):
    model = make_model(transfer="copy", num_layers=3)
    model.add(0, 5 * P)
    with pytest.raises(TensorError) as info:
        run(model.cache.map_pages(0, slot=slot))
    assert (info.value.field, info.value.got) == ("map_pages.slot", slot)
    mapped = run(model.cache.map_pages(0, slot=0))  # nothing was left mapped
    assert [bytes(g) for g in mapped.groups] == model.expected_groups(0)
    mapped.release()


def test_a_released_mapping_frees_its_slot_and_releasing_twice_does_nothing(make_model, transfer):
    model = make_model(transfer=transfer, num_layers=3)
    model.add(0, 5 * P)
    first = run(model.cache.map_pages(0, slot=0))
    first.release()
    first.release()
    again = run(model.cache.map_pages(0, slot=0))
    assert [bytes(g) for g in again.groups] == model.expected_groups(0)
    again.release()
    model.append({0: 3})  # the cache still runs forward passes
    model.assert_holds(0)


def test_a_slot_serves_a_larger_mapping_after_a_smaller_one(make_model, transfer):
    model = make_model(transfer=transfer, num_layers=3)
    model.add(0, 6 * P - 2)
    small = run(model.cache.map_pages(0, 4, 6, slot=0))
    assert [bytes(g) for g in small.groups] == [bytes(g) for g in run(model.cache.read_pages(0, 4, 6))]
    small.release()
    whole = run(model.cache.map_pages(0, slot=0))
    assert [bytes(g) for g in whole.groups] == model.expected_groups(0)
    whole.release()


@pytest.mark.parametrize("tokens", [16 * P, 16 * P - 1])
def test_import_into_an_empty_cache_restores_every_layer_through_one_copy(make_model, tokens):
    source = make_model(transfer="copy", num_layers=3, seed=4)
    source.add(0, tokens)
    metadata, groups = checkpoint(source, 0)
    target = make_model(transfer="copy", num_layers=3)
    target.cache.prepare_import(0, metadata)
    cache = target.cache
    assert cache.mover.span_stride("copy", cache.layers, cache._checkpoint.importing.seq.pages) is not None
    run(cache.import_groups(0, groups))
    cache.finish_import(0)
    target.ref[0] = source.ref[0]
    target.assert_holds(0)


def _count_uploads(monkeypatch, cache) -> list[list[int]]:
    """The chunk sizes of every ``device.upload`` the cache makes from now on."""
    calls: list[list[int]] = []
    upload = cache.device.upload

    async def counting(buffer, offset, chunks):
        calls.append([len(memoryview(c).cast("B")) for c in chunks])
        await upload(buffer, offset, chunks)

    monkeypatch.setattr(cache.device, "upload", counting)
    return calls


@pytest.mark.parametrize("beside", [False, True], ids=["empty-cache", "beside-another-sequence"])
def test_import_of_exported_page_groups_goes_up_in_one_host_copy(make_model, monkeypatch, beside):
    limits = small_limits(max_total_seq_len=32 * P, prefill_chunk_size=32 * P)
    source = make_model(limits=limits, transfer="copy", num_layers=3, seed=4)
    source.add(0, 30 * P - 1)  # 30 of 33 pages: the groups come back at the layers' stride, gaps included
    out = memoryview(bytearray(source.cache.host_nbytes(0)))
    groups = run(source.cache.export_groups(0, out=out))
    assert isinstance(groups, PageGroups) and len(groups.host) == len(out) and groups.stride > groups.group_bytes
    target = make_model(limits=limits, transfer="copy", num_layers=3)
    if beside:
        target.add(5, P)  # page 0: one copy of every layer would cover it, so each layer goes alone
    calls = _count_uploads(monkeypatch, target.cache)
    run(target.cache.load_checkpoint(source.cache.get_checkpoint_metadata(0), groups, exclusive=False))
    assert [sizes for sizes in calls if sum(sizes) > 4 * 16] == [[len(out)]]  # beyond the page-table upload
    target.ref[0] = source.ref[0]
    target.assert_holds(0)
    if beside:
        target.assert_holds(5)


@pytest.mark.parametrize("pages, spaced", [(30, True), (16, False)])
def test_host_groups_are_spaced_like_the_layers_only_where_one_copy_may_carry_them(make_model, pages, spaced):
    cache = make_model(limits=small_limits(max_total_seq_len=32 * P, prefill_chunk_size=32 * P), transfer="copy",
                       num_layers=3).cache
    groups = cache.host_groups(pages)
    group = pages * cache.layout.page_bytes
    assert groups.group_bytes == group and len(groups) == 3 and not any(groups.host)
    layer_stride = cache.layers[1].offset - cache.layers[0].offset
    assert groups.stride == (layer_stride if spaced else group)


def test_one_copy_scatter_refuses_a_stride_other_than_the_layers(make_model):
    cache = make_model(transfer="copy", num_layers=3).cache
    group = 16 * cache.layout.page_bytes  # 16 of the 17 pages: one copy may carry them, at the layers' stride
    with pytest.raises(TensorError) as info:
        cache.mover.scatter_layers("copy", cache.layers[0].buffer, cache.layers[0].buffer, list(range(16)),
                                   cache.layers, group, one_copy=True)
    layer_stride = cache.layers[1].offset - cache.layers[0].offset
    assert (info.value.field, info.value.expected, info.value.got) == ("scatter_layers.stride", layer_stride, group)


def test_import_of_page_groups_scatters_in_steps_from_its_one_upload(make_model, monkeypatch):
    limits = small_limits(max_total_seq_len=32 * P, prefill_chunk_size=32 * P)
    source = make_model(limits=limits, transfer="copy", num_layers=3, seed=4)
    source.add(0, 8 * P)
    groups = run(source.cache.export_groups(0))
    target = make_model(limits=limits, transfer="copy", num_layers=3)
    target.add(5, P)  # no one copy for all layers: each layer's scatter is its own command
    cache = target.cache
    cache.mover.batch_bytes = 2 * groups.group_bytes
    uploads = _count_uploads(monkeypatch, cache)
    submits: list[int] = []
    submit = cache.device.submit
    monkeypatch.setattr(cache.device, "submit", lambda commands: (submits.append(len(commands)), submit(commands)))
    cache.prepare_import(0, source.cache.get_checkpoint_metadata(0), exclusive=False)
    submits.clear()
    run(cache.import_groups(0, groups))
    cache.finish_import(0)
    assert [sizes for sizes in uploads if sum(sizes) > 4 * 8] == [[len(groups.host)]]
    assert submits == [2, 1]  # layers 0-1, then layer 2, all read from the one upload
    target.ref[0] = source.ref[0]
    target.assert_holds(0)
    target.assert_holds(5)


def test_page_groups_at_a_stride_copies_cannot_use_still_import(make_model):
    source = make_model(transfer="copy", num_layers=3, seed=4)
    source.add(0, 8 * P)
    group = len(source.export(0)[0])
    host = memoryview(bytearray(3 * (group + 2)))
    for g, data in enumerate(source.export(0)):
        host[g * (group + 2):g * (group + 2) + group] = data
    target = make_model(transfer="copy", num_layers=3)
    run(target.cache.load_checkpoint(source.cache.get_checkpoint_metadata(0), PageGroups(host, group, 3, group + 2)))
    target.ref[0] = source.ref[0]
    target.assert_holds(0)


def test_page_groups_of_another_length_are_refused_naming_the_group(make_model):
    source = make_model(transfer="copy", num_layers=3, seed=4)
    source.add(0, 8 * P)
    shorter = make_model(transfer="copy", num_layers=3, seed=4)
    shorter.add(0, 4 * P)
    target = make_model(transfer="copy", num_layers=3)
    with pytest.raises(TensorError) as info:
        run(target.cache.load_checkpoint(source.cache.get_checkpoint_metadata(0),
                                         run(shorter.cache.export_groups(0))))
    assert info.value.field == "groups[0].nbytes"
    assert target.cache.sequence_ids() == [] and target.cache._checkpoint.importing is None


def test_import_of_separate_group_buffers_goes_up_in_steps(make_model, monkeypatch):
    source = make_model(transfer="copy", num_layers=3, seed=4)
    source.add(0, 8 * P)
    metadata, groups = checkpoint(source, 0)
    target = make_model(transfer="copy", num_layers=3)
    target.cache.mover.batch_bytes = 2 * len(groups[0])
    calls = _count_uploads(monkeypatch, target.cache)
    import_host(target.cache, 0, metadata, groups)
    assert len([sizes for sizes in calls if sum(sizes) > 4 * 8]) == 2  # layers 0-1, then layer 2
    target.ref[0] = source.ref[0]
    target.assert_holds(0)


def test_import_beside_another_sequence_leaves_its_pages_untouched(make_model):
    limits = small_limits(max_total_seq_len=32 * P, prefill_chunk_size=32 * P)
    source = make_model(limits=limits, transfer="copy", num_layers=3, seed=4)
    source.add(0, 30 * P)
    metadata, groups = checkpoint(source, 0)
    target = make_model(limits=limits, transfer="copy", num_layers=3)
    target.add(5, P)  # page 0; the import then takes pages 1..30, and a one-layer-span copy would cover page 0
    run(target.cache.load_checkpoint(metadata, groups, exclusive=False))
    target.ref[0] = source.ref[0]
    target.assert_holds(0)
    target.assert_holds(5)


def test_stale_data_beyond_the_sequence_is_exported_as_zeros(make_model, transfer):
    model = make_model(transfer=transfer)
    model.add(0, 2 * P)  # pages 0, 1 full of random bits
    model.remove(0)
    model.add(1, P + 1)  # reuses pages 0, 1: page 1 holds one valid token and stale data
    assert model.cache.seqs.get(1).pages == [0, 1]
    stale = np.frombuffer(run(read_layer_page(model.cache, 0, 1)), model.bits).reshape(2, 2, P, 8)
    assert stale[:, :, 1:].any()  # the stale tokens really are still in the page
    groups = model.export(1)
    for group in groups:
        tail = np.frombuffer(group, model.bits).reshape(2, 2, 2, P, 8)[1, :, :, 1:]
        assert not tail.any()
    assert groups == model.expected_groups(1)


def test_copy_path_zeroes_the_unused_slots_of_a_partial_last_page_without_a_kernel(make_model,
                                                                                   page_copy_dispatches):
    model = make_model(transfer="copy")
    model.add(0, 2 * P)
    model.remove(0)
    model.add(1, P + 1)  # page 1: one valid token, then stale data
    assert model.export(1) == model.expected_groups(1)
    for g, expected in enumerate(model.expected_groups(1)):
        dst = model.cache.empty_group(2)
        model.cache.export_page_group(1, g, dst)
        assert run(read_device_array(model.cache.device, dst)) == expected
    assert page_copy_dispatches == []


def test_mapped_transfer_zeroes_unused_slots_that_are_not_whole_words(make_model, device):
    if not device.info.maps_storage:
        pytest.skip(f"{device.info.adapter!r}: storage buffers do not map in place")
    model = make_model(transfer="mapped", qk_head_dim=33)  # float16: the unused slots start 66 bytes into a row block
    model.add(0, 2 * P)
    model.remove(0)
    model.add(1, P + 1)
    assert model.export(1) == model.expected_groups(1)


def test_mapped_export_into_an_out_buffer_too_small_is_refused(make_model, device):
    if not device.info.maps_storage:
        pytest.skip(f"{device.info.adapter!r}: storage buffers do not map in place")
    model = make_model(transfer="mapped", num_layers=3)
    model.add(0, 4 * P)
    group = 4 * model.layout.page_bytes
    with pytest.raises(TensorError) as info:
        run(model.cache.export_groups(0, out=memoryview(bytearray(3 * group - 4))))
    assert (info.value.field, info.value.got) == ("out.nbytes", 3 * group - 4)
    assert [bytes(g) for g in run(model.cache.export_groups(0, out=memoryview(bytearray(3 * group))))] == \
        model.expected_groups(0)


def test_copy_path_packs_a_partial_last_page_whose_unused_slots_are_not_whole_words(make_model,
                                                                                    page_copy_dispatches):
    model = make_model(transfer="copy", qk_head_dim=33)  # float16: the unused slots start 66 bytes into a row block
    model.add(0, 2 * P)
    model.remove(0)
    model.add(1, P + 1)
    assert model.export(1) == model.expected_groups(1)
    assert page_copy_dispatches and set(page_copy_dispatches) == {"pack"}


def test_export_page_group_overwrites_the_tail_of_a_dirty_tensor_with_zeros(make_model, transfer):
    model = make_model(transfer=transfer)
    model.add(0, P + 1)
    dst = model.cache.empty_group(2)
    model.cache.device.write(dst.buffer, 0, b"\xff" * (2 * model.layout.page_bytes))
    model.cache.export_page_group(0, 1, dst)
    assert run(read_device_array(model.cache.device, dst)) == model.expected_group(0, 1)


def test_export_page_group_at_an_offset_writes_only_its_bytes(make_model, transfer):
    model = make_model(transfer=transfer)
    model.add(0, 6)
    pb = model.layout.page_bytes
    buf = model.cache.device.create_buffer(256 + 2 * pb + 64, Usage.STORAGE | Usage.COPY_SRC | Usage.COPY_DST)
    model.cache.device.write(buf, 0, b"\xab" * buf.size)
    whole = DeviceArray(buf, (buf.size // 2,), "float16")
    model.cache.export_page_group(0, 1, DeviceArray(buf, model.layout.group_shape(2), "float16", offset=256))
    data = run(read_device_array(model.cache.device, whole))
    assert data[:256] == b"\xab" * 256
    assert data[256:256 + 2 * pb] == model.expected_group(0, 1)
    assert data[256 + 2 * pb:] == b"\xab" * 64
    model.cache.device.destroy(buf)


def test_import_page_group_from_an_offset(make_model, transfer):
    source = make_model(seed=3)
    source.add(0, 6)
    metadata, groups = checkpoint(source, 0)
    target = make_model(transfer=transfer)
    pb = target.layout.page_bytes
    target.cache.prepare_import(0, metadata)
    for g, data in enumerate(groups):
        buf = target.cache.device.create_buffer(128 + 2 * pb, Usage.STORAGE | Usage.COPY_SRC | Usage.COPY_DST)
        target.cache.device.write(buf, 0, b"\xcd" * 128 + data)
        target.cache.import_page_group(0, g, DeviceArray(buf, target.layout.group_shape(2), "float16", offset=128))
    target.cache.finish_import(0)
    assert target.export(0) == groups


def test_empty_group_is_a_device_tensor_of_the_group_shape_and_dtype(make_cache):
    group = make_cache(dtype="float32").empty_group(3)
    assert (group.shape, group.dtype, group.offset) == ((1, 3, 2, 2, P, 8), "float32", 0)
    assert group.buffer.size >= 3 * 2 * 2 * P * 8 * 4


# ----- dtypes ------------------------------------------------------------------------------------------

DTYPES = {
    "float16": dict(dtype="float16"),
    "bfloat16": dict(dtype="bfloat16"),
    "float32": dict(dtype="float32"),
    "float16-head_dim33": dict(dtype="float16", qk_head_dim=33),
    "bfloat16-head_dim7": dict(dtype="bfloat16", qk_head_dim=7, num_kv_heads=3, num_qo_heads=3),
    "float32-head_dim5": dict(dtype="float32", qk_head_dim=5),
    "float16-page2-heads3-dim7": dict(dtype="float16", page_size=2, num_kv_heads=3, num_qo_heads=3, qk_head_dim=7),
}
"""The last: pages of 42 words, not whole vec4 units, so the kernel path moves single words."""


@pytest.mark.parametrize("name", DTYPES)
def test_every_dtype_round_trips(make_model, transfer, name):
    source = make_model(transfer=transfer, seed=5, **DTYPES[name])
    source.add(0, 2)
    source.add(1, 3)
    source.append({0: 5, 1: 1})
    target = make_model(transfer=transfer, **DTYPES[name])
    for seq in (0, 1):
        source.assert_holds(seq)
        metadata, groups = checkpoint(source, seq)
        assert groups == source.expected_groups(seq)
        run(target.cache.load_checkpoint(metadata, groups, exclusive=False))
        target.ref[seq] = source.ref[seq]
        target.assert_holds(seq)
        assert target.export(seq) == groups


# ----- export / import argument validation (ports of TVM's tests) ---------------------------------------


@pytest.fixture
def exporting(make_model):
    """A model whose sequence 0 holds 5 tokens (2 pages), and a correct group tensor for it."""
    model = make_model()
    model.add(0, P + 1)
    return model.cache, model.cache.empty_group(2)


@pytest.mark.parametrize("group_id", [2, -1, True, 0.0])
def test_export_page_group_refuses_an_invalid_group_id(exporting, group_id):
    cache, dst = exporting
    with pytest.raises(TensorError, match="group id") as info:
        cache.export_page_group(0, group_id, dst)
    assert (info.value.field, info.value.got) == ("export_page_group.group_id", group_id)


def bad_tensors(cache, good: DeviceArray) -> dict:
    shape = list(good.shape)
    shape[-1] += 1
    return {
        "head_dim": ("shape", dataclasses.replace(good, shape=tuple(shape)), tuple(shape)),
        "pages": ("shape", cache.empty_group(3), (1, 3, 2, 2, P, 8)),
        "rank": ("shape", dataclasses.replace(good, shape=good.shape[1:]), good.shape[1:]),
        "dtype": ("dtype", dataclasses.replace(good, dtype="float32"), "float32"),
        "offset_unaligned": ("offset", dataclasses.replace(good, offset=2), 2),
        "buffer_too_small": ("offset", DeviceArray(cache.empty_group(1).buffer, good.shape, good.dtype), 0),
        "storage_only_buffer": ("buffer.usage", DeviceArray(cache.device.create_buffer(good.buffer.size,
                                                                                       Usage.STORAGE),
                                                            good.shape, good.dtype), "STORAGE"),
    }


BAD_TENSOR_NAMES = ["head_dim", "pages", "rank", "dtype", "offset_unaligned", "buffer_too_small",
                    "storage_only_buffer"]
#: Parts whose errors are about the buffer rather than TVM's tensor layout message.
BUFFER_PARTS = ("offset", "buffer.usage")


@pytest.mark.parametrize("name", BAD_TENSOR_NAMES)
def test_export_page_group_refuses_a_tensor_of_another_shape_dtype_or_size(exporting, name):
    cache, dst = exporting
    part, bad, got = bad_tensors(cache, dst)[name]
    with pytest.raises(TensorError, match=None if part in BUFFER_PARTS else "ExportPageGroup expects") as info:
        cache.export_page_group(0, 0, bad)
    assert (info.value.field, info.value.got) == (f"ExportPageGroup.{part}", got)
    if part == "dtype":
        assert "dtype mismatches" in str(info.value) and info.value.expected == "float16"


def test_export_page_group_refuses_a_host_array(exporting):
    cache, _ = exporting
    with pytest.raises(TensorError) as info:
        cache.export_page_group(0, 0, np.zeros((1, 2, 2, 2, P, 8), np.float16))
    assert (info.value.field, info.value.got) == ("ExportPageGroup", "ndarray")


@pytest.fixture
def importing(make_model):
    """A fresh cache with an import of a 5-token sequence 0 prepared; the source groups as device tensors."""
    source = make_model(seed=2)
    source.add(0, P + 1)
    metadata, groups = checkpoint(source, 0)
    target = make_model()
    target.cache.prepare_import(0, metadata)
    tensors = [device_array_from(target.cache, g, 2) for g in groups]
    return target, tensors, source


@pytest.mark.parametrize("group_id", [2, -1, False])
def test_import_page_group_refuses_an_invalid_group_id(importing, group_id):
    target, tensors, _ = importing
    with pytest.raises(TensorError, match="group id") as info:
        target.cache.import_page_group(0, group_id, tensors[0])
    assert (info.value.field, info.value.got) == ("import_page_group.group_id", group_id)


@pytest.mark.parametrize("name", BAD_TENSOR_NAMES)
def test_import_page_group_refuses_a_bad_tensor_and_still_accepts_a_good_one(importing, name):
    target, tensors, source = importing
    cache = target.cache
    part, bad, got = bad_tensors(cache, tensors[0])[name]
    with pytest.raises(TensorError, match=None if part in BUFFER_PARTS else "ImportPageGroup expects") as info:
        cache.import_page_group(0, 0, bad)
    assert (info.value.field, info.value.got) == (f"ImportPageGroup.{part}", got)
    for g, tensor in enumerate(tensors):  # the rejected call did not count as importing group 0
        cache.import_page_group(0, g, tensor)
    cache.finish_import(0)
    target.ref[0] = source.ref[0]
    target.assert_holds(0)


def test_import_groups_refuses_bytes_of_another_size(importing):
    target, _, source = importing
    groups = source.export(0)
    with pytest.raises(TensorError) as info:
        run(target.cache.import_groups(0, [groups[0], groups[1][:-2]]))
    assert (info.value.field, info.value.expected, info.value.got) == ("groups[1].nbytes", len(groups[0]),
                                                                        len(groups[0]) - 2)


def test_import_groups_accepts_groups_one_at_a_time_in_any_order(importing):
    target, _, source = importing
    groups = source.export(0)
    run(target.cache.import_group_bytes(0, 1, groups[1]))
    run(target.cache.import_groups(0, {0: groups[0]}))
    target.cache.finish_import(0)
    target.ref[0] = source.ref[0]
    target.assert_holds(0)


# ----- the import state machine ------------------------------------------------------------------------


def test_import_requires_all_groups_and_explicit_finish(importing):
    """Port of TVM's test_checkpoint_import_requires_all_groups_and_explicit_finish."""
    target, tensors, _ = importing
    cache = target.cache
    cache.import_page_group(0, 0, tensors[0])
    with pytest.raises(CheckpointStateError, match="group 0 was already imported"):
        cache.import_page_group(0, 0, tensors[0])
    with pytest.raises(CheckpointStateError, match="missing group 1"):
        cache.finish_import(0)
    with pytest.raises(CheckpointStateError, match="before checkpoint import is finished"):
        cache.begin_forward([0], [1])
    cache.import_page_group(0, 1, tensors[1])
    cache.finish_import(0)
    with pytest.raises(CheckpointStateError, match="has not been prepared"):
        cache.finish_import(0)


def test_import_groups_refuses_a_group_already_imported(importing):
    target, _, source = importing
    groups = source.export(0)
    run(target.cache.import_group_bytes(0, 0, groups[0]))
    with pytest.raises(CheckpointStateError, match="group 0 was already imported"):
        run(target.cache.import_groups(0, groups))


def test_sequence_length_is_unavailable_until_finish(importing):
    target, tensors, _ = importing
    with pytest.raises(CheckpointStateError, match="until checkpoint import is finished"):
        target.cache.get_sequence_length(0)
    for g, tensor in enumerate(tensors):
        target.cache.import_page_group(0, g, tensor)
    target.cache.finish_import(0)
    assert target.cache.get_sequence_length(0) == P + 1


@pytest.mark.parametrize("operation", ["add_sequence", "remove_sequence", "fork_sequence", "popn", "prepare_import",
                                       "get_checkpoint_metadata", "export_page_group", "export_groups"])
def test_other_operations_are_refused_during_an_import(importing, operation):
    target, tensors, source = importing
    cache = target.cache
    calls = {
        "add_sequence": lambda: cache.add_sequence(5),
        "remove_sequence": lambda: cache.remove_sequence(0),
        "fork_sequence": lambda: cache.fork_sequence(0, 5),
        "popn": lambda: cache.popn(0, 1),
        "prepare_import": lambda: cache.prepare_import(0, source.cache.get_checkpoint_metadata(0)),
        "get_checkpoint_metadata": lambda: cache.get_checkpoint_metadata(0),
        "export_page_group": lambda: cache.export_page_group(0, 0, tensors[0]),
        "export_groups": lambda: run(cache.export_groups(0)),
    }
    with pytest.raises(CheckpointStateError):
        calls[operation]()


@pytest.mark.parametrize("operation", ["import_page_group", "finish_import", "abort_import", "import_groups"])
def test_import_steps_without_prepare_are_refused(make_model, operation):
    cache = make_model().cache
    calls = {
        "import_page_group": lambda: cache.import_page_group(0, 0, cache.empty_group(1)),
        "finish_import": lambda: cache.finish_import(0),
        "abort_import": lambda: cache.abort_import(0),
        "import_groups": lambda: run(cache.import_groups(0, [b"", b""])),
    }
    with pytest.raises(CheckpointStateError, match="has not been prepared"):
        calls[operation]()


@pytest.mark.parametrize("operation", ["import_page_group", "finish_import", "abort_import"])
def test_import_steps_for_another_sequence_are_refused(importing, operation):
    target, tensors, _ = importing
    cache = target.cache
    calls = {
        "import_page_group": lambda: cache.import_page_group(1, 0, tensors[0]),
        "finish_import": lambda: cache.finish_import(1),
        "abort_import": lambda: cache.abort_import(1),
    }
    with pytest.raises(SequenceError, match="the sequence being imported"):
        calls[operation]()


def test_prepare_import_during_a_forward_is_refused(make_model):
    source = make_model(seed=1)
    source.add(0, 3)
    model = make_model()
    model.add(0, 2)
    model.cache.begin_forward([0], [1])
    with pytest.raises(CheckpointStateError, match="forward pass"):
        model.cache.prepare_import(0, source.cache.get_checkpoint_metadata(0))
    model.cache.end_forward()
    assert model.cache.sequence_ids() == [0]


@pytest.mark.parametrize("wrong", ["one group too few", "one group too many", "a group one page short"])
def test_an_exclusive_load_of_wrong_page_groups_is_refused_before_any_sequence_is_cleared(make_model, wrong):
    source = make_model(seed=1)
    source.add(0, 3 * P + 1)
    metadata, groups = checkpoint(source, 0)
    target = make_model(seed=2)
    target.add(0, 5)
    target.add(1, 2 * P)
    bad = {"one group too few": groups[:-1], "one group too many": groups + groups[:1],
           "a group one page short": [groups[0][:-target.layout.page_bytes]] + groups[1:]}[wrong]
    before = state(target)
    with pytest.raises(TensorError, match="groups"):
        run(target.cache.load_checkpoint(metadata, bad, exclusive=True))
    assert state(target) == before
    target.assert_holds(0)
    target.assert_holds(1)


def test_metadata_and_export_are_refused_while_a_forward_pass_is_open(make_model):
    model = make_model(seed=1)
    model.add(0, 30)
    cache = model.cache
    cache.begin_forward([0], [3])
    k, v = model.random_kv(3)
    cache.append_kv(0, model.as_input(k[0]), model.as_input(v[0]))  # layer 0 holds the new tokens, layer 1 not yet
    dst = cache.empty_group(len(cache.seqs.get(0).pages))
    for call in (lambda: cache.get_checkpoint_metadata(0), lambda: cache.export_page_group(0, 0, dst),
                 lambda: run(cache.export_groups(0))):
        with pytest.raises(CheckpointStateError, match="forward pass in progress"):
            call()
    cache.end_forward()
    assert json.loads(cache.get_checkpoint_metadata(0))["seq_length"] == 33


# ----- sequence ids ------------------------------------------------------------------------------------


def test_any_sequence_id_can_be_checkpointed_and_restored(make_model):
    source = make_model(seed=4)
    source.add(12345, 6)
    metadata, groups = checkpoint(source, 12345)
    assert json.loads(metadata)["seq_id"] == 12345
    target = make_model()
    run(target.cache.load_checkpoint(metadata, groups))
    assert target.cache.sequence_ids() == [12345]
    target.ref[12345] = source.ref[12345]
    target.assert_holds(12345)


@pytest.mark.parametrize("seq_id", [-1, True, "0", None])
def test_prepare_import_refuses_ids_that_are_not_non_negative_integers(make_model, seq_id):
    model = make_model()
    model.add(0, 3)
    before = state(model)
    with pytest.raises(SequenceError):
        model.cache.prepare_import(seq_id, model.cache.get_checkpoint_metadata(0))
    assert state(model) == before


@pytest.mark.parametrize("seq_id", [-1, 3])
def test_export_of_a_missing_sequence_is_refused(make_model, seq_id):
    model = make_model()
    model.add(0, 3)
    with pytest.raises(SequenceError):
        model.cache.get_checkpoint_metadata(seq_id)
    with pytest.raises(SequenceError):
        model.cache.export_page_group(seq_id, 0, model.cache.empty_group(1))
    with pytest.raises(SequenceError):
        run(model.cache.export_groups(seq_id))


# ----- transactional prepare_import, exclusive, abort ----------------------------------------------------


@pytest.fixture
def populated(make_model):
    """A model with sequences 0 (6 tokens), 1 (3 tokens) and 3 (9 tokens), and a 7-token checkpoint of seq 1."""
    source = make_model(seed=9)
    source.add(1, 7)
    model = make_model(seed=10)
    model.add(0, 6)
    model.add(1, 3)
    model.add(3, 9)
    return model, source, checkpoint(source, 1)


def _mutate(metadata: str, **changes) -> str:
    m = json.loads(metadata)
    m.update(changes)
    return json.dumps(m)


BAD_IMPORTS = {
    "layout_hash": (lambda m: _mutate(m, layout_hash="0" * 16), 1, LayoutHashMismatch),
    "too_long_for_cache": (lambda m: _mutate(m, seq_length=100, num_total_pages=200), 1, MetadataError),
    "malformed_json": (lambda m: m[:-1], 1, MetadataError),
    "other_seq_id": (lambda m: m, 2, MetadataError),
    "other_dtype": (lambda m: _mutate(m, dtype="float32"), 1, MetadataError),
}


@pytest.mark.parametrize("exclusive", [True, False], ids=["exclusive", "non_exclusive"])
@pytest.mark.parametrize("name", BAD_IMPORTS)
def test_rejected_prepare_import_leaves_the_cache_as_it_was(populated, name, exclusive):
    model, _, (metadata, _) = populated
    corrupt, seq_id, error = BAD_IMPORTS[name]
    before = state(model)
    with pytest.raises(error):
        model.cache.prepare_import(seq_id, corrupt(metadata), exclusive=exclusive)
    assert state(model) == before
    model.append({0: 2, 3: 1})  # no import is in progress: the cache works on
    for s in (0, 1, 3):
        model.assert_holds(s)


def test_non_exclusive_prepare_import_without_free_pages_changes_nothing(make_model):
    source = make_model(seed=1)
    source.add(1, 7)  # 2 pages
    model = make_model(limits=small_limits(max_total_seq_len=16))  # 5 pages
    model.add(0, 13)  # 4 pages
    model.add(1, 1)  # 1 page
    before = state(model)
    with pytest.raises(CapacityError):
        model.cache.prepare_import(1, source.cache.get_checkpoint_metadata(1), exclusive=False)
    assert state(model) == before


def test_exclusive_prepare_import_clears_every_other_sequence(populated):
    model, source, (metadata, groups) = populated
    cache = model.cache
    cache.prepare_import(1, metadata)
    assert cache.sequence_ids() == []
    assert cache.get_num_available_pages() == cache.num_total_pages - 2
    run(cache.import_groups(1, groups))
    cache.finish_import(1)
    assert cache.sequence_ids() == [1]
    model.ref = {1: source.ref[1]}
    model.assert_holds(1)


def test_non_exclusive_import_keeps_other_sequences_and_replaces_only_at_finish(populated):
    model, source, (metadata, groups) = populated
    cache = model.cache
    free = cache.get_num_available_pages()
    cache.prepare_import(1, metadata, exclusive=False)
    assert cache.sequence_ids() == [0, 1, 3]
    k, _ = run(model.stored_kv(1))  # the old sequence 1 is still there until finish
    np.testing.assert_array_equal(k, model.ref[1][0])
    run(cache.import_groups(1, groups))
    cache.finish_import(1)
    model.ref[1] = source.ref[1]
    for s in (0, 1, 3):
        model.assert_holds(s)
    assert cache.get_num_available_pages() == free - 2 + 1  # 7 tokens replaced 3


def test_abort_of_a_non_exclusive_import_restores_the_cache(populated):
    model, _, (metadata, groups) = populated
    before = state(model)
    model.cache.prepare_import(1, metadata, exclusive=False)
    run(model.cache.import_groups(1, groups))  # data written into the reserved pages, then abandoned
    model.cache.abort_import(1)
    assert state(model) == before
    model.append({1: 2})
    model.assert_holds(1)


def test_abort_of_an_exclusive_import_leaves_an_empty_usable_cache(populated):
    model, _, (metadata, _) = populated
    cache = model.cache
    cache.prepare_import(1, metadata)
    cache.abort_import(1)
    assert cache.sequence_ids() == []
    assert cache.get_num_available_pages() == cache.num_total_pages
    model.ref = {}
    model.add(4, 5)
    model.assert_holds(4)


def test_a_new_import_can_be_prepared_after_an_abort(populated):
    model, source, (metadata, groups) = populated
    model.cache.prepare_import(1, metadata, exclusive=False)
    model.cache.abort_import(1)
    import_host(model.cache, 1, metadata, groups, exclusive=False)
    model.ref[1] = source.ref[1]
    for s in (0, 1, 3):
        model.assert_holds(s)


def test_load_checkpoint_with_missing_groups_abandons_the_import(populated):
    model, _, (metadata, groups) = populated
    before = state(model)
    with pytest.raises(TensorError) as info:
        run(model.cache.load_checkpoint(metadata, groups[:1], exclusive=False))
    assert (info.value.field, info.value.got) == ("groups", 1)
    assert state(model) == before


def test_load_checkpoint_imports_into_the_metadata_seq_id(populated):
    model, source, (metadata, groups) = populated
    run(model.cache.load_checkpoint(metadata, groups, exclusive=False))
    model.ref[1] = source.ref[1]
    for s in (0, 1, 3):
        model.assert_holds(s)


# ----- unsupported layouts at the cache ----------------------------------------------------------------

UNSUPPORTED = {
    "mla": (dict(attn_kinds=("mha", "mla")), "full-context MHA/GQA"),
    "sliding_window": (dict(support_sliding_window=True), "sliding-window"),
    "rope_ext_factors": (dict(has_rope_ext_factors=True), "RoPE extension factors"),
    "kv_transfer": (dict(kv_transfer=True), "KV transfer"),
    "v_head_dim": (dict(v_head_dim=4), "qk_head_dim to equal v_head_dim"),
}


@pytest.mark.parametrize("name", UNSUPPORTED)
def test_cache_with_an_unsupported_layout_refuses_every_checkpoint_primitive(make_cache, name):
    change, reason = UNSUPPORTED[name]
    supported = make_cache()
    supported.add_sequence(0)
    metadata = supported.get_checkpoint_metadata(0)
    cache = make_cache(**change)
    cache.add_sequence(0)
    calls = [cache.get_layout_hash, lambda: cache.get_checkpoint_metadata(0),
             lambda: cache.export_page_group(0, 0, cache.empty_group(0)), lambda: run(cache.export_groups(0)),
             lambda: cache.prepare_import(0, metadata)]
    for call in calls:
        with pytest.raises(UnsupportedLayoutError, match=reason):
            call()
    assert cache.sequence_ids() == [0]


@pytest.mark.parametrize("maps", [True, False], ids=["storage-maps-in-place", "storage-does-not-map"])
def test_an_empty_sequence_round_trips_whether_or_not_storage_maps_in_place(device, unmapped_device, maps):
    dev = device if maps else unmapped_device
    src, dst = (PagedKVCache(dev, small_layout(), small_limits()) for _ in range(2))
    try:
        src.add_sequence(0)
        dst.prepare_import(0, src.get_checkpoint_metadata(0))
        run(dst.import_groups(0, run(src.export_groups(0))))
        dst.finish_import(0)
        assert dst.get_sequence_length(0) == 0
        assert dst.get_num_available_pages() == src.get_num_available_pages()
    finally:
        src.close()
        dst.close()


# ----- sliding-window layers (FORMAT.md section 11) ------------------------------------------------------

SLIDING_LAYOUT = dict(attn_kinds=("mha_sliding", "mha"), support_layer_sliding_window=True, sliding_window=8,
                      sliding_rotary_theta=100.0)


def test_a_cache_with_sliding_layers_exports_and_imports_every_page_of_every_layer(make_model):
    model = make_model(**SLIDING_LAYOUT)
    model.add(0, 21)  # more tokens than the window: the pages before it are kept too
    metadata, groups = checkpoint(model, 0)
    assert json.loads(metadata)["sliding_window"] == 8
    twin = make_model(**SLIDING_LAYOUT)
    import_host(twin.cache, 0, metadata, groups)
    twin.ref[0] = model.ref[0]
    twin.assert_holds(0)
    assert twin.export(0) == groups == model.expected_groups(0)


def test_a_checkpoint_of_another_window_is_refused_naming_the_field(make_model):
    model = make_model(**SLIDING_LAYOUT)
    model.add(0, 5)
    metadata, _ = checkpoint(model, 0)
    other = make_model(**{**SLIDING_LAYOUT, "sliding_window": 16})
    with pytest.raises(MetadataError) as info:
        other.cache.prepare_import(0, metadata)
    assert (info.value.field, info.value.expected, info.value.got) == ("metadata.sliding_window", 16, 8)
    assert other.cache.sequence_ids() == []
