"""What every ``kvckpt bench`` shares: the benchmarked sequence, paired timing rounds and the table rows.

Every number is a ratio against a baseline measured in the same run on the same
adapter, interleaved with it, so machine noise hits both alike.
"""

from __future__ import annotations

import os
import re
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable

from ..errors import FieldError
from ..gpu.device import Buffer, Copy, Device, Usage
from ..tvm.layout import KVLayout

EXPORT_LAYOUT = KVLayout(page_size=16, num_layers=16, num_qo_heads=32, num_kv_heads=8, qk_head_dim=128,
                         dtype="float16")
EXPORT_TOKENS = 4096

ALL_PATHS = "all"
"""A ``paths`` entry naming every transfer the device offers: kernel, copy, and mapped where storage maps in place."""


def expand_paths(device: Device, paths: tuple[str, ...]) -> tuple[str, ...]:
    """``paths`` with :data:`ALL_PATHS` replaced by the transfers ``device`` offers."""
    offered = ("kernel", "copy") + (("mapped",) if device.info.maps_storage else ())
    return tuple(dict.fromkeys(q for p in paths for q in (offered if p == ALL_PATHS else (p,))))


def load_average() -> float:
    """The 1-minute load average now."""
    return os.getloadavg()[0]


def load_range(loads: tuple[float, ...] | list[float]) -> str:
    """``min-max`` of the load averages ``loads``, one decimal ("?" if none was taken)."""
    return f"{min(loads):.1f}-{max(loads):.1f}" if loads else "?"


@dataclass(frozen=True)
class Row:
    """One benchmark line: an operation's median time, its baseline's, and the ratio of each round."""

    name: str
    nbytes: int
    seconds: float
    baseline: str
    baseline_seconds: float
    round_ratios: tuple[float, ...] = ()
    """Baseline time / operation time of each round, both timed back to back in that round."""
    loads: tuple[float, ...] = ()
    """The 1-minute load average after each round."""

    @classmethod
    def of_rounds(cls, name: str, nbytes: int, times: list[float], baseline: str,
                  baseline_times: list[float], loads: list[float] | tuple[float, ...] = ()) -> "Row":
        """The row of paired rounds: ``times[i]`` and ``baseline_times[i]`` were measured together, and the load
        average after them was ``loads[i]``."""
        if not times or len(times) != len(baseline_times):
            raise FieldError(f"{name}: rounds timed (operation, baseline)", "the same number, at least 1",
                             (len(times), len(baseline_times)))
        return cls(name, nbytes, statistics.median(times), baseline, statistics.median(baseline_times),
                   tuple(b / t for t, b in zip(times, baseline_times)), tuple(loads))

    @property
    def ratio(self) -> float:
        """Throughput relative to the baseline (1.0 = as fast as the raw transfer), of the medians."""
        return self.baseline_seconds / self.seconds

    def verdict(self, target: float) -> str:
        """The ratio to three decimals and whether it reaches ``target``, judged on the unrounded ratio (a
        ratio of 0.796 prints as 0.80 in :meth:`format` and misses a target of 0.8)."""
        return f"{self.ratio:.3f}, target >= {target:g}: {'met' if self.ratio >= target else 'not met'}"

    def format(self) -> str:
        """A table row; the ratio is followed by the range of the rounds' ratios when there are several."""
        gbs = lambda s: self.nbytes / s / 1e9  # noqa: E731
        spread = (f" ({min(self.round_ratios):.2f}-{max(self.round_ratios):.2f})"
                  if len(self.round_ratios) > 1 else "")
        return (f"| {self.name} | {self.nbytes / 2**20:.0f} MiB | {self.seconds * 1e3:.1f} ms ({gbs(self.seconds):.2f} GB/s)"
                f" | {self.baseline} {self.baseline_seconds * 1e3:.1f} ms ({gbs(self.baseline_seconds):.2f} GB/s)"
                f" | {self.ratio:.2f}{spread} | {load_range(self.loads)} |")


HEADER = ("| operation | bytes | time (median) | baseline, same run | ratio (range over rounds) | load average |\n"
          "|---|---|---|---|---|---|")


async def paired_rounds(op: Callable[[], Awaitable[None]], base: Callable[[], Awaitable[None]],
                        repeats: int) -> tuple[list[float], list[float], list[float]]:
    """Seconds of ``op`` and ``base`` in each of ``repeats`` rounds, after one warm-up round, and the load
    average after each round; within a round both run back to back, in an order that alternates from round
    to round."""
    times: tuple[list[float], list[float], list[float]] = ([], [], [])
    for i in range(repeats + 1):
        for fn, bucket in ((op, times[0]), (base, times[1])) if i % 2 else ((base, times[1]), (op, times[0])):
            start = time.perf_counter()
            await fn()
            if i:
                bucket.append(time.perf_counter() - start)
        if i:
            times[2].append(load_average())
    return times


class Probe:
    """A 4-byte copy read back: waits until the device has finished all work submitted before it."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self.buffers: tuple[Buffer, Buffer] = (device.create_buffer(4, Usage.COPY_SRC, "bench.probe"),
                                               device.create_buffer(4, Usage.MAP_READ | Usage.COPY_DST,
                                                                    "bench.probe_read"))

    async def sync(self) -> None:
        """Wait until the device has finished all submitted work."""
        self.device.submit([Copy(self.buffers[0], 0, self.buffers[1], 0, 4)])
        await self.device.read(self.buffers[1], 0, 4)

    def close(self) -> None:
        for buf in self.buffers:
            self.device.destroy(buf)


def emit(rows: list[Row], row: Row, echo: Callable[[str], None]) -> Row:
    """Add ``row`` to ``rows`` and print it; returns it."""
    rows.append(row)
    echo(row.format())
    return row


def vector_width(cpu_flags: set[str], adapter: str) -> str:
    """The CPU's widest vector instructions of AVX2 and AVX-512 (``cpu_flags``: /proc/cpuinfo's), and llvmpipe's
    vector width from its adapter name (``llvmpipe (LLVM 15.0.6, 256 bits)``) where it is llvmpipe."""
    cpu = cpu_width(cpu_flags)
    bits = re.search(r"llvmpipe \(.*?(\d+) bits\)", adapter)
    return f"{cpu}, llvmpipe {bits.group(1)} bits" if bits else f"{cpu}, {adapter}"


def cpu_width(cpu_flags: set[str]) -> str:
    """The CPU's widest vector instructions of AVX2 and AVX-512 (``cpu_flags``: /proc/cpuinfo's)."""
    return "AVX-512" if "avx512f" in cpu_flags else "AVX2" if "avx2" in cpu_flags else "no AVX2"


def cpu_description() -> str:
    """The CPU's model name in /proc/cpuinfo and its widest vector instructions: ``AMD EPYC, AVX-512``."""
    return f"{cpuinfo_field('model name') or 'unknown CPU'}, {cpu_width(cpu_flags())}"


def cpuinfo_field(name: str) -> str | None:
    """The value of ``name`` for the first processor in /proc/cpuinfo (None where there is no such file or field)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    found = re.search(rf"^{re.escape(name)}\s*:(.*)$", text, re.MULTILINE)
    return found.group(1).strip() if found else None


def cpu_flags() -> set[str]:
    """The flags of the first processor in /proc/cpuinfo (none where there is no such file)."""
    return set((cpuinfo_field("flags") or "").split())
