// kvckpt_web in the browser: the chat engine in a Web Worker, and Pyodide with the kvckpt_web wheel for the raw cache.
//
// The Python package is the single source of truth; this module only loads it and forwards calls.
//
// The chat engine (engine.mjs), shaped as WebLLM's; its objects are OpenAI's and the engine's (snake_case keys):
//
//   import { createEngine } from "/kvckpt.mjs";
//   const engine = await createEngine({model: "/model.gguf", store: "indexeddb", onProgress: (p) => show(p.stage)});
//   const chunks = await engine.chat.completions.create({messages, stream: true, temperature: 0, max_tokens: 64});
//   for await (const chunk of chunks) text += chunk.choices[0].delta.content ?? "";   // the last has `usage`
//   for (const {name} of await engine.unfinished()) await engine.resume(name);   // replies a crash cut
//   await engine.close();
//
// The raw cache, in this realm (results are plain objects with camelCase keys, as the arguments):
//
//   import { boot } from "/kvckpt.mjs";
//   const kv = await boot();                       // Pyodide + micropip + kvckpt_web from this origin
//   const layout = {page_size: 16, num_layers: 2, num_qo_heads: 8, num_kv_heads: 2, qk_head_dim: 64,
//                   dtype: "float16"};            // kvckpt_web.KVLayout's fields
//   const cache = await kv.createCache(layout, {max_total_seq_len: 1024});   // CacheLimits' fields
//   const n = 20;                                  // new tokens; K and V of each layer: raw little-endian
//   const bytes = n * layout.num_kv_heads * layout.qk_head_dim * 2;   // float16 (n, num_kv_heads, head_dim)
//   const layers = Array.from({length: layout.num_layers}, () => [new Uint8Array(bytes), new Uint8Array(bytes)]);
//   cache.addSequence(0);
//   cache.append([0], [n], layers);                // layers[i] = [k, v] of layer i
//   await cache.checkpoint({seqId: 0, store: "indexeddb", storeName: "kv", name: "chat", appState: {turn: 1}});
//   // after a crash, in a fresh page: boot() and createCache(layout, ...) again, then
//   const {appState, seqLength} = await cache.restore({store: "indexeddb", storeName: "kv", name: "chat"});
//   await kv.gc({store: "indexeddb", storeName: "kv"});   // deletes what a failed checkpoint left
//   const r = await kv.runJSON("import json; json.dumps({'ok': 1})");   // or any Python
//   cache.close();                                 // frees its GPU memory now: close each cache when done
//
// Errors: every method of KVCkpt and KVCache throws (or rejects with) a plain Error, never Pyodide's PythonError.
// Its `message` is kvckpt_web's one-line message and its `name` the kvckpt_web exception class (kvckpt_web/errors.py:
// "FieldError", "TensorError", "NotFoundError", "StoreError", "CheckpointStateError", ...); an error about one
// value (a caller's: FieldError, TensorError; stored data's: FormatError, MetadataError) also has `field`,
// `expected` and `got`, an UnusableCheckpointError `reason` ("model", "layout", "corrupt", "length"). Any other
// Python exception arrives as name "PythonError", message the traceback's last line ("TypeError: ..."). `cause` is
// Pyodide's PythonError (with the traceback). A bad call leaves the cache and the store as they were.
//
//   try { cache.append([0], [n + 1], layers); }
//   catch (e) { if (e.name === "TensorError") console.log(e.field, e.expected, e.got); }   // "layers[0].k.nbytes"
//
// Other code that calls Python in a Pyodide where kvckpt_web is installed (a page's worker running its own module)
// gets the same errors with `toError` on what it catches, or with `guard` around a Python object:
//
//   import { guard, toError } from "/kvckpt.mjs";
//   try { await pyodide.runPythonAsync(source); } catch (e) { throw toError(pyodide, e); }
//   const mine = guard(pyodide, pyodide.pyimport("my_module"));   // mine.f(...) throws or rejects as above
//
// Served by `kvckpt serve` (routes /pyodide/, /wheels/ and /wheels/index.json).

import { errorOf } from "./errors.mjs";

export { createEngine, Engine, savedConversations } from "./engine.mjs";

const here = new URL(".", import.meta.url);

// `progress({stage, done, total})` hears of each stage as it begins: "python" (Pyodide), then "packages" (micropip
// and the wheels); `log` of Pyodide's messages.
export async function boot({ base = here.href, packages = [], log = () => {}, progress = () => {} } = {}) {
  const t0 = performance.now();
  progress({ stage: "python", done: 0, total: 1 });
  const { loadPyodide } = await import(new URL("pyodide/pyodide.mjs", base).href);
  const pyodide = await loadPyodide({ indexURL: new URL("pyodide/", base).href });
  progress({ stage: "packages", done: 0, total: 1 });
  const index = await (await fetch(new URL("wheels/index.json", base))).json();
  const url = (name) => {
    const norm = (s) => s.toLowerCase().replace(/[-.]+/g, "_");
    const wheel = index.wheels.find((w) => norm(w.split("-")[0]) === norm(name));
    if (!wheel) throw new Error(`wheel ${name}: expected in /wheels/, got none`);
    return new URL("wheels/" + wheel, base).href;
  };
  const errors = [];
  await pyodide.loadPackage([url("packaging"), url("micropip")], {
    messageCallback: log, errorCallback: (m) => errors.push(m),
  });
  if (errors.length) throw new Error("loadPackage failed: " + errors.join("; "));
  const micropip = pyodide.pyimport("micropip");
  const wanted = ["kvckpt_web", ...packages].map(url);
  await micropip.install(wanted, { deps: false });
  micropip.destroy();
  log(`kvckpt_web ready in ${(performance.now() - t0).toFixed(0)} ms`);
  return new KVCkpt(pyodide);
}

