"""Choosing how pages move on CPU and non-CPU adapters: measure_path, and the size of copies of page runs."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from kvckpt_web import PagedKVCache
from kvckpt_web.gpu.device import Buffer, Region, Usage
from kvckpt_web.kv import kernels
from kvckpt_web.kv.transfer import CPU_COPY_PIECE_BYTES, PATHS, PageMover, in_pieces, measure_path

from support.kvmodel import small_layout, small_limits


def as_adapter(monkeypatch, device, is_cpu: bool):
    """``device`` reporting ``is_cpu``, with no remembered choices."""
    monkeypatch.setattr(device, "info", dataclasses.replace(device.info, is_cpu=is_cpu))
    monkeypatch.setattr(device, "choices", {})
    return device


def test_a_cpu_adapter_takes_the_copy_path_without_running_a_kernel(device, monkeypatch, page_copy_dispatches):
    cpu = as_adapter(monkeypatch, device, is_cpu=True)
    assert asyncio.run(measure_path(cpu, small_layout())) == "copy"
    assert page_copy_dispatches == []


@pytest.mark.parametrize(("is_cpu", "path"), [(True, "copy"), (False, "kernel")], ids=["cpu-adapter", "other-adapter"])
def test_an_auto_cache_moves_pages_on_the_device_by_the_untimed_choice_before_any_measurement(device, monkeypatch,
                                                                                           is_cpu, path):
    cache = PagedKVCache(as_adapter(monkeypatch, device, is_cpu=is_cpu), small_layout(), small_limits())
    try:
        assert cache.page_path() == path  # what export_page_group takes before anything measured the paths
    finally:
        cache.close()


def test_another_adapter_times_both_paths_and_remembers_the_faster(device, monkeypatch, page_copy_dispatches):
    gpu = as_adapter(monkeypatch, device, is_cpu=False)
    layout = small_layout()
    choice = asyncio.run(measure_path(gpu, layout))
    assert choice in PATHS and "pack" in page_copy_dispatches
    timed = len(page_copy_dispatches)
    assert asyncio.run(measure_path(gpu, layout)) == choice
    assert len(page_copy_dispatches) == timed  # the second call measured nothing
    assert gpu.choices == {f"page_transfer/{layout.page_bytes}": choice}


def test_in_pieces_cuts_each_run_into_runs_of_at_most_the_piece():
    assert in_pieces([(0, 100, 10), (10, 8, 4)], 4) == [(0, 100, 4), (4, 104, 4), (8, 108, 2), (10, 8, 4)]
    assert in_pieces([(0, 100, 3), (3, 8, 4)], 4) == [(0, 100, 3), (3, 8, 4)]
    assert in_pieces([(0, 100, 10)], None) == [(0, 100, 10)]


@pytest.mark.parametrize(("is_cpu", "page_bytes", "pieces"),
                         [(True, 64 << 10, 8), (True, 3 << 20, 1), (False, 64 << 10, None)],
                         ids=["cpu-adapter", "cpu-adapter-pages-over-the-piece", "other-adapter"])
def test_page_runs_are_copied_in_pieces_of_whole_pages_only_on_a_cpu_adapter(device, monkeypatch, is_cpu,
                                                                              page_bytes, pieces):
    adapter = as_adapter(monkeypatch, device, is_cpu=is_cpu)
    layout = small_layout(qk_head_dim=page_bytes // (2 * 2 * 4 * 2))  # K and V, 2 heads, page 4, float16
    assert layout.page_bytes == page_bytes
    expected = None if pieces is None else max(1, CPU_COPY_PIECE_BYTES // page_bytes)
    assert PageMover(adapter, layout).copy_piece_pages == expected == pieces


def test_host_runs_pair_each_run_of_pages_with_its_bytes_of_the_group_by_buffer(device, monkeypatch):
    layout = small_layout()
    mover = PageMover(as_adapter(monkeypatch, device, is_cpu=True), layout)
    mover.copy_piece_pages = 2
    pb = layout.page_bytes
    arena, other = Buffer(64 * pb, Usage.STORAGE, None, "arena"), Buffer(16 * pb, Usage.STORAGE, None, "other")
    layers = [Region(arena, 0, 16 * pb), Region(arena, 32 * pb, 16 * pb), Region(other, 0, 16 * pb)]
    groups = [memoryview(bytearray(4 * pb)) for _ in layers]
    runs = mover.host_runs(layers, [5, 6, 7, 2], groups)  # a run of three pages (pieces of two and one), then one
    assert list(runs) == [arena, other]
    expected = {arena: [(0, 0), (1, 32)], other: [(2, 0)]}  # (group, layer offset in pages) per buffer
    for buffer, layer_groups in expected.items():
        assert [(offset, len(view)) for offset, view in runs[buffer]] == [
            ((base + first) * pb, n * pb) for _, base in layer_groups for first, n in ((5, 2), (7, 1), (2, 1))]
        for (_, view), (g, start) in zip(runs[buffer], [(g, start) for g, _ in layer_groups for start in (0, 2, 3)]):
            view[:] = bytes([g + 1]) * len(view)  # a view of the group's own bytes, at the run's place in it
            assert groups[g][start * pb:start * pb + len(view)] == bytes([g + 1]) * len(view)


@pytest.mark.parametrize(("words_per_page", "dense_word_offset", "entry", "per_invocation"),
                         [(64, 0, "pack4", 4), (64, 8, "pack4", 4), (42, 0, "pack", 1), (64, 2, "pack", 1)],
                         ids=["whole-vec4-pages", "vec4-offset", "pages-of-42-words", "offset-of-2-words"])
def test_page_copy_moves_vec4_units_where_pages_and_offset_allow(device, words_per_page, dense_word_offset, entry,
                                                                 per_invocation):
    buffer = device.create_buffer(3 * 4 * words_per_page + 4 * dense_word_offset, Usage.STORAGE, "test.pages")
    try:
        dispatch = kernels.page_copy(device, "pack", pages=buffer, page_table=buffer, dense=buffer, num_pages=3,
                                     words_per_page=words_per_page, tail_tokens=4, elem_bytes=2, head_dim=8,
                                     page_size=4, dense_word_offset=dense_word_offset)
    finally:
        device.destroy(buffer)
    assert dispatch.kernel.name == f"page_copy.{entry}"
    assert dispatch.invocations == 3 * words_per_page // per_invocation
