// The chat page's conversations: the saved ones listed (open, inspect, delete), one shown with its history and
// settings, a damaged one with what can be recovered, a new one.
import { kib } from "./figures.mjs";
import { $, showConversations, showWarnings } from "./view.mjs";

// What the page (page.mjs's Page) does with its conversations; `continueReply(info, options)` goes on with one's
// unfinished reply (replies.mjs).
export function conversationsOf(page, { continueReply }) {
  const { state } = page;

  // ----- the list ------------------------------------------------------------------------------------------------

  async function refresh() {
    if (!page.engine) return;
    try {
      state.conversations = await page.engine.conversations();
    } catch (error) {
      return page.problem("storage", "The store cannot be read", error);
    }
    for (const row of state.conversations) row.stopped = localStorage.getItem(page.stopKey(row.name)) !== null;
    drawList();
  }

  function drawList() {
    showConversations(state.conversations, {
      current: state.conversation, confirming: page.confirming, onOpen: (name) => openConversation(name),
      writing: page.streaming ? state.conversation : null,
      onInspect: inspect,
      onDelete: (name) => { page.confirming = name; drawList(); document.querySelector(".cancel-delete")?.focus(); },
      onCancel: (name) => { page.confirming = null; drawList(); focusRow(name, ".delete"); },
      onConfirm: remove,
    });
  }

  const focusRow = (name, selector) =>
    document.querySelector(`#conversations li[data-name="${CSS.escape(name)}"] ${selector}`)?.focus();

  async function inspect(name) {
    try {
      const details = await page.engine.inspect(name);
      $("inspect").hidden = false;
      $("inspect").dataset.name = name;
      $("inspect-title").textContent = `checkpoints of ${name} in ${details.store}`;
      $("inspect-text").textContent = details.generations.map((g) => `generation ${g.generation}: ` +
        (g.error ? `damaged (${g.error})` : `${g.kv_tokens} tokens of K/V, ${kib(g.bytes)}, ` +
         new Date(g.created_ms).toLocaleString())).join("\n");
    } catch (error) {
      page.problem("storage", "The conversation cannot be inspected", error);
    }
  }

  function closeInspect() {
    const name = $("inspect").dataset.name;
    $("inspect").hidden = true;
    delete $("inspect").dataset.name;
    if (name) focusRow(name, ".inspect");
  }

  async function remove(name) {
    page.confirming = null;
    const mine = await page.tabs.claim(name);
    try {
      if (!mine) throw Object.assign(new Error(`conversation ${name}: open in another tab; take it over there ` +
        "first, or close it"), { name: "ConflictError" });
      await page.engine.delete(name);
    } catch (error) {
      if (!mine || state.conversation !== name) page.tabs.release(name);
      page.problem("storage", "The conversation was not deleted", error);
      return drawList();
    }
    page.tabs.release(name);
    localStorage.removeItem(page.stopKey(name));
    if ($("inspect").dataset.name === name) closeInspect();
    if (state.conversation === name) newConversation();
    page.announce("Conversation deleted");
    await refresh();
    $("new-chat").focus();
  }

  // ----- a conversation -----------------------------------------------------------------------------------------

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
    page.setPhase("opening", "opening the conversation");
    let info;
    try {
      info = await page.engine.conversation(name);
    } catch (error) {
      page.setPhase("ready", "ready");
      return page.problem("storage", "The conversation cannot be read", error);
    }
    if (state.conversation && state.conversation !== name) page.tabs.release(state.conversation);
    page.clearProblem();
    page.editing = null;
    state.conversation = name;
    state.readOnly = !(await page.tabs.claim(name));
    if (info.error) return damaged(info);
    show(info);
    if (!info.same_model) {
      state.readOnly = true;
      $("owner-text").textContent = "Written by another model: its replies cannot be continued with this one.";
      if (!info.finished) page.problem("model", "This conversation was written by another model", { message: "Its " +
        "K/V cannot be used with this model; Continue runs its saved tokens through this model again, then goes on." },
        [{ id: "replay", label: "Continue with this model",
           run: () => { state.readOnly = false; continueReply(info); } }]);
    } else {
      $("owner-text").textContent = "This conversation is open in another tab: here it is read-only.";
    }
    page.setPhase("ready", state.readOnly ? "read-only" : "ready");
    drawList();
  }

  // A conversation whose newest checkpoint cannot be read: say so, and offer the newest generation that can.
  async function damaged(info) {
    state.messages = [];
    const details = await page.engine.inspect(info.name).catch(() => ({ generations: [] }));
    const good = details.generations.filter((g) => !g.error);
    const older = good[good.length - 1];
    page.problem("record", "This checkpoint cannot be read", { message: info.error + (details.generations.length ?
      `: ${details.generations.filter((g) => g.error).map((g) => g.error).join("; ")}` : "") },
      older ? [{ id: "replay", label: `Resume generation ${older.generation} (${older.kv_tokens} tokens)`,
                run: () => continueReply(info, { generation: older.generation }) }] : []);
    page.setPhase("ready", "damaged");
  }

  function newConversation() {
    if (state.conversation) page.tabs.release(state.conversation);
    Object.assign(state, { conversation: null, messages: [], reply: "", replyIds: [], finishReason: null, usage: null,
                           readOnly: false, restored: null, measured: null });
    page.editing = null;
    $("chat-title").textContent = "New conversation";
    $("restored").hidden = true;
    $("figures").textContent = "";
    showWarnings([]);
    page.setPhase(page.engine ? "ready" : state.phase, page.engine ? "ready" : state.phase);
    drawList();
    $("prompt").focus();
  }

  return { refresh, drawList, inspect, closeInspect, remove, show, openConversation, newConversation };
}
