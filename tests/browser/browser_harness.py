"""The browser test harness (its fixtures are re-exported by conftest.py): a local server, headless
Chromium (SwiftShader WebGPU) driven by Python Playwright, and a page that boots Pyodide and installs
the kvckpt_web wheel built from this tree. Chromium, its flags and the pages are the browser benchmark's
(``kvckpt_web.bench.chromium`` and ``pages``, which say what they need); without what they need the browser
tests are skipped -- or fail when ``KVCKPT_REQUIRE_GPU=1``.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from kvckpt_web.bench import pages
from kvckpt_web.bench.chromium import (BOOT_TIMEOUT_MS, REPO, CDPChromium, build_wheel,  # noqa: F401
                                       chromium_flags, find_chromium, headless_context, pyodide_dir, wheels_dir)

HERE = Path(__file__).resolve().parent
CHROMIUM_FLAGS = chromium_flags()


def gpu_required() -> bool:
    return os.environ.get("KVCKPT_REQUIRE_GPU") == "1"


def unavailable(reason: str) -> None:
    """Skip (developer machine) or fail (CI, KVCKPT_REQUIRE_GPU=1) for a missing browser prerequisite."""
    if gpu_required():
        pytest.fail(f"KVCKPT_REQUIRE_GPU=1 but the browser tests cannot run: {reason}", pytrace=False)
    pytest.skip(f"browser tests need {reason}")


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
    ctx = headless_context(playwright_instance, browser_prereqs["chromium"], profile)
    yield ctx
    ctx.close()


class PyPage(pages.PyPage):
    """The benchmark's page, with the ``kvtest`` helpers installed at each boot."""

    def boot(self) -> "PyPage":
        """(Re)load the page, wait for Pyodide + kvckpt_web, install the ``kvtest`` helpers."""
        super().boot()
        self.page.evaluate("""async (src) => { const kv = await window.kvckpt;
            kv.pyodide.FS.writeFile('/home/pyodide/kvtest.py', src); }""", (HERE / "kvtest.py").read_text())
        self.run("import sys, importlib\nif '/home/pyodide' not in sys.path: sys.path.insert(0, '/home/pyodide')\n"
                 "importlib.invalidate_caches()\nimport kvtest")
        return self


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
