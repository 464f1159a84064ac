"""Pages in headless Chromium, driven as the browser benchmark and the browser tests use them: a page running
kvckpt_web in Pyodide (:class:`PyPage`), and the chat page of ``examples/chat`` used as a person would
(:class:`ChatPage`).

``window.chatPage.state`` (the chat page's app.mjs) mirrors what the chat page shows; the driver waits on it and
clicks what a person would. A reply is cut where the caller chooses: ``hold_after(k)`` holds the engine's worker
once the reply holds k tokens (its autosaves up to there done; :mod:`.holding`) -- never after a sleep.
"""

from __future__ import annotations

import base64
import os
import textwrap
from typing import Any

from .chromium import BOOT_TIMEOUT_MS
from .holding import HOLD_REPLIES

PHASE_MS = int(os.environ.get("KVCKPT_PHASE_MS", 240_000))
"""How long the chat page may take to reach a state it is waited for (``KVCKPT_PHASE_MS``)."""
SETTLED = ("ready", "stopped", "crashed")


def console_of(page: Any) -> list[str]:
    """A list that ``page``'s console messages and uncaught errors are appended to as they come."""
    lines: list[str] = []
    page.on("console", lambda msg: lines.append(f"{msg.type}: {msg.text}"))
    page.on("pageerror", lambda err: lines.append(f"pageerror: {err}"))
    return lines


class PyPage:
    """A page running kvckpt_web in Pyodide; :meth:`run` executes Python there and returns its ``result``."""

    def __init__(self, page: Any, base_url: str) -> None:
        self.page = page
        self.base_url = base_url
        self.console = console_of(page)

    def boot(self) -> "PyPage":
        """(Re)load the page and wait for Pyodide + kvckpt_web."""
        self.page.goto(self.base_url, timeout=BOOT_TIMEOUT_MS)
        try:
            self.page.evaluate("() => window.kvckpt.then(() => true)")
        except Exception as exc:
            raise RuntimeError(f"page boot failed: {exc}\nconsole:\n" + "\n".join(self.console[-30:])) from None
        return self

    def write_file(self, path: str, data: bytes, chunk: int = 8 << 20) -> None:
        """Write ``data`` to ``path`` in Pyodide's file system, ``chunk`` bytes (as base64) per page call.

        (Chunked: Playwright answering a fetch with a ~100 MB file closed the page.)"""
        for offset in range(0, max(len(data), 1), chunk):
            self.page.evaluate("""async ([path, text, offset]) => { const kv = await window.kvckpt;
                const bin = atob(text), bytes = new Uint8Array(bin.length);
                for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
                const stream = kv.pyodide.FS.open(path, offset === 0 ? "w" : "r+");
                try { kv.pyodide.FS.write(stream, bytes, 0, bytes.length, offset); }
                finally { kv.pyodide.FS.close(stream); } }""",
                               [path, base64.b64encode(data[offset:offset + chunk]).decode(), offset])

    def run(self, body: str) -> Any:
        """Run ``body`` (top-level ``await`` allowed) in the page; return the JSON value of its ``result``."""
        src = "import json as _json\nresult = None\n" + textwrap.dedent(body).strip("\n") + "\n_json.dumps(result)\n"
        return self.page.evaluate("(src) => window.runPy(src)", src)


class ChatPage:
    """The chat page in a tab: open it, set its reply's settings, send, hold a reply and release it, read
    ``window.chatPage.state``."""

    def __init__(self, page: Any, url: str) -> None:
        self.page = page
        self.url = url
        self.console = console_of(page)
        page.add_init_script(HOLD_REPLIES)

    def open(self, *, store: str = "indexeddb", every: int = 8, fragment: str = "") -> "ChatPage":
        """Load the page with the engine's store and autosave interval (as its settings remember them), and a
        ``fragment`` (a link's ``#...``), and wait until it settled: ready (after what it resumed), or stopped with a
        problem."""
        self.page.goto(f"{self.url}?store={store}&every={every}{fragment}")
        return self.settle()

    def settle(self, timeout_ms: int = PHASE_MS) -> "ChatPage":
        """Wait until the page is idle (no reply running) or shows a problem."""
        self.wait(f"d => d.opened && ({list(SETTLED)}.includes(d.phase) || d.problem !== null)", timeout_ms)
        return self

    def wait(self, predicate: str, timeout_ms: int = PHASE_MS) -> None:
        """Wait for ``predicate`` (a JS function of ``window.chatPage.state``) to hold."""
        try:
            self.page.wait_for_function(f"() => window.chatPage && ({predicate})(window.chatPage.state)",
                                        timeout=timeout_ms)
        except Exception as exc:
            raise AssertionError(f"{predicate} never held: {exc}\nstate: {self.state()}\nconsole:\n"
                                 + "\n".join(self.console[-20:])) from None

    def state(self) -> dict[str, Any]:
        return self.page.evaluate("() => JSON.parse(JSON.stringify(window.chatPage?.state ?? null))")

    def open_settings(self) -> None:
        if not self.page.evaluate("document.getElementById('settings').open"):
            self.page.click("#settings summary")

    def configure(self, *, max_tokens: int, seed: int | None = None, system: str = "") -> None:
        """Set the reply's settings: greedy, or seeded temperature sampling when ``seed`` is given."""
        self.open_settings()
        self.page.fill("#max-tokens", str(max_tokens))
        self.page.fill("#system", system)
        if seed is not None:
            self.page.check("input[name=mode][value=sample]")
            self.page.fill("#seed", str(seed))
        else:
            self.page.check("input[name=mode][value=greedy]")

    def send(self, text: str) -> None:
        """Type ``text`` and press Enter (the reply starts)."""
        if not self.page.is_enabled("#send"):
            raise AssertionError(f"the page cannot send: {self.state()}\nconsole:\n" + "\n".join(self.console[-20:]))
        self.page.fill("#prompt", text)
        self.page.press("#prompt", "Enter")

    def hold_after(self, tokens: int) -> None:
        """The next reply holds once it holds ``tokens`` tokens (its autosaves until then done: holding.py)."""
        self.page.evaluate("(k) => window.kvckptHold.hold(k)", tokens)

    def wait_held(self, tokens: int = 0) -> None:
        """Wait until the reply holds and the page shows its ``tokens`` tokens."""
        self.wait(f"d => window.kvckptHold.held !== null && d.replyIds.length >= {tokens}")

    def release(self) -> None:
        """Let the held reply go on."""
        self.page.evaluate("() => window.kvckptHold.release()")

    def send_and_hold(self, text: str, tokens: int) -> dict[str, Any]:
        """Send ``text``, and hold the reply once it holds ``tokens`` tokens; the state then."""
        self.hold_after(tokens)
        self.send(text)
        self.wait_held(tokens)
        return self.state()
