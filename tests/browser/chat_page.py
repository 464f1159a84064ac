"""Harness of the chat page tests: the page of ``examples/chat`` served with a model file the test controls (the tiny
random llama, another tiny one, the real SmolLM2, or none), and a driver that uses it as a person would: the browser
benchmark's (``kvckpt_web.bench.pages.ChatPage``) with the controls only tests use.

A reply is cut where the test chooses: ``hold_after(k)`` holds the engine's worker once the reply holds k tokens (its
autosaves up to there done), and the test then crashes it, kills the browser or reloads -- never after a sleep.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from kvckpt_web.bench import pages

from .browser_harness import CDPChromium

REPO = Path(__file__).resolve().parents[2]
CHAT_DIR = REPO / "examples" / "chat"
sys.path.insert(0, str(REPO / "tests" / "model"))  # tiny_llama and the reference it is built from

from tiny_llama import write_tiny_llama  # noqa: E402

CONTROL_ROLES = {"button", "textbox", "combobox", "spinbutton", "radio", "checkbox", "progressbar",
                 "DisclosureTriangle", "link"}


class ChatServer:
    """A server of the chat page whose ``/model.gguf`` is the file at ``model_path`` (which tests replace); with a
    ``token``, it serves the FileStore ``store`` too (``kvckpt serve --store DIR --token T``)."""

    def __init__(self, url: str, model_path: Path, store: Any = None, token: str | None = None) -> None:
        self.url = url
        self.model_path = model_path
        self.store = store
        self.token = token

    def use_tiny(self, seed: int = 0) -> None:
        """The tiny llama of ``seed`` (another seed: other weights, another model identity)."""
        write_tiny_llama(self.model_path, seed=seed)

    def use_file(self, path: Path) -> None:
        shutil.copyfile(path, self.model_path)

    def remove_model(self) -> None:
        self.model_path.unlink(missing_ok=True)


@contextmanager
def chat_served(browser_prereqs, fresh_wheel, directory: Path, *, token: str | None = None) -> Iterator[ChatServer]:
    """The chat page served with the tiny llama (in ``directory``), and with a ``token``, a FileStore there too."""
    from kvckpt_web.server.run import serve_in_thread
    from kvckpt_web.server.store_routes import StoreRoutes
    from kvckpt_web.stores.file import FileStore

    model = directory / "model.gguf"
    write_tiny_llama(model)
    store = FileStore(directory / "served-store") if token is not None else None
    server, url = serve_in_thread(browser_prereqs["pyodide"], [fresh_wheel, browser_prereqs["wheels"]], port=0,
                                  page_dir=CHAT_DIR, model=model,
                                  routes=StoreRoutes(store, token).routes() if store is not None else ())
    try:
        yield ChatServer(url, model, store, token)
    finally:
        server.shutdown()


@pytest.fixture
def chat_server(browser_prereqs, fresh_wheel, tmp_path) -> ChatServer:
    with chat_served(browser_prereqs, fresh_wheel, tmp_path) as served:
        yield served


@contextmanager
def chromium_of(browser_prereqs, playwright, profile: Path) -> Iterator[CDPChromium]:
    """A Chromium of its own on ``profile`` (a device), closed afterwards."""
    chromium = CDPChromium(browser_prereqs["chromium"], profile, playwright)
    try:
        yield chromium
    finally:
        chromium.close()


@pytest.fixture
def chat_browser(browser_prereqs, playwright_instance, tmp_path) -> Iterator[CDPChromium]:
    """A Chromium of the test's own (its profile in ``tmp_path / "profile"``), closed after the test."""
    with chromium_of(browser_prereqs, playwright_instance, tmp_path / "profile") as chromium:
        yield chromium


