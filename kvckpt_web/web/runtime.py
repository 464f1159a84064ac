"""What every browser entry point of a JavaScript realm (a page or a worker) shares: a :class:`Runtime` holding
its WebGPU device, its stores by name and the caches JavaScript holds by handle."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from ..errors import CheckpointStateError, FieldError, KVCkptError, is_int
from ..gpu.open import open_device_async
from ..stores.indexeddb import IndexedDBStore
from ..stores.opfs import OPFSStore

if TYPE_CHECKING:
    from ..gpu.device import Device
    from ..kv.cache import PagedKVCache
    from ..stores.base import Store

STORE_KINDS = {"indexeddb": IndexedDBStore, "opfs": OPFSStore}


class Runtime:
    """The objects one JavaScript realm holds: its device, opened on first use; its stores, each opened once per
    kind and name (so each keeps its own :class:`~kvckpt_web.durable.ledger.Ledger` and saves stay incremental);
    and the caches JavaScript drives by handle (1, 2, ...: never reused, so a closed cache's handle never
    reaches another cache)."""

    def __init__(self) -> None:
        self._device: "Device | None" = None
        self._stores: dict[tuple[str, str], "Store"] = {}
        self._caches: dict[int, "PagedKVCache"] = {}
        self._issued = 0

    async def device(self) -> "Device":
        """The WebGPU device of this realm, opened on first use; DeviceError if there is none."""
        if self._device is None:
            self._device = await open_device_async()
        return self._device

    async def open_store(self, kind: str, name: str) -> "Store":
        """The store of ``kind`` ("indexeddb", "opfs") named ``name``, opened on first use."""
        if kind not in STORE_KINDS:
            raise FieldError("store", "'indexeddb' or 'opfs'", kind)
        if (kind, name) not in self._stores:
            self._stores[(kind, name)] = await STORE_KINDS[kind].open(name)
        return self._stores[(kind, name)]

    def add_cache(self, cache: "PagedKVCache") -> int:
        """Hold ``cache`` for JavaScript; its new handle."""
        self._issued += 1
        self._caches[self._issued] = cache
        return self._issued

    def cache(self, handle: int) -> "PagedKVCache":
        """The open cache of ``handle``: CheckpointStateError if it was closed, FieldError if there never was one."""
        if self._closed(handle):
            raise CheckpointStateError(f"cache {handle}: expected an open cache, got a closed one (close() was called)")
        if handle not in self._caches:
            raise FieldError("cache", f"an open cache handle {sorted(self._caches)}", handle)
        return self._caches[handle]

    def close_cache(self, handle: int) -> None:
        """Release the cache of ``handle`` (its GPU memory, now) and forget it; closing again does nothing."""
        if not self._closed(handle):
            self.cache(handle).close()
            del self._caches[handle]

    def _closed(self, handle: int) -> bool:
        return handle not in self._caches and is_int(handle, 1, self._issued)


REALM = Runtime()
"""This realm's runtime. Pyodide imports a module once per realm, and JavaScript calls module functions
(``pyimport("kvckpt_web.web.js_api").create_cache(...)``), so the realm's one Runtime is held here."""


async def device() -> "Device":
    """The WebGPU device of this realm (:meth:`Runtime.device` of :data:`REALM`)."""
    return await REALM.device()


async def open_store(kind: str, name: str) -> "Store":
    """The store of ``kind`` named ``name`` in this realm (:meth:`Runtime.open_store` of :data:`REALM`)."""
    return await REALM.open_store(kind, name)


def to_py(value: Any) -> Any:
    """A JS value (JsProxy) as the matching Python value; Python values pass through."""
    return value.to_py() if hasattr(value, "to_py") else value


def camel_json(fields: dict[str, Any]) -> str:
    """A result's fields as JSON text for JavaScript, its keys in camelCase (``seq_length`` as ``seqLength``)."""
    def camel(name: str) -> str:
        head, *rest = name.split("_")
        return head + "".join(word.capitalize() for word in rest)

    return json.dumps({camel(key): value for key, value in fields.items()})


def error_fields(exc: BaseException) -> dict[str, Any]:
    """An exception as it crosses to JavaScript (``web/errors.mjs`` makes it an Error there): ``{name, message}``
    (its class name, its one-line message), and for a kvckpt_web error ``field``, ``expected``, ``got`` of a
    FieldError, ``reason`` of an UnusableCheckpointError."""
    fields: dict[str, Any] = {"name": type(exc).__name__, "message": str(exc)}
    for key in ("field", "expected", "got", "reason"):
        if isinstance(exc, KVCkptError) and hasattr(exc, key):
            fields[key] = _plain(getattr(exc, key))
    return fields


def _plain(value: Any) -> Any:
    """``value`` as JSON carries it: numbers, strings, booleans, null, lists and objects of them; anything else
    (and a float JSON has no literal for) as its ``str``."""
    if value is None or isinstance(value, (bool, int, str)) or (isinstance(value, float) and math.isfinite(value)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)
