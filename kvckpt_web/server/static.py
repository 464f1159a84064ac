"""What ``kvckpt serve`` serves, and from where: an allow-list of routes; every other path is 404.

* ``/`` and ``/<path>`` -- a file of the page directory (``--page``; ``/`` is its ``index.html``), else one of
  the runtime's browser files in ``kvckpt_web/web`` (``index.html``, ``kvckpt.mjs`` and the modules it loads:
  ``engine.mjs``, ``engine-worker.mjs``, ``errors.mjs``, ``weights.mjs``), never its Python;
* ``/pyodide/<path>`` -- a file of the pinned npm package ``pyodide`` (no CDN);
* ``/wheels/<name>.whl`` -- pure-Python wheels (micropip, packaging, kvckpt_web, ...) from one or more
  directories, and ``/wheels/index.json`` listing them, which the page uses to find them. A project's wheels
  come from the first directory that holds one, so a freshly built kvckpt_web wheel put first hides a stale
  one further on;
* ``/model.gguf`` -- the model file, if one was given and exists now, and ``/model.json`` describing it:
  ``{"available": true, "file": name, "bytes": size}``, or ``{"available": false, "expected": path or
  default name, "hint": how to install it}``.

A file of a served directory is served only if it is a regular file whose path, after every symbolic link
is followed, is still inside that directory and names no dotfile or dot-directory on the way: a link within
the directory exposes nothing that is not served under its own name, one leading out of it (or to
``.git/...``) would expose anything. No directory is listed. Files are answered with byte ranges
(``ranges.py``), ``Accept-Ranges: bytes``, and the content types browsers need (``.mjs`` as JavaScript,
``.wasm`` as ``application/wasm``).
"""

from __future__ import annotations

import mimetypes
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from ..errors import FieldError, KVCkptError
from ..model.loader import DEFAULT_MODEL_FILE, INSTALL_HINT
from .ranges import RangedFileResponse

RUNTIME_DIR = Path(__file__).resolve().parents[1] / "web"
"""The browser runtime's files (the ``kvckpt_web.web`` package, served as data, never imported here)."""
RUNTIME_FILES = ("index.html", "kvckpt.mjs", "engine.mjs", "engine-worker.mjs", "errors.mjs", "weights.mjs")
DEFAULT_PYODIDE = Path("build/web/node_modules/pyodide")
DEFAULT_WHEELS = Path("build/web/wheels")

_TYPES = {".mjs": "text/javascript", ".js": "text/javascript", ".wasm": "application/wasm",
          ".whl": "application/zip", ".json": "application/json", ".zip": "application/zip",
          ".html": "text/html; charset=utf-8", ".map": "application/json", ".gguf": "application/octet-stream"}


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


def check_pyodide_dir(path: str | os.PathLike[str]) -> Path:
    """``path`` resolved, if it is the npm package pyodide (holds ``pyodide.mjs``); KVCkptError if not."""
    pyodide = Path(path).resolve()
    if not (pyodide / "pyodide.mjs").is_file():
        raise KVCkptError(f"pyodide directory {pyodide}: expected the npm package pyodide (pyodide.mjs), got none; "
                          "run `make web-deps` or `npm install --prefix build/web pyodide@314.0.7`")
    return pyodide


def model_description(model: Path | None) -> dict[str, object]:
    """What ``/model.json`` says of ``model`` (None: no model given), as it is on disk now."""
    if model is not None and model.is_file():
        return {"available": True, "file": model.name, "bytes": model.stat().st_size}
    return {"available": False, "expected": str(model) if model is not None else DEFAULT_MODEL_FILE,
            "hint": INSTALL_HINT}


def _names(path: str) -> list[str] | None:
    """The names of a relative URL path, or None if one is empty, ``.``, ``..``, a dotfile's, or holds a NUL
    or a backslash (never a served name)."""
    names = path.split("/")
    if any(not n or n.startswith(".") or "\x00" in n or "\\" in n for n in names):
        return None
    return names