class ChatPage(pages.ChatPage):
    """The chat page in a tab, as the benchmark drives it, and: restart its engine, crash and reopen it, continue on
    another device, read its problem's actions, its accessibility tree and its conversations."""

    def restart_engine(self, *, store: str = "indexeddb", every: int = 8) -> None:
        """Choose the store and the autosave interval, and restart the engine with them."""
        self.open_settings()
        self.page.select_option("#store", store)
        self.page.fill("#every", str(every))
        self.page.click("#apply-engine")
        self.settle()

    def reply_to(self, text: str) -> dict[str, Any]:
        """Send ``text`` and wait until the reply ends; the state then."""
        self.send(text)
        self.wait("d => d.phase === 'ready' && d.finishReason !== null")
        return self.state()

    def crash(self) -> None:
        """The page's Crash control (the engine's worker is terminated)."""
        self.page.click("#crash")
        self.wait("d => d.phase === 'crashed'")

    def reopen(self) -> None:
        """Reopen after a crash (a new worker, as a reopened tab); wait until the page settled."""
        self.page.click("#reopen")
        self.settle()

    def open_device(self) -> None:
        if not self.page.evaluate("document.getElementById('device').open"):
            self.page.click("#device summary")

    def push(self, token: str) -> dict[str, Any]:
        """Continue on another device with the store ``token``: wait until the push ended; the state then."""
        self.open_device()
        self.page.fill("#store-token", token)
        self.page.click("#push")
        self.wait("d => d.device.busy === null && (d.device.pushed !== null || d.problem !== null)")
        return self.state()

    def pull(self, name: str, token: str) -> dict[str, Any]:
        """Pull conversation ``name`` with the store ``token``: wait until it is open here, or the pull failed; the
        state then."""
        self.open_device()
        self.page.fill("#store-token", token)
        self.page.fill("#pull-name", name)
        self.page.click("#pull")
        self.wait("d => d.device.busy === null && (d.device.pulled !== null || d.problem !== null)")
        return self.state()

    def offered(self) -> set[str]:
        """The ids of the problem's action buttons a person sees."""
        return set(self.page.evaluate("""() => [...document.querySelectorAll("#problem-actions button")]
            .filter((b) => b.offsetParent !== null).map((b) => b.id)"""))

    def controls(self, browser: CDPChromium) -> tuple[int, list[str]]:
        """How many controls the accessibility tree holds, and the roles of those without a name."""
        nodes = browser.context.new_cdp_session(self.page).send("Accessibility.getFullAXTree")["nodes"]
        controls = [n for n in nodes if not n.get("ignored") and n.get("role", {}).get("value") in CONTROL_ROLES]
        return len(controls), [n["role"]["value"] for n in controls if not n.get("name", {}).get("value", "").strip()]

    def conversation(self, name: str) -> dict[str, Any]:
        rows = [row for row in self.state()["conversations"] if row["name"] == name]
        assert rows, f"{name} is not listed: {self.state()['conversations']}"
        return rows[0]

    def open_conversation(self, name: str) -> None:
        self.page.click(f"#conversations li[data-name='{name}'] .open")
        self.wait(f"d => d.conversation === '{name}' && ['ready', 'stopped'].includes(d.phase)")


def open_chat(browser: CDPChromium, url: str) -> ChatPage:
    return ChatPage(browser.context.new_page(), url)


def uninterrupted(browser_prereqs, playwright, url: str, profile: Path, turns: list[str], *, max_tokens: int,
                  every: int = 8, **settings) -> list[list[int]]:
    """The reply ids of every turn of ``turns``, never interrupted, in a browser (and a store) of their own."""
    browser = CDPChromium(browser_prereqs["chromium"], profile, playwright)
    try:
        page = open_chat(browser, url).open(every=every)
        page.configure(max_tokens=max_tokens, **settings)
        return [page.reply_to(text)["replyIds"] for text in turns]
    finally:
        browser.close()


def user_turns(n: int) -> list[str]:
    """``n`` user messages, different each."""
    return [f"tell me about the sea, part {i + 1}." for i in range(n)]


OPEN_DB = """
    const db = await new Promise((ok, fail) => {
        const r = indexedDB.open("kvckpt-demo"); r.onsuccess = () => ok(r.result); r.onerror = () => fail(r.error);
    });
"""  # JS statements: ``db``, the page's IndexedDB database

# The page's IndexedDB store, edited from the page's main thread as something outside the page would (a damaged
# disk, a lost write): ``[key, action]`` where action is "flip" (one byte of the record changed), "delete" or
# "garbage" (the record replaced by bytes that are no checkpoint record).
EDIT_RECORD = "async ([key, action]) => {" + OPEN_DB + """
    const done = (request) => new Promise((ok, fail) => { request.onsuccess = () => ok(request.result);
                                                          request.onerror = () => fail(request.error); });
    const store = db.transaction("kv", "readwrite").objectStore("kv");
    const value = await done(store.get(key));
    if (value === undefined) throw new Error(`no record ${key}`);
    if (action === "delete") await done(store.delete(key));
    else if (action === "garbage") await done(store.put(new TextEncoder().encode("not a manifest"), key));
    else { const bytes = new Uint8Array(value); bytes[bytes.length >> 1] ^= 0xff; await done(store.put(bytes, key)); }
    db.close();
}"""

# The records of the page's IndexedDB store: {key: the record's bytes as text (latin-1)} for manifests, the keys
# alone (value null) for chunks.
READ_RECORDS = "async () => {" + OPEN_DB + """
    const store = db.transaction("kv").objectStore("kv");
    const [keys, values] = await Promise.all([store.getAllKeys(), store.getAll()].map((request) =>
        new Promise((ok, fail) => { request.onsuccess = () => ok(request.result); request.onerror = fail; })));
    db.close();
    return Object.fromEntries(keys.map((k, i) => [k, k.startsWith("manifests/")
        ? String.fromCharCode(...new Uint8Array(values[i])) : null]));
}"""


def edit_record(page: ChatPage, key: str, action: str) -> None:
    """Change one record of the page's IndexedDB store behind the page's back (see EDIT_RECORD)."""
    page.page.evaluate(EDIT_RECORD, [key, action])


def stored_records(page: ChatPage) -> dict[str, str | None]:
    """The records of the page's IndexedDB store (see READ_RECORDS)."""
    return page.page.evaluate(READ_RECORDS)
