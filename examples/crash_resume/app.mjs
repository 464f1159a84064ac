// The crash-resume page: drives the model worker (worker.mjs) and shows what it does.
//
// On load it boots the worker, loads the model, and continues the newest unfinished conversation of the
// selected store from its last checkpoint. `window.demo` mirrors what the page shows, for tests.
const STORE_NAME = "kvckpt-demo";
const $ = (id) => document.getElementById(id);
const state = (window.demo = {
  phase: "starting", model: null, name: null, prompt: "", reply: "", tokens: 0, committed: null,
  restored: null, problem: null, finishReason: null, generated: null, conversations: [], errors: [],
});

// ----- the worker ------------------------------------------------------------------------------

class Runner {
  constructor(onEvent) {
    this.worker = new Worker(new URL("worker.mjs", import.meta.url), { type: "module" });
    this.pending = new Map();
    this.next = 1;
    this.worker.onmessage = ({ data }) => {
      if (data.event) return onEvent(data.event);
      const call = this.pending.get(data.id);
      this.pending.delete(data.id);
      if (data.ok) call.resolve(data.result);
      else call.reject(Object.assign(new Error(data.error.message), data.error));
    };
    this.worker.onerror = (e) => this.failAll(new Error(`worker: ${e.message}`));
  }

  call(op, ...args) {
    const id = this.next++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      this.worker.postMessage({ id, op, args });
    });
  }

  // The crash: the worker stops where it is; nothing it would have done next happens.
  terminate() {
    this.worker.terminate();
    this.failAll(Object.assign(new Error("the worker was terminated"), { name: "Crashed" }));
  }

  failAll(error) {
    for (const call of this.pending.values()) call.reject(error);
    this.pending.clear();
  }
}

let runner = null;

// ----- showing state ---------------------------------------------------------------------------

const kib = (n) => (n >= 1 << 20 ? `${(n / (1 << 20)).toFixed(1)} MiB` : `${(n / 1024).toFixed(0)} KiB`);
const ms = (x) => (x >= 10000 ? `${(x / 1000).toFixed(1)} s` : `${x.toFixed(0)} ms`);

function setPhase(phase, text = phase) {
  state.phase = phase;
  $("phase").textContent = text;
  const busy = ["generating", "restoring", "booting", "loading"].includes(phase);
  $("generate").disabled = busy || !state.model;
  $("pause").disabled = phase !== "generating";
  $("crash").disabled = !runner || phase === "crashed" || !state.model;
}

function setLoad(fraction, text) {
  $("load-bar").value = fraction;
  $("load-text").textContent = text;
}

function showReply(prompt, text) {
  state.prompt = prompt;
  state.reply = text;
  $("reply-prompt").textContent = prompt;
  $("reply-text").textContent = text;
}

// A failure a person can hit: what happened, and what they can do (each action keeps saved checkpoints).
function showProblem(kind, title, error, actions = {}) {
  state.problem = { kind, title, message: error.message, field: error.field, expected: error.expected,
                    got: error.got, name: error.name };
  $("problem").hidden = false;
  $("problem-title").textContent = title;
  $("problem-text").textContent = error.message;
  for (const [id, handler] of [["replay", actions.replay], ["fresh", actions.fresh], ["retry-save", actions.retry]]) {
    $(id).hidden = !handler;
    $(id).onclick = handler ? () => { clearProblem(); handler(); } : null;
  }
  if (actions.replayLabel) $("replay").textContent = actions.replayLabel;
}

function clearProblem() {
  state.problem = null;
  $("problem").hidden = true;
  $("replay").textContent = "Replay the saved tokens";
}

const PROBLEM_TITLES = {
  model: "This checkpoint was written by another model",
  layout: "This checkpoint has another cache layout",
  corrupt: "This checkpoint is damaged or incomplete",
  length: "This checkpoint's K/V do not match its tokens",
};

