// The chat page's replies: a message sent, an edited one (a fork), the last reply regenerated, an unfinished one
// continued; each read chunk by chunk into the conversation, with the figures of what it cost.
import { liveLine, notePrefill, replyLine, restoredLine, timelineLine } from "./figures.mjs";
import { $, showReplyText, showWarnings } from "./view.mjs";

const sampling = () => document.querySelector("input[name=mode]:checked").value === "sample";

// The number in the settings' field `id` (named `label`) as its min, max and step allow; a FieldError naming it if
// it is empty or outside them (the reply is then not asked for).
function number(id, label) {
  const input = $(id);
  if (input.value !== "" && input.checkValidity()) return Number(input.value);
  const expected = `${["", "1"].includes(input.step) ? "an integer" : "a number"} ` +
    (input.max ? `in [${input.min}, ${input.max}]` : `>= ${input.min}`);
  const got = input.value === "" ? "nothing" : input.value;
  throw Object.assign(new Error(`${label}: expected ${expected}, got ${got}`),
                      { name: "FieldError", field: label, expected, got });
}

function settings() {
  return { temperature: sampling() ? number("temperature", "temperature") : 0, seed: number("seed", "seed"),
           max_tokens: number("max-tokens", "max tokens") };
}

function request(messages, extra = {}) {
  const system = $("system").value.trim();
  return { messages: system ? [{ role: "system", content: system }, ...messages] : messages, stream: true,
           ...settings(), ...extra };
}

