// The chat engine in JavaScript, shaped as WebLLM's: createEngine() starts kvckpt_web's engine in a module Web Worker
// (engine-worker.mjs: Pyodide, the model on WebGPU, an IndexedDB or OPFS store), so the page never blocks, and
// answers OpenAI-shaped chat completions whose conversations survive a crash. Exported by kvckpt.mjs; see there.

import { errorOf, fieldError } from "./errors.mjs";

const here = new URL(".", import.meta.url);

const typeOf = (value) => (value === null ? "null" : Array.isArray(value) ? "array" : typeof value);

// The chunks of one streamed reply, as they come: `for await (const chunk of stream)`. Leaving the loop early stops
// the reply as interrupt() does (it is saved and stays resumable).
class ChunkStream {
  constructor(cancel) {
    this.queue = [];
    this.waiting = null;
    this.ended = false;
    this.cancel = cancel;
    this.restored = null;   // for engine.resume(): how the reply's K/V came back ({kv_restored, ...}), null if kept
  }

  push(item) {
    if (!this.waiting) { this.queue.push(item); return; }
    const { resolve } = this.waiting;
    this.waiting = null;
    resolve(item);
  }

  next() {
    if (this.queue.length) return Promise.resolve(this.#settle(this.queue.shift()));
    if (this.ended) return Promise.resolve({ done: true, value: undefined });
    return new Promise((resolve) => { this.waiting = { resolve }; }).then((item) => this.#settle(item));
  }

  #settle(item) {
    if (item.chunk) return { done: false, value: item.chunk };
    this.ended = true;
    if (item.error) throw errorOf(item.error);
    return { done: true, value: undefined };
  }

  async return() {
    if (!this.ended) { this.ended = true; await this.cancel(); }
    return { done: true, value: undefined };
  }

  [Symbol.asyncIterator]() { return this; }
}

class Worker_ {
  constructor(base, { onProgress, onEvent }) {
    this.worker = new Worker(new URL("engine-worker.mjs", base), { type: "module" });
    this.pending = new Map();
    this.streams = new Map();
    this.next = 1;
    this.dead = null;
    this.worker.onmessage = ({ data }) => {
      if (data.progress) return onProgress(data.progress);
      if (data.event) return onEvent(data.event);
      if (data.stream !== undefined) {
        const stream = this.streams.get(data.stream);
        if (data.end || data.error) this.streams.delete(data.stream);
        return stream?.push(data);
      }
      const call = this.pending.get(data.id);
      this.pending.delete(data.id);
      if (data.ok) call.resolve(data.result);
      else { this.streams.delete(data.id); call.reject(errorOf(data.error)); }
    };
    this.worker.onerror = (e) => this.fail({ name: "WorkerError",
                                             message: `the engine's worker failed: ${e.message}` });
  }

  call(op, ...args) {
    if (this.dead) return Promise.reject(errorOf(this.dead));
    const id = this.next++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      this.worker.postMessage({ id, op, args });
    });
  }

  // A call whose reply streams: the stream, registered before the call is sent so no chunk is missed.
  stream(op, ...args) {
    const id = this.next;
    const stream = new ChunkStream(() => (this.dead ? null : this.call("cancel", id).catch(() => null)));
    this.streams.set(id, stream);
    return { stream, started: this.call(op, ...args) };
  }

  fail(error) {
    this.dead = error;
    for (const call of this.pending.values()) call.reject(errorOf(error));
    for (const stream of this.streams.values()) stream.push({ error });
    this.pending.clear();
    this.streams.clear();
  }

  terminate(error) {
    this.worker.terminate();
    this.fail(error);
  }
}

