"""What ``web/kvckpt.mjs`` calls: a page drives caches and checkpoints from JavaScript without writing Python.

Each function adapts JS values (plain objects, typed arrays) to the Python API and
back; the Python API stays the single source of truth. The caches, stores and device
are the realm's :class:`~.runtime.Runtime`'s (:data:`~.runtime.REALM`). Results cross as JSON text
whose keys are in JavaScript's camelCase (``seqLength``, ``appState``), K/V bytes as
``Uint8Array``. Errors cross as Pyodide's PythonError, which kvckpt.mjs turns into plain
JS errors with :func:`describe_error`.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import traceback
from typing import Any

from ..durable.restore import restore as restore_checkpoint
from ..durable.retention import DEFAULT_KEEP
from ..durable.retention import gc as collect
from ..durable.save import save
from ..errors import FieldError, KVCkptError, is_int
from ..gpu.tensors import as_bytes
from ..kv.cache import PagedKVCache
from ..tvm.layout import CacheLimits, KVLayout
from .runtime import REALM, camel_json, error_fields, to_py


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


async def create_cache(layout: Any, limits: Any = None, transfer: str = "auto") -> int:
    """Open a cache of ``layout`` (KVLayout's fields) and ``limits`` (CacheLimits' fields); its handle."""
    lay, lim = _fields("layout", to_py(layout), KVLayout), _fields("limits", to_py(limits) or {}, CacheLimits)
    if isinstance(lay.get("attn_kinds"), list):
        lay["attn_kinds"] = tuple(lay["attn_kinds"])
    return REALM.add_cache(PagedKVCache(await REALM.device(), KVLayout(**lay), CacheLimits(**lim), transfer=transfer))


def close_cache(handle: int) -> None:
    """Release a cache's GPU memory now (every buffer of it is destroyed) and forget its handle; every later use
    of the handle raises CheckpointStateError. Closing again does nothing."""
    REALM.close_cache(handle)


async def device_memory() -> str:
    """``{liveResources, liveBytes}`` as JSON: the buffers and textures kvckpt_web holds on this page's device."""
    dev = await REALM.device()
    return camel_json({"live_resources": dev.live_resources, "live_bytes": dev.live_bytes})


def add_sequence(handle: int, seq_id: int) -> None:
    """Create an empty sequence."""
    REALM.cache(handle).add_sequence(seq_id)


def remove_sequence(handle: int, seq_id: int) -> None:
    """Delete a sequence."""
    REALM.cache(handle).remove_sequence(seq_id)


def sequence_length(handle: int, seq_id: int) -> int:
    """Tokens in a sequence."""
    return REALM.cache(handle).get_sequence_length(seq_id)


def append(handle: int, seq_ids: Any, lengths: Any, layers: Any) -> None:
    """One forward pass: ``layers[i] = [k, v]``, the raw bytes of layer i's K and V for every new token.

    The size of every K and V is checked before the forward begins: a bad call leaves the cache as it was.
    """
    cache = REALM.cache(handle)
    lay, layers, lengths = cache.layout, to_py(layers), list(to_py(lengths))
    if len(layers) != lay.num_layers:
        raise FieldError("layers", f"{lay.num_layers} [k, v] pairs", len(layers))
    kv = [(_bytes(k), _bytes(v)) for k, v in layers]
    if all(is_int(n, 1) for n in lengths):  # else begin_forward names the bad length
        nbytes = sum(lengths) * lay.num_kv_heads * lay.head_dim * lay.elem_bytes
        for i, (k, v) in enumerate(kv):
            as_bytes(k, f"layers[{i}].k", lay.dtype, nbytes)
            as_bytes(v, f"layers[{i}].v", lay.dtype, nbytes)
    cache.begin_forward(list(to_py(seq_ids)), lengths)
    try:
        for layer, (k, v) in enumerate(kv):
            cache.append_kv(layer, k, v)
    finally:
        cache.end_forward()


async def read_kv(handle: int, seq_id: int, start: int, end: int) -> Any:
    """``[k, v]`` of tokens ``[start, end)`` as Uint8Arrays, each (num_layers, n, num_kv_heads, head_dim)."""
    from pyodide.ffi import to_js  # type: ignore[import-not-found]

    k, v = await REALM.cache(handle).debug_get_kv(seq_id, start, end)
    return to_js([k.data, v.data])


async def checkpoint(handle: int, seq_id: int, store: str, store_name: str, name: str, app_state: Any = None) -> str:
    """Save ``seq_id`` as the next generation of ``name``; ``{name, generation, seqLength, chunksWritten,
    bytesWritten}`` as JSON."""
    result = await save(REALM.cache(handle), seq_id, await REALM.open_store(store, store_name), name,
                        app_state=to_py(app_state) or {})
    return camel_json({"name": result.name, "generation": result.generation, "seq_length": result.seq_length,
                  "chunks_written": result.chunks_written, "bytes_written": result.bytes_written})


async def restore(handle: int, store: str, store_name: str, name: str, seq_id: Any = None) -> str:
    """Load the newest generation of ``name`` into the cache; ``{name, generation, seqId, seqLength, appState}``
    as JSON."""
    result = await restore_checkpoint(await REALM.open_store(store, store_name), name, REALM.cache(handle),
                                      seq_id=to_py(seq_id))
    return camel_json({"name": result.name, "generation": result.generation, "seq_id": result.seq_id,
                  "seq_length": result.seq_length, "app_state": result.app_state})


async def gc(store: str, store_name: str, keep: int = DEFAULT_KEEP) -> str:
    """Keep the newest ``keep`` generations of each name (0: all of them), then delete every chunk none of them
    uses, such as those of a failed save; the GcResult's fields as JSON (``keptManifests``, ``deletedChunks``,
    ...)."""
    result = await collect(await REALM.open_store(store, store_name), keep=None if keep == 0 else keep)
    return camel_json(dataclasses.asdict(result))


def describe_error(traceback_text: str) -> str:
    """What kvckpt.mjs's ``toError`` makes of a Pyodide PythonError whose message (a formatted traceback) is
    ``traceback_text``, as JSON: ``{name, message}``, and ``field``, ``expected``, ``got`` for a FieldError,
    ``reason`` for an UnusableCheckpointError.

    The exception is ``sys.last_exc``, where Pyodide keeps the last one that reached JavaScript, if the
    traceback ends with it. A kvckpt_web error gives its class name and its one-line message; anything else
    (another exception, or one that is no longer ``sys.last_exc``) the name "PythonError" and the traceback's
    last line ("TypeError: ...").
    """
    exc = getattr(sys, "last_exc", None)
    text = traceback_text.rstrip()
    if not isinstance(exc, KVCkptError) or not text.endswith("".join(traceback.format_exception_only(exc)).rstrip()):
        return json.dumps({"name": "PythonError", "message": text.splitlines()[-1] if text else ""})
    return json.dumps(error_fields(exc))
