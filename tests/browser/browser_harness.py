"""The browser test harness (its fixtures are re-exported by conftest.py): a local server, headless
Chromium (SwiftShader WebGPU) driven by Python Playwright, and a page that boots Pyodide and installs
the kvckpt_web wheel built from this tree.

Needs: a ``chromium`` binary (``KVCKPT_CHROMIUM`` or on PATH), the npm package pyodide
(``KVCKPT_PYODIDE`` or ``build/web/node_modules/pyodide``), pure wheels of micropip and packaging
(``KVCKPT_WHEELS`` or ``build/web/wheels``; ``make web-deps`` fetches all three) and Python
``playwright``. Without them the browser tests are skipped -- or fail when ``KVCKPT_REQUIRE_GPU=1``.
Playwright's own browser downloads are never used: Chromium is the system one.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent

#: Flags verified for headless Chromium here (see the project notes): WebGPU on SwiftShader, offline.
CHROMIUM_FLAGS = [
    "--enable-unsafe-webgpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-dev-shm-usage",
]
if hasattr(os, "geteuid") and os.geteuid() == 0:
    CHROMIUM_FLAGS.append("--no-sandbox")

BOOT_TIMEOUT_MS = 120_000


def gpu_required() -> bool:
    return os.environ.get("KVCKPT_REQUIRE_GPU") == "1"


def unavailable(reason: str) -> None:
    """Skip (developer machine) or fail (CI, KVCKPT_REQUIRE_GPU=1) for a missing browser prerequisite."""
    if gpu_required():
        pytest.fail(f"KVCKPT_REQUIRE_GPU=1 but the browser tests cannot run: {reason}", pytrace=False)
    pytest.skip(f"browser tests need {reason}")


def find_chromium() -> str | None:
    env = os.environ.get("KVCKPT_CHROMIUM")
    if env:
        return env if os.path.exists(env) else None
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def pyodide_dir() -> Path:
    return Path(os.environ.get("KVCKPT_PYODIDE") or REPO / "build/web/node_modules/pyodide")


def wheels_dir() -> Path:
    return Path(os.environ.get("KVCKPT_WHEELS") or REPO / "build/web/wheels")


def build_wheel(out: Path) -> Path:
    """The kvckpt_web wheel of this source tree (hatchling, no network)."""
    from kvckpt_web.server.wheel import build_wheel as build

    return build(REPO, out)


@pytest.fixture(scope="package")
def browser_prereqs() -> dict[str, Any]:
    chromium = find_chromium()
    if chromium is None:
        unavailable("a chromium binary (apt-get install chromium, or set KVCKPT_CHROMIUM)")
    pyo = pyodide_dir()
    if not (pyo / "pyodide.mjs").is_file():
        unavailable(f"the npm package pyodide in {pyo} (make web-deps)")
    wheels = wheels_dir()
    for name in ("micropip", "packaging"):
        if not list(wheels.glob(f"{name}-*.whl")):
            unavailable(f"a {name} wheel in {wheels} (make web-deps)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        unavailable("Python playwright (pip install playwright; never `playwright install`)")
    try:
        import hatchling  # noqa: F401
    except ImportError:
        unavailable("hatchling in this environment (to build the kvckpt_web wheel offline)")
    return {"chromium": chromium, "pyodide": pyo, "wheels": wheels}


@pytest.fixture(scope="package")
def fresh_wheel(browser_prereqs, tmp_path_factory) -> Path:
    """A directory holding the kvckpt_web wheel of this tree, built once."""
    fresh = tmp_path_factory.mktemp("wheel")
    build_wheel(fresh)
    return fresh


@pytest.fixture(scope="package")
def web_server(browser_prereqs, fresh_wheel) -> str:
    """Base URL of a `kvckpt serve` server on 127.0.0.1 serving Pyodide and a fresh kvckpt_web wheel."""
    from kvckpt_web.server.run import serve_in_thread

    server, url = serve_in_thread(browser_prereqs["pyodide"], [fresh_wheel, browser_prereqs["wheels"]], port=0)
    yield url
    server.shutdown()


@pytest.fixture(scope="package")
def playwright_instance(browser_prereqs):
    from playwright.sync_api import sync_playwright

    pw = sync_playwright().start()
    yield pw
    pw.stop()


@pytest.fixture(scope="package")
def browser_context(playwright_instance, browser_prereqs, tmp_path_factory):
    """A headless Chromium with a persistent profile (storage survives navigation)."""
    profile = tmp_path_factory.mktemp("profile")
    ctx = playwright_instance.chromium.launch_persistent_context(
        str(profile), executable_path=browser_prereqs["chromium"], headless=True, args=CHROMIUM_FLAGS)
    yield ctx
    ctx.close()


class PyPage:
    """A page running kvckpt_web in Pyodide; :meth:`run` executes Python there and returns its ``result``."""

    def __init__(self, page, base_url: str) -> None:
        self.page = page
        self.base_url = base_url
        self.console: list[str] = []
        page.on("console", lambda msg: self.console.append(f"{msg.type}: {msg.text}"))
        page.on("pageerror", lambda err: self.console.append(f"pageerror: {err}"))

    def boot(self) -> "PyPage":
        """(Re)load the page, wait for Pyodide + kvckpt_web, install the ``kvtest`` helpers."""
        self.page.goto(self.base_url, timeout=BOOT_TIMEOUT_MS)
        try:
            self.page.evaluate("() => window.kvckpt.then(() => true)")
        except Exception as exc:
            raise RuntimeError(f"page boot failed: {exc}\nconsole:\n" + "\n".join(self.console[-30:])) from None
        self.page.evaluate("""async (src) => { const kv = await window.kvckpt;
            kv.pyodide.FS.writeFile('/home/pyodide/kvtest.py', src); }""", (HERE / "kvtest.py").read_text())
        self.run("import sys, importlib\nif '/home/pyodide' not in sys.path: sys.path.insert(0, '/home/pyodide')\n"
                 "importlib.invalidate_caches()\nimport kvtest")
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


@pytest.fixture(scope="package")
def py_page(browser_context, web_server) -> PyPage:
    """One booted page for the session, with ``dev`` (a BrowserDevice) opened in its Python globals."""
    page = PyPage(browser_context.new_page(), web_server).boot()
    page.run("""
        from kvckpt_web.gpu.browser import BrowserDevice
        dev = await BrowserDevice.open()
    """)
    return page


def run_desktop(coro: Any) -> Any:
    """asyncio.run in a thread: Playwright's sync API keeps an event loop running in this one."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class CDPChromium:
    """A Chromium we start ourselves (so we can SIGKILL it), driven over CDP by Playwright."""

    def __init__(self, chromium: str, profile: Path, playwright, *, webgpu: bool = True) -> None:
        """``webgpu=False``: without ``--enable-unsafe-webgpu``, as a browser with WebGPU off."""
        self.port = free_port()
        flags = [f for f in CHROMIUM_FLAGS if webgpu or f != "--enable-unsafe-webgpu"]
        self.proc = subprocess.Popen(
            [chromium, "--headless", *flags, f"--user-data-dir={profile}",
             "--remote-debugging-address=127.0.0.1", f"--remote-debugging-port={self.port}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/version", timeout=2) as r:
                    json.load(r)
                break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.kill()
                    raise RuntimeError("chromium with remote debugging did not come up")
                time.sleep(0.2)
        self.browser = playwright.chromium.connect_over_cdp(f"http://127.0.0.1:{self.port}")
        self.context = self.browser.contexts[0]

    def kill(self) -> None:
        """SIGKILL the browser process (then its leftover children, all started by us)."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait(timeout=30)

    def close(self) -> None:
        try:
            self.browser.close()
        except Exception:
            pass
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
