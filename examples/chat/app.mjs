// The chat page: kvckpt_web's engine (createEngine, in a Web Worker) behind a multi-turn chat whose conversations
// survive a crash. On load it starts the engine and continues the newest reply a crash cut; `window.demo` mirrors what
// the page shows (for tests), `window.demoHooks` holds the test hook that holds a reply after k tokens.
import { createEngine, savedConversations } from "/kvckpt.mjs";
import { kib, liveLine, ms, notePrefill, replyLine, restoredLine, timelineLine } from "./figures.mjs";
import { Tabs } from "./tabs.mjs";
import { $, disable, showConversations, showMessages, showProblem, showProgress, showReplyText } from "./view.mjs";

const STORE_NAME = "kvckpt-demo";
const state = (window.demo = {
  opened: false, phase: "starting", model: null, store: null, conversation: null, messages: [], reply: "", replyIds: [],
  finishReason: null, usage: null, readOnly: false, restored: null, measured: null, committed: null, problem: null,
  conversations: [], held: null, timeline: null, stages: [], errors: [],
});
let engine = null;
let tabs = null;
let streaming = null;   // the reply stream being read
let editing = null;     // the index of the message being edited
let confirming = null;  // the conversation whose delete asks for confirmation
const started = { runs: 0, origin: 0, at: 0, took: null };   // engine starts; when the page (or a restart) began   // when the page (or Reopen) began, when the engine started

const query = new URLSearchParams(location.search);   // ?store=opfs&every=8 overrides what is remembered
const setting = (key, fallback) => query.get(key) ?? localStorage.getItem(`kvckpt-chat:${key}`) ?? fallback;
const stopKey = (name) => `kvckpt-chat:stopped:${$("store").value}:${STORE_NAME}:${name}`;
const announce = (text) => { $("status").textContent = text; };

// ----- what the controls allow ---------------------------------------------------------------------------------

function setPhase(phase, text = phase) {
  state.phase = phase;
  $("phase").textContent = text;
  const ready = engine !== null && phase !== "crashed";
  const busy = phase === "generating" || phase === "restoring";
  const writable = ready && !busy && !state.readOnly;
  const last = state.messages[state.messages.length - 1];
  const unfinished = state.finishReason === "abort" || state.finishReason === null && last?.role === "assistant";
  const controls = [["send", !writable, "prompt"], ["stop", phase !== "generating", "continue"],
                    ["continue", !(writable && state.conversation && unfinished), "stop"],
                    ["regenerate", !(writable && state.conversation && last?.role === "assistant"), "prompt"],
                    ["crash", phase !== "generating", "prompt"]];
  for (const [id, off] of controls) if (!off) disable($(id), false);   // enabled first: the focus may move there
  for (const [id, off, next] of controls) if (off) disable($(id), true, $(next));
  $("measure").disabled = !writable;
  $("apply-engine").disabled = busy;
  $("owner").hidden = !state.readOnly;
  render();
}

function render() {
  showMessages(state.messages, { editable: engine !== null && !state.readOnly && state.phase !== "generating",
                                 editing, onEdit: (i) => { editing = i; render(); $("edit-text").focus(); },
                                 onEditSend: sendEdited, onEditCancel: () => { editing = null; render(); } });
}

function problem(kind, title, error, actions = []) {
  state.problem = { kind, title, message: error.message, name: error.name, field: error.field };
  showProblem(state.problem, actions);
  announce(title);
}

function clearProblem() {
  state.problem = null;
  showProblem(null);
}

// ----- the engine ------------------------------------------------------------------------------------------------

function onEvent(e) {
  if (e.type === "saved") {
    state.committed = e;
    $("committed").textContent = `last committed: ${e.store} · generation ${e.generation} of ` +
      `${e.conversation} · ${e.tokens} tokens · ${kib(e.bytes)} written in ${ms(e.ms)}`;
    tabs?.saved(e.conversation);
    if (state.problem?.kind === "quota" || state.problem?.kind === "save") clearProblem();  // saved again
  } else if (e.type === "save_failed") {
    const quota = e.error.message.toLowerCase().includes("quota");
    problem(quota ? "quota" : "save", "Saving failed", { ...e.error, message: `${e.store}: ${e.error.message}. The ` +
      "reply goes on and the last committed generation stays; the next autosave tries again (deleting " +
      "conversations frees space)." });
  } else if (e.type === "held") {
    state.held = e;
  }
}

