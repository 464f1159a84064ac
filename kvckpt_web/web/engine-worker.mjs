// The module Web Worker behind createEngine (engine.mjs): Pyodide, the model and kvckpt_web's chat engine
// (kvckpt_web/web/chat_api.py) on this worker's WebGPU device, so the page never waits on them.
//
// The page sends {id, op, args}; the worker answers {id, ok: true, result} or {id, ok: false, error} (error: the
// fields of errors.mjs), posts {progress} while it starts, {event} for what happens meanwhile (commits, failed
// autosaves), and for a streamed reply {stream: id, chunk}, then {stream: id, end: true} or {stream: id, error}, after
// the answer to the call that opened it. Terminating this worker is a crash: nothing runs on the way out, and the
// store keeps the last committed checkpoints.
//
// A worker module of a page's own may import this one, which runs the engine there, and set
// `engineWorker.beforeChunk` (see EngineWorker) to pace, pause or watch the replies.
import { errorFields, errorOf, fieldError } from "./errors.mjs";
import { boot, guard } from "./kvckpt.mjs";
import { loadWeights } from "./weights.mjs";

// The calls the page may make, by op; create and resume get the call's id first (their stream's).
const OPS = ["init", "create", "complete", "resume", "cancel", "interrupt", "conversations", "unfinished",
             "conversation", "inspect", "delete", "release", "push", "pull", "measureReprefill", "saved", "close"];
const STREAMING = ["create", "resume"];

async function webgpu() {
  const adapter = "gpu" in navigator ? await navigator.gpu.requestAdapter() : null;
  if (adapter === null) {
    throw errorOf({ name: "DeviceError", message: "navigator.gpu: expected a WebGPU adapter, got none (this browser " +
      "has WebGPU off or unsupported; Chromium headless needs --enable-unsafe-webgpu)",
      field: "navigator.gpu", expected: "a WebGPU adapter", got: "none" });
  }
}

// One stream being read: cancel() asks it to stop and resolves once it stopped.
class Reading {
  #ask;
  #end;

  constructor() {
    this.cancelled = false;
    this.asked = new Promise((resolve) => { this.#ask = resolve; });
    this.ended = new Promise((resolve) => { this.#end = resolve; });
  }

  cancel() {
    this.cancelled = true;
    this.#ask();
    return this.ended;
  }

  end() { this.#end(null); }
}

// The engine's side of the worker of `scope` (the worker's global): it answers the page's messages.
export class EngineWorker {
  constructor(scope) {
    this.scope = scope;
    this.kv = null;
    this.api = null;              // the guarded chat_api.BrowserEngine
    this.reading = new Map();     // stream id -> its Reading
    // Awaited, when set, before each chunk of a streamed reply is asked for, with {stream, conversation, tokens}: the
    // stream's id and what the reply holds so far (conversation null and tokens 0 before its first chunk, whose
    // prefill has not run yet). A stream cancelled meanwhile stops without waiting for it.
    this.beforeChunk = null;
    scope.onmessage = ({ data }) => this.receive(data);
  }

  post(message) { this.scope.postMessage(message); }
  progress(fields) { this.post({ progress: fields }); }
  event(fields) { this.post({ event: fields }); }

  async receive({ id, op, args = [] }) {
    try {
      if (!OPS.includes(op)) throw fieldError("op", `one of ${OPS}`, op);
      const result = await this[op](...(STREAMING.includes(op) ? [id, ...args] : args));
      const start = result?.start;
      if (start) delete result.start;
      this.post({ id, ok: true, result });
      start?.();
    } catch (e) {
      this.post({ id, ok: false, error: errorFields(e) });
    }
  }

  // Read stream `id` (a chat_api stream handle) to its end, posting each chunk.
  async pump(id, handle) {
    const reading = new Reading();
    let tokens = 0, conversation = null;
    this.reading.set(id, reading);
    try {
      for (;;) {
        const paced = this.beforeChunk?.({ stream: id, conversation, tokens });
        if (paced) await Promise.race([paced, reading.asked]);
        if (reading.cancelled) { await this.api.cancel(handle); break; }
        const text = await this.api.next_chunk(handle);
        if (!text) break;
        const chunk = JSON.parse(text);
        this.post({ stream: id, chunk });
        tokens += chunk.kvckpt.token_ids.length;
        conversation = chunk.kvckpt.conversation;
      }
      this.post({ stream: id, end: true });
    } catch (e) {
      this.post({ stream: id, error: errorFields(e) });
    } finally {
      this.reading.delete(id);
      reading.end();
    }
  }

  // ----- the ops ------------------------------------------------------------------------------------------------

  // Pyodide and kvckpt_web, then (given a model URL) WebGPU, the weights (kept in the browser), the engine.
  async init(o) {
    const took = {};
    let t = performance.now();
    const lap = (stage) => { const now = performance.now(); took[stage] = now - t; t = now; };
    const progress = (fields) => this.progress(fields);
    this.kv = await boot({ base: o.base, progress, log: (m) => this.event({ type: "log", message: String(m) }) });
    lap("boot");
    const module = this.kv.pyodide.pyimport("kvckpt_web.web.chat_api");
    if (o.model === null) {
      this.api = guard(this.kv.pyodide, module);
      return { took };
    }
    await webgpu();
    const api = (this.api = guard(this.kv.pyodide, module.BrowserEngine((text) => {
      const e = JSON.parse(text);
      if (e.type === "upload") progress({ stage: "upload", done: e.done, total: e.total });
      else this.event(e);
    })));
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
  }

  async create(id, body, kind) {
    const { stream } = JSON.parse(await this.api.create(body, kind));
    return { stream, start: () => this.pump(id, stream) };
  }

  async complete(body, kind) { return JSON.parse(await this.api.complete(body, kind)); }

  async resume(id, name, generation, stream) {
    const started = JSON.parse(await this.api.resume(name, generation ?? undefined, stream));
    return stream ? { restored: started.restored, start: () => this.pump(id, started.stream) } : started;
  }

  // Stop reading stream `id` (its reply stops as an interrupt stops it); resolves once it stopped.
  cancel(id) { return this.reading.get(id)?.cancel() ?? null; }

  interrupt(name) { this.api.interrupt(name ?? undefined); return null; }
  async conversations() { return JSON.parse(await this.api.conversations()); }
  async unfinished() { return JSON.parse(await this.api.unfinished()); }
  async conversation(name) { return JSON.parse(await this.api.conversation(name)); }
  async inspect(name) { return JSON.parse(await this.api.inspect(name)); }
  async delete(name) { await this.api.delete(name); return null; }
  async release(name) { await this.api.release(name); return null; }
  async push(name, url, token) { return JSON.parse(await this.api.push(name, url, token)); }
  async pull(name, url, token) { return JSON.parse(await this.api.pull(name, url, token)); }

  async measureReprefill(name, tokens) {
    return JSON.parse(await this.api.measure_reprefill(name, tokens ?? undefined));
  }

  async saved(store, storeName) { return JSON.parse(await this.api.saved_conversations(store, storeName)); }
  async close() { await this.api?.close?.(); return null; }
}

export const engineWorker = new EngineWorker(self);
