"""Choosing the page-transfer path: measure_path on CPU and non-CPU adapters."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

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
