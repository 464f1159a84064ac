"""What every browser entry point shares: this page's (or worker's) WebGPU device and its stores by name."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import FieldError
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
