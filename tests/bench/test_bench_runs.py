"""`kvckpt bench export` and `save` run end to end on the device (a small sequence; nothing here is timed)."""

from __future__ import annotations

import asyncio

import pytest

from kvckpt_web.bench.export import bench_export
from kvckpt_web.bench.rows import expand_paths
from kvckpt_web.bench.save import bench_save


TOKENS = 64  # 4 pages of each of 16 layers: 4 MiB


def test_bench_export_prints_every_export_and_import_row_next_to_its_baseline(device):
    lines: list[str] = []
    rows = asyncio.run(bench_export(device, repeats=1, paths=("copy",), echo=lines.append, tokens=TOKENS))
    names = [row.name for row in rows]
    assert names[:4] == ["raw readback, one copy per layer (adapter floor)",
                         "raw upload, one copy per layer (adapter floor)",
                         "raw readback, one copy per page (floor of a scattered table)",
                         "raw upload, one copy per page (floor of a scattered table)"]
    for table in ("contiguous", "interleaved", "scattered"):
        assert f"export ({table} page table, copy path)" in names
        assert f"import ({table} page table, copy path)" in names
        assert f"import ({table} page table, copy path, one buffer per group)" in names
    assert all(row.nbytes == 4 << 20 and row.ratio > 0 and len(row.loads) == 1 for row in rows)
    assert [line for line in lines if line.startswith("| export")] == [row.format() for row in rows
                                                                       if row.name.startswith("export")]


def test_bench_export_of_the_mapped_path_prints_the_floor_of_copies_in_place(device):
    if not device.info.maps_storage:
        pytest.skip(f"{device.info.adapter!r}: storage buffers do not map in place")
    rows = asyncio.run(bench_export(device, repeats=1, paths=("mapped",), echo=lambda line: None, tokens=TOKENS))
    by_name = {row.name: row for row in rows}
    assert by_name["raw readback, mapped in place (floor of the mapped path)"].baseline == "raw readback"
    assert by_name["raw upload, mapped in place (floor of the mapped path)"].baseline == "raw upload"
    for table in ("contiguous", "interleaved", "scattered"):
        assert by_name[f"export ({table} page table, mapped path)"].baseline == "raw readback"
        assert by_name[f"import ({table} page table, mapped path)"].baseline == "raw upload"


def test_all_paths_are_the_transfers_the_device_offers(device, unmapped_device):
    assert expand_paths(unmapped_device, ("all",)) == ("kernel", "copy")
    assert expand_paths(device, ("all", "copy")) == ("kernel", "copy") + (("mapped",) if device.info.maps_storage
                                                                            else ())
    assert expand_paths(device, ("auto",)) == ("auto",)


def test_bench_save_prints_full_incremental_and_restore_rows(device, tmp_path):
    rows = asyncio.run(bench_save(device, repeats=1, paths=("copy",), echo=lambda line: None,
                                  directory=str(tmp_path), tokens=TOKENS))
    assert [row.name.split(" (")[0] for row in rows] == ["chunk files alone, one FileStore set each",
                                                         "save, full, to disk", "save, incremental +64 tokens",
                                                         "its files alone, FileStore sets as the incremental "
                                                         "save makes them",
                                                         "save of a new process, every chunk stored already and "
                                                         "read back", "restore from disk"]
    assert [row.baseline for row in rows] == ["raw write+fsync", "raw write+fsync", "full save", "full save",
                                              "full save", "raw read+upload"]
    assert all(len(row.loads) == 1 for row in rows)  # the load average of its one round
    assert not list(tmp_path.iterdir())  # the benchmark removes what it wrote


def test_bench_save_ends_with_a_verdict_on_each_target_from_its_rows(device, tmp_path):
    lines: list[str] = []
    rows = asyncio.run(bench_save(device, repeats=1, paths=("copy",), echo=lines.append,
                                  directory=str(tmp_path), tokens=TOKENS))
    full, incremental = rows[1], rows[2]
    assert lines[-1] == (f"copy path: full save vs raw write+fsync {full.verdict(0.8)}; "
                         f"incremental save vs full save {incremental.verdict(20)}")
