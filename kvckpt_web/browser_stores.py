"""Browser stores: :class:`IndexedDBStore` and :class:`OPFSStore` (Pyodide only).

Both implement :class:`~kvckpt_web.store.Store`, so :mod:`kvckpt_web.persist` runs
on them unchanged.

* :class:`IndexedDBStore` -- one object store of ``key -> Uint8Array``; every
  ``set`` / ``delete`` is one ``readwrite`` transaction with
  ``durability: "strict"``, awaited until ``complete`` (so it is on disk).
* :class:`OPFSStore` -- the Origin Private File System; each key is a file under
  a per-store directory, written with ``createWritable()``, whose ``close()``
  replaces the file atomically (an aborted or failed write leaves the old one).

Writer locks use the Web Locks API (``navigator.locks``), which excludes other
tabs and workers of the same origin as well as other tasks of this one. Both
``open`` classmethods ask for persistent storage (``navigator.storage.persist()``;
the answer is in ``.persisted``). A full quota raises :class:`StoreError`; the
failed write changes nothing, so the last committed checkpoint stays intact. Every JS promise
the stores await is made by one helper (``call``) that turns any rejection into a plain
``Error`` with the reason's name and message, which Pyodide always raises; a stored value that is
not bytes raises :class:`CorruptionError` naming its key.

IndexedDB transactions auto-commit when control returns to the event loop with
no request pending, so each transaction here issues all its requests before
awaiting anything.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

from .errors import CorruptionError, StoreError
from .store import DEFAULT_LOCK_TIMEOUT, Store

__all__ = ["IndexedDBStore", "OPFSStore", "request_persistence"]

_JS_HELPERS = r"""
({
  // obj[method](...args) as a promise that rejects only with a plain Error carrying the reason's name and
  // message. Pyodide turns a promise into a Python future as it crosses over, and a future rejected with a
  // value Pyodide cannot raise (Chromium's QuotaExceededError class, undefined, a string) never completes.
  call(obj, method, ...args) {
    return (async () => obj[method](...args))().catch((reason) => {
      const error = new Error(reason?.message ?? String(reason));
      error.name = reason?.name ?? "Error";
      throw error;
    });
  },
  req(r) {
    return new Promise((resolve, reject) => {
      r.onsuccess = () => resolve(r.result);
      r.onerror = () => reject(r.error);
    });
  },
  tx(t) {
    return new Promise((resolve, reject) => {
      t.oncomplete = () => resolve(true);
      t.onerror = () => reject(t.error);
      t.onabort = () => reject(t.error || new DOMException("transaction aborted", "AbortError"));
    });
  },
  open(name, objectStore) {
    return new Promise((resolve, reject) => {
      const r = indexedDB.open(name, 1);
      r.onupgradeneeded = () => r.result.createObjectStore(objectStore);
      r.onsuccess = () => resolve(r.result);
      r.onerror = () => reject(r.error);
      r.onblocked = () => reject(new DOMException("open blocked by another connection", "InvalidStateError"));
    });
  },
  // Resolves to a release function once the Web Lock `name` is held; rejects after timeoutMs.
  lock(name, timeoutMs) {
    return new Promise((resolve, reject) => {
      const ctrl = new AbortController();
      const timer = setTimeout(() => ctrl.abort(), Math.max(0, timeoutMs));
      navigator.locks.request(name, { mode: "exclusive", signal: ctrl.signal }, () => {
        clearTimeout(timer);
        return new Promise((release) => resolve(() => release()));
      }).catch(reject);
    });
  },
  async listFiles(dir, prefix, out) {
    for await (const [name, handle] of dir.entries()) {
      if (handle.kind === "directory") await this.listFiles(handle, prefix + name + "/", out);
      else out.push(prefix + name);
    }
    return out;
  },
  // What a stored value is when it is not a Uint8Array, the only thing these stores write ("" if it is one).
  notBytes(value) {
    if (value instanceof Uint8Array) return "";
    return value === null ? "null" : typeof value === "object" ? value.constructor?.name ?? "object" : typeof value;
  },
  async bytes(fileHandle) {
    return new Uint8Array(await (await fileHandle.getFile()).arrayBuffer());
  },
})
"""

_helpers: Any = None


def _js() -> tuple[Any, Any, Any]:
    global _helpers
    try:
        import js  # type: ignore[import-not-found]
        from pyodide.code import run_js  # type: ignore[import-not-found]
        from pyodide.ffi import JsException  # type: ignore[import-not-found]
    except ImportError:
        raise StoreError("browser stores need Pyodide in a browser (no `js` module here)") from None
    if _helpers is None:
        _helpers = run_js(_JS_HELPERS)
    return js, _helpers, JsException


async def _call(obj: Any, method: str, *args: Any) -> Any:
    """The awaited result of ``obj.method(*args)`` on a JS object; any rejection raises ``JsException``."""
    _, helpers, _ = _js()
    return await helpers.call(obj, method, *args)


def _obj(value: dict[str, Any]) -> Any:
    import js  # type: ignore[import-not-found]
    from pyodide.ffi import to_js  # type: ignore[import-not-found]

    return to_js(value, dict_converter=js.Object.fromEntries)


def _u8(data: bytes) -> Any:
    import js  # type: ignore[import-not-found]

    arr = js.Uint8Array.new(len(data))
    if data:
        arr.assign(data)
    return arr


def _to_bytes(arr: Any) -> bytes:
    out = bytearray(arr.byteLength)
    if out:
        arr.assign_to(out)
    return bytes(out)


def _error(what: str, exc: BaseException) -> StoreError:
    text = str(exc)
    if "QuotaExceeded" in text or "quota" in text.lower():
        return StoreError(f"{what}: storage quota exceeded ({text}); nothing was written, the last committed "
                          "checkpoint is intact")
    return StoreError(f"{what}: {text}")


async def request_persistence() -> bool:
    """Ask the browser to keep this origin's storage under pressure; True if granted."""
    js, _, JsException = _js()
    storage = getattr(js.navigator, "storage", None)
    if storage is None or not hasattr(storage, "persist"):
        return False
    try:
        return bool(await _call(storage, "persist"))
    except JsException:
        return False


