// What the chat page shows: the messages, the conversation list, problems and the load progress. Rendering keeps the
// focus where the user was (an element with the same `data-focus` key gets it back after a list is redrawn).

export const $ = (id) => document.getElementById(id);

const el = (tag, { dataset = {}, ...props } = {}, ...children) => {
  const node = Object.assign(document.createElement(tag), props);
  Object.assign(node.dataset, dataset);
  node.append(...children);
  return node;
};

// Redraw `container`'s children with `render()`, giving the focus back to the element with the same data-focus key.
function keepingFocus(container, render) {
  const key = container.contains(document.activeElement) ? document.activeElement.dataset.focus : undefined;
  container.replaceChildren(...render());
  if (key !== undefined) container.querySelector(`[data-focus="${CSS.escape(key)}"]`)?.focus();
}

// Move the focus to `next` if it was on `button`, which is being disabled (focus never falls to the page's body).
export function disable(button, disabled, next = null) {
  if (disabled && document.activeElement === button && next && !next.disabled) next.focus();
  button.disabled = disabled;
}

const ROLE_NAMES = { system: "System", user: "You", assistant: "Model" };

// The messages of the conversation: each as its role and its text (never the chat template); a user message that
// can be edited has an Edit button, and `editing` (its index) shows a form in its place.
export function showMessages(messages, { editable, editing, onEdit, onEditSend, onEditCancel }) {
  keepingFocus($("messages"), () => messages.map((m, i) => {
    const item = el("li", { className: `message ${m.role}`, dataset: { index: String(i), role: m.role } },
                    el("span", { className: "role", textContent: ROLE_NAMES[m.role] ?? m.role }));
    if (i === editing) {
      const text = el("textarea", { value: m.content, rows: 2, id: "edit-text" });
      text.setAttribute("aria-label", "Edited message");
      const send = el("button", { type: "submit", textContent: "Send edited" });
      const cancel = el("button", { type: "button", textContent: "Cancel", onclick: onEditCancel });
      const submit = (e) => { e.preventDefault(); onEditSend(i, text.value); };
      const form = el("form", { className: "edit row", onsubmit: submit }, text, send, cancel);
      item.append(form);
      return item;
    }
    item.append(el("span", { className: "content", textContent: m.content }));
    if (m.role === "user" && editable) {
      const edit = el("button", { type: "button", className: "edit-button", textContent: "Edit",
                                  dataset: { focus: `edit:${i}` }, onclick: () => onEdit(i) });
      edit.setAttribute("aria-label", `Edit message ${i + 1}`);
      item.append(edit);
    }
    return item;
  }));
}

// The text of the reply being written (the last message's), without redrawing the list.
export function showReplyText(text) {
  const last = $("messages").lastElementChild?.querySelector(".content");
  if (last) last.textContent = text;
}

// What a reply did without (the engine's `kvckpt.warnings`: K/V in the store that could not be used, and what was done
// instead), as a notice beside it, text only; none hides it.
export function showWarnings(warnings) {
  $("reply-warnings").hidden = warnings.length === 0;
  $("reply-warnings").textContent = warnings.length ? `Note: ${warnings.join("; ")}` : "";
}

function label(row, writing) {
  if (row.name === writing) return "writing";
  if (row.error) return "damaged";
  if (!row.same_model) return "another model's";
  if (!row.finished) return row.stopped ? "stopped" : "cut";
  return "";
}

// How the list names conversation `row`: its title (its first message), and where another row has the same title
// (an edit's fork and its original), its last message too.
function titleOf(row, rows) {
  const title = row.title || row.name;
  if (!rows.some((other) => other !== row && (other.title || other.name) === title)) return title;
  const last = row.messages.filter((m) => m.role === "user").pop()?.content.split(/\s+/).join(" ") ?? "";
  return last && last !== title ? `${title} · ${last.length > 40 ? `${last.slice(0, 39)}…` : last}` : title;
}

