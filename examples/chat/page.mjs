// The chat page's state, on one object the page creates (app.mjs): what it shows (`state`, which the tests read as
// `window.chatPage.state`), the engine and the tabs it works with, and what every part of it uses to say things (the
// phase and the controls it allows, problems, announcements).
import { $, disable, showMessages, showProblem } from "./view.mjs";

export const STORE_NAME = "kvckpt-demo";

export class Page {
  // `sendEdited(index, text)`: what an edited message's Send does (replies.mjs).
  constructor({ sendEdited }) {
    this.state = {
      opened: false, phase: "starting", model: null, store: null, conversation: null, messages: [], reply: "",
      replyIds: [], finishReason: null, usage: null, readOnly: false, restored: null, measured: null, committed: null,
      problem: null, conversations: [], timeline: null, stages: [], errors: [],
      device: { busy: null, pushed: null, pulled: null },   // another device: "push" | "pull" under way; what moved
    };
    this.engine = null;        // createEngine's, while it runs
    this.tabs = null;          // one writer per conversation (tabs.mjs)
    this.streaming = null;     // the reply being read: {done}, a promise of its end
    this.editing = null;       // the index of the message being edited
    this.stopping = false;     // Stop was pressed during the reply being read
    this.confirming = null;    // the conversation whose delete asks for confirmation
    this.started = { runs: 0, origin: 0, at: 0, took: null };   // engine starts; when the page (or a restart) began
    this.sendEdited = sendEdited;
  }

  stopKey(name) { return `kvckpt-chat:stopped:${$("store").value}:${STORE_NAME}:${name}`; }
  announce(text) { $("status").textContent = text; }

  // ----- what the controls allow -------------------------------------------------------------------------------

  setPhase(phase, text = phase) {
    this.state.phase = phase;
    $("phase").textContent = text;
    this.updateControls();
  }

  // Enable the controls the phase, the open conversation and a push or pull under way allow.
  updateControls() {
    const { state } = this;
    const phase = state.phase;
    const ready = this.engine !== null && phase !== "crashed";
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
    this.render();
  }

  render() {
    showMessages(this.state.messages, {
      editable: this.engine !== null && !this.state.readOnly && this.state.phase !== "generating",
      editing: this.editing,
      onEdit: (i) => { this.editing = i; this.render(); $("edit-text").focus(); },
      onEditSend: (i, text) => this.sendEdited(i, text),
      onEditCancel: () => { this.editing = null; this.render(); },
    });
  }

  problem(kind, title, error, actions = []) {
    this.state.problem = { kind, title, message: error.message, name: error.name, field: error.field };
    showProblem(this.state.problem, actions);
    this.announce(title);
  }

  clearProblem() {
    this.state.problem = null;
    showProblem(null);
  }
}
