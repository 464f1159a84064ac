"""The JS-facing API of kvckpt.mjs: a page that writes no Python fills, checkpoints and restores a cache."""

from __future__ import annotations

LAYOUT = "{page_size: 4, num_layers: 2, num_qo_heads: 4, num_kv_heads: 2, qk_head_dim: 8, dtype: 'float16'}"
LIMITS = "{max_total_seq_len: 64, prefill_chunk_size: 64}"


def test_js_page_checkpoints_to_indexeddb_and_restores_into_a_new_cache(py_page):
    out = py_page.page.evaluate(f"""async () => {{
        const kv = await window.kvckpt;
        const cache = await kv.createCache({LAYOUT}, {LIMITS});
        cache.addSequence(0);
        const n = 6, bytes = n * 2 * 8 * 2;
        const fill = (a, b) => Uint8Array.from({{length: bytes}}, (_, i) => (i * a + b) & 255);
        const layers = [0, 1].map((l) => [fill(7, l), fill(3, l + 1)]);
        cache.append([0], [n], layers);
        const saved = await cache.checkpoint({{seqId: 0, store: "indexeddb", storeName: "js-api", name: "chat",
                                              appState: {{tokens: [1, 2, 3]}}}});
        const other = await kv.createCache({LAYOUT}, {LIMITS});
        const restored = await other.restore({{store: "indexeddb", storeName: "js-api", name: "chat"}});
        const a = await cache.readKV(0, 0, n), b = await other.readKV(0, 0, n);
        const same = (x, y) => x.length === y.length && x.every((v, i) => v === y[i]);
        const k1 = layers[1][0].slice(0, 32);   // layer 1, token 0, both heads
        return {{saved, restored, length: other.sequenceLength(0), sameK: same(a.k, b.k), sameV: same(a.v, b.v),
                 layer1token0: same(b.k.slice(n * 32, n * 32 + 32), k1)}};
    }}""")
    assert out["saved"]["generation"] >= 1 and out["saved"]["seqLength"] == 6
    assert out["restored"]["appState"] == {"tokens": [1, 2, 3]}
    assert out["restored"]["generation"] == out["saved"]["generation"]
    assert out["length"] == 6
    assert out["sameK"] and out["sameV"] and out["layer1token0"]


def test_js_errors_name_the_field(py_page):
    message = py_page.page.evaluate(f"""async () => {{
        const kv = await window.kvckpt;
        const cache = await kv.createCache({LAYOUT}, {LIMITS});
        cache.addSequence(0);
        try {{ cache.append([0], [1], [[new Uint8Array(32), new Uint8Array(32)]]); return "accepted"; }}
        catch (e) {{ return String(e.message); }}
    }}""")
    assert "layers: expected 2 [k, v] pairs, got 1" in message


def test_js_create_cache_names_an_unknown_layout_field(py_page):
    message = py_page.page.evaluate("""async () => {
        const kv = await window.kvckpt;
        try { await kv.createCache({page_size: 4, num_layers: 2, num_qo_heads: 4, num_kv_heads: 2,
                                    qk_head_dim: 8, head_size: 8}); return "accepted"; }
        catch (e) { return String(e.message); }
    }""")
    assert "layout.head_size: expected one of" in message
