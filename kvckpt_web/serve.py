"""``kvckpt serve``: a small offline web server for the browser runtime.

It serves, from one origin on 127.0.0.1 (a secure context, as WebGPU, IndexedDB
and OPFS require):

* ``/`` -- the page and the ES module of ``kvckpt_web/web`` (``index.html``, ``kvckpt.mjs``);
* ``/pyodide/`` -- the files of the pinned npm package ``pyodide`` (no CDN);
* ``/wheels/`` -- pure-Python wheels (micropip, packaging, kvckpt_web, ...) from one or more
  directories, plus ``/wheels/index.json`` listing them, which the page uses to find them.

Nothing here runs in Pyodide.
"""

from __future__ import annotations

import json
import os
import posixpath
import threading
import urllib.parse
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from .errors import FieldError, KVCkptError

WEB_DIR = Path(__file__).resolve().parent / "web"
DEFAULT_PYODIDE = Path("build/web/node_modules/pyodide")
DEFAULT_WHEELS = Path("build/web/wheels")

_TYPES = {".mjs": "text/javascript", ".js": "text/javascript", ".wasm": "application/wasm",
          ".whl": "application/zip", ".json": "application/json", ".zip": "application/zip",
          ".html": "text/html; charset=utf-8", ".map": "application/json"}


class _Handler(SimpleHTTPRequestHandler):
    pyodide_dir: Path
    wheel_dirs: list[Path]

    def __init__(self, *args, pyodide_dir: Path, wheel_dirs: list[Path], **kwargs) -> None:
        self.pyodide_dir = pyodide_dir
        self.wheel_dirs = wheel_dirs
        super().__init__(*args, directory=str(WEB_DIR), **kwargs)

    def log_message(self, format: str, *args) -> None:  # quiet
        pass

    def end_headers(self) -> None:
        self.send_header("Cache-Control", "no-cache")
        super().end_headers()

    def guess_type(self, path: str) -> str:
        return _TYPES.get(posixpath.splitext(path)[1].lower()) or super().guess_type(path)

    def _wheels(self) -> dict[str, Path]:
        found: dict[str, Path] = {}
        for d in self.wheel_dirs:
            if d.is_dir():
                for p in sorted(d.glob("*.whl")):
                    found.setdefault(p.name, p)
        return found

    def do_GET(self) -> None:
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        if path == "/wheels/index.json":
            body = json.dumps({"wheels": sorted(self._wheels())}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        super().do_GET()

    def translate_path(self, path: str) -> str:
        path = urllib.parse.unquote(urllib.parse.urlsplit(path).path)
        if "\x00" in path:  # no file has such a name: answer 404 instead of failing in open()
            return str(WEB_DIR / "__missing__")
        parts = [p for p in path.split("/") if p and p not in (".", "..")]
        if parts[:1] == ["pyodide"]:
            return str(self.pyodide_dir.joinpath(*parts[1:]))
        if parts[:1] == ["wheels"]:
            wheel = self._wheels().get("/".join(parts[1:]))
            return str(wheel) if wheel else str(WEB_DIR / "__missing__")
        if not parts:
            return str(WEB_DIR / "index.html")
        return str(WEB_DIR.joinpath(*parts))


def make_server(pyodide_dir: str | os.PathLike[str] = DEFAULT_PYODIDE,
                wheel_dirs: list[str | os.PathLike[str]] | None = None, *, host: str = "127.0.0.1",
                port: int = 8000) -> ThreadingHTTPServer:
    """A (not yet started) HTTP server for the browser runtime; ``port=0`` picks a free port.

    KVCkptError if it cannot listen there (a bad port or host, a port in use).
    """
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise FieldError("port", "an integer in [0, 65535]", port)
    if "\x00" in host:
        raise FieldError("host", "a host name or address", host)
    pyodide = Path(pyodide_dir).resolve()
    if not (pyodide / "pyodide.mjs").is_file():
        raise KVCkptError(f"pyodide directory {pyodide}: expected the npm package pyodide (pyodide.mjs), got none; "
                          "run `make web-deps` or `npm install --prefix build/web pyodide@314.0.7`")
    wheels = [Path(d).resolve() for d in (wheel_dirs if wheel_dirs is not None else [DEFAULT_WHEELS])]
    handler = partial(_Handler, pyodide_dir=pyodide, wheel_dirs=wheels)
    try:
        server = ThreadingHTTPServer((host, port), handler)
    except (OSError, UnicodeError) as exc:  # socket.gaierror for a host, EADDRINUSE, EACCES; an IDNA-invalid host
        raise KVCkptError(f"serve on {host}:{port}: cannot listen ({getattr(exc, 'strerror', None) or exc})") from exc
    server.daemon_threads = True
    return server


def serve_in_thread(*args, **kwargs) -> tuple[ThreadingHTTPServer, str]:
    """Start :func:`make_server` in a daemon thread; returns the server and its base URL."""
    server = make_server(*args, **kwargs)
    threading.Thread(target=server.serve_forever, daemon=True, name="kvckpt-serve").start()
    host, port = server.server_address[:2]
    return server, f"http://{host}:{port}/"