class _BrowserStore(Store):
    """What both browser stores share: a name, the persistence answer, and a Web Lock named for them."""

    KIND = ""

    def __init__(self, name: str, *, read_only: bool, lock_timeout: float, persisted: bool) -> None:
        super().__init__(read_only=read_only, lock_timeout=lock_timeout)
        self.name = name
        self.persisted = persisted
        self._lock_name = f"kvckpt:{self.KIND.lower()}:{name}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, read_only={self.read_only})"

    @asynccontextmanager
    async def _lock(self, timeout: float) -> AsyncIterator[None]:
        js, helpers, JsException = _js()
        if getattr(js.navigator, "locks", None) is None:
            raise StoreError(f"lock {self._lock_name}: the Web Locks API is unavailable")
        try:
            release = await _call(helpers, "lock", self._lock_name, int(timeout * 1000))
        except JsException as exc:
            raise StoreError(f"lock {self._lock_name}: not acquired within {timeout} s (held by another writer, "
                             f"tab or worker: {exc})") from None
        try:
            yield
        finally:
            release()


class IndexedDBStore(_BrowserStore):
    """A :class:`~kvckpt_web.store.Store` in one IndexedDB database of this origin.

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
        _, helpers, JsException = _js()
        persisted = await request_persistence() if persist else False
        try:
            db = await _call(helpers, "open", name, cls.OBJECT_STORE)
        except JsException as exc:
            raise _error(f"open IndexedDB {name!r}", exc) from None
        return cls(db, name, read_only=read_only, lock_timeout=lock_timeout, persisted=persisted)

    def close(self) -> None:
        """Close the database connection."""
        self._db.close()

    def _tx(self, mode: str) -> tuple[Any, Any]:
        options = {"durability": "strict"} if mode == "readwrite" else {}
        tx = self._db.transaction(self.OBJECT_STORE, mode, _obj(options))
        return tx, tx.objectStore(self.OBJECT_STORE)

    async def _get(self, key: str) -> bytes | None:
        _, helpers, JsException = _js()
        try:
            _, os_ = self._tx("readonly")
            value = await _call(helpers, "req", os_.get(key))
        except JsException as exc:
            raise _error(f"get {key!r}", exc) from None
        if value is None:
            return None
        got = helpers.notBytes(value)
        if got:
            raise CorruptionError(f"IndexedDB {self.name!r} record {key!r}: expected bytes (a Uint8Array), got {got}")
        return _to_bytes(value)

    async def _set(self, key: str, data: bytes) -> None:
        _, helpers, JsException = _js()
        value = _u8(data)  # convert before the transaction starts: nothing may await inside it
        try:
            tx, os_ = self._tx("readwrite")
            os_.put(value, key)
            await _call(helpers, "tx", tx)
        except JsException as exc:
            raise _error(f"set {key!r}", exc) from None

    async def _delete(self, key: str) -> None:
        _, helpers, JsException = _js()
        try:
            tx, os_ = self._tx("readwrite")
            os_.delete(key)
            await _call(helpers, "tx", tx)
        except JsException as exc:
            raise _error(f"delete {key!r}", exc) from None

    async def _exists(self, key: str) -> bool:
        _, helpers, JsException = _js()
        try:
            _, os_ = self._tx("readonly")
            return int(await _call(helpers, "req", os_.count(key))) > 0
        except JsException as exc:
            raise _error(f"exists {key!r}", exc) from None

    async def _list_prefix(self, prefix: str) -> list[str]:
        js, helpers, JsException = _js()
        try:
            _, os_ = self._tx("readonly")
            if prefix:
                keys = await _call(helpers, "req", os_.getAllKeys(js.IDBKeyRange.bound(prefix, prefix + "\uffff")))
            else:
                keys = await _call(helpers, "req", os_.getAllKeys())
        except JsException as exc:
            raise _error(f"list {prefix!r}", exc) from None
        return [str(k) for k in keys if str(k).startswith(prefix)]


class OPFSStore(_BrowserStore):
    """A :class:`~kvckpt_web.store.Store` in a directory of the Origin Private File System.

    Open with ``store = await OPFSStore.open("name")``; keys map to nested files under ``/name/``.
    """

    KIND = "OPFS"

    def __init__(self, root: Any, name: str, *, read_only: bool = False,
                 lock_timeout: float = DEFAULT_LOCK_TIMEOUT, persisted: bool = False) -> None:
        super().__init__(name, read_only=read_only, lock_timeout=lock_timeout, persisted=persisted)
        self._root = root

    @classmethod
    async def open(cls, name: str = "kvckpt", *, read_only: bool = False, lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
                   persist: bool = True) -> "OPFSStore":
        """Open (creating) directory ``name`` of the OPFS; ``persist`` requests persistent storage first."""
        js, _, JsException = _js()
        persisted = await request_persistence() if persist else False
        try:
            top = await _call(js.navigator.storage, "getDirectory")
            root = await _call(top, "getDirectoryHandle", name, _obj({"create": True}))
        except JsException as exc:
            raise _error(f"open OPFS directory {name!r}", exc) from None
        return cls(root, name, read_only=read_only, lock_timeout=lock_timeout, persisted=persisted)

    async def _dir(self, parts: list[str], create: bool) -> Any:
        d = self._root
        for part in parts:
            d = await _call(d, "getDirectoryHandle", part, _obj({"create": create}))
        return d

    @staticmethod
    def _missing(exc: BaseException) -> bool:
        text = str(exc)
        return "NotFoundError" in text or "TypeMismatchError" in text or "TypeError" in text

    async def _get(self, key: str) -> bytes | None:
        _, helpers, JsException = _js()
        *dirs, base = key.split("/")
        try:
            d = await self._dir(dirs, False)
            handle = await _call(d, "getFileHandle", base)
            return _to_bytes(await _call(helpers, "bytes", handle))
        except JsException as exc:
            if self._missing(exc):
                return None
            raise _error(f"get {key!r}", exc) from None

    async def _set(self, key: str, data: bytes) -> None:
        *dirs, base = key.split("/")
        _, _, JsException = _js()
        writable, created_in = None, None
        try:
            d = await self._dir(dirs, True)
            created_in = None if await self._exists(key) else d
            handle = await _call(d, "getFileHandle", base, _obj({"create": True}))
            writable = await _call(handle, "createWritable", _obj({"keepExistingData": False}))
            await _call(writable, "write", _u8(data))
            await _call(writable, "close")  # atomically replaces the file's contents
        except JsException as exc:
            if writable is not None:
                with suppress(JsException):
                    await _call(writable, "abort")
            if created_in is not None:  # the empty file it created would pass for a stored value
                with suppress(JsException):
                    await _call(created_in, "removeEntry", base)
            raise _error(f"set {key!r}", exc) from None

    async def _delete(self, key: str) -> None:
        *dirs, base = key.split("/")
        _, _, JsException = _js()
        try:
            chain = [self._root]
            for part in dirs:
                chain.append(await _call(chain[-1], "getDirectoryHandle", part))
            await _call(chain[-1], "removeEntry", base)
        except JsException as exc:
            if self._missing(exc):
                return
            raise _error(f"delete {key!r}", exc) from None
        for i in range(len(dirs), 0, -1):  # prune directories left empty
            try:
                await _call(chain[i - 1], "removeEntry", dirs[i - 1])  # fails unless empty (no recursive option)
            except JsException:
                break

    async def _exists(self, key: str) -> bool:
        *dirs, base = key.split("/")
        _, _, JsException = _js()
        try:
            d = await self._dir(dirs, False)
            await _call(d, "getFileHandle", base)
            return True
        except JsException as exc:
            if self._missing(exc):
                return False
            raise _error(f"exists {key!r}", exc) from None

    async def _list_prefix(self, prefix: str) -> list[str]:
        js, helpers, JsException = _js()
        try:
            keys = await _call(helpers, "listFiles", self._root, "", js.Array.new())
        except JsException as exc:
            raise _error(f"list {prefix!r}", exc) from None
        return [str(k) for k in keys if str(k).startswith(prefix)]
