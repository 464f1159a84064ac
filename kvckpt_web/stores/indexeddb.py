"""IndexedDBStore: a store in one IndexedDB database of this origin (Pyodide only).

One object store of ``key -> Uint8Array``; every ``set`` / ``delete`` is one ``readwrite`` transaction
with ``durability: "strict"``, awaited until ``complete`` (so it is on disk). IndexedDB transactions
auto-commit when control returns to the event loop with no request pending, so each transaction here
issues all its requests before awaiting anything.
"""

from __future__ import annotations

from typing import Any

from ..errors import CorruptionError
from .base import DEFAULT_LOCK_TIMEOUT
from .js import BrowserStore, call, js_object, pyodide_js, request_persistence, store_error, to_bytes, u8

__all__ = ["IndexedDBStore"]


class IndexedDBStore(BrowserStore):
    """A :class:`~kvckpt_web.stores.base.Store` in one IndexedDB database of this origin.

    Open with ``store = await IndexedDBStore.open("name")``.
    """

    KIND = "IndexedDB"
    OBJECT_STORE = "kv"

    def __init__(self, db: Any, name: str, *, read_only: bool = False,
                 lock_timeout: float = DEFAULT_LOCK_TIMEOUT, persisted: bool = False) -> None:
        super().__init__(name, read_only=read_only, lock_timeout=lock_timeout, persisted=persisted)
        self._db = db

    @classmethod
    async def open(cls, name: str = "kvckpt", *, read_only: bool = False, lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
                   persist: bool = True) -> "IndexedDBStore":
        """Open (creating) database ``name``; ``persist`` requests persistent storage first."""
        cls.check_open(name, read_only, lock_timeout, persist)
        _, helpers, JsException = pyodide_js()
        persisted = await request_persistence() if persist else False
        try:
            db = await call(helpers, "open", name, cls.OBJECT_STORE)
        except JsException as exc:
            raise store_error(f"open IndexedDB {name!r}", exc) from None
        return cls(db, name, read_only=read_only, lock_timeout=lock_timeout, persisted=persisted)

    def close(self) -> None:
        """Close the database connection."""
        self._db.close()

    def _tx(self, mode: str) -> tuple[Any, Any]:
        options = {"durability": "strict"} if mode == "readwrite" else {}
        tx = self._db.transaction(self.OBJECT_STORE, mode, js_object(options))
        return tx, tx.objectStore(self.OBJECT_STORE)

    async def _get(self, key: str) -> bytes | None:
        _, helpers, JsException = pyodide_js()
        try:
            _, os_ = self._tx("readonly")
            value = await call(helpers, "req", os_.get(key))
        except JsException as exc:
            raise store_error(f"get {key!r}", exc) from None
        if value is None:
            return None
        got = helpers.notBytes(value)
        if got:
            raise CorruptionError(f"IndexedDB {self.name!r} record {key!r}: expected bytes (a Uint8Array), got {got}")
        return to_bytes(value)

    async def _set(self, key: str, data: bytes) -> None:
        _, helpers, JsException = pyodide_js()
        value = u8(data)  # convert before the transaction starts: nothing may await inside it
        try:
            tx, os_ = self._tx("readwrite")
            os_.put(value, key)
            await call(helpers, "tx", tx)
        except JsException as exc:
            raise store_error(f"set {key!r}", exc) from None

    async def _delete(self, key: str) -> None:
        _, helpers, JsException = pyodide_js()
        try:
            tx, os_ = self._tx("readwrite")
            os_.delete(key)
            await call(helpers, "tx", tx)
        except JsException as exc:
            raise store_error(f"delete {key!r}", exc) from None

    async def _exists(self, key: str) -> bool:
        _, helpers, JsException = pyodide_js()
        try:
            _, os_ = self._tx("readonly")
            return int(await call(helpers, "req", os_.count(key))) > 0
        except JsException as exc:
            raise store_error(f"exists {key!r}", exc) from None

    async def _list_prefix(self, prefix: str) -> list[str]:
        js, helpers, JsException = pyodide_js()
        try:
            _, os_ = self._tx("readonly")
            if prefix:
                keys = await call(helpers, "req", os_.getAllKeys(js.IDBKeyRange.bound(prefix, prefix + "\uffff")))
            else:
                keys = await call(helpers, "req", os_.getAllKeys())
        except JsException as exc:
            raise store_error(f"list {prefix!r}", exc) from None
        return [str(k) for k in keys if str(k).startswith(prefix)]
