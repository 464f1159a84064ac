"""Browser benchmark (``make bench-browser``): in one page on headless Chromium (SwiftShader WebGPU),

* export / import throughput of a 64 MiB sequence vs a raw copyBufferToBuffer + mapAsync readback /
  upload of the same bytes (target >= 0.8x), in one run of pages on both paths, and on the copy path
  also with a second sequence appended in turns ("interleaved") and with every page apart ("scattered");
* IndexedDBStore vs OPFSStore save and restore throughput of that 64 MiB checkpoint (save/restore).

Run from the repository root: ``.venv/bin/python -m bench.browser [--repeats N]`` (it shares the page
harness of the browser tests, ``tests/browser/browser_harness.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from tests.browser import browser_harness as harness

BENCH = """
import random, js, statistics
from kvckpt_web import PagedKVCache, KVLayout, CacheLimits
from kvckpt_web.gpu.browser import BrowserDevice
from kvckpt_web.gpu.device import Copy, Usage
from kvckpt_web.stores.indexeddb import IndexedDBStore
from kvckpt_web.stores.opfs import OPFSStore
from kvckpt_web.durable.memo import forget
from kvckpt_web.durable.restore import restore
from kvckpt_web.durable.save import save
from kvckpt_web.kv.scatter import scatter_free_pages

R = REPEATS
now = lambda: js.performance.now() / 1000
dev = await BrowserDevice.open()
lay = KVLayout(page_size=16, num_layers=16, num_qo_heads=32, num_kv_heads=8, qk_head_dim=128, dtype="float16",
               rope_mode="none")
lim = CacheLimits(reserved_num_seqs=2, max_total_seq_len=1024, prefill_chunk_size=1024)
lim2 = CacheLimits(reserved_num_seqs=2, max_total_seq_len=2048, prefill_chunk_size=1024)  # room for 2 tables
tokens = 1024
rows = {}

async def median(fn):
    await fn()  # warm-up (pipelines, staging buffers)
    ts = []
    for _ in range(R):
        t = now(); await fn(); ts.append(now() - t)
    return statistics.median(ts)

def rnd(n, seed):
    return random.Random(seed).randbytes(n)

def append(cache, seq, start, count):
    n = count * lay.num_kv_heads * lay.head_dim * lay.elem_bytes
    cache.begin_forward([seq], [count])
    for layer in range(lay.num_layers):
        cache.append_kv(layer, rnd(n, layer + start), rnd(n, 100 + layer + start))
    cache.end_forward()

def build(table, transfer, fill):
    # a cache holding page table `table`; sequence 0 has `tokens` if fill, else its pages are free
    cache = PagedKVCache(dev, lay, lim if table == "contiguous" else lim2, transfer=transfer)
    if table == "scattered":
        scatter_free_pages(cache, first_id=2)
    if table == "interleaved":  # two sequences appended a page at a time; placement keeps each in one run
        cache.add_sequence(0); cache.add_sequence(1)
        for start in range(0, tokens, lay.page_size):
            append(cache, 0, start, lay.page_size); append(cache, 1, start, lay.page_size)
        if not fill:
            cache.remove_sequence(0)
    elif fill:
        cache.add_sequence(0)
        append(cache, 0, 0, tokens)
    return cache

