"""The persistent prefix cache on a SmolLM2-135M-layout cache (30 layers, 3 KV heads, head_dim 64, float16, pages of
16 tokens; 768 bytes per token and layer) and a FileStore: what chunk size lets conversations share their prefix,
and what the prefix index costs.

``chunks``: N conversations share a prefix of P tokens. The first is L tokens of seeded K/V, saved. Every other
one restores the first P tokens of the first (``restore(..., length=P)``), appends its own L - P tokens and is saved
under its own name. Then the first gets 64 more tokens and an autosave, and the second is restored whole into a
fresh sequence. Each variant is a chunk size in tokens (``pages_per_chunk`` = tokens / 16); 1,360 tokens is
about the 1 MiB default. Each round runs every variant once, in a fresh store directory, in an order that
alternates from round to round, after a warm-up round. Printed per variant: the medians of the rounds, the
bytes of chunks stored, the bytes the autosave wrote, and the 1-minute load average over the rounds.

``index``: 1,000 prefix records of 2,000 tokens each (125 pages) in a FileStore, all starting with the same 300
tokens (a system prompt). Printed: the first ``PrefixIndex.refresh`` of a new index (reads every record), a
refresh that finds nothing new (only lists), and lookups: one conversation's tokens and 3 more (every record
matches on 18 pages, that one on 125), the shared tokens and others (every record matches on 18 pages), and
tokens that match nothing.

Run from the repository root: ``.venv/bin/python -m kvckpt_web.bench.prefix_cache [chunks] [index] [--rounds N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from ..durable.prefix_index import PrefixIndex
from ..durable.prefix_records import PrefixKey, encode_record, prefix_record
from ..durable.restore import restore
from ..durable.save import save
from ..gpu.open import open_device
from ..kv.cache import PagedKVCache
from ..stores.file import FileStore
from ..tvm.layout import CacheLimits, KVLayout

LAYOUT = KVLayout(page_size=16, num_layers=30, num_qo_heads=9, num_kv_heads=3, qk_head_dim=64, dtype="float16",
                  rope_mode="normal", rotary_theta=100000.0)
SCOPE = "SmolLM2-135M-Instruct|layout|kernels"


def fill(cache: PagedKVCache, seq_id: int, n: int, seed: int) -> None:
    """Append ``n`` tokens of seeded K/V bytes to ``seq_id`` in one forward."""
    rng = np.random.default_rng(seed)
    shape = (n, LAYOUT.num_kv_heads, LAYOUT.head_dim)
    cache.begin_forward([seq_id], [n])
    for layer in range(LAYOUT.num_layers):
        k, v = (rng.integers(0, 1 << 16, size=shape, dtype=np.uint16).view(np.float16) for _ in "kv")
        cache.append_kv(layer, k, v)
    cache.end_forward()


def stored_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in (directory / "chunks").iterdir())


async def timed(coro) -> tuple[float, object]:
    start = time.perf_counter()
    result = await coro
    return time.perf_counter() - start, result


async def scenario(cache: PagedKVCache, directory: Path, chunk_tokens: int, conversations: int, prefix: int,
                   length: int) -> dict[str, float]:
    """One run of the chunks scenario in a fresh store at ``directory``; seconds and bytes by row name."""
    store = FileStore(directory)
    ppc = chunk_tokens // LAYOUT.page_size
    out: dict[str, list[float]] = {"full save": [], "prefix restore": [], "save sharing the prefix": []}
    cache.add_sequence(0)
    fill(cache, 0, length, seed=0)
    seconds, _ = await timed(save(cache, 0, store, "c0", pages_per_chunk=ppc))
    out["full save"].append(seconds)
    for i in range(1, conversations):
        seconds, _ = await timed(restore(store, "c0", cache, seq_id=1, length=prefix))
        out["prefix restore"].append(seconds)
        fill(cache, 1, length - prefix, seed=i)
        seconds, _ = await timed(save(cache, 1, store, f"c{i}", pages_per_chunk=ppc))
        out["save sharing the prefix"].append(seconds)
        cache.remove_sequence(1)
    row = {name: statistics.median(values) for name, values in out.items()}
    row["chunk bytes stored"] = stored_bytes(directory)
    fill(cache, 0, 64, seed=99)
    row["autosave +64 tokens"], result = await timed(save(cache, 0, store, "c0", pages_per_chunk=ppc))
    row["autosave bytes written"] = result.bytes_written  # type: ignore[attr-defined]
    cache.remove_sequence(0)
    row["full restore"], _ = await timed(restore(store, "c1", cache, seq_id=2))
    cache.remove_sequence(2)
    return row


async def bench_chunks(rounds: int, variants: list[int], conversations: int, prefix: int, length: int) -> None:
    device = open_device()
    cache = PagedKVCache(device, LAYOUT, CacheLimits(reserved_num_seqs=4, max_total_seq_len=3 * (length + 80),
                                                     prefill_chunk_size=length))
    rows: dict[int, list[dict[str, float]]] = {v: [] for v in variants}
    loads: list[float] = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("KVCKPT_BENCH_DIR")) as tmp:
        for r in range(rounds + 1):
            for v in (variants if r % 2 else variants[::-1]):
                row = await scenario(cache, Path(tmp) / f"r{r}-{v}", v, conversations, prefix, length)
                if r:
                    rows[v].append(row)
            if r:
                loads.append(os.getloadavg()[0])
    cache.close()
    logical = conversations * length * LAYOUT.num_layers * 768
    print(f"{conversations} conversations of {length} tokens sharing {prefix}; {rounds} rounds; K/V of all "
          f"conversations {logical / 2**20:.1f} MiB; load average {min(loads):.1f}..{max(loads):.1f}")
    names = list(rows[variants[0]][0])
    print(f"  {'chunk tokens':34s}" + "".join(f"{v:>14d}" for v in variants))
    for name in names:
        cells = []
        for v in variants:
            values = [row[name] for row in rows[v]]
            if "bytes" in name:
                cells.append(f"{statistics.median(values) / 2**20:11.1f} MiB")
            else:
                cells.append(f"{statistics.median(values) * 1e3:11.1f} ms")
        print(f"  {name:34s}" + "".join(f"{c:>14s}" for c in cells))


async def bench_index(rounds: int, records: int = 1000, tokens: int = 2000, shared: int = 300,
                      lookups: int = 20) -> None:
    with tempfile.TemporaryDirectory(dir=os.environ.get("KVCKPT_BENCH_DIR")) as tmp:
        store = FileStore(tmp)
        rng = np.random.default_rng(1)
        system = rng.integers(0, 49152, size=shared).tolist()
        prompts = [system + rng.integers(0, 49152, size=tokens - shared).tolist() for _ in range(records)]
        async with store.batch():
            for i, ids in enumerate(prompts):
                r = prefix_record(PrefixKey(SCOPE, ids), f"c{i}", 1, tokens, LAYOUT.page_size)
                await store.set(r.key, encode_record(r))
        queries = {f"lookup, a conversation's {tokens} tokens + 3": prompts[7] + [5, 6, 7],
                   f"lookup, the {shared} shared tokens + {tokens - shared} others": system + [1] * (tokens - shared),
                   f"lookup, {tokens} tokens matching nothing": [3] * tokens}
        times: dict[str, list[float]] = {"first refresh (reads every record)": [], "refresh, nothing new": [],
                                         **{name: [] for name in queries}}
        hits = {}
        loads = []
        for _ in range(rounds):
            index = PrefixIndex(FileStore(tmp, read_only=True), SCOPE, LAYOUT.page_size)
            for name in ("first refresh (reads every record)", "refresh, nothing new"):
                seconds, _ = await timed(index.refresh())
                times[name].append(seconds)
            for _ in range(lookups):
                for name, prompt in queries.items():
                    start = time.perf_counter()
                    found = index.lookup(prompt)
                    times[name].append(time.perf_counter() - start)
                    hits[name] = (len(found), found[0].pages if found else 0)
            loads.append(os.getloadavg()[0])
        print(f"prefix index: {records} records of {tokens} tokens ({tokens // LAYOUT.page_size} pages) in a FileStore, "
              f"{shared} tokens shared by all; {rounds} rounds, {lookups} lookups of each kind a round; "
              f"load average {min(loads):.1f}..{max(loads):.1f}")
        for name, values in times.items():
            extra = f"  {hits[name][0]} hits, the longest {hits[name][1]} pages" if name in hits else ""
            print(f"  {name:46s} median {statistics.median(values) * 1e3:8.2f} ms  "
                  f"range {min(values) * 1e3:.2f}..{max(values) * 1e3:.2f}{extra}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("parts", nargs="*", help="chunks, index (default: both)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chunk-tokens", type=int, nargs="+", default=[256, 1360])
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--prefix", type=int, default=300)
    parser.add_argument("--length", type=int, default=1000)
    args = parser.parse_args()
    parts = args.parts or ["chunks", "index"]
    if set(parts) - {"chunks", "index"}:
        parser.error(f"parts: expected chunks or index, got {parts}")
    if "chunks" in parts:
        asyncio.run(bench_chunks(args.rounds, args.chunk_tokens, args.conversations, args.prefix, args.length))
    if "index" in parts:
        asyncio.run(bench_index(args.rounds))


if __name__ == "__main__":
    main()