// Start the engine (a new worker) and continue what a crash cut: what opening the page, Reopen after a crash and
// Retry after a failed start do.
async function open() {
  state.opened = false;
  try {
    await start();
  } finally {
    state.opened = true;   // started (and what a crash cut resumed), or failed to
  }
}

async function start() {
  clearProblem();
  engine?.terminate();
  engine = null;
  tabs?.close();
  const store = $("store").value;
  tabs = new Tabs(store, STORE_NAME, { onLost, onSaved });
  state.model = null;
  setPhase("starting", "starting the engine");
  started.at = performance.now();
  started.origin = started.runs++ ? started.at : 0;   // a restart is timed from itself, not from the page's opening
  try {
    state.stages = [];
    engine = await createEngine({ model: "/model.gguf", store, storeName: STORE_NAME, onEvent,
                                  autosaveEvery: Number($("every").value), onProgress: (p) => {
                                    if (state.stages[state.stages.length - 1] !== p.stage) state.stages.push(p.stage);
                                    showProgress(p);
                                  } });
  } catch (error) {
    return failedStart(error);
  }
  window.demoHooks = engine.testing;
  state.model = engine.info.model;
  state.store = engine.info.store;
  started.took = engine.info.took;
  $("model-name").textContent = `${state.model.url.split("/").pop()} · ${state.model.num_layers} layers · ` +
    `${engine.info.store}`;
  $("load-bar").value = 1;
  $("load-text").textContent = `ready in ${ms(performance.now())} since the page opened (weights ` +
    `${engine.info.weights.source === "cache" ? "from the browser's cache" : "downloaded"})` +
    (engine.info.weights.note ? `; ${engine.info.weights.note}` : "");
  setPhase("ready", "ready");
  announce("The model is ready");
  await refresh();
  // A reply a crash cut goes on (the one on screen first, after Reopen); a stopped one waits for Continue.
  const unfinished = await engine.unfinished();
  unfinished.sort((a, b) => (b.name === state.conversation) - (a.name === state.conversation));
  for (const row of unfinished) {
    if (localStorage.getItem(stopKey(row.name)) === null && await tabs.claim(row.name)) {
      return continueReply(row, { timeline: true });
    }
  }
  if (state.conversation) await openConversation(state.conversation);   // a restarted engine: where the user was
}

async function failedStart(error) {
  state.errors.push(error);
  setPhase("stopped", "not running");
  $("load-text").textContent = "the engine did not start";
  const retry = { id: "retry", label: "Retry", run: open };
  if (error.name === "DeviceError") {
    problem("webgpu", "No WebGPU in this browser", { ...error, message: `${error.message}. Saved conversations are ` +
      "kept." });
  } else if (error.name === "ModelUnavailableError") {
    const info = await fetch("/model.json").then((r) => r.json()).catch(() => null);
    const hint = info && !info.available ? ` (the server expects ${info.expected}: ${info.hint})` : "";
    problem("model-missing", "The model cannot be loaded", { ...error, message: error.message + hint }, [retry]);
  } else {
    problem("start", "The engine did not start", error, [retry]);
  }
  try {
    state.conversations = await savedConversations({ store: $("store").value, storeName: STORE_NAME });
  } catch (listing) {
    state.errors.push(listing);
    state.conversations = [];
  }
  drawList();
}

function onSaved(name) {
  refresh();
  if (state.readOnly && state.conversation === name) openConversation(name);
}

// Another tab took the conversation over: stop writing it and let it go.
async function onLost(name) {
  if (state.conversation !== name) return;
  state.readOnly = true;
  if (streaming) { await engine.interrupt(); await streaming.done; }
  await engine.release(name).catch((error) => state.errors.push(error));
  setPhase("ready", "read-only");
  announce("Another tab took this conversation over");
}

// ----- the list ----------------------------------------------------------------------------------------------------

async function refresh() {
  if (!engine) return;
  try {
    state.conversations = await engine.conversations();
  } catch (error) {
    return problem("storage", "The store cannot be read", error);
  }
  for (const row of state.conversations) row.stopped = localStorage.getItem(stopKey(row.name)) !== null;
  drawList();
}

function drawList() {
  showConversations(state.conversations, {
    current: state.conversation, confirming, onOpen: (name) => openConversation(name), onInspect: inspect,
    onDelete: (name) => { confirming = name; drawList(); document.querySelector(".cancel-delete")?.focus(); },
    onCancel: (name) => { confirming = null; drawList(); focusRow(name, ".delete"); },
    onConfirm: remove,
  });
}