for transfer, table in (("kernel", "contiguous"), ("copy", "contiguous"), ("copy", "interleaved"),
                        ("copy", "scattered")):
    src = build(table, transfer, fill=True)
    meta = src.get_checkpoint_metadata(0)
    groups = [bytes(g) for g in await src.export_groups(0)]
    total = sum(len(g) for g in groups)
    out = memoryview(bytearray(total))
    raw_src = dev.create_buffer(total, Usage.STORAGE | Usage.COPY_SRC | Usage.COPY_DST)
    raw_dst = dev.create_buffer(total, Usage.STORAGE | Usage.COPY_SRC | Usage.COPY_DST)
    read_st = dev.create_buffer(total, Usage.MAP_READ | Usage.COPY_DST)
    write_st = dev.create_buffer(total, Usage.MAP_WRITE | Usage.COPY_SRC)
    sync = dev.create_buffer(8, Usage.MAP_READ | Usage.COPY_DST)

    async def export():
        await src.export_groups(0, out)

    async def raw_read():
        dev.submit([Copy(raw_src, 0, read_st, 0, total)])
        await dev.read(read_st, 0, total, out)

    dst = build(table, transfer, fill=False)
    label = transfer if table == "contiguous" else f"{transfer}, {table}"

    async def import_():
        if 0 in dst.sequence_ids():
            dst.remove_sequence(0)
        dst.prepare_import(0, meta, exclusive=False)
        await dst.import_groups(0, groups)
        dst.finish_import(0)
        await dev.read(sync, 0, 4)  # wait for the device

    async def raw_upload():
        await dev.upload(write_st, 0, groups)
        dev.submit([Copy(write_st, 0, raw_dst, 0, total)])
        await dev.read(sync, 0, 4)

    t_exp, t_raw = await median(export), await median(raw_read)
    rows[f"export ({label})"] = (total, t_exp, t_raw)
    t_imp, t_up = await median(import_), await median(raw_upload)
    rows[f"import ({label})"] = (total, t_imp, t_up)
    same = [bytes(g) for g in await dst.export_groups(0)] == groups
    assert same, "import/export mismatch"
    for b in (raw_src, raw_dst, read_st, write_st, sync):
        dev.destroy(b)
    if transfer == "kernel":  # the contiguous kernel-path sequence: what the store rows save
        store_src = src
    else:
        src.close()
    dst.close()

stores = {}
for kind, opener in (("IndexedDB", IndexedDBStore.open), ("OPFS", OPFSStore.open)):
    store = await opener("bench")
    async def clear(store=store):
        for k in await store.list_prefix(""):
            await store.delete(k)
        forget(store)
    saves, restores = [], []
    for i in range(R):
        await clear()
        t = now(); await save(store_src, 0, store, "bench"); saves.append(now() - t)
        target = PagedKVCache(dev, lay, lim)
        t = now(); r = await restore(store, "bench", target); restores.append(now() - t)
        target.close()
    await clear()
    stores[kind] = (total, statistics.median(saves), statistics.median(restores))

result = {"adapter": dev.info.adapter, "rows": rows, "stores": stores}
"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    from kvckpt_web.web.serve import serve_in_thread

    chromium = harness.find_chromium()
    if chromium is None:
        print("no chromium", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        harness.build_wheel(Path(tmp) / "wheel")
        server, url = serve_in_thread(harness.pyodide_dir(), [Path(tmp) / "wheel", harness.wheels_dir()], port=0)
        with sync_playwright() as pw:
            ctx = pw.chromium.launch_persistent_context(str(Path(tmp) / "profile"), executable_path=chromium,
                                                        headless=True, args=harness.CHROMIUM_FLAGS)
            page = harness.PyPage(ctx.new_page(), url).boot()
            out = page.run(BENCH.replace("REPEATS", str(args.repeats)))
            ctx.close()
        server.shutdown()
    mib = 2**20
    print(f"browser bench on {out['adapter']} (Chromium headless, Pyodide), median of {args.repeats}")
    print(f"{'operation':<31}{'MiB':>6}{'ms':>9}{'MB/s':>9}   {'raw same bytes':<16}{'ms':>9}{'MB/s':>9}{'ratio':>8}")
    for name, (nbytes, t, t_raw) in out["rows"].items():
        raw = "raw readback" if name.startswith("export") else "raw upload"
        print(f"{name:<31}{nbytes / mib:>6.0f}{t * 1e3:>9.1f}{nbytes / t / 1e6:>9.0f}   {raw:<16}{t_raw * 1e3:>9.1f}"
              f"{nbytes / t_raw / 1e6:>9.0f}{t_raw / t:>7.2f}x")
    print(f"{'store':<12}{'MiB':>6}{'save ms':>10}{'save MB/s':>11}{'restore ms':>12}{'restore MB/s':>14}")
    for kind, (nbytes, ts, tr) in out["stores"].items():
        print(f"{kind:<12}{nbytes / mib:>6.0f}{ts * 1e3:>10.0f}{nbytes / ts / 1e6:>11.0f}{tr * 1e3:>12.0f}"
              f"{nbytes / tr / 1e6:>14.0f}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
