// Continue on another device: the open conversation pushed to the store this page's server serves (kvckpt serve
// --page examples/chat --store DIR --token T), and on the other device pulled from there by its name and opened, its
// K/V restored from the store at its next turn instead of computed. The token is entered once per device and kept in
// localStorage once the server accepted it (never in a link: the link the page shows holds the name alone).
import { kib, ms } from "./figures.mjs";
import { $ } from "./view.mjs";

const TOKEN_KEY = "kvckpt-chat:store-token";
const LINK_KEY = "pull=";   // #pull=<name>: the link another device opens
const SERVED = "Check the store token, and that this page's server serves a store (kvckpt serve --page " +
  "examples/chat --store DIR --token T).";

const moved = (r) => (r.copied ? `${r.chunks_sent} chunks (${kib(r.bytes_sent)}) in ${ms(r.ms)}, ` +
  `${r.chunks_present} already there` : "nothing moved: the other side held this generation already");

// A link from another device (#pull=<name>) fills in the name to pull; Pull and open is then one click.
function fromLink() {
  if (!location.hash.startsWith(`#${LINK_KEY}`)) return;
  const name = location.hash.slice(LINK_KEY.length + 1);
  try { $("pull-name").value = decodeURIComponent(name); } catch { $("pull-name").value = name; }
  $("device").open = true;
}