const focusRow = (name, selector) =>
  document.querySelector(`#conversations li[data-name="${CSS.escape(name)}"] ${selector}`)?.focus();

async function inspect(name) {
  try {
    const details = await engine.inspect(name);
    $("inspect").hidden = false;
    $("inspect").dataset.name = name;
    $("inspect-title").textContent = `checkpoints of ${name} in ${details.store}`;
    $("inspect-text").textContent = details.generations.map((g) => `generation ${g.generation}: ` +
      (g.error ? `damaged (${g.error})` : `${g.kv_tokens} tokens of K/V, ${kib(g.bytes)}, ` +
       new Date(g.created_ms).toLocaleString())).join("\n");
  } catch (error) {
    problem("storage", "The conversation cannot be inspected", error);
  }
}

function closeInspect() {
  const name = $("inspect").dataset.name;
  $("inspect").hidden = true;
  delete $("inspect").dataset.name;
  if (name) focusRow(name, ".inspect");
}

async function remove(name) {
  confirming = null;
  const mine = await tabs.claim(name);
  try {
    if (!mine) throw Object.assign(new Error(`conversation ${name}: open in another tab; take it over there ` +
      "first, or close it"), { name: "ConflictError" });
    await engine.delete(name);
  } catch (error) {
    if (!mine || state.conversation !== name) tabs.release(name);
    problem("storage", "The conversation was not deleted", error);
    return drawList();
  }
  tabs.release(name);
  localStorage.removeItem(stopKey(name));
  if ($("inspect").dataset.name === name) closeInspect();
  if (state.conversation === name) newConversation();
  announce("Conversation deleted");
  await refresh();
  $("new-chat").focus();
}

// ----- a conversation ---------------------------------------------------------------------------------------------

function show(info) {
  state.messages = info.messages.slice(info.messages[0]?.role === "system" ? 1 : 0);
  $("system").value = info.messages[0]?.role === "system" ? info.messages[0].content : "";
  const s = info.settings ?? {};
  document.querySelector(`input[name=mode][value=${s.temperature === 0 ? "greedy" : "sample"}]`).checked = true;
  if (s.temperature) $("temperature").value = s.temperature;
  if (Number.isInteger(s.seed)) $("seed").value = s.seed;
  if (Number.isInteger(s.max_tokens)) $("max-tokens").value = s.max_tokens;
  state.finishReason = info.finished ? info.finish_reason : "abort";
  $("chat-title").textContent = info.title || info.name;
}

async function openConversation(name) {
  if (state.phase === "generating" || state.phase === "restoring") return;
  setPhase("opening", "opening the conversation");
  let info;
  try {
    info = await engine.conversation(name);
  } catch (error) {
    setPhase("ready", "ready");
    return problem("storage", "The conversation cannot be read", error);
  }
  if (state.conversation && state.conversation !== name) tabs.release(state.conversation);
  clearProblem();
  editing = null;
  state.conversation = name;
  state.readOnly = !(await tabs.claim(name));
  if (info.error) return damaged(info);
  show(info);
  if (!info.same_model) {
    state.readOnly = true;
    $("owner-text").textContent = "Written by another model: its replies cannot be continued with this one.";
    if (!info.finished) problem("model", "This conversation was written by another model", { message: "Its K/V " +
      "cannot be used with this model; Continue runs its saved tokens through this model again, then goes on." },
      [{ id: "replay", label: "Continue with this model", run: () => { state.readOnly = false; continueReply(info); } }]);
  } else {
    $("owner-text").textContent = "This conversation is open in another tab: here it is read-only.";
  }
  setPhase("ready", state.readOnly ? "read-only" : "ready");
  drawList();
}

// A conversation whose newest checkpoint cannot be read: say so, and offer the newest generation that can.
async function damaged(info) {
  state.messages = [];
  const details = await engine.inspect(info.name).catch(() => ({ generations: [] }));
  const good = details.generations.filter((g) => !g.error);
  const older = good[good.length - 1];
  problem("record", "This checkpoint cannot be read", { message: info.error + (details.generations.length ?
    `: ${details.generations.filter((g) => g.error).map((g) => g.error).join("; ")}` : "") },
    older ? [{ id: "replay", label: `Resume generation ${older.generation} (${older.kv_tokens} tokens)`,
              run: () => continueReply(info, { generation: older.generation }) }] : []);
  setPhase("ready", "damaged");
}