def served_file(root: Path, path: str) -> tuple[Path, os.stat_result] | None:
    """The file ``path`` (relative, ``/``-separated) of the resolved directory ``root`` and its stat, or None
    if it is not served there (see the module docstring)."""
    names = _names(path)
    if names is None:
        return None
    try:
        real = root.joinpath(*names).resolve(strict=True)
        inside = real.relative_to(root)
        info = real.stat()
    except (OSError, RuntimeError, ValueError):  # missing, a link loop, a link out of root
        return None
    if _names(inside.as_posix()) is None or not stat.S_ISREG(info.st_mode):
        return None
    return real, info


def _project(wheel: str) -> str:
    """The normalized project name of a wheel file name (as kvckpt.mjs matches it)."""
    return wheel.split("-")[0].lower().replace(".", "_")


def _file(found: tuple[Path, os.stat_result] | None, name: str) -> Response:
    """The answer for a served file at a URL ending in ``name`` (its content type comes from there), or 404."""
    if found is None:
        return PlainTextResponse("Not Found", 404)
    path, info = found
    kind = (_TYPES.get(os.path.splitext(name)[1].lower()) or mimetypes.guess_type(name)[0]
            or "application/octet-stream")
    return RangedFileResponse(path, stat_result=info, headers={"content-type": kind})


@dataclass(frozen=True)
class Site:
    """The directories and files a server serves (all paths resolved)."""

    pyodide_dir: Path
    wheel_dirs: tuple[Path, ...]
    page_dir: Path | None = None
    model: Path | None = None

    @classmethod
    def of(cls, pyodide_dir: str | os.PathLike[str], wheel_dirs: list[str | os.PathLike[str]], *,
           page_dir: str | os.PathLike[str] | None = None, model: str | os.PathLike[str] | None = None) -> "Site":
        """A site from paths as given: KVCkptError if ``pyodide_dir`` is not the npm package pyodide, FieldError
        for a page directory without ``index.html``; a model file may be missing (``/model.json`` says so)."""
        return cls(check_pyodide_dir(pyodide_dir), tuple(Path(d).resolve() for d in wheel_dirs),
                   check_page_dir(page_dir) if page_dir is not None else None,
                   Path(model).resolve() if model is not None else None)

    def wheels(self) -> dict[str, tuple[Path, os.stat_result]]:
        """File name -> served file of the wheels served: each project's from the first directory holding one."""
        found: dict[str, tuple[Path, os.stat_result]] = {}
        for d in self.wheel_dirs:
            seen = {_project(name) for name in found}
            names = sorted(p.name for p in d.iterdir()) if d.is_dir() else []
            for name in names:
                wheel = served_file(d, name) if name.endswith(".whl") and _project(name) not in seen else None
                if wheel is not None:
                    found[name] = wheel
        return found

    def page_file(self, path: str) -> tuple[Path, os.stat_result] | None:
        """The file ``/path`` names: the page directory's, else the runtime's."""
        found = served_file(self.page_dir, path) if self.page_dir is not None else None
        return found or (served_file(RUNTIME_DIR, path) if path in RUNTIME_FILES else None)

    def model_file(self) -> tuple[Path, os.stat_result] | None:
        """The model file, if one was given and is a file now (a link to it is followed: it was named)."""
        try:
            info = self.model.stat() if self.model is not None else None
        except OSError:
            return None
        return (self.model, info) if info is not None and stat.S_ISREG(info.st_mode) else None

    def routes(self) -> list[Route]:
        """The routes of everything served (GET and HEAD); the last one catches every other path."""
        return [Route("/wheels/index.json", self._wheel_index), Route("/wheels/{path:path}", self._wheel),
                Route("/pyodide/{path:path}", self._pyodide), Route("/model.json", self._model_json),
                Route("/model.gguf", self._model), Route("/{path:path}", self._page)]

    def _wheel_index(self, request: Request) -> Response:
        return JSONResponse({"wheels": sorted(self.wheels())})

    def _wheel(self, request: Request) -> Response:
        name = request.path_params["path"]
        return _file(self.wheels().get(name), name)

    def _pyodide(self, request: Request) -> Response:
        path = request.path_params["path"]
        return _file(served_file(self.pyodide_dir, path), path)

    def _model_json(self, request: Request) -> Response:
        return JSONResponse(model_description(self.model))

    def _model(self, request: Request) -> Response:
        return _file(self.model_file(), "model.gguf")

    def _page(self, request: Request) -> Response:
        path = request.path_params["path"] or "index.html"
        return _file(self.page_file(path), path)
