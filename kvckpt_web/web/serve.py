"""``kvckpt serve``: a small offline web server for the browser runtime.

It serves, from one origin on 127.0.0.1 (a secure context, as WebGPU, IndexedDB
and OPFS require):

* ``/`` -- the page and the ES module of ``kvckpt_web/web`` (``index.html``, ``kvckpt.mjs``); with a page
  directory, each path is looked up there first (``/`` is its ``index.html``), then in ``kvckpt_web/web``;
* ``/model.gguf`` -- the model file, if one was given and exists (streamed, never read whole), and
  ``/model.json`` describing it: ``{"available": true, "file": name, "bytes": size}``, or
  ``{"available": false, "expected": path or default name, "hint": how to install it}``;
* ``/pyodide/`` -- the files of the pinned npm package ``pyodide`` (no CDN);
* ``/wheels/`` -- pure-Python wheels (micropip, packaging, kvckpt_web, ...) from one or more
  directories, plus ``/wheels/index.json`` listing them, which the page uses to find them.
  A project's wheels come from the first directory that holds one, so a freshly built
  kvckpt_web wheel put first hides a stale one further on.

Nothing here runs in Pyodide.
"""

from __future__ import annotations

import json
import os
import posixpath
import subprocess
import sys
import threading
import urllib.parse
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from ..errors import FieldError, KVCkptError, is_int
from ..model.loader import DEFAULT_MODEL_FILE, INSTALL_HINT

WEB_DIR = Path(__file__).resolve().parent
DEFAULT_PYODIDE = Path("build/web/node_modules/pyodide")
DEFAULT_WHEELS = Path("build/web/wheels")

_TYPES = {".mjs": "text/javascript", ".js": "text/javascript", ".wasm": "application/wasm",
          ".whl": "application/zip", ".json": "application/json", ".zip": "application/zip",
          ".html": "text/html; charset=utf-8", ".map": "application/json", ".gguf": "application/octet-stream"}
MISSING = WEB_DIR / "__missing__"
"""A path no file has: what a request for something not served resolves to (answered 404)."""


def source_checkout() -> Path | None:
    """The source tree this package runs from (``pyproject.toml`` beside the package), or None when it runs
    from an installed wheel."""
    root = WEB_DIR.parents[1]
    return root if (root / "pyproject.toml").is_file() else None


