"""The model files a server serves (``kvckpt serve --model A.gguf --model B.gguf``), as a page picks one: each at
``/models/<file name>``, described by ``/models.json``; the first is also ``/model.gguf`` (``static.py``).

A description is read from the file's GGUF header when asked for, and kept while the file's size and modification
time stay the same: ``{"file", "url", "available": true, "bytes", "name" (``general.name``, or null), "quant"}``,
where ``quant`` is the llama.cpp file type that ``general.file_type`` names (``Q4_K_M``, ``Q8_0``, ...), else the type
of the tensors holding most of the file's bytes. A file missing now is ``{"file", "url", "available": false,
"expected": its path}``; one whose header cannot be read is available with ``"error"`` saying why (the page's load
then names the problem).
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import FieldError, KVCkptError
from ..model.gguf import GGUFFile, open_gguf

FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
              12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
              32: "BF16"}
"""llama.cpp's file types (``general.file_type``, ``LLAMA_FTYPE_MOSTLY_*``) by id."""


def model_paths(model: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None,
                field: str = "model") -> tuple[Path, ...]:
    """The model files ``model`` names (one path, several, or None), resolved; FieldError naming ``field`` when two
    share a file name (each is served under its name)."""
    if model is None:
        return ()
    given = [model] if isinstance(model, (str, os.PathLike)) else list(model)
    paths = tuple(Path(p).resolve() for p in given)
    names = Counter(p.name for p in paths)
    twice = sorted(name for name, count in names.items() if count > 1)
    if twice:
        raise FieldError(field, "model files of different file names (each is served as /models/<file name>)",
                         twice[0], "given more than once")
    return paths


def quant_of(f: GGUFFile) -> str:
    """The quant a model file is known by: its ``general.file_type``'s name, else its tensors' main type."""
    named = FILE_TYPES.get(f.metadata.get("general.file_type"))  # type: ignore[arg-type]
    if named is not None:
        return named
    weight: Counter[str] = Counter()
    for tensor in f.tensors.values():
        weight[tensor.type_name] += tensor.nbytes
    return weight.most_common(1)[0][0] if weight else "none"


class ServedModels:
    """The model files of a server, by file name, and what ``/models.json`` says of them."""

    def __init__(self, paths: tuple[Path, ...]) -> None:
        self.paths = paths
        self.by_name = {p.name: p for p in paths}
        self._described: dict[Path, tuple[tuple[int, int], dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def describe(self) -> list[dict[str, Any]]:
        """Each served model as it is on disk now (reads headers: run it off the event loop)."""
        return [self._describe(path) for path in self.paths]

    def _describe(self, path: Path) -> dict[str, Any]:
        where = {"file": path.name, "url": f"/models/{path.name}"}
        try:
            info = path.stat()
        except OSError:
            return {**where, "available": False, "expected": str(path)}
        key = (info.st_size, info.st_mtime_ns)
        with self._lock:
            kept = self._described.get(path)
        if kept is not None and kept[0] == key:
            return kept[1]
        described: dict[str, Any] = {**where, "available": True, "bytes": info.st_size}
        try:
            f = open_gguf(path)
            name = f.metadata.get("general.name")
            described.update(name=name if isinstance(name, str) and name.strip() else None, quant=quant_of(f))
        except (KVCkptError, OSError, ValueError) as exc:
            described.update(name=None, quant=None, error=str(exc))
        with self._lock:
            self._described[path] = (key, described)
        return described