// The Error to throw for `e`, an exception caught from a call into Python: a PythonError becomes a plain Error as
// described above (read from the Python exception through kvckpt_web.web.js_api.describe_error); any other Error
// is returned as it is, any other value wrapped in an Error.
export function toError(pyodide, e) {
  if (!(e instanceof pyodide.ffi.PythonError)) return e instanceof Error ? e : new Error(String(e));
  const api = pyodide.pyimport("kvckpt_web.web.js_api");
  let info;
  try { info = JSON.parse(api.describe_error(e.message)); } finally { api.destroy(); }
  const error = errorOf(info, { cause: e });
  error.stack = `${info.name}: ${info.message}\n${e.message}`;   // the Python traceback, for whoever debugs
  return error;
}

// `target` (a Python object: a module, a class instance) whose callable attributes throw, or return promises that
// reject, with toError's Errors; other attributes as they are.
export function guard(pyodide, target) {
  const settle = (out) => out && typeof out.then === "function"
    ? Promise.resolve(out).catch((e) => { throw toError(pyodide, e); })
    : out;
  return new Proxy({}, {
    get(_, name) {
      const value = target[name];
      if (typeof value !== "function") return value;
      return (...args) => {
        try { return settle(value(...args)); } catch (e) { throw toError(pyodide, e); }
      };
    },
  });
}

export class KVCkpt {
  constructor(pyodide) {
    this.pyodide = pyodide;
    this.api = guard(pyodide, pyodide.pyimport("kvckpt_web.web.js_api"));
  }

  // A paged KV cache on this page's WebGPU device. `layout` and `limits` take the field names of
  // kvckpt_web.KVLayout and kvckpt_web.CacheLimits.
  async createCache(layout, limits = {}, transfer = "auto") {
    return new KVCache(this.api, await this.api.create_cache(layout, limits, transfer));
  }

  // Keep the newest `keep` generations of each name in an IndexedDB or OPFS store (0 keeps all; left out, the
  // default of kvckpt_web.durable.retention.gc), then delete every chunk none of them uses, such as those a failed
  // checkpoint left. Returns {keptManifests, deletedManifests, deletedChunks, freedBytes, damagedManifests,
  // keptReasons, deletedRecords}.
  async gc({ store = "indexeddb", storeName = "kvckpt", keep } = {}) {
    const args = keep === undefined ? [store, storeName] : [store, storeName, keep];
    return JSON.parse(await this.api.gc(...args));
  }

  // {liveResources, liveBytes}: the GPU buffers and textures kvckpt_web holds on this page's device (closed
  // caches hold none).
  async deviceMemory() { return JSON.parse(await this.api.device_memory()); }

  // Run Python source (top-level await allowed); its last expression must be a JSON string.
  async runJSON(source) {
    let out;
    try { out = await this.pyodide.runPythonAsync(source); } catch (e) { throw toError(this.pyodide, e); }
    return typeof out === "string" ? JSON.parse(out) : out;
  }
}

// One cache, driven through kvckpt_web.web.js_api (the Python API does the work).
export class KVCache {
  constructor(api, handle) {
    this.api = api;
    this.handle = handle;
  }

  addSequence(seqId) { this.api.add_sequence(this.handle, seqId); }
  removeSequence(seqId) { this.api.remove_sequence(this.handle, seqId); }
  sequenceLength(seqId) { return this.api.sequence_length(this.handle, seqId); }

  // Release the cache's GPU memory now (its buffers are destroyed, not left to garbage collection): close every
  // cache you are done with, such as one a restore filled for a look. Later calls reject with a
  // CheckpointStateError; closing again does nothing.
  close() { this.api.close_cache(this.handle); }

  // One forward pass: lengths[i] new tokens for seqIds[i]; layers[l] = [k, v], the raw K and V bytes of
  // layer l for all new tokens, (tokens, num_kv_heads, head_dim) each, tokens in batch order.
  append(seqIds, lengths, layers) { this.api.append(this.handle, seqIds, lengths, layers); }

  // {k, v}: Uint8Arrays (num_layers, end - start, num_kv_heads, head_dim) of tokens [start, end).
  async readKV(seqId, start, end) {
    const pair = await this.api.read_kv(this.handle, seqId, start, end);
    return { k: pair[0], v: pair[1] };
  }

  // Save sequence seqId as the next generation of `name` in an IndexedDB or OPFS store; returns
  // {name, generation, seqLength, chunksWritten, bytesWritten}. Over the storage quota it rejects with a
  // StoreError ("storage quota exceeded"); the last committed generation stays, kv.gc() frees the rest.
  async checkpoint({ seqId = 0, store = "indexeddb", storeName = "kvckpt", name, appState = {} }) {
    return JSON.parse(await this.api.checkpoint(this.handle, seqId, store, storeName, name, appState));
  }

  // Load the newest generation of `name`; returns {name, generation, seqId, seqLength, appState}.
  async restore({ store = "indexeddb", storeName = "kvckpt", name, seqId = null }) {
    return JSON.parse(await this.api.restore(this.handle, store, storeName, name, seqId ?? undefined));
  }
}
