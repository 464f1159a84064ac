// The chat page's shared state: what it shows (`window.demo`, which tests read), the engine and the tabs it works
// with, and what every part of it uses to say things (the phase and the controls it allows, problems, announcements).
import { $, disable, showMessages, showProblem } from "./view.mjs";

export const STORE_NAME = "kvckpt-demo";
export const state = (window.demo = {
  opened: false, phase: "starting", model: null, store: null, conversation: null, messages: [], reply: "", replyIds: [],
  finishReason: null, usage: null, readOnly: false, restored: null, measured: null, committed: null, problem: null,
  conversations: [], timeline: null, stages: [], errors: [],
  device: { busy: null, pushed: null, pulled: null },   // another device: "push" | "pull" under way; what moved last
});
export const page = {
  engine: null,        // createEngine's, while it runs
  tabs: null,          // one writer per conversation (tabs.mjs)
  streaming: null,     // the reply being read: {done}, a promise of its end
  editing: null,       // the index of the message being edited
  stopping: false,     // Stop was pressed during the reply being read
  confirming: null,    // the conversation whose delete asks for confirmation
  started: { runs: 0, origin: 0, at: 0, took: null },   // engine starts; when the page (or a restart) began
  sendEdited: null,    // what an edited message's Send does (replies.mjs)
};

export const stopKey = (name) => `kvckpt-chat:stopped:${$("store").value}:${STORE_NAME}:${name}`;
export const announce = (text) => { $("status").textContent = text; };

// ----- what the controls allow ---------------------------------------------------------------------------------

export function setPhase(phase, text = phase) {
  state.phase = phase;
  $("phase").textContent = text;
  updateControls();
}

// Enable the controls the phase, the open conversation and a push or pull under way allow.
export function updateControls() {
  const phase = state.phase;
  const ready = page.engine !== null && phase !== "crashed";
  const busy = phase === "generating" || phase === "restoring";
  const writable = ready && !busy && !state.readOnly && state.device.busy !== "pull";
  const last = state.messages[state.messages.length - 1];
  const unfinished = state.finishReason === "abort" || state.finishReason === null && last?.role === "assistant";
  const controls = [["send", !writable, "prompt"], ["stop", phase !== "generating", "continue"],
                    ["continue", !(writable && state.conversation && unfinished), "stop"],
                    ["regenerate", !(writable && state.conversation && last?.role === "assistant"), "prompt"],
                    ["crash", phase !== "generating", "prompt"],
                    ["push", !(writable && state.conversation && state.device.busy === null), "prompt"],
                    ["pull", !(ready && !busy && state.device.busy === null), "pull-name"]];
  for (const [id, off] of controls) if (!off) disable($(id), false);   // enabled first: the focus may move there
  for (const [id, off, next] of controls) if (off) disable($(id), true, $(next));
  $("measure").disabled = !writable;
  $("apply-engine").disabled = busy || phase === "starting";   // one engine at a time
  $("owner").hidden = !state.readOnly;
  render();
}

export function render() {
  showMessages(state.messages, {
    editable: page.engine !== null && !state.readOnly && state.phase !== "generating", editing: page.editing,
    onEdit: (i) => { page.editing = i; render(); $("edit-text").focus(); },
    onEditSend: (i, text) => page.sendEdited(i, text), onEditCancel: () => { page.editing = null; render(); },
  });
}

export function problem(kind, title, error, actions = []) {
  state.problem = { kind, title, message: error.message, name: error.name, field: error.field };
  showProblem(state.problem, actions);
  announce(title);
}

export function clearProblem() {
  state.problem = null;
  showProblem(null);
}
