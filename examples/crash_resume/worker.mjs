// The crash-resume page's model worker: Pyodide and kvckpt_web on this worker's WebGPU device.
//
// The page sends {id, op, args}; the worker answers {id, ok: true, result} or {id, ok: false, error}
// where error is {name, message, field?, expected?, got?}, and posts {event} for what happens meanwhile
// (see kvckpt_web/web/chat_api.py). Terminating this worker is the demo's crash: nothing runs on the way out.
import { boot, guard } from "/kvckpt.mjs";

let kv = null;
let api = null;

const post = (message) => self.postMessage(message);
const event = (fields) => post({ event: fields });

class DemoError extends Error {
  constructor(name, message, extra = {}) {
    super(message);
    this.name = name;
    Object.assign(this, extra);
  }
}

// A thrown Error (plain ones from guard()'s Python calls included) as the fields the page shows.
function describe(e) {
  const fields = { name: e?.name ?? "Error", message: String(e?.message ?? e) };
  for (const key of ["field", "expected", "got", "reason"]) if (e && key in e) fields[key] = e[key];
  return fields;
}

async function fetchModel(url) {
  const info = await (await fetch("/model.json")).json();
  if (!info.available) {
    throw new DemoError("ModelMissing", `model: expected the GGUF file ${info.expected} on the server, got none ` +
      `(${info.hint})`, { field: "model", expected: info.expected, got: "none" });
  }
  const response = await fetch(url);
  if (!response.ok) {
    throw new DemoError("ModelMissing", `model: expected ${url} from the server, got HTTP ${response.status}`,
      { field: "model", expected: url, got: `HTTP ${response.status}` });
  }
  const total = Number(response.headers.get("Content-Length")) || info.bytes;
  const bytes = new Uint8Array(total);
  const reader = response.body.getReader();
  let done = 0, last = 0;
  for (;;) {
    const { done: end, value } = await reader.read();
    if (end) break;
    bytes.set(value, done);
    done += value.length;
    if (done - last > (1 << 20) || done === total) {
      last = done;
      event({ type: "fetch", done, total });
    }
  }
  if (done !== total) {
    throw new DemoError("ModelMissing", `model: expected ${total} bytes of ${url}, got ${done}`,
      { field: "model", expected: total, got: done });
  }
  return { bytes, file: info.file };
}

// Options as Python keyword values: keys whose value is null or undefined are left to the defaults.
const py = (options) => kv.pyodide.toPy(Object.fromEntries(
  Object.entries(options ?? {}).filter(([, value]) => value !== null && value !== undefined)));

const ops = {
  // Python and kvckpt_web; without WebGPU too (saved conversations can still be listed), saying so.
  async boot() {
    const started = performance.now();
    const webgpu = "gpu" in navigator && (await navigator.gpu.requestAdapter()) !== null;
    kv = await boot({ log: (m) => event({ type: "log", message: String(m) }) });
    api = guard(kv.pyodide, kv.pyodide.pyimport("kvckpt_web.web.chat_api"));
    api.set_emit((text) => event(JSON.parse(text)));
    const error = webgpu ? null : { name: "NoWebGPU", field: "navigator.gpu", expected: "a WebGPU adapter", got: "none",
      message: "navigator.gpu: expected a WebGPU adapter, got none (this browser has WebGPU off or unsupported; " +
               "Chromium headless needs --enable-unsafe-webgpu). Saved conversations are kept." };
    return { webgpu, error, bootMs: performance.now() - started };
  },
  async loadModel(url = "/model.gguf") {
    const started = performance.now();
    const { bytes, file } = await fetchModel(url);
    const fetchMs = performance.now() - started;
    const info = JSON.parse(await api.load_model(bytes));
    return { ...info, file, bytes: bytes.length, fetchMs };
  },
  async start(prompt, options) { return JSON.parse(await api.start(prompt, py(options))); },
  async resume(options) { return JSON.parse(await api.resume_saved(py(options))); },
  pause() { api.pause(); return null; },
  async saveNow() { return JSON.parse(await api.save_now()); },
  async conversations(store, storeName) { return JSON.parse(await api.conversations(store, storeName)); },
  async inspect(store, storeName, name) { return JSON.parse(await api.conversation(store, storeName, name)); },
  async remove(store, storeName, name) { return JSON.parse(await api.delete(store, storeName, name)); },
  async close() { await api?.close(); return null; },
};

self.onmessage = async ({ data }) => {
  const { id, op, args = [] } = data;
  try {
    if (!(op in ops)) throw new DemoError("FieldError", `op: expected one of ${Object.keys(ops)}, got ${op}`);
    post({ id, ok: true, result: await ops[op](...args) });
  } catch (e) {
    post({ id, ok: false, error: describe(e) });
  }
};
