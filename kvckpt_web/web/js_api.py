"""What ``web/kvckpt.mjs`` calls: a page drives caches and checkpoints from JavaScript without writing Python.

Each function adapts JS values (plain objects, typed arrays) to the Python API and
back; the Python API stays the single source of truth. Results cross as JSON text
whose keys are in JavaScript's camelCase (``seqLength``, ``appState``), K/V bytes as
``Uint8Array``.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from ..durable.restore import restore as restore_checkpoint
from ..durable.retention import DEFAULT_KEEP
from ..durable.retention import gc as collect
from ..durable.save import save
from ..errors import FieldError
from ..kv.cache import PagedKVCache
from ..tvm.layout import CacheLimits, KVLayout
from .runtime import device, open_store

_caches: dict[int, PagedKVCache] = {}


def _py(value: Any) -> Any:
    """A JS value (JsProxy) as the matching Python value; Python values pass through."""
    return value.to_py() if hasattr(value, "to_py") else value


def _camel(name: str) -> str:
    """``seq_length`` as ``seqLength``."""
    head, *rest = name.split("_")
    return head + "".join(word.capitalize() for word in rest)


def _json(fields: dict[str, Any]) -> str:
    """A result's fields as JSON text for JavaScript: its keys in camelCase (the values as they are)."""
    return json.dumps({_camel(key): value for key, value in fields.items()})


def _bytes(value: Any) -> bytes:
    return value.to_bytes() if hasattr(value, "to_bytes") else bytes(value)


def _fields(what: str, value: Any, cls: type) -> dict[str, Any]:
    """``value`` as keyword arguments of dataclass ``cls``; FieldError naming an unknown field."""
    if not isinstance(value, dict):
        raise FieldError(what, "an object of fields", type(value).__name__)
    known = {f.name for f in dataclasses.fields(cls)}
    for key in value:
        if key not in known:
            raise FieldError(f"{what}.{key}", f"one of {sorted(known)}", "an unknown field")
    return dict(value)


def _cache(handle: int) -> PagedKVCache:
    if handle not in _caches:
        raise FieldError("cache", f"an open cache handle {sorted(_caches)}", handle)
    return _caches[handle]


async def create_cache(layout: Any, limits: Any = None, transfer: str = "auto") -> int:
    """Open a cache of ``layout`` (KVLayout's fields) and ``limits`` (CacheLimits' fields); its handle."""
    lay, lim = _fields("layout", _py(layout), KVLayout), _fields("limits", _py(limits) or {}, CacheLimits)
    if isinstance(lay.get("attn_kinds"), list):
        lay["attn_kinds"] = tuple(lay["attn_kinds"])
    cache = PagedKVCache(await device(), KVLayout(**lay), CacheLimits(**lim), transfer=transfer)
    handle = max(_caches, default=0) + 1
    _caches[handle] = cache
    return handle


def close_cache(handle: int) -> None:
    """Release a cache's GPU memory."""
    _cache(handle).close()
    del _caches[handle]


def add_sequence(handle: int, seq_id: int) -> None:
    """Create an empty sequence."""
    _cache(handle).add_sequence(seq_id)


def remove_sequence(handle: int, seq_id: int) -> None:
    """Delete a sequence."""
    _cache(handle).remove_sequence(seq_id)


def sequence_length(handle: int, seq_id: int) -> int:
    """Tokens in a sequence."""
    return _cache(handle).get_sequence_length(seq_id)


def append(handle: int, seq_ids: Any, lengths: Any, layers: Any) -> None:
    """One forward pass: ``layers[i] = [k, v]``, the raw bytes of layer i's K and V for every new token."""
    cache = _cache(handle)
    layers = _py(layers)
    if len(layers) != cache.layout.num_layers:
        raise FieldError("layers", f"{cache.layout.num_layers} [k, v] pairs", len(layers))
    kv = [(_bytes(k), _bytes(v)) for k, v in layers]
    cache.begin_forward(list(_py(seq_ids)), list(_py(lengths)))
    try:
        for layer, (k, v) in enumerate(kv):
            cache.append_kv(layer, k, v)
    finally:
        cache.end_forward()


async def read_kv(handle: int, seq_id: int, start: int, end: int) -> Any:
    """``[k, v]`` of tokens ``[start, end)`` as Uint8Arrays, each (num_layers, n, num_kv_heads, head_dim)."""
    from pyodide.ffi import to_js  # type: ignore[import-not-found]

    k, v = await _cache(handle).debug_get_kv(seq_id, start, end)
    return to_js([k.data, v.data])


async def checkpoint(handle: int, seq_id: int, store: str, store_name: str, name: str, app_state: Any = None) -> str:
    """Save ``seq_id`` as the next generation of ``name``; ``{name, generation, seqLength, chunksWritten,
    bytesWritten}`` as JSON."""
    result = await save(_cache(handle), seq_id, await open_store(store, store_name), name,
                        app_state=_py(app_state) or {})
    return _json({"name": result.name, "generation": result.generation, "seq_length": result.seq_length,
                  "chunks_written": result.chunks_written, "bytes_written": result.bytes_written})


async def restore(handle: int, store: str, store_name: str, name: str, seq_id: Any = None) -> str:
    """Load the newest generation of ``name`` into the cache; ``{name, generation, seqId, seqLength, appState}``
    as JSON."""
    result = await restore_checkpoint(await open_store(store, store_name), name, _cache(handle), seq_id=_py(seq_id))
    return _json({"name": result.name, "generation": result.generation, "seq_id": result.seq_id,
                  "seq_length": result.seq_length, "app_state": result.app_state})


async def gc(store: str, store_name: str, keep: int = DEFAULT_KEEP) -> str:
    """Keep the newest ``keep`` generations of each name (0: all of them), then delete every chunk none of them
    uses, such as those of a failed save; the GcResult's fields as JSON (``keptManifests``, ``deletedChunks``,
    ...)."""
    result = await collect(await open_store(store, store_name), keep=None if keep == 0 else keep)
    return _json(dataclasses.asdict(result))
