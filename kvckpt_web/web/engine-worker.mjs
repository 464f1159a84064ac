// The module Web Worker behind createEngine (engine.mjs): Pyodide, the model and kvckpt_web's chat engine
// (kvckpt_web/web/chat_api.py) on this worker's WebGPU device, so the page never waits on them.
//
// The page sends {id, op, args}; the worker answers {id, ok: true, result} or {id, ok: false, error} (error: {name,
// message, field?, expected?, got?, reason?}), posts {progress} while it starts, {event} for what happens meanwhile
// (commits, failed autosaves, a test hold), and for a streamed reply {stream: id, chunk}, then {stream: id, end: true}
// or {stream: id, error}, after the answer to the call that opened it. Terminating this worker is a crash: nothing
// runs on the way out, and the store keeps the last committed checkpoints.
import { boot, guard } from "./kvckpt.mjs";
import { loadWeights } from "./weights.mjs";

let kv = null;
let api = null;   // the guarded chat_api.BrowserEngine
const live = new Set();        // streams being read
const cancelling = new Map();  // stream -> resolve() once it stopped
let holdAt = null;             // the test hook: hold a reply once it holds this many tokens
let unhold = null;

const post = (message) => self.postMessage(message);
const progress = (fields) => post({ progress: fields });
const event = (fields) => post({ event: fields });

function describe(e) {
  const fields = { name: e?.name ?? "Error", message: String(e?.message ?? e) };
  for (const key of ["field", "expected", "got", "reason"]) if (e && key in e) fields[key] = e[key];
  return fields;
}

function failure(name, message, fields = {}) {
  return Object.assign(new Error(message), { name, ...fields });
}

async function webgpu() {
  const adapter = "gpu" in navigator ? await navigator.gpu.requestAdapter() : null;
  if (adapter === null) {
    throw failure("DeviceError", "navigator.gpu: expected a WebGPU adapter, got none (this browser has WebGPU off or " +
      "unsupported; Chromium headless needs --enable-unsafe-webgpu)",
      { field: "navigator.gpu", expected: "a WebGPU adapter", got: "none" });
  }
}

// Read stream `id` (a chat_api stream handle) to its end, posting each chunk; hold where the test hook says (with 0
// tokens, before the first chunk is asked for: before the prompt's prefill).
async function pump(id, handle) {
  let tokens = 0, conversation = null;
  live.add(id);
  try {
    for (;;) {
      if (holdAt !== null && tokens >= holdAt) {
        holdAt = null;
        event({ type: "held", conversation, tokens });
        await new Promise((resolve) => { unhold = resolve; });
      }
      if (cancelling.has(id)) { await api.cancel(handle); break; }
      const text = await api.next_chunk(handle);
      if (!text) break;
      const chunk = JSON.parse(text);
      post({ stream: id, chunk });
      tokens += chunk.kvckpt.token_ids.length;
      conversation = chunk.kvckpt.conversation;
    }
    post({ stream: id, end: true });
  } catch (e) {
    post({ stream: id, error: describe(e) });
  } finally {
    live.delete(id);
    cancelling.get(id)?.();
    cancelling.delete(id);
  }
}

const ops = {
  // Pyodide and kvckpt_web, then (given a model URL) WebGPU, the weights (kept in the browser), the engine.
  async init(o) {
    const took = {};
    let t = performance.now();
    const lap = (stage) => { const now = performance.now(); took[stage] = now - t; t = now; };
    kv = await boot({ base: o.base, progress, log: (m) => event({ type: "log", message: String(m) }) });
    lap("boot");
    const module = kv.pyodide.pyimport("kvckpt_web.web.chat_api");
    if (o.model === null) {
      api = guard(kv.pyodide, module);
      return { took };
    }
    await webgpu();
    api = guard(kv.pyodide, module.BrowserEngine((text) => {
      const e = JSON.parse(text);
      if (e.type === "upload") progress({ stage: "upload", done: e.done, total: e.total });
      else event(e);
    }));
    progress({ stage: "weights", done: 0, total: 0 });
    const weights = await loadWeights(o.model, { progress: (p) => progress({ stage: "weights", ...p }) });
    lap("weights");
    progress({ stage: "upload", done: 0, total: 1 });
    const model = JSON.parse(await api.load_model(weights.bytes));
    lap("upload");
    progress({ stage: "engine", done: 0, total: 1 });
    const opened = JSON.parse(await api.open(JSON.stringify(o.engine)));
    lap("engine");
    progress({ stage: "kernels", done: 0, total: 1 });
    await api.warm_up();
    lap("kernels");
    const { bytes, ...kept } = weights;
    return { model: { ...model, url: o.model, bytes: bytes.length }, weights: kept, ...opened, took };
  },
  async create(id, body, kind) {
    const { stream } = JSON.parse(await api.create(body, kind));
    return { stream, start: () => pump(id, stream) };
  },
  async complete(body, kind) { return JSON.parse(await api.complete(body, kind)); },
  async resume(id, name, generation, stream) {
    const started = JSON.parse(await api.resume(name, generation ?? undefined, stream));
    return stream ? { restored: started.restored, start: () => pump(id, started.stream) } : started;
  },
  // Stop reading stream `id` (its reply stops as an interrupt stops it); resolves once it stopped.
  cancel(id) {
    if (!live.has(id)) return null;
    const stopped = new Promise((resolve) => cancelling.set(id, () => resolve(null)));
    ops.unhold();
    return stopped;
  },
  interrupt() { api.interrupt(); return null; },
  async conversations() { return JSON.parse(await api.conversations()); },
  async unfinished() { return JSON.parse(await api.unfinished()); },
  async conversation(name) { return JSON.parse(await api.conversation(name)); },
  async inspect(name) { return JSON.parse(await api.inspect(name)); },
  async delete(name) { await api.delete(name); return null; },
  async release(name) { await api.release(name); return null; },
  async push(name, url, token) { return JSON.parse(await api.push(name, url, token)); },
  async pull(name, url, token) { return JSON.parse(await api.pull(name, url, token)); },
  async measureReprefill(name, tokens) { return JSON.parse(await api.measure_reprefill(name, tokens ?? undefined)); },
  async saved(store, storeName) { return JSON.parse(await api.saved_conversations(store, storeName)); },
  hold(tokens) { holdAt = tokens; return null; },
  unhold() { holdAt = null; unhold?.(); unhold = null; return null; },
  async close() { await api?.close?.(); return null; },
};

self.onmessage = async ({ data }) => {
  const { id, op, args = [] } = data;
  try {
    if (!(op in ops)) throw failure("FieldError", `op: expected one of ${Object.keys(ops)}, got ${op}`);
    const withId = op === "create" || op === "resume";
    const result = await ops[op](...(withId ? [id, ...args] : args));
    const start = result?.start;
    if (start) delete result.start;
    post({ id, ok: true, result });
    start?.();
  } catch (e) {
    post({ id, ok: false, error: describe(e) });
  }
};
