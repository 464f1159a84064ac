"""``kvckpt demo``: fill a cache in a worker, export it, kill the worker, restore in a fresh process.

The K/V are a deterministic function of a seed, so the restoring process can
check every byte without the crashed worker's help. The cache has
SmolLM2-135M's layout (30 layers, 9 query / 3 KV heads, head_dim 64, page 16,
float16).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from ..durable.tvm_export import check_replaceable, is_tvm_export, read_tvm_export, read_tvm_metadata, write_tvm_export
from ..errors import FieldError, KVCkptError
from ..gpu.open import open_device
from ..kv.cache import PagedKVCache
from ..tvm.layout import CacheLimits, KVLayout
from ..tvm.metadata import layout_from_metadata, parse_metadata

SMOLLM2_LAYOUT = KVLayout(page_size=16, num_layers=30, num_qo_heads=9, num_kv_heads=3, qk_head_dim=64,
                          dtype="float16", rope_mode="normal", rotary_theta=100000.0)
CHUNK = 512


def chunks_of_kv(seed: int, tokens: int, layout: KVLayout) -> Iterator[tuple[int, list[tuple[Any, Any]]]]:
    """The demo's K/V: per chunk of up to CHUNK tokens, (length, [(k, v) per layer]); same seed, same values."""
    rng = np.random.default_rng(seed)
    for start in range(0, tokens, CHUNK):
        n = min(CHUNK, tokens - start)
        shape = (n, layout.num_kv_heads, layout.head_dim)
        yield n, [(rng.standard_normal(shape).astype(layout.dtype), rng.standard_normal(shape).astype(layout.dtype))
                  for _ in range(layout.num_layers)]


async def fill_and_export(out: Path, tokens: int, seed: int) -> dict[str, float]:
    """Worker: append ``tokens`` tokens of seeded K/V to sequence 0 and write a TVM export directory."""
    cache = PagedKVCache(open_device(), SMOLLM2_LAYOUT, CacheLimits(4, max(tokens, 16), CHUNK))
    cache.add_sequence(0)
    start = time.perf_counter()
    for n, kv in chunks_of_kv(seed, tokens, SMOLLM2_LAYOUT):
        cache.begin_forward([0], [n])
        for layer, (k, v) in enumerate(kv):
            cache.append_kv(layer, k, v)
        cache.end_forward()
    filled = time.perf_counter()
    metadata = cache.get_checkpoint_metadata(0)
    groups = await cache.export_groups(0)
    exported = time.perf_counter()
    write_tvm_export(out, metadata, groups, overwrite=True)
    written = time.perf_counter()
    return {"fill_s": filled - start, "export_s": exported - filled, "write_s": written - exported,
            "bytes": sum(len(g) for g in groups)}