export class Engine {
  constructor(worker, info, base = here.href) {
    this.worker = worker;
    this.base = base;
    // {model: {url, identity, name (the file's general.name, or null), num_layers, vocab_size, max_context, bytes,
    //  chat_template ("ChatML", "Qwen3", "Gemma", "Llama 3", or null: a base model, which answers completions only),
    //  load_ms}, weights: {source, kept, note}, context, store, config: the engine's settings (snake_case,
    //  kvckpt_web/engine/config.py), took: {boot, weights, upload, engine, kernels} (ms)}
    this.info = info;
    this.chat = { completions: { create: (body) => this.#create(body, "chat") } };
    // OpenAI's legacy completions: {prompt, max_tokens, ...} continued as raw text (a base model's only way), answered
    // as text_completion objects (choices[0].text); saved, resumed and listed as a chat's replies are.
    this.completions = { create: (body) => this.#create(body, "completion") };
  }

  async #create(body, kind) {
    if (typeOf(body) !== "object") {
      throw fieldError("body", `an object of ${kind === "chat" ? "chat-completions" : "completions"} parameters`,
                       typeOf(body));
    }
    const text = JSON.stringify(body);
    if (!body.stream) return this.worker.call("complete", text, kind);
    const { stream, started } = this.worker.stream("create", text, kind);
    await started;
    return stream;
  }

  // Stop the reply being generated in conversation `name` (without it, every reply) after its current token; it ends
  // with finish_reason "abort" and stays resumable.
  interrupt(name) { return this.worker.call("interrupt", name); }

  // Conversations whose last reply was cut by a crash or stopped (ConversationInfo objects, newest first).
  unfinished() { return this.worker.call("unfinished"); }

  // Continue conversation `name`'s unfinished reply with the tokens an uninterrupted run gives (its first chunk holds
  // what was written before): a completion, or with {stream: true} a stream whose `restored` says how the K/V came
  // back. {generation} continues from that stored generation instead of the newest.
  async resume(name, { stream = false, generation = null } = {}) {
    if (typeof name !== "string") throw fieldError("name", "a conversation name (string)", typeOf(name));
    if (!stream) {
      const { completion, restored } = await this.worker.call("resume", name, generation, false);
      return Object.assign(completion, { restored });
    }
    const { stream: chunks, started } = this.worker.stream("resume", name, generation, true);
    chunks.restored = (await started).restored;
    return chunks;
  }

  // Every conversation of the store, newest first: {name, title, messages, tokens, updated_ms, finished,
  // finish_reason, same_model, settings, error, prompt (a completion's raw prompt, else null)}.
  conversations() { return this.worker.call("conversations"); }
  conversation(name) { return this.worker.call("conversation", name); }
  // Every stored generation of `name`: {name, store, generations: [{generation, error, kv_tokens, bytes, created_ms}]}.
  inspect(name) { return this.worker.call("inspect", name); }
  delete(name) { return this.worker.call("delete", name); }
  // Let go of conversation `name` (its claim, its slot), so another tab's engine may continue it.
  release(name) { return this.worker.call("release", name); }
  // Continue on another device, through the store `kvckpt serve --store DIR --token T` serves at `url` (default: the
  // server of kvckpt.mjs, beside this page). push(name, {token}) copies conversation `name`'s newest committed
  // checkpoint there, pull(name, {token}) copies the server's newest into this engine's store (letting go of this
  // engine's slot of it, whose K/V stay stored): the next turn then restores its K/V instead of computing them. Only
  // the chunks the other side lacks move: {name, generation, apart_from, copied, chunks_sent, chunks_present,
  // records_sent, bytes_sent, ms}. Nothing is overwritten: a copy that went apart from the other side's (each device
  // went on its own way) is kept there beside it as `name`, `<apart_from>.apart-<id>`. Errors: StoreError (the token
  // refused: nothing written; no server), NotFoundError (no such conversation on the sending side), ConflictError
  // (the other side's copy goes on from this one: another device continued it; or a reply is being generated in
  // it), FieldError (no token, a bad URL).
  push(name, { url = null, token = null } = {}) { return this.worker.call("push", name, this.#remote(url), token); }
  pull(name, { url = null, token = null } = {}) { return this.worker.call("pull", name, this.#remote(url), token); }
  #remote(url) { return url === null ? this.base : new URL(url, globalThis.location?.href ?? this.base).href; }

  // {tokens, ms}: a prefill of the first `tokens` (default: all) of the tokens whose K/V conversation `name`'s newest
  // checkpoint holds, timed now.
  measureReprefill(name, { tokens = null } = {}) { return this.worker.call("measureReprefill", name, tokens); }

  // Stop every reply (each stays resumable), release the GPU memory and end the worker.
  async close() {
    try { await this.worker.call("close"); } finally {
      this.worker.terminate({ name: "CheckpointStateError", message: "engine: closed" });
    }
  }

  // End the worker at once, as a crash would: nothing is saved or released on the way out (the store keeps the last
  // committed checkpoints, the browser releases the worker's locks). Calls in flight reject with name "Terminated".
  terminate() {
    this.worker.terminate({ name: "Terminated", message: "engine: the worker was terminated" });
  }
}

const ENGINE_KEYS = { context: "context", sequences: "sequences", autosaveEvery: "autosave_every",
                      prefillChunk: "prefill_chunk", modelName: "model_name" };

// Start the engine: Pyodide and kvckpt_web in a module Web Worker, the model of `model` (the GGUF file's URL, kept
// in the browser for the next load: weights.mjs) on WebGPU, conversations in the IndexedDB or OPFS store
// `storeName`. `onProgress({stage, done, total, source?})` hears of each stage: "python", "packages", "weights"
// (source "cache" or "network", bytes), "upload" (parts of the weights), "engine", "kernels" (every one a reply
// uses, built by a warm-up, so the first reply does not wait for them); `onEvent(e)` of what happens while
// replies run: {type: "saved", conversation, generation, tokens, bytes, ms, store}, {type: "save_failed",
// conversation, error, store}. `base`: the folder of kvckpt.mjs, pyodide/ and wheels/ (default: this module's).
// `context`, `sequences`, `autosaveEvery`, `prefillChunk`, given, replace those of the engine's "browser" preset.
export async function createEngine({ model, store = "indexeddb", storeName = "kvckpt", onProgress = () => {},
                                     onEvent = () => {}, base = here.href, ...settings } = {}) {
  if (typeof model !== "string" || !model) throw fieldError("model", "the URL of a GGUF model file", typeOf(model));
  if (!["indexeddb", "opfs"].includes(store)) throw fieldError("store", "'indexeddb' or 'opfs'", store);
  const engineOptions = { store, store_name: storeName };
  for (const [key, value] of Object.entries(settings)) {
    if (!(key in ENGINE_KEYS)) throw fieldError(key, `one of model, store, storeName, onProgress, onEvent, base, ` +
                                                `${Object.keys(ENGINE_KEYS).join(", ")}`, "an unknown option");
    engineOptions[ENGINE_KEYS[key]] = value;
  }
  const worker = new Worker_(base, { onProgress, onEvent });
  try {
    const info = await worker.call("init", { base, model: new URL(model, globalThis.location?.href ?? base).href,
                                             engine: engineOptions });
    return new Engine(worker, info, base);
  } catch (error) {
    worker.terminate(error);
    throw error;
  }
}

// The conversations saved in a store, read without a model or WebGPU (their messages but not the last reply, which
// only its model can decode), newest first: what a page shows when createEngine cannot run.
export async function savedConversations({ store = "indexeddb", storeName = "kvckpt", base = here.href } = {}) {
  const worker = new Worker_(base, { onProgress: () => {}, onEvent: () => {} });
  try {
    await worker.call("init", { base, model: null });
    return await worker.call("saved", store, storeName);
  } finally {
    worker.terminate({ name: "CheckpointStateError", message: "closed" });
  }
}