def build_wheel(source: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """Build the kvckpt_web wheel of the source tree ``source`` into directory ``out`` and return its path
    (hatchling from this environment, no build isolation, no network). KVCkptError if the build fails."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "--no-index", "-w", str(out), str(source)], capture_output=True, text=True)
    wheels = sorted(out.glob("kvckpt_web-*.whl"))
    if build.returncode != 0 or not wheels:
        raise KVCkptError(f"wheel of {source}: expected a kvckpt_web wheel built by pip (hatchling installed), "
                          f"got exit status {build.returncode}: {' '.join(build.stderr.split())[-500:]}")
    return wheels[-1]


def check_page_dir(path: str | os.PathLike[str], field: str = "page_dir") -> Path:
    """``path`` resolved, if it is a directory holding ``index.html``; FieldError naming ``field`` if not."""
    page = Path(path).resolve()
    if not (page / "index.html").is_file():
        raise FieldError(field, "a page directory holding index.html", str(path),
                         "not a directory" if not page.is_dir() else "no index.html in it")
    return page


def check_model_file(path: str | os.PathLike[str], field: str = "model") -> Path:
    """``path`` resolved, if it is a file; FieldError naming ``field`` if not."""
    model = Path(path).resolve()
    if not model.is_file():
        raise FieldError(field, "a GGUF model file", str(path), "missing" if not model.exists() else "not a file")
    return model


def model_description(model: Path | None) -> dict[str, object]:
    """What ``/model.json`` says of ``model`` (None: no model given), as it is on disk now."""
    if model is not None and model.is_file():
        return {"available": True, "file": model.name, "bytes": model.stat().st_size}
    return {"available": False, "expected": str(model) if model is not None else DEFAULT_MODEL_FILE,
            "hint": INSTALL_HINT}


def _project(wheel: str) -> str:
    """The normalized project name of a wheel file name (as kvckpt.mjs matches it)."""
    return posixpath.basename(wheel).split("-")[0].lower().replace(".", "_")


class _Handler(SimpleHTTPRequestHandler):
    pyodide_dir: Path
    wheel_dirs: list[Path]
    page_dir: Path | None
    model: Path | None

    def __init__(self, *args, pyodide_dir: Path, wheel_dirs: list[Path], page_dir: Path | None,
                 model: Path | None, **kwargs) -> None:
        self.pyodide_dir = pyodide_dir
        self.wheel_dirs = wheel_dirs
        self.page_dir = page_dir
        self.model = model
        super().__init__(*args, directory=str(WEB_DIR), **kwargs)

    def log_message(self, format: str, *args) -> None:  # quiet
        pass

    def end_headers(self) -> None:
        self.send_header("Cache-Control", "no-cache")
        super().end_headers()

    def guess_type(self, path: str) -> str:
        return _TYPES.get(posixpath.splitext(path)[1].lower()) or super().guess_type(path)

    def _wheels(self) -> dict[str, Path]:
        """File name -> path of the wheels served: each project's from the first directory holding one."""
        found: dict[str, Path] = {}
        for d in self.wheel_dirs:
            if d.is_dir():
                seen = {_project(name) for name in found}
                for p in sorted(d.glob("*.whl")):
                    if _project(p.name) not in seen:
                        found[p.name] = p
        return found

    def do_GET(self) -> None:
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        if path == "/wheels/index.json":
            return self._send_json({"wheels": sorted(self._wheels())})
        if path == "/model.json":
            return self._send_json(model_description(self.model))
        super().do_GET()

    def _send_json(self, value: object) -> None:
        body = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def translate_path(self, path: str) -> str:
        path = urllib.parse.unquote(urllib.parse.urlsplit(path).path)
        if "\x00" in path:  # no file has such a name: answer 404 instead of failing in open()
            return str(MISSING)
        parts = [p for p in path.split("/") if p and p not in (".", "..")]
        if parts[:1] == ["pyodide"]:
            return str(self.pyodide_dir.joinpath(*parts[1:]))
        if parts[:1] == ["wheels"]:
            wheel = self._wheels().get("/".join(parts[1:]))
            return str(wheel) if wheel else str(MISSING)
        if parts == ["model.gguf"]:
            return str(self.model) if self.model is not None and self.model.is_file() else str(MISSING)
        parts = parts or ["index.html"]
        if self.page_dir is not None and self.page_dir.joinpath(*parts).exists():
            return str(self.page_dir.joinpath(*parts))
        return str(WEB_DIR.joinpath(*parts))


def make_server(pyodide_dir: str | os.PathLike[str] = DEFAULT_PYODIDE,
                wheel_dirs: list[str | os.PathLike[str]] | None = None, *, host: str = "127.0.0.1",
                port: int = 8000, page_dir: str | os.PathLike[str] | None = None,
                model: str | os.PathLike[str] | None = None) -> ThreadingHTTPServer:
    """A (not yet started) HTTP server for the browser runtime; ``port=0`` picks a free port.

    ``page_dir`` (holding ``index.html``) is served before ``kvckpt_web/web``; ``model`` (a GGUF file's path)
    at ``/model.gguf``: a model file that is missing, now or later, is reported by ``/model.json``, not
    refused. FieldError for a page directory without ``index.html``; KVCkptError if it cannot listen there
    (a bad port or host, a port in use).
    """
    if not is_int(port, 0, 65535):
        raise FieldError("port", "an integer in [0, 65535]", port)
    if "\x00" in host:
        raise FieldError("host", "a host name or address", host)
    pyodide = Path(pyodide_dir).resolve()
    if not (pyodide / "pyodide.mjs").is_file():
        raise KVCkptError(f"pyodide directory {pyodide}: expected the npm package pyodide (pyodide.mjs), got none; "
                          "run `make web-deps` or `npm install --prefix build/web pyodide@314.0.7`")
    wheels = [Path(d).resolve() for d in (wheel_dirs if wheel_dirs is not None else [DEFAULT_WHEELS])]
    page = check_page_dir(page_dir) if page_dir is not None else None
    handler = partial(_Handler, pyodide_dir=pyodide, wheel_dirs=wheels, page_dir=page,
                      model=Path(model).resolve() if model is not None else None)
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
