"""Headless Chromium (SwiftShader WebGPU) driven by Python Playwright, as the browser benchmark and the browser
tests run it: where its binary, Pyodide and the wheels it is served are, its flags, and a Chromium started as a
process of our own (so that it can be killed).

Needs, from a source checkout: a ``chromium`` binary (``KVCKPT_CHROMIUM`` or on PATH), the npm package pyodide
(``KVCKPT_PYODIDE`` or ``build/web/node_modules/pyodide``), pure wheels of micropip and packaging
(``KVCKPT_WHEELS`` or ``build/web/wheels``; ``make web-deps`` fetches all three) and Python ``playwright``.
Playwright's own browser downloads are never used: Chromium is the system one.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from ..server.wheel import build_wheel as build

REPO = Path(__file__).resolve().parents[2]
"""The source checkout this package runs from."""
BOOT_TIMEOUT_MS = 120_000


def chromium_flags(*, webgpu: bool = True) -> list[str]:
    """The flags verified for headless Chromium here: WebGPU on SwiftShader (unless ``webgpu`` is False, as a
    browser with WebGPU off), offline; without the sandbox when run as root."""
    flags = ["--enable-unsafe-webgpu"] if webgpu else []
    flags += ["--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-quic",
              "--no-first-run", "--no-default-browser-check", "--disable-dev-shm-usage"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        flags.append("--no-sandbox")
    return flags


def find_chromium() -> str | None:
    """``KVCKPT_CHROMIUM`` if it exists, else the first Chromium on PATH; None without one."""
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
    return build(REPO, out)


def headless_context(playwright: Any, chromium: str, profile: Path) -> Any:
    """A headless Chromium with the persistent profile ``profile`` (storage survives navigation)."""
    return playwright.chromium.launch_persistent_context(str(profile), executable_path=chromium, headless=True,
                                                         args=chromium_flags())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class CDPChromium:
    """A Chromium we start ourselves (so we can SIGKILL it), driven over CDP by Playwright."""

    def __init__(self, chromium: str, profile: Path, playwright: Any, *, webgpu: bool = True) -> None:
        """``webgpu=False``: without ``--enable-unsafe-webgpu``, as a browser with WebGPU off."""
        self.port = free_port()
        self.proc = subprocess.Popen(
            [chromium, "--headless", *chromium_flags(webgpu=webgpu), f"--user-data-dir={profile}",
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
