"""Choosing the page-transfer path: measure_path on CPU and non-CPU adapters."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from kvckpt_web import shaders
from kvckpt_web.device import Usage
from kvckpt_web.transfer import PATHS, measure_path

try:
    from kvmodel import small_layout
except ImportError:  # run from the repository root
    from tests.kvmodel import small_layout


def as_adapter(monkeypatch, device, is_cpu: bool):
    """``device`` reporting ``is_cpu``, with no remembered choices."""
    monkeypatch.setattr(device, "info", dataclasses.replace(device.info, is_cpu=is_cpu))
    monkeypatch.setattr(device, "choices", {})
    return device


def test_a_cpu_adapter_takes_the_copy_path_without_running_a_kernel(device, monkeypatch, page_copy_dispatches):
    cpu = as_adapter(monkeypatch, device, is_cpu=True)
    assert asyncio.run(measure_path(cpu, small_layout())) == "copy"
    assert page_copy_dispatches == []


def test_another_adapter_times_both_paths_and_remembers_the_faster(device, monkeypatch, page_copy_dispatches):
    gpu = as_adapter(monkeypatch, device, is_cpu=False)
    layout = small_layout()
    choice = asyncio.run(measure_path(gpu, layout))
    assert choice in PATHS and "pack" in page_copy_dispatches
    timed = len(page_copy_dispatches)
    assert asyncio.run(measure_path(gpu, layout)) == choice
    assert len(page_copy_dispatches) == timed  # the second call measured nothing
    assert gpu.choices == {f"page_transfer/{layout.page_bytes}": choice}


@pytest.mark.parametrize(("words_per_page", "dense_word_offset", "entry", "per_invocation"),
                         [(64, 0, "pack4", 4), (64, 8, "pack4", 4), (42, 0, "pack", 1), (64, 2, "pack", 1)],
                         ids=["whole-vec4-pages", "vec4-offset", "pages-of-42-words", "offset-of-2-words"])
def test_page_copy_moves_vec4_units_where_pages_and_offset_allow(device, words_per_page, dense_word_offset, entry,
                                                                 per_invocation):
    buffer = device.create_buffer(3 * 4 * words_per_page + 4 * dense_word_offset, Usage.STORAGE, "test.pages")
    try:
        dispatch = shaders.page_copy(device, "pack", pages=buffer, page_table=buffer, dense=buffer, num_pages=3,
                                     words_per_page=words_per_page, tail_tokens=4, elem_bytes=2, head_dim=8,
                                     page_size=4, dense_word_offset=dense_word_offset)
    finally:
        device.destroy(buffer)
    assert dispatch.kernel.name == f"page_copy.{entry}"
    assert dispatch.invocations == 3 * words_per_page // per_invocation