// What the page (page.mjs's Page) does with replies; `conversations` (conversations.mjs) shows and lists what they
// change.
export function repliesOf(page, conversations) {
  const { state } = page;

  // Read a reply's chunks into the last message; `opened()` gives the stream (it may reject before anything changed:
  // `refused()` then puts back what the caller changed). With `resumed`, the first chunk is what the reply had written
  // before (restored, not generated now).
  async function run(opened, { resumed = false, timeline = false, refused = () => {} } = {}) {
    page.clearProblem();
    page.stopping = false;
    const ended = state.finishReason;   // how the last reply ended, while a refused one changes nothing
    Object.assign(state, { reply: "", replyIds: [], finishReason: null });
    state.messages.push({ role: "assistant", content: "" });
    page.setPhase("generating", "waiting for the first token");
    const asked = performance.now();
    let stream;
    try {
      stream = await opened();
    } catch (error) {
      state.messages.pop();
      state.finishReason = ended;
      refused();
      return failedReply(error);
    }
    const openedAt = performance.now();   // a resume's K/V are back (or a new prompt's prefix is)
    let finish, firstAt = null, old = resumed;
    page.streaming = { done: new Promise((resolve) => { finish = resolve; }) };
    try {
      for await (const chunk of stream) {
        const now = performance.now();
        const [choice] = chunk.choices;
        if (choice.delta.role) showWarnings(chunk.kvckpt.warnings ?? []);   // on its first chunk
        if (!old && chunk.kvckpt.token_ids.length && firstAt === null) {
          firstAt = now;
          $("phase").textContent = "generating";
        }
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
      page.streaming = null;
      finish();
    }
    if (timeline && firstAt !== null) showTimeline(asked, openedAt, firstAt);
  }

  // The conversation a reply is saved under (the page.engine names a new one, or a fork): this tab holds it now.
  async function adopt(name) {
    if (state.conversation && state.conversation !== name) page.tabs.release(state.conversation);
    state.conversation = name;
    $("chat-title").textContent = state.messages.find((m) => m.role === "user")?.content.slice(0, 60) ?? name;
    await page.tabs.claim(name);
  }

  async function finished(reason, usage) {
    if (reason === "abort" && page.stopping) localStorage.setItem(page.stopKey(state.conversation), "1");
    state.finishReason = reason;
    state.usage = usage;
    $("figures").textContent = replyLine(usage);
    notePrefill(state.model.identity, usage.prompt_tokens - usage.prompt_tokens_details.cached_tokens,
                usage.timings.prefill_s);
    const info = await page.engine.conversation(state.conversation).catch(() => null);
    if (info && !info.error) {   // the page.engine's own record of the messages: the next turn matches its tokens
      conversations.show(info);
      state.finishReason = reason;
    }
    page.setPhase("ready", reason === "abort" ? "stopped: Continue goes on" : `finished (${reason})`);
    page.announce(reason === "abort" ? "Reply stopped" : `Reply finished: ${usage.completion_tokens} tokens`);
    conversations.refresh();
  }

  function failedReply(error) {
    if (error.name === "Terminated") return;   // the crash control
    state.errors.push(error);
    page.setPhase("ready", "stopped");
    if (error.name === "ContextFullError") {
      return page.problem("full", "This conversation is full", { ...error, message: `${error.message}. A new ` +
        "conversation starts with the whole context free (what you wrote stays in the box)." },
        [{ id: "new-conversation", label: "New conversation", run: () => conversations.newConversation() }]);
    }
    page.problem(error.name === "ConflictError" ? "conflict" : "error", "The reply did not run", error);
  }

  // A refused send leaves the history as it was (`before`), and the text in the box.
  async function send(text) {
    if (!text.trim() || $("send").disabled) return;
    const before = state.messages;
    $("prompt").value = "";
    if (state.conversation) localStorage.removeItem(page.stopKey(state.conversation));
    state.messages = [...before, { role: "user", content: text }];
    const messages = state.messages.map(({ role, content }) => ({ role, content }));
    // the open conversation's next turn is saved into it (a new one: the page.engine names it)
    const open = state.conversation ? { conversation: state.conversation } : {};
    await run(() => page.engine.chat.completions.create(request(messages, open)),
              { refused: () => { state.messages = before; $("prompt").value = text; } });
  }

  async function sendEdited(index, text) {
    const before = state.messages;
    page.editing = null;
    state.messages = [...state.messages.slice(0, index), { role: "user", content: text }];
    const messages = state.messages.map(({ role, content }) => ({ role, content }));
    await run(() => page.engine.chat.completions.create(request(messages)),   // a fork: the page.engine names it anew
              { refused: () => { state.messages = before; } });
  }

  // The last reply answered again; with temperature sampling from a new seed (shown in the settings, saved with it).
  async function regenerate() {
    const name = state.conversation;
    const before = state.messages;
    state.messages = state.messages.slice();
    while (state.messages.length && state.messages[state.messages.length - 1].role === "assistant") {
      state.messages.pop();
    }
    localStorage.removeItem(page.stopKey(name));
    if (sampling()) $("seed").value = String(crypto.getRandomValues(new Uint32Array(1))[0]);
    const messages = state.messages.map(({ role, content }) => ({ role, content }));
    await run(() => page.engine.chat.completions.create(request(messages, { conversation: name })),
              { refused: () => { state.messages = before; } });
  }

  // Continue conversation `info`'s unfinished reply (from `generation`, or its newest), showing how its K/V came back.
  async function continueReply(info, { generation = null, timeline = false } = {}) {
    page.clearProblem();
    conversations.show(info);
    state.conversation = info.name;
    localStorage.removeItem(page.stopKey(info.name));
    const resumed = state.messages[state.messages.length - 1]?.role === "assistant";
    if (resumed) state.messages.pop();   // its text comes back as the first chunk
    conversations.drawList();
    await run(async () => {
      page.setPhase("restoring", "restoring the conversation");
      const stream = await page.engine.resume(info.name, { stream: true, generation });
      state.restored = stream.restored;
      state.measured = null;
      showRestored();
      page.setPhase("generating", "generating");
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
      state.measured = await page.engine.measureReprefill(state.conversation, { tokens: state.restored.tokens });
      notePrefill(state.model.identity, state.measured.tokens, state.measured.ms / 1e3);
    } catch (error) {
      page.problem("error", "The re-prefill could not be measured", error);
    }
    showRestored();
    $("measure").disabled = false;
  }

  // The way from the page's opening (or Reopen) to the first resumed token, stage by stage.
  function showTimeline(asked, openedAt, firstAt) {
    const took = page.started.took;
    const stages = [{ label: "page", ms: page.started.at - page.started.origin }, { label: "Python", ms: took.boot },
                    { label: `weights (${page.engine.info.weights.source === "cache" ? "browser cache" : "download"})`,
                      ms: took.weights }, { label: "upload", ms: took.upload }, { label: "engine", ms: took.engine },
                    { label: "kernels", ms: took.kernels },
                    { label: "restore", ms: openedAt - asked }, { label: "first token", ms: firstAt - openedAt }];
    state.timeline = { total_ms: firstAt - page.started.origin, stages,
                       weights_source: page.engine.info.weights.source };
    $("timeline").hidden = false;
    $("timeline").textContent = timelineLine(state.timeline);
  }

  return { send, sendEdited, regenerate, continueReply, measure };
}
