// The chat page: kvckpt_web's engine (createEngine, in a Web Worker) behind a multi-turn chat whose conversations
// survive a crash. On load it starts the engine and continues the newest reply a crash cut. The page's state is held
// by the Page it creates here, which the other modules are given; `window.chatPage` is that Page, for tests (its
// `state` mirrors what the page shows).
import { createEngine, savedConversations } from "/kvckpt.mjs";
import { conversationsOf } from "./conversations.mjs";
import { setUpDevices } from "./devices.mjs";
import { kib, ms } from "./figures.mjs";
import { STORE_NAME, Page } from "./page.mjs";
import { repliesOf } from "./replies.mjs";
import { Tabs } from "./tabs.mjs";
import { $, showProgress } from "./view.mjs";

const query = new URLSearchParams(location.search);   // ?store=opfs&every=8 overrides what is remembered
const setting = (key, fallback) => query.get(key) ?? localStorage.getItem(`kvckpt-chat:${key}`) ?? fallback;

const page = new Page({ sendEdited: (index, text) => replies.sendEdited(index, text) });
const { state } = page;
const conversations = conversationsOf(page, { continueReply: (info, options) => replies.continueReply(info, options) });
const replies = repliesOf(page, conversations);
window.chatPage = page;

// ----- the engine ---------------------------------------------------------------------------------------------------

function onEvent(e) {
  if (e.type === "saved") {
    state.committed = e;
    $("committed").textContent = `last committed: ${e.store} · generation ${e.generation} of ` +
      `${e.conversation} · ${e.tokens} tokens · ${kib(e.bytes)} written in ${ms(e.ms)}`;
    page.tabs?.saved(e.conversation);
    if (state.problem?.kind === "quota" || state.problem?.kind === "save") page.clearProblem();  // saved again
    const row = state.conversations.find((r) => r.name === e.conversation);
    if (!row) conversations.refresh();   // a new one: list it
    else if (e.tokens > (row.tokens ?? 0)) {   // the list keeps up with the commit line while a reply runs
      Object.assign(row, { tokens: e.tokens, updated_ms: Date.now() });
      conversations.drawList();
    }
  } else if (e.type === "save_failed") {
    const quota = e.error.message.toLowerCase().includes("quota");
    page.problem(quota ? "quota" : "save", "Saving failed", { ...e.error, message: `${e.store}: ${e.error.message}. ` +
      "The reply goes on and the last committed generation stays; the next autosave tries again (deleting " +
      "conversations frees space)." });
  }
}

// Start the page.engine (a new worker) and continue what a crash cut: what opening the page, Reopen after a crash and
// Retry after a failed start do.
async function open() {
  state.opened = false;
  try {
    await start();
  } finally {
    state.opened = true;   // page.started (and what a crash cut resumed), or failed to
  }
}

async function start() {
  page.clearProblem();
  page.engine?.terminate();
  page.engine = null;
  page.tabs?.close();
  const store = $("store").value;
  page.tabs = new Tabs(store, STORE_NAME, { onLost, onSaved });
  state.model = null;
  page.setPhase("starting", "starting the engine");
  page.started.at = performance.now();
  page.started.origin = page.started.runs++ ? page.started.at : 0;   // a restart is timed from itself
  try {
    state.stages = [];
    page.engine = await createEngine({ model: "/model.gguf", store, storeName: STORE_NAME, onEvent,
                                  autosaveEvery: Number($("every").value) || undefined, onProgress: (p) => {
                                    if (state.stages[state.stages.length - 1] !== p.stage) state.stages.push(p.stage);
                                    showProgress(p);
                                  } });
  } catch (error) {
    return failedStart(error);
  }
  state.model = page.engine.info.model;
  $("every").value ||= page.engine.info.config.autosave_every;   // none given: the engine's preset's
  state.store = page.engine.info.store;
  page.started.took = page.engine.info.took;
  $("model-name").textContent = `${state.model.name ?? state.model.url.split("/").pop()} · ` +
    `${state.model.num_layers} layers · ` +
    `${page.engine.info.store}`;
  $("load-bar").value = 1;
  $("load-text").textContent = `ready in ${ms(performance.now() - page.started.origin)} since ` +
    `${page.started.origin ? "the engine was started again" : "the page opened"} (weights ` +
    `${page.engine.info.weights.source === "cache" ? "from the browser's cache" : "downloaded"})` +
    (page.engine.info.weights.note ? `; ${page.engine.info.weights.note}` : "");
  page.setPhase("ready", "ready");
  page.announce("The model is ready");
  await conversations.refresh();
  // A reply a crash cut goes on (the one on screen first, after Reopen); a stopped one waits for Continue.
  const unfinished = await page.engine.unfinished();
  unfinished.sort((a, b) => (b.name === state.conversation) - (a.name === state.conversation));
  for (const row of unfinished) {
    if (localStorage.getItem(page.stopKey(row.name)) === null && await page.tabs.claim(row.name)) {
      return replies.continueReply(row, { timeline: true });
    }
  }
  if (state.conversation) await conversations.openConversation(state.conversation);   // restarted: where it was
}