// The saved conversations, newest first: open, inspect, delete (which asks, and can be cancelled); `writing` is the one
// a reply is being written in.
export function showConversations(rows, { current, writing, confirming, onOpen, onInspect, onDelete, onConfirm,
                                         onCancel }) {
  $("no-conversations").hidden = rows.length > 0;
  keepingFocus($("conversations"), () => rows.map((row) => {
    const title = titleOf(row, rows);
    const item = el("li", { className: row.name === current ? "current" : "", dataset: { name: row.name } });
    if (row.name === confirming) {
      item.append(el("span", { className: "ask", textContent: `Delete “${title}”?` }),
                  el("button", { type: "button", className: "confirm-delete", textContent: "Delete",
                                 dataset: { focus: `confirm:${row.name}` }, onclick: () => onConfirm(row.name) }),
                  el("button", { type: "button", className: "cancel-delete", textContent: "Cancel",
                                 dataset: { focus: `cancel:${row.name}` }, onclick: () => onCancel(row.name) }));
      return item;
    }
    const open = el("button", { type: "button", className: "open", dataset: { focus: `open:${row.name}` },
                                onclick: () => onOpen(row.name) }, title);
    if (row.name === current) open.setAttribute("aria-current", "true");
    const state = label(row, writing);
    const meta = el("span", { className: "meta", textContent: [state, row.tokens ? `${row.tokens} tokens` : "",
      row.updated_ms ? new Date(row.updated_ms).toLocaleString() : ""].filter(Boolean).join(" · ") });
    const inspect = el("button", { type: "button", className: "inspect", textContent: "Inspect",
                                   dataset: { focus: `inspect:${row.name}` }, onclick: () => onInspect(row.name) });
    inspect.setAttribute("aria-label", `Inspect the checkpoints of ${title}`);
    const del = el("button", { type: "button", className: "delete", textContent: "Delete",
                               dataset: { focus: `delete:${row.name}` }, onclick: () => onDelete(row.name) });
    del.setAttribute("aria-label", `Delete ${title}`);
    item.append(open, meta, el("span", { className: "actions" }, inspect, del));
    return item;
  }));
}

// A problem a person can act on: what happened, and buttons for what can be done ({id, label, run}).
export function showProblem(problem, actions = []) {
  $("problem").hidden = problem === null;
  if (problem === null) return;
  $("problem-title").textContent = problem.title;
  $("problem-text").textContent = problem.message;
  $("problem-actions").replaceChildren(...actions.map(({ id, label: text, run }) =>
    el("button", { type: "button", id, textContent: text, onclick: run })));
}

const STAGES = { python: [0, 0.3, "starting Python"], packages: [0.3, 0.4, "installing kvckpt_web"],
                 weights: [0.4, 0.6, "reading the weights"], upload: [0.6, 0.85, "uploading the weights to the GPU"],
                 engine: [0.85, 0.87, "opening the engine"], kernels: [0.87, 1, "building the model's GPU kernels"] };

// The engine's start, stage by stage (onProgress of createEngine), on the progress bar.
export function showProgress(p) {
  const [from, to, text] = STAGES[p.stage] ?? [0, 0, p.stage];
  const part = p.total > 0 ? Math.min(1, p.done / p.total) : 0;
  $("load-bar").value = from + (to - from) * part;
  const step = `${Object.keys(STAGES).indexOf(p.stage) + 1}/${Object.keys(STAGES).length}`;
  let detail = "";
  if (p.stage === "weights" && p.total) {
    detail = `: ${(p.done / 2 ** 20).toFixed(0)} of ${(p.total / 2 ** 20).toFixed(0)} MiB ` +
             (p.source === "cache" ? "from the browser's cache" : "downloaded");
  } else if (p.stage === "upload" && p.total > 1) {
    detail = `: part ${p.done} of ${p.total}`;
  }
  $("load-text").textContent = `${text}${detail} (${step})`;
}
