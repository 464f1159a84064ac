"""The Python the browser benchmark (:mod:`.browser`) runs in its page, in Pyodide: source text whose placeholders
(``REPEATS``, ``CONTEXT_TOKENS``, ``DECODE_TOKENS``, ``BENCH_TEXT``, ``FETCH_SOURCE``) the driver replaces, each
setting ``result`` to the rows it measured."""

from __future__ import annotations

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
fetched with nothing computed (:mod:`.model_kernels`' floor, as the browser binds textures), alternating."""