function onEvent(e) {
  switch (e.type) {
    case "fetch":
      setLoad(0.8 * e.done / e.total, `fetched ${kib(e.done)} of ${kib(e.total)}`);
      break;
    case "upload":
      setLoad(0.8 + 0.2 * e.done / e.total, `uploaded ${e.done} of ${e.total} parts of the weights to the GPU`);
      break;
    case "prefill": case "replay":
      setPhase(state.phase, `${e.type} ${e.done}/${e.total} tokens`);
      break;
    case "token":
      state.tokens = e.index + 1;
      showReply(state.prompt, state.reply + e.text);
      if (e.tokensPerS) $("speed").textContent = `${state.tokens} tokens · ${e.tokensPerS.toFixed(2)} tokens/s`;
      setPhase("generating", "generating");
      break;
    case "saved":
      state.committed = e;
      $("committed").textContent = `last committed: generation ${e.generation} · ${e.tokens} tokens · ` +
        `${kib(e.bytes)} written in ${ms(e.ms)} · ${$("store").selectedOptions[0].text}`;
      refresh();  // the storage panel lists what is committed now
      break;
    case "saveFailed":
      showProblem(e.error.message.includes("quota") ? "quota" : "save", "Saving failed", e.error, {
        retry: () => runner.call("saveNow").catch((err) => showProblem("save", "Saving failed", err,
                                                                     { retry: null })),
      });
      break;
    case "restored":
      state.restored = e;
      showReply(e.prompt, e.text);
      showRestored(e);
      break;
    default:
      break;
  }
}

// ----- the flow ----------------------------------------------------------------------------------

const store = () => $("store").value;

function rememberedPrefill(identity) {
  const value = Number(localStorage.getItem(`kvckpt-demo:prefill-ms-per-token:${identity}`));
  return value > 0 ? value : null;
}

function showRestored(r) {
  const measured = r.reprefillMs !== null;
  const perToken = measured ? r.reprefillMs / r.tokens : rememberedPrefill(state.model.identity);
  if (measured) localStorage.setItem(`kvckpt-demo:prefill-ms-per-token:${state.model.identity}`, String(perToken));
  r.reprefillEstimateMs = perToken * r.tokens;
  const versus = ` · a re-prefill of the same ${r.tokens} tokens takes ${ms(r.reprefillEstimateMs)} on this device ` +
    `(${measured ? "measured now" : "measured once"}): ${(r.reprefillEstimateMs / r.restoreMs).toFixed(0)}x`;
  $("restored").hidden = false;
  $("restored").textContent = r.kvRestored
    ? `restored ${r.tokens} tokens in ${ms(r.restoreMs)}` + versus
    : `replayed ${r.tokens} saved tokens in ${ms(r.replayMs)} (the K/V were not usable: ${r.reason})`;
}

async function resume(name, { replay = false, generation = null } = {}) {
  clearProblem();
  state.name = name;
  setPhase("restoring", replay ? "replaying the saved tokens" : "restoring");
  const measure = !replay && !rememberedPrefill(state.model.identity);
  let result;
  try {
    result = await runner.call("resume", { store: store(), storeName: STORE_NAME, name, replay, measure,
                                           generation, every: Number($("every").value) });
  } catch (error) {
    return failed(error, name);
  }
  if (result.problem) {
    setPhase("ready", "waiting for a choice");
    return showProblem(result.problem.reason, PROBLEM_TITLES[result.problem.reason] ?? "Checkpoint not usable",
                       result.problem, { replay: () => resume(name, { replay: true, generation }), fresh });
  }
  return finished(result);
}

function finished(result) {
  state.finishReason = result.finishReason;
  state.generated = result.tokens;
  setPhase(result.finishReason ? "finished" : "paused", result.finishReason ? `finished (${result.finishReason})` : "paused");
  refresh();
}

// A call that failed: the crash control, or a problem to show (saved conversations stay).
async function failed(error, name) {
  if (error.name === "Crashed") return;
  state.errors.push(error);
  setPhase("ready", "stopped");
  if (error.name === "CorruptionError" || error.name === "FormatError") {
    const older = await olderGeneration(name);
    return showProblem("record", "This checkpoint cannot be read", error, older === null ? { fresh } : {
      fresh, replay: () => resume(name, { generation: older.generation }),
      replayLabel: `Resume generation ${older.generation} (${older.tokens} tokens)`,
    });
  }
  showProblem("error", "Something went wrong", error, { fresh });
}

async function olderGeneration(name) {
  try {
    const details = await runner.call("inspect", store(), STORE_NAME, name);
    const good = details.generations.filter((g) => !g.error);
    return good.length ? good[good.length - 1] : null;
  } catch {
    return null;
  }
}

