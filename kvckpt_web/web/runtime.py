"""What every browser entry point shares: this page's (or worker's) WebGPU device and its stores by name."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from ..errors import FieldError, KVCkptError
from ..gpu.open import open_device_async
from ..stores.indexeddb import IndexedDBStore
from ..stores.opfs import OPFSStore

if TYPE_CHECKING:
    from ..gpu.device import Device

STORE_KINDS = {"indexeddb": IndexedDBStore, "opfs": OPFSStore}

_stores: dict[tuple[str, str], Any] = {}
_device: "Device | None" = None


async def device() -> "Device":
    """The WebGPU device of this JavaScript realm, opened on first use; DeviceError if there is none."""
    global _device
    if _device is None:
        _device = await open_device_async()
    return _device


async def open_store(kind: str, name: str) -> Any:
    """The store of ``kind`` ("indexeddb", "opfs") named ``name``, opened once per realm (incremental saves
    remember what they wrote per store object)."""
    if kind not in STORE_KINDS:
        raise FieldError("store", "'indexeddb' or 'opfs'", kind)
    if (kind, name) not in _stores:
        _stores[(kind, name)] = await STORE_KINDS[kind].open(name)
    return _stores[(kind, name)]


def to_py(value: Any) -> Any:
    """A JS value (JsProxy) as the matching Python value; Python values pass through."""
    return value.to_py() if hasattr(value, "to_py") else value


def camel_json(fields: dict[str, Any]) -> str:
    """A result's fields as JSON text for JavaScript, its keys in camelCase (``seq_length`` as ``seqLength``)."""
    def camel(name: str) -> str:
        head, *rest = name.split("_")
        return head + "".join(word.capitalize() for word in rest)

    return json.dumps({camel(key): value for key, value in fields.items()})


def error_fields(exc: KVCkptError) -> dict[str, Any]:
    """A kvckpt_web error as JavaScript shows it: ``{name, message}`` (its class name, its one-line message),
    and ``field``, ``expected``, ``got`` for a FieldError, ``reason`` for an UnusableCheckpointError."""
    fields: dict[str, Any] = {"name": type(exc).__name__, "message": str(exc)}
    for key in ("field", "expected", "got", "reason"):
        if hasattr(exc, key):
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