function newConversation() {
  if (state.conversation) tabs.release(state.conversation);
  Object.assign(state, { conversation: null, messages: [], reply: "", replyIds: [], finishReason: null, usage: null,
                         readOnly: false, restored: null, measured: null });
  editing = null;
  $("chat-title").textContent = "New conversation";
  $("restored").hidden = true;
  $("figures").textContent = "";
  setPhase(engine ? "ready" : state.phase, engine ? "ready" : state.phase);
  drawList();
  $("prompt").focus();
}

// ----- replies ------------------------------------------------------------------------------------------------------

function settings() {
  const sample = document.querySelector("input[name=mode]:checked").value === "sample";
  return { temperature: sample ? Number($("temperature").value) : 0, seed: Number($("seed").value),
           max_tokens: Number($("max-tokens").value) };
}

function request(messages, extra = {}) {
  const system = $("system").value.trim();
  return { messages: system ? [{ role: "system", content: system }, ...messages] : messages, stream: true,
           ...settings(), ...extra };
}

// Read a reply's chunks into the last message; `opened()` gives the stream (it may reject before anything changed).
// With `resumed`, the first chunk is what the reply had written before (restored, not generated now).
async function run(opened, { resumed = false, timeline = false } = {}) {
  clearProblem();
  Object.assign(state, { reply: "", replyIds: [], held: null, finishReason: null });
  state.messages.push({ role: "assistant", content: "" });
  setPhase("generating", "waiting for the first token");
  const asked = performance.now();
  let stream;
  try {
    stream = await opened();
  } catch (error) {
    state.messages.pop();
    return failedReply(error);
  }
  const openedAt = performance.now();   // a resume's K/V are back (or a new prompt's prefix is)
  let finish, firstAt = null, old = resumed;
  streaming = { done: new Promise((resolve) => { finish = resolve; }) };
  try {
    for await (const chunk of stream) {
      const now = performance.now();
      const [choice] = chunk.choices;
      if (!old && chunk.kvckpt.token_ids.length) firstAt ??= now;
      old = false;
      if (state.conversation !== chunk.kvckpt.conversation) await adopt(chunk.kvckpt.conversation);
      state.replyIds.push(...chunk.kvckpt.token_ids);
      state.reply += choice.delta.content ?? "";
      state.messages[state.messages.length - 1].content = state.reply;
      showReplyText(state.reply);
      if (firstAt !== null) $("figures").textContent = liveLine(state.replyIds.length, firstAt, now);
      if (choice.finish_reason) await finished(choice.finish_reason, chunk.usage);
    }
  } catch (error) {
    failedReply(error);
  } finally {
    streaming = null;
    finish();
  }
  if (timeline && firstAt !== null) showTimeline(asked, openedAt, firstAt);
}

// The conversation a reply is saved under (the engine names a new one, or a fork): this tab holds it now.
async function adopt(name) {
  if (state.conversation && state.conversation !== name) tabs.release(state.conversation);
  state.conversation = name;
  await tabs.claim(name);
}

async function finished(reason, usage) {
  state.finishReason = reason;
  state.usage = usage;
  $("figures").textContent = replyLine(usage);
  notePrefill(state.model.identity, usage.prompt_tokens - usage.prompt_tokens_details.cached_tokens,
              usage.timings.prefill_s);
  const info = await engine.conversation(state.conversation).catch(() => null);
  if (info && !info.error) {   // the engine's own record of the messages: the next turn matches its tokens
    show(info);
    state.finishReason = reason;
  }
  setPhase("ready", reason === "abort" ? "stopped: Continue goes on" : `finished (${reason})`);
  announce(reason === "abort" ? "Reply stopped" : `Reply finished: ${usage.completion_tokens} tokens`);
  refresh();
}

function failedReply(error) {
  if (error.name === "Terminated") return;   // the crash control
  state.errors.push(error);
  setPhase("ready", "stopped");
  problem(error.name === "ConflictError" ? "conflict" : "error", "The reply did not run", error);
}

async function send(text) {
  if (!text.trim() || $("send").disabled) return;
  $("prompt").value = "";
  if (state.conversation) localStorage.removeItem(stopKey(state.conversation));
  state.messages.push({ role: "user", content: text });
  const messages = state.messages.map(({ role, content }) => ({ role, content }));
  await run(() => engine.chat.completions.create(request(messages)));
}

async function sendEdited(index, text) {
  editing = null;
  state.messages = [...state.messages.slice(0, index), { role: "user", content: text }];
  const messages = state.messages.map(({ role, content }) => ({ role, content }));
  await run(() => engine.chat.completions.create(request(messages)));   // a fork: the engine names it anew
}