// Set up the controls of another device on the page (page.mjs's Page); a conversation pulled is listed and opened
// with `conversations` (conversations.mjs).
export function setUpDevices(page, conversations) {
  const { state } = page;

  // The token to send, or null (the field is empty: the page says so and puts the focus there).
  function token() {
    const value = $("store-token").value.trim();
    if (value) return value;
    $("device").open = true;
    page.problem("remote", "Enter the store token", { message: "Moving a conversation between devices needs the " +
      "token this page's server was started with (kvckpt serve --token T): enter it under Another device, then try " +
      "again." });
    $("store-token").focus();
    return null;
  }

  // Run `move()` (`kind` "push" or "pull") with the controls that must wait disabled and its progress shown, what the
  // last one of its kind moved forgotten.
  async function moving(kind, text, move) {
    const shown = `${kind}ed`;   // state.device.pushed, #pushed; state.device.pulled, #pulled
    page.clearProblem();
    state.device[shown] = null;
    $(shown).hidden = true;
    state.device.busy = kind;
    $("device-status").hidden = false;
    $("device-status").textContent = text;
    page.announce(text);
    page.updateControls();
    try {
      return await move();
    } finally {
      state.device.busy = null;
      $("device-status").hidden = true;
      page.updateControls();
    }
  }

  function failed(title, error, message, actions) {
    state.errors.push(error);
    page.problem("remote", title, { name: error.name, field: error.field, message }, actions);
  }

  // Push conversation `name` (the open one); show what was sent and what the other device uses to pull it.
  async function push(name = state.conversation) {
    const key = token();
    if (!name || key === null) return;
    let sent;
    try {
      sent = await moving("push", `sending ${name} to the server…`, () => page.engine.push(name, { token: key }));
    } catch (error) {
      const retry = { id: "retry-push", label: "Retry", run: () => push(name) };
      if (error.name === "ConflictError") {
        return failed("The conversation was not sent", error, `${error.message}. Another device went on with this ` +
          "conversation from where this one is: pull the server's copy to go on from there, or start a new " +
          "conversation here.",
          [retry, { id: "pull-instead", label: "Pull the server's copy", run: () => pull(name) }]);
      }
      const hint = error.name === "StoreError" ? ` ${SERVED}` : "";
      return failed("The conversation was not sent", error, `${error.message}.${hint}`, [retry]);
    }
    localStorage.setItem(TOKEN_KEY, key);
    state.device.pushed = sent;
    const link = new URL(location.pathname, location.href);
    link.hash = LINK_KEY + encodeURIComponent(sent.name);
    // A copy that went apart from the server's (another device went on with the conversation its own way) was sent
    // under a name of its own, beside the server's copy: nothing there was overwritten.
    $("pushed-text").textContent = (sent.apart_from ? `This device's copy of ${sent.apart_from} went apart from the ` +
      `server's (another device went on with it its own way): nothing was overwritten, both are kept there, this ` +
      `one as ${sent.name}. ` : "") + `Sent generation ${sent.generation} of ${sent.name}: ${moved(sent)}.`;
    $("pushed-name").textContent = sent.name;
    $("pushed-link").href = link.href;
    $("pushed-link").textContent = link.href;
    $("pushed").hidden = false;
    $("device").open = true;
    page.announce(`Sent: ${moved(sent)}. On the other device, pull ${sent.name}`);
    $("pushed-link").focus();
  }

  // Pull conversation `name` from the server into this device's store and open it.
  async function pull(name) {
    if (!name) {
      page.problem("remote", "Enter the conversation's name", { message: "Pull needs the name the other device shows " +
        "after Continue on another device (or open the link it shows)." });
      return $("pull-name").focus();
    }
    const key = token();
    if (key === null) return;
    let got;
    try {
      got = await moving("pull", `pulling ${name} from the server…`, () => page.engine.pull(name, { token: key }));
    } catch (error) {
      const retry = { id: "retry-pull", label: "Retry", run: () => pull(name) };
      const why = {
        NotFoundError: `No conversation ${name} on this server (${error.message}). Check the name the other device ` +
          "shows after Continue on another device, and that its push finished.",
        ConflictError: `${error.message}. This device's copy of ${name} goes on from the server's (or a reply is ` +
          "being written in it): open it from the list; the server's copy stays there.",
        StoreError: `${error.message}. ${SERVED}`,
      }[error.name] ?? `${error.message}.`;
      return failed(error.name === "NotFoundError" ? "Not on the server" : "The conversation was not pulled", error,
                    why, [retry]);
    }
    localStorage.setItem(TOKEN_KEY, key);
    $("pulled").textContent = `Pulled generation ${got.generation} of ${got.name}: ${moved(got)}. Its next turn ` +
      "restores its history from this device's store instead of computing it again.";
    $("pulled").hidden = false;
    await conversations.refresh();
    if (got.apart_from) return keptApart(got);
    await conversations.openConversation(name);
    state.device.pulled = got;   // and open
    page.announce(`Pulled ${name}: continue it here`);
    $("prompt").focus();
  }

  // The server's copy of a conversation went apart from this device's (each device went on with it its own way): it
  // was kept here under a name of its own, beside this device's, which stays as it was. Both are listed; say so and
  // offer to open either.
  function keptApart(got) {
    const mine = got.apart_from;
    page.problem("apart", "Two copies of this conversation are kept", { message: `The server's copy of ${mine} and ` +
      `this device's went apart: each device went on with the conversation its own way. Nothing was overwritten: the ` +
      `server's copy (generation ${got.generation}) is kept here as ${got.name}, beside this device's ${mine}; both ` +
      "are in the list." }, [
      { id: "open-theirs", label: "Open the server's copy", run: () => conversations.openConversation(got.name) },
      { id: "open-mine", label: "Open this device's copy", run: () => conversations.openConversation(mine) }]);
    state.device.pulled = got;
    $("open-theirs").focus();
  }

  function forget() {
    localStorage.removeItem(TOKEN_KEY);
    $("store-token").value = "";
    page.announce("The store token was forgotten on this device");
    $("store-token").focus();
  }

  $("store-token").value = localStorage.getItem(TOKEN_KEY) ?? "";
  $("forget-token").onclick = forget;
  $("push").onclick = () => push();
  $("pull-form").onsubmit = (e) => { e.preventDefault(); pull($("pull-name").value.trim()); };
  window.addEventListener("hashchange", fromLink);
  fromLink();
}