async def restore_and_verify(path: Path, tokens: int, seed: int) -> dict[str, float]:
    """Fresh process: import the export directory into a new cache and compare every K/V byte with the seeded values."""
    start = time.perf_counter()
    export = read_tvm_export(path)
    read = time.perf_counter()
    device = open_device()
    opened = time.perf_counter()
    cache = PagedKVCache.from_metadata(device, export.metadata_json)
    await cache.load_checkpoint(export.metadata_json, export.groups)
    imported = time.perf_counter()
    if cache.get_sequence_length(0) != tokens:
        raise KVCkptError(f"seq_length: expected {tokens}, got {cache.get_sequence_length(0)}")
    k, v = await cache.debug_get_kv(0, 0, tokens)
    got_k, got_v = k.numpy(), v.numpy()
    pos = 0
    for n, kv in chunks_of_kv(seed, tokens, SMOLLM2_LAYOUT):
        for layer, (want_k, want_v) in enumerate(kv):
            for name, got, want in (("K", got_k, want_k), ("V", got_v, want_v)):
                if got[layer, pos:pos + n].tobytes() != want.tobytes():
                    raise KVCkptError(f"{name}[layer {layer}, tokens {pos}..{pos + n}): expected the seeded values, "
                                      "got different bytes")
        pos += n
    tail = tokens % SMOLLM2_LAYOUT.page_size
    if tail:
        last = np.frombuffer(export.groups[0], dtype="float16").reshape(
            SMOLLM2_LAYOUT.group_shape(len(export.groups[0]) // SMOLLM2_LAYOUT.page_bytes))[0, -1]
        if np.any(last[:, :, tail:, :].view(np.uint16)):
            raise KVCkptError("group_0 last page tail: expected zeros, got stale data")
    verified = time.perf_counter()
    return {"read_s": read - start, "device_s": opened - read, "import_s": imported - opened,
            "verify_s": verified - imported}


def _worker_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "kvckpt_web.cli", *args]


def is_demo_export(path: Path) -> bool:
    """Whether ``path`` is a TVM export directory of the demo's cache layout (what ``--dir`` may replace)."""
    if not is_tvm_export(path):
        return False
    try:
        return layout_from_metadata(parse_metadata(read_tvm_metadata(path))) == SMOLLM2_LAYOUT
    except KVCkptError:
        return False


def check_demo_dir(directory: Path) -> None:
    """Refuse a ``--dir`` the demo must not replace: anything but a new path, an empty directory or a demo export."""
    check_replaceable(directory)  # a file, a symlink, a store, a directory of something else
    if is_tvm_export(directory) and not is_demo_export(directory):
        raise FieldError(str(directory), "a new path, an empty directory or a demo export to replace",
                          "a TVM export directory of another cache layout")


def _failure(what: str, returncode: int, errors: Path) -> KVCkptError:
    """The error of a demo child process that failed: the last line it wrote to stderr (``errors``)."""
    lines = errors.read_text(errors="replace").strip().splitlines()
    last = lines[-1].removeprefix("kvckpt: error: ") if lines else "no message"
    return KVCkptError(f"{what} failed (exit status {returncode}): {last}")


def run_demo(tokens: int, seed: int, directory: Path | None, echo: Callable[[str], None] = print) -> None:
    """Run the crash/restore demo and print what happened; KVCkptError if restored bytes differ or ``directory``
    holds something the demo must not replace (see :func:`check_demo_dir`)."""
    if directory is not None:
        check_demo_dir(directory)
    with tempfile.TemporaryDirectory(prefix="kvckpt-demo-") as tmp:
        out = directory or Path(tmp) / "checkpoint"
        errors = Path(tmp) / "stderr"
        echo(f"worker: filling {tokens} tokens of SmolLM2-135M-layout K/V (30 layers, 3 KV heads, head_dim 64, "
             f"float16) on the GPU ...")
        with open(errors, "w") as err:
            worker = subprocess.Popen(_worker_command("_demo-worker", str(out), str(tokens), str(seed)),
                                      stdout=subprocess.PIPE, stderr=err, text=True)
        line = worker.stdout.readline()
        if not line:
            worker.wait()
            raise _failure("demo worker", worker.returncode, errors)
        report = json.loads(line)
        echo(f"worker: filled in {report['fill_s'] * 1e3:.0f} ms, exported {report['bytes'] / 2**20:.1f} MiB in "
             f"{report['export_s'] * 1e3:.0f} ms, wrote + fsynced {out} in {report['write_s'] * 1e3:.0f} ms")
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        echo(f"worker: killed with SIGKILL (exit status {worker.returncode}); its GPU state is gone")
        with open(errors, "w") as err:
            result = subprocess.run(_worker_command("_demo-verify", str(out), str(tokens), str(seed)),
                                    stdout=subprocess.PIPE, stderr=err, text=True)
        if result.returncode != 0:
            raise _failure("demo verifier", result.returncode, errors)
        check = json.loads(result.stdout.strip().splitlines()[-1])
        echo(f"fresh process: read {check['read_s'] * 1e3:.0f} ms, opened the GPU device in "
             f"{check['device_s'] * 1e3:.0f} ms, new cache + import (prepare/import/finish) "
             f"{check['import_s'] * 1e3:.0f} ms, verified every K/V byte of {tokens} tokens x 30 layers in "
             f"{check['verify_s'] * 1e3:.0f} ms: identical")


def demo_child_main(mode: str, path: str, tokens: int, seed: int) -> None:
    """Entry of the demo's child processes: report one JSON line, then (worker) wait to be killed."""
    if mode == "fill":
        print(json.dumps(asyncio.run(fill_and_export(Path(path), tokens, seed))), flush=True)
        signal.pause()
    else:
        print(json.dumps(asyncio.run(restore_and_verify(Path(path), tokens, seed))), flush=True)