async function failedStart(error) {
  state.errors.push(error);
  page.setPhase("stopped", "not running");
  $("load-text").textContent = "the engine did not start";
  const retry = { id: "retry", label: "Retry", run: open };
  if (error.name === "DeviceError") {
    page.problem("webgpu", "No WebGPU in this browser", { ...error, message: `${error.message}. Saved conversations ` +
      "are kept." });
  } else if (error.name === "ModelUnavailableError") {
    const info = await fetch("/model.json").then((r) => r.json()).catch(() => null);
    const hint = info && !info.available ? ` (the server expects ${info.expected}: ${info.hint})` : "";
    page.problem("model-missing", "The model cannot be loaded", { ...error, message: error.message + hint }, [retry]);
  } else {
    page.problem("start", "The engine did not start", error, [retry]);
  }
  try {
    state.conversations = await savedConversations({ store: $("store").value, storeName: STORE_NAME });
  } catch (listing) {
    state.errors.push(listing);
    state.conversations = [];
  }
  conversations.drawList();
}

function onSaved(name) {
  conversations.refresh();
  if (state.readOnly && state.conversation === name) conversations.openConversation(name);
}

// Another tab took the conversation over: stop writing it and let it go.
async function onLost(name) {
  if (state.conversation !== name) return;
  state.readOnly = true;
  if (page.streaming) { await page.engine.interrupt(); await page.streaming.done; }
  await page.engine.release(name).catch((error) => state.errors.push(error));
  $("figures").textContent = "";   // the other tab's reply is not this one's to measure
  $("restored").hidden = true;
  page.setPhase("ready", "read-only");
  page.announce("Another tab took this conversation over");
}

// ----- the controls ------------------------------------------------------------------------------------------------

$("composer").onsubmit = (e) => { e.preventDefault(); replies.send($("prompt").value); };
$("prompt").onkeydown = (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); $("composer").requestSubmit(); }
};
$("stop").onclick = () => {
  page.stopping = true;   // a new conversation is named by the reply's first chunk: its end marks it stopped
  if (state.conversation) localStorage.setItem(page.stopKey(state.conversation), "1");
  page.engine.interrupt();
};
$("continue").onclick = async () => replies.continueReply(await page.engine.conversation(state.conversation));
$("regenerate").onclick = () => replies.regenerate();
$("crash").onclick = () => {
  page.engine.terminate();
  page.engine = null;
  page.setPhase("crashed", "crashed: the worker was terminated");
  page.problem("crashed", "Crashed", { message: "The model's worker was terminated without saving. Reopen to start " +
    "it again: the reply goes on from the last checkpoint, as in a reopened tab." },
    [{ id: "reopen", label: "Reopen", run: open }]);
  $("reopen").focus();
};
$("take-over").onclick = async () => {
  $("owner-text").textContent = "taking over: waiting for the other tab to let go…";
  await page.tabs.takeOver(state.conversation);
  state.readOnly = false;
  page.announce("This tab writes the conversation now");
  const info = await page.engine.conversation(state.conversation);
  if (!info.finished && info.same_model) return replies.continueReply(info);
  await conversations.openConversation(state.conversation);
  $("prompt").focus();
};
$("new-chat").onclick = () => conversations.newConversation();
$("inspect-close").onclick = () => conversations.closeInspect();
$("measure").onclick = () => replies.measure();
$("store").value = setting("store", "indexeddb");
$("every").value = setting("every", "");
$("apply-engine").onclick = () => {
  localStorage.setItem("kvckpt-chat:store", $("store").value);
  localStorage.setItem("kvckpt-chat:every", $("every").value);
  state.conversation = null;
  conversations.newConversation();
  open();
};
setUpDevices(page, conversations);
open();