async function regenerate() {
  const name = state.conversation;
  while (state.messages.length && state.messages[state.messages.length - 1].role === "assistant") state.messages.pop();
  localStorage.removeItem(stopKey(name));
  const messages = state.messages.map(({ role, content }) => ({ role, content }));
  await run(() => engine.chat.completions.create(request(messages, { conversation: name })));
}

// Continue conversation `info`'s unfinished reply (from `generation`, or its newest), showing how its K/V came back.
async function continueReply(info, { generation = null, timeline = false } = {}) {
  clearProblem();
  show(info);
  state.conversation = info.name;
  localStorage.removeItem(stopKey(info.name));
  const resumed = state.messages[state.messages.length - 1]?.role === "assistant";
  if (resumed) state.messages.pop();   // its text comes back as the first chunk
  drawList();
  await run(async () => {
    setPhase("restoring", "restoring the conversation");
    const stream = await engine.resume(info.name, { stream: true, generation });
    state.restored = stream.restored;
    state.measured = null;
    showRestored();
    setPhase("generating", "generating");
    return stream;
  }, { resumed, timeline });
}

function showRestored() {
  $("restored").hidden = state.restored === null;
  if (state.restored === null) return;
  $("restored-text").textContent = restoredLine(state.restored, state.model.identity, state.measured);
  $("measure").hidden = !state.restored.kv_restored || state.measured !== null;
}

async function measure() {
  $("measure").disabled = true;
  $("restored-text").textContent += " · measuring a re-prefill…";
  try {
    state.measured = await engine.measureReprefill(state.conversation, { tokens: state.restored.tokens });
    notePrefill(state.model.identity, state.measured.tokens, state.measured.ms / 1e3);
  } catch (error) {
    problem("error", "The re-prefill could not be measured", error);
  }
  showRestored();
  $("measure").disabled = false;
}

// The way from the page's opening (or Reopen) to the first resumed token, stage by stage.
function showTimeline(asked, openedAt, firstAt) {
  const took = started.took;
  const stages = [{ label: "page", ms: started.at - started.origin }, { label: "Python", ms: took.boot },
                  { label: `weights (${engine.info.weights.source === "cache" ? "browser cache" : "download"})`,
                    ms: took.weights }, { label: "upload", ms: took.upload }, { label: "engine", ms: took.engine },
                  { label: "restore", ms: openedAt - asked }, { label: "first token", ms: firstAt - openedAt }];
  state.timeline = { total_ms: firstAt - started.origin, stages, weights_source: engine.info.weights.source };
  $("timeline").hidden = false;
  $("timeline").textContent = timelineLine(state.timeline);
}

// ----- the controls ------------------------------------------------------------------------------------------------

$("composer").onsubmit = (e) => { e.preventDefault(); send($("prompt").value); };
$("prompt").onkeydown = (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); $("composer").requestSubmit(); }
};
$("stop").onclick = () => {
  localStorage.setItem(stopKey(state.conversation), "1");
  engine.interrupt();
};
$("continue").onclick = async () => continueReply(await engine.conversation(state.conversation));
$("regenerate").onclick = regenerate;
$("crash").onclick = () => {
  engine.terminate();
  engine = null;
  setPhase("crashed", "crashed: the worker was terminated");
  problem("crashed", "Crashed", { message: "The model's worker was terminated without saving. Reopen to start it " +
    "again: the reply goes on from the last checkpoint, as in a reopened tab." },
    [{ id: "reopen", label: "Reopen", run: open }]);
  $("reopen").focus();
};
$("take-over").onclick = async () => {
  $("owner-text").textContent = "taking over: waiting for the other tab to let go…";
  await tabs.takeOver(state.conversation);
  state.readOnly = false;
  announce("This tab writes the conversation now");
  const info = await engine.conversation(state.conversation);
  if (!info.finished && info.same_model) return continueReply(info);
  await openConversation(state.conversation);
  $("prompt").focus();
};
$("new-chat").onclick = newConversation;
$("inspect-close").onclick = closeInspect;
$("measure").onclick = measure;
$("store").value = setting("store", "indexeddb");
$("every").value = setting("every", "16");
$("apply-engine").onclick = () => {
  localStorage.setItem("kvckpt-chat:store", $("store").value);
  localStorage.setItem("kvckpt-chat:every", $("every").value);
  state.conversation = null;
  newConversation();
  open();
};
open();
