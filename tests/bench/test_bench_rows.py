"""How `kvckpt bench` turns paired timings into the rows it prints (no device, no timing of this machine)."""

import asyncio

import pytest

from kvckpt_web.bench import rows
from kvckpt_web.bench.rows import HEADER, Row, paired_rounds
from kvckpt_web.errors import FieldError


def test_row_ratio_is_the_baseline_median_over_the_operation_median():
    row = Row.of_rounds("op", 1 << 20, [2.0, 4.0, 3.0], "raw", [1.0, 3.0, 2.0])
    assert (row.seconds, row.baseline_seconds) == (3.0, 2.0)
    assert row.ratio == pytest.approx(2.0 / 3.0)


def test_row_keeps_the_ratio_of_each_round_in_order():
    row = Row.of_rounds("op", 1 << 20, [2.0, 4.0], "raw", [1.0, 3.0])
    assert row.round_ratios == (0.5, 0.75)


def test_row_refuses_rounds_that_do_not_pair_up():
    with pytest.raises(FieldError, match=r"op: rounds timed \(operation, baseline\): expected the same number, "
                                         r"at least 1, got \(2, 1\)"):
        Row.of_rounds("op", 1, [1.0, 2.0], "raw", [1.0])
    with pytest.raises(FieldError, match=r"got \(0, 0\)"):
        Row.of_rounds("op", 1, [], "raw", [])


def test_format_shows_the_range_of_the_round_ratios_after_the_ratio():
    row = Row.of_rounds("export", 256 << 20, [0.1, 0.2, 0.1], "raw readback", [0.09, 0.1, 0.08])
    assert row.format() == ("| export | 256 MiB | 100.0 ms (2.68 GB/s) | raw readback 90.0 ms (2.98 GB/s)"
                            " | 0.90 (0.50-0.90) | ? |")


def test_format_of_a_single_round_has_no_range():
    row = Row.of_rounds("export", 1 << 20, [0.5], "raw", [0.25])
    assert row.format().endswith("| 0.50 | ? |")


def test_verdict_judges_the_unrounded_ratio():
    row = Row.of_rounds("save", 1, [0.2358], "raw", [0.1877])  # 0.796: the table prints 0.80
    assert row.format().endswith("| 0.80 | ? |")
    assert row.verdict(0.8) == "0.796, target >= 0.8: not met"


def test_verdict_of_a_ratio_at_its_target_is_met():
    row = Row.of_rounds("save", 1, [0.25], "raw", [0.2])
    assert row.verdict(0.8) == "0.800, target >= 0.8: met"
    assert Row.of_rounds("inc", 1, [0.01], "full", [0.2]).verdict(20) == "20.000, target >= 20: met"


def test_header_has_one_column_per_cell_of_a_row():
    cells = Row.of_rounds("op", 1, [1.0, 1.0], "raw", [1.0, 1.0]).format().count("|")
    assert all(line.count("|") == cells for line in HEADER.splitlines())


def test_paired_rounds_warm_up_once_then_alternate_which_runs_first():
    calls: list[str] = []

    def recorder(name: str):
        async def run() -> None:
            calls.append(name)
        return run

    op_times, base_times, loads = asyncio.run(paired_rounds(recorder("op"), recorder("base"), 3))
    assert calls == ["base", "op", "op", "base", "base", "op", "op", "base"]
    assert len(op_times) == len(base_times) == len(loads) == 3  # the warm-up round is not recorded


def test_paired_rounds_take_the_load_average_after_each_round(monkeypatch):
    seen = iter([1.25, 0.5, 3.0])
    monkeypatch.setattr(rows, "load_average", lambda: next(seen))

    async def nothing() -> None:
        pass

    assert asyncio.run(paired_rounds(nothing, nothing, 3))[2] == [1.25, 0.5, 3.0]


def test_format_ends_with_the_range_of_the_load_averages_of_the_rounds():
    row = Row.of_rounds("op", 1, [1.0, 1.0, 1.0], "raw", [1.0, 1.0, 1.0], [2.34, 0.96, 1.5])
    assert row.format().endswith("| 1.00 (1.00-1.00) | 1.0-2.3 |")
