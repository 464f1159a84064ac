"""Harness of the crash-resume page tests: the page of ``examples/crash_resume`` served with a model file the
test controls (the tiny random llama, another tiny one, the real SmolLM2, or none), and a driver for it.

``window.demo`` (app.mjs) mirrors what the page shows; the driver waits on it and clicks what a person would.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from .browser_harness import CDPChromium

REPO = Path(__file__).resolve().parents[2]
DEMO_DIR = REPO / "examples" / "crash_resume"
sys.path.insert(0, str(REPO / "tests" / "model"))  # tiny_llama and the reference it is built from

from tiny_llama import write_tiny_llama  # noqa: E402

PHASE_MS = 240_000
SETTLED = ("ready", "finished", "paused", "stopped")


class DemoServer:
    """A server of the demo page whose ``/model.gguf`` is the file at ``model_path`` (which tests replace)."""

    def __init__(self, url: str, model_path: Path) -> None:
        self.url = url
        self.model_path = model_path

    def use_tiny(self, seed: int = 0) -> None:
        """The tiny llama of ``seed`` (another seed: other weights, another model identity)."""
        write_tiny_llama(self.model_path, seed=seed)

    def use_file(self, path: Path) -> None:
        shutil.copyfile(path, self.model_path)

    def remove_model(self) -> None:
        self.model_path.unlink(missing_ok=True)


@pytest.fixture
def demo_server(browser_prereqs, fresh_wheel, tmp_path) -> DemoServer:
    from kvckpt_web.server.run import serve_in_thread

    model = tmp_path / "model.gguf"
    write_tiny_llama(model)
    server, url = serve_in_thread(browser_prereqs["pyodide"], [fresh_wheel, browser_prereqs["wheels"]], port=0,
                                  page_dir=DEMO_DIR, model=model)
    yield DemoServer(url, model)
    server.shutdown()


class DemoPage:
    """The demo page in a tab: open it, set its controls, generate, crash, read ``window.demo``."""

    def __init__(self, page, url: str) -> None:
        self.page = page
        self.url = url
        self.console: list[str] = []
        page.on("console", lambda msg: self.console.append(f"{msg.type}: {msg.text}"))
        page.on("pageerror", lambda err: self.console.append(f"pageerror: {err}"))

    def open(self) -> "DemoPage":
        """Load the page and wait until it settled: ready, or done with what it resumed, or stopped."""
        self.page.goto(self.url)
        return self.settle()

    def settle(self, timeout_ms: int = PHASE_MS) -> "DemoPage":
        """Wait until the page is idle or shows a problem."""
        self.wait(f"d => {list(SETTLED)}.includes(d.phase) || d.problem !== null", timeout_ms)
        return self

    def wait(self, predicate: str, timeout_ms: int = PHASE_MS) -> None:
        """Wait for ``predicate`` (a JS function of ``window.demo``) to hold."""
        try:
            self.page.wait_for_function(f"() => ({predicate})(window.demo)", timeout=timeout_ms)
        except Exception as exc:
            raise AssertionError(f"{predicate} never held: {exc}\nstate: {self.state()}\nconsole:\n"
                                 + "\n".join(self.console[-20:])) from None

    def state(self) -> dict[str, Any]:
        return self.page.evaluate("() => JSON.parse(JSON.stringify(window.demo))")

    def configure(self, *, max_tokens: int, every: int, seed: int | None = None, store: str = "indexeddb",
                  prompt: str = "Tell me a story about the sea.") -> None:
        """Set the controls: greedy, or seeded temperature sampling when ``seed`` is given."""
        self.page.fill("#prompt", prompt)
        self.page.fill("#max-tokens", str(max_tokens))
        self.page.fill("#every", str(every))
        self.page.select_option("#store", store)
        if seed is not None:
            self.page.check("input[name=mode][value=sample]")
            self.page.fill("#seed", str(seed))

    def generate(self) -> None:
        state = self.state()
        if state["problem"] is not None or state["model"] is None:
            raise AssertionError(f"the page cannot generate: {state}\nconsole:\n" + "\n".join(self.console[-20:]))
        self.page.click("#generate")

    def crash_and_reopen(self, after_tokens: int) -> None:
        """Generate until ``after_tokens`` tokens and a checkpoint exist, press Crash (the worker is terminated),
        then Reopen (a new worker, as a reopened tab)."""
        self.generate()
        self.wait(f"d => d.tokens >= {after_tokens} && d.committed !== null")
        self.page.click("#crash")
        self.wait("d => d.phase === 'crashed'")
        self.page.click("#fresh")

    def run_to_end(self) -> dict[str, Any]:
        """Generate with the current settings until the reply ends; the final state."""
        self.generate()
        self.wait("d => d.phase === 'finished'")
        return self.state()


def open_demo(browser: CDPChromium, url: str) -> DemoPage:
    return DemoPage(browser.context.new_page(), url)


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


def edit_record(page: DemoPage, key: str, action: str) -> None:
    """Change one record of the page's IndexedDB store behind the page's back (see EDIT_RECORD)."""
    page.page.evaluate(EDIT_RECORD, [key, action])


def stored_records(page: DemoPage) -> dict[str, str | None]:
    """The records of the page's IndexedDB store (see READ_RECORDS)."""
    return page.page.evaluate(READ_RECORDS)
