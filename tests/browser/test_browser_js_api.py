"""The JS-facing API of kvckpt.mjs: a page that writes no Python fills, checkpoints and restores a cache."""

from __future__ import annotations

LAYOUT = "{page_size: 4, num_layers: 2, num_qo_heads: 4, num_kv_heads: 2, qk_head_dim: 8, dtype: 'float16'}"
LIMITS = "{max_total_seq_len: 64, prefill_chunk_size: 64}"


def test_js_page_checkpoints_to_indexeddb_and_restores_into_a_new_cache(py_page):
    out = py_page.page.evaluate(f"""async () => {{
        {SETUP}
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


def test_js_create_cache_rejects_an_unknown_layout_field_with_a_field_error_naming_it(py_page):
    error = py_page.page.evaluate("""async () => {
        const kv = await window.kvckpt;
        try { await kv.createCache({page_size: 4, num_layers: 2, num_qo_heads: 4, num_kv_heads: 2,
                                    qk_head_dim: 8, head_size: 8}); return "accepted"; }
        catch (e) { return {isError: e instanceof Error, isPythonError: e instanceof kv.pyodide.ffi.PythonError,
                            name: e.name, message: e.message, field: e.field, expected: e.expected, got: e.got}; }
    }""")
    assert error["isError"] and not error["isPythonError"]
    assert (error["name"], error["field"], error["got"]) == ("FieldError", "layout.head_size", "an unknown field")
    assert error["expected"].startswith("one of [") and "'qk_head_dim'" in error["expected"]
    assert error["message"] == f"layout.head_size: expected {error['expected']}, got 'an unknown field'"


OTHER_LAYOUT = "{page_size: 4, num_layers: 2, num_qo_heads: 4, num_kv_heads: 2, qk_head_dim: 16, dtype: 'float16'}"
#: JS: a cache of LAYOUT holding 6 tokens of sequence 0 (K/V of layer l: bytes (i * 7 + l) and (i * 3 + l + 1)),
#: `n`, `bytes` (per layer and K or V) and `layers`; `caught(f)`: what calling (or awaiting) f threw, as data.
SETUP = f"""
    const kv = await window.kvckpt;
    const cache = await kv.createCache({LAYOUT}, {LIMITS});
    cache.addSequence(0);
    const n = 6, bytes = n * 2 * 8 * 2;
    const fill = (a, b) => Uint8Array.from({{length: bytes}}, (_, i) => (i * a + b) & 255);
    const layers = [0, 1].map((l) => [fill(7, l), fill(3, l + 1)]);
    cache.append([0], [n], layers);
    const caught = async (f) => {{
        try {{ await f(); return null; }}
        catch (e) {{ return {{isError: e instanceof Error, isPythonError: e instanceof kv.pyodide.ffi.PythonError,
                              name: e.name, message: e.message, field: e.field, expected: e.expected, got: e.got}}; }}
    }};
    const snapshot = async (c) => {{ const {{k, v}} = await c.readKV(0, 0, c.sequenceLength(0));
                                     return {{length: c.sequenceLength(0), k: Array.from(k), v: Array.from(v)}}; }};
"""


def test_js_append_of_too_few_bytes_for_its_lengths_throws_a_plain_error_with_field_expected_and_got(py_page):
    error = py_page.page.evaluate(f"""async () => {{ {SETUP}
        const e = await caught(() => cache.append([0], [n + 1], layers));
        cache.close();
        return e;
    }}""")
    assert error == {"isError": True, "isPythonError": False, "name": "TensorError",
                     "message": "layers[0].k.nbytes: expected 224, got 192",
                     "field": "layers[0].k.nbytes", "expected": 224, "got": 192}


def test_js_append_of_too_few_bytes_leaves_the_cache_as_it_was(py_page):
    out = py_page.page.evaluate(f"""async () => {{ {SETUP}
        const before = await snapshot(cache);
        await caught(() => cache.append([0], [n + 1], layers));
        const after = await snapshot(cache);
        cache.close();
        return {{before, after}};
    }}""")
    assert out["before"]["length"] == 6
    assert out["after"] == out["before"]


def test_js_restore_of_an_unknown_name_rejects_with_a_plain_not_found_error(py_page):
    error = py_page.page.evaluate(f"""async () => {{ {SETUP}
        const e = await caught(() => cache.restore({{store: "indexeddb", storeName: "js-errors", name: "nothing"}}));
        cache.close();
        return e;
    }}""")
    assert error["isError"] and not error["isPythonError"]
    assert error["name"] == "NotFoundError"
    assert "'nothing'" in error["message"] and "\n" not in error["message"]
    assert error["field"] is None


def test_js_restore_into_a_cache_of_another_layout_rejects_naming_the_layout_hash_expected_and_got(py_page):
    out = py_page.page.evaluate(f"""async () => {{ {SETUP}
        await cache.checkpoint({{seqId: 0, store: "indexeddb", storeName: "js-errors", name: "layout"}});
        const other = await kv.createCache({OTHER_LAYOUT}, {LIMITS});
        const e = await caught(() => other.restore({{store: "indexeddb", storeName: "js-errors", name: "layout"}}));
        const hashes = await kv.runJSON(`
import json
from kvckpt_web import KVLayout
json.dumps([KVLayout(**{{'page_size': 4, 'num_layers': 2, 'num_qo_heads': 4, 'num_kv_heads': 2, 'qk_head_dim': q,
                          'dtype': 'float16'}}).layout_hash() for q in (16, 8)])`);
        cache.close(); other.close();
        return {{error: e, hashes}};
    }}""")
    error, (expected, got) = out["error"], out["hashes"]
    assert error["isError"] and not error["isPythonError"]
    assert error["name"] == "LayoutHashMismatch"
    assert error["field"].endswith("tvm_metadata.layout_hash")
    assert (error["expected"], error["got"]) == (expected, got)
    assert error["message"] == f"{error['field']}: expected {expected}, got {got!r}"


def test_js_restore_into_a_cache_of_another_layout_leaves_that_cache_and_the_checkpoint_as_they_were(py_page):
    out = py_page.page.evaluate(f"""async () => {{ {SETUP}
        const saved = await cache.checkpoint({{seqId: 0, store: "indexeddb", storeName: "js-errors", name: "kept"}});
        const other = await kv.createCache({OTHER_LAYOUT}, {LIMITS});
        other.addSequence(0);
        const before = other.sequenceLength(0);
        await caught(() => other.restore({{store: "indexeddb", storeName: "js-errors", name: "kept"}}));
        const after = {{ids: other.sequenceLength(0)}};
        const fresh = await kv.createCache({LAYOUT}, {LIMITS});
        const restored = await fresh.restore({{store: "indexeddb", storeName: "js-errors", name: "kept"}});
        const same = JSON.stringify(await snapshot(fresh)) === JSON.stringify(await snapshot(cache));
        cache.close(); other.close(); fresh.close();
        return {{saved, before, after, restored, same}};
    }}""")
    assert out["before"] == 0 and out["after"] == {"ids": 0}
    assert out["restored"]["generation"] == out["saved"]["generation"]
    assert out["same"]


def test_js_a_python_exception_that_is_not_kvckpts_is_a_plain_error_named_python_error(py_page):
    error = py_page.page.evaluate(f"""async () => {{ {SETUP}
        cache.close();
        return await caught(() => kv.runJSON("1 / 0"));
    }}""")
    assert error == {"isError": True, "isPythonError": False, "name": "PythonError",
                     "message": "ZeroDivisionError: division by zero", "field": None, "expected": None, "got": None}


def test_js_to_error_gives_other_modules_the_same_errors_for_python_they_call(py_page):
    error = py_page.page.evaluate("""async () => {
        const kv = await window.kvckpt;
        const { toError } = await import(new URL("kvckpt.mjs", location.href).href);
        try { kv.pyodide.runPython("from kvckpt_web.errors import FieldError\\nraise FieldError('x.y', [1, 2], 3.5)"); }
        catch (e) { const err = toError(kv.pyodide, e);
                    return {isPythonError: e instanceof kv.pyodide.ffi.PythonError, isError: err instanceof Error,
                            name: err.name, message: err.message, field: err.field, expected: err.expected,
                            got: err.got, cause: err.cause === e}; }
        return null;
    }""")
    assert error == {"isPythonError": True, "isError": True, "name": "FieldError",
                     "message": "x.y: expected [1, 2], got 3.5", "field": "x.y", "expected": [1, 2], "got": 3.5,
                     "cause": True}


def test_js_guard_makes_python_calls_of_other_modules_reject_with_plain_errors(py_page):
    error = py_page.page.evaluate("""async () => {
        const kv = await window.kvckpt;
        const { guard } = await import(new URL("kvckpt.mjs", location.href).href);
        const api = guard(kv.pyodide, kv.pyodide.pyimport("kvckpt_web.web.js_api"));
        try { await api.gc("elsewhere", "x"); return null; }
        catch (e) { return {isError: e instanceof Error, isPythonError: e instanceof kv.pyodide.ffi.PythonError,
                            name: e.name, field: e.field, got: e.got}; }
    }""")
    assert error == {"isError": True, "isPythonError": False, "name": "FieldError", "field": "store",
                     "got": "elsewhere"}


def test_js_closing_caches_that_restores_filled_leaves_no_gpu_memory_behind(py_page):
    out = py_page.page.evaluate(f"""async () => {{ {SETUP}
        await cache.checkpoint({{seqId: 0, store: "indexeddb", storeName: "js-errors", name: "again"}});
        const before = await kv.deviceMemory();
        const during = [];
        for (let i = 0; i < 3; i++) {{
            const fresh = await kv.createCache({LAYOUT}, {LIMITS});
            await fresh.restore({{store: "indexeddb", storeName: "js-errors", name: "again"}});
            during.push(await kv.deviceMemory());
            fresh.close();
        }}
        const after = await kv.deviceMemory();
        cache.close();
        return {{before, during, after}};
    }}""")
    assert all(d["liveBytes"] > out["before"]["liveBytes"] for d in out["during"])
    assert out["after"] == out["before"]


def test_js_a_closed_cache_refuses_use_with_a_checkpoint_state_error(py_page):
    out = py_page.page.evaluate(f"""async () => {{ {SETUP}
        cache.close();
        cache.close();  // again: nothing more
        return {{sync: await caught(() => cache.addSequence(1)), async: await caught(() => cache.readKV(0, 0, 1))}};
    }}""")
    for error in out.values():
        assert error["isError"] and not error["isPythonError"]
        assert error["name"] == "CheckpointStateError"
        assert error["message"].endswith("expected an open cache, got a closed one (close() was called)")