async function fresh() {
  clearProblem();
  state.restored = null;
  state.committed = null;
  $("restored").hidden = true;
  $("committed").textContent = "no checkpoint yet";
  $("speed").textContent = "";
  showReply("", "");
  setPhase("ready", "ready");
}

async function generate() {
  clearProblem();
  await fresh();
  const sample = document.querySelector("input[name=mode]:checked").value === "sample";
  const name = `chat-${Date.now()}`;
  state.name = name;
  state.tokens = 0;
  showReply($("prompt").value, "");
  setPhase("generating", "prefill");
  try {
    finished(await runner.call("start", $("prompt").value, {
      store: store(), storeName: STORE_NAME, name, every: Number($("every").value),
      maxTokens: Number($("max-tokens").value), temperature: sample ? Number($("temperature").value) : 0,
      seed: Number($("seed").value),
    }));
  } catch (error) {
    failed(error, name);
  }
}

async function refresh() {
  if (!runner) return;
  let rows;
  try {
    rows = await runner.call("conversations", store(), STORE_NAME);
  } catch (error) {
    return showProblem("storage", "The store cannot be read", error, { fresh });
  }
  state.conversations = rows;
  const body = $("conversations");
  body.replaceChildren(...rows.map((row) => {
    const tr = document.createElement("tr");
    const when = row.createdMs ? new Date(row.createdMs).toLocaleString() : "?";
    const cells = [row.name, row.error ? "damaged" : row.tokens, kib(row.bytes), when];
    tr.append(...cells.map((text) => Object.assign(document.createElement("td"), { textContent: text })));
    const actions = document.createElement("td");
    const inspect = Object.assign(document.createElement("button"), { textContent: "inspect" });
    inspect.onclick = async () => {
      const details = await runner.call("inspect", store(), STORE_NAME, row.name).catch((e) => ({ error: e.message }));
      $("inspect").hidden = false;
      $("inspect").textContent = JSON.stringify(details, null, 1);
    };
    const del = Object.assign(document.createElement("button"), { textContent: "delete" });
    del.onclick = async () => {
      if (del.textContent !== "confirm") { del.textContent = "confirm"; return; }
      await runner.call("remove", store(), STORE_NAME, row.name).catch((e) => showProblem("storage", "Delete failed", e));
      refresh();
    };
    actions.append(inspect, del);
    tr.append(actions);
    return tr;
  }));
}

// Boot the worker, load the model, continue the newest unfinished conversation: what opening the page does.
async function open() {
  clearProblem();
  runner = new Runner(onEvent);
  state.model = null;
  setPhase("booting", "starting Python");
  setLoad(0, "starting Python in a worker");
  let boot;
  try {
    boot = await runner.call("boot");
  } catch (error) {
    return failed(error);
  }
  await refresh();
  if (!boot.webgpu) {
    setPhase("stopped", "no WebGPU");
    return showProblem("webgpu", "No WebGPU in this browser", boot.error, {});
  }
  setPhase("loading", "loading the model");
  try {
    state.model = await runner.call("loadModel");
  } catch (error) {
    setPhase("stopped", "no model");
    return showProblem(error.name === "ModelMissing" ? "model-missing" : "model", "The model cannot be loaded", error, {});
  }
  $("model-name").textContent = `${state.model.file} · ${state.model.numLayers} layers`;
  setLoad(1, `loaded in ${ms(state.model.fetchMs + state.model.loadMs)}`);
  setPhase("ready", "ready");
  await refresh();
  // A damaged newest record may hide an unfinished conversation: resuming it shows the problem and what is left.
  const open = state.conversations.find((row) => row.error || row.finishReason === null);
  if (open) await resume(open.name);
}

$("generate").onclick = generate;
$("pause").onclick = () => runner.call("pause");
$("crash").onclick = () => {
  runner.terminate();
  runner = null;
  setPhase("crashed", "crashed: the worker was terminated mid-generation");
  showProblem("crashed", "Crashed", { message: "The model's worker was terminated without saving. Reopen to continue " +
    "from the last checkpoint, as a reopened tab would." }, { fresh: open });
  $("fresh").textContent = "Reopen";
};
$("fresh").addEventListener("click", () => { $("fresh").textContent = "Start fresh"; });
$("refresh").onclick = refresh;
$("store").value = localStorage.getItem("kvckpt-demo:store") ?? "indexeddb";
$("store").onchange = () => { localStorage.setItem("kvckpt-demo:store", store()); refresh(); };
open();
