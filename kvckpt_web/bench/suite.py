"""``kvckpt bench``: checkpoint throughput measured side by side with raw transfers of the same bytes.

Every number is a ratio against a baseline measured in the same run on the same
adapter, interleaved with it, so machine noise hits both alike (see :mod:`.rows`).
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any, Callable

from ..gpu.device import Device
from .chat import bench_chat
from .export import bench_export
from .rows import Row, load_range
from .save import bench_save
from .serve import bench_serve
from .soak import run_soak
from .generate import bench_generate


async def bench_soak(device: Device | None = None, repeats: int = 0, paths: tuple[str, ...] = (),
                     echo: Callable[[str], None] = print, trials: int = 200) -> list[Row]:
    """kill -9 trials of processes that are saving (see :mod:`kvckpt_web.bench.soak`); raises if any trial failed."""
    started = time.perf_counter()
    result = await run_soak(trials, device=device, echo=lambda line: print(line, file=sys.stderr, flush=True))
    echo(f"{result.trials} trials in {time.perf_counter() - started:.0f} s: worker killed while saving "
         f"{result.kills['killed']}, save finished first {result.kills['completed']}; restored the previous "
         f"generation {result.restored[2]}, the new one {result.restored[3]}; failures {len(result.failures)}; "
         f"load average {load_range(result.loads)}")
    for failure in result.failures:
        echo(f"FAILED: {failure}")
    if result.failures:
        raise AssertionError(f"soak: {len(result.failures)} of {result.trials} trials failed")
    return []


BENCHES = {"export": bench_export, "save": bench_save, "soak": bench_soak, "generate": bench_generate,
           "chat": bench_chat}


def run(names: list[str], repeats: int, paths: tuple[str, ...], echo: Callable[[str], None] = print, *,
        trials: int = 200, serve: dict[str, Any] | None = None) -> None:
    """Run the named benchmarks and print their tables (``trials``: of the soak benchmark; ``serve``: the keyword
    arguments of :func:`.serve.bench_serve`, which runs servers, not a coroutine)."""
    for name in names:
        echo(f"## kvckpt bench {name}\n")
        if name == "serve":
            bench_serve(repeats=repeats, echo=echo, **(serve or {}))
            continue
        extra = {"trials": trials} if name == "soak" else {}
        asyncio.run(BENCHES[name](repeats=repeats, paths=paths, echo=echo, **extra))
