"""What both browser stores share (Pyodide only): the JS glue they call through, persistent storage, and
their base class with its Web Lock.

Writer locks and claims of a checkpoint name use the Web Locks API (``navigator.locks``), which excludes
other tabs and workers of the same origin as well as other tasks of this one; a claim asks with
``ifAvailable`` and never waits. Both stores' ``open`` classmethods ask for persistent
storage (``navigator.storage.persist()``; the answer is in ``.persisted``). A full quota raises
:class:`StoreError`; the failed write changes nothing, so the last committed checkpoint stays intact.
Every JS promise the stores await is made by one helper (``call``) that turns any rejection into a
plain ``Error`` with the reason's name and message, which Pyodide always raises; a stored value that is
not bytes raises :class:`CorruptionError` naming its key.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from ..checks import check_bool, check_instance
from ..errors import StoreError
from .base import Store, check_store_options

__all__ = ["BrowserStore", "call", "js_object", "pyodide_js", "request_persistence", "store_error", "to_bytes", "u8"]

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
  // Resolves at once: to false if the Web Lock `name` is held, else to a function that releases the lock now
  // held, returning a promise that resolves once the lock is free again.
  claim(name) {
    return new Promise((resolve, reject) => {
      const released = navigator.locks.request(name, { mode: "exclusive", ifAvailable: true }, (lock) => {
        if (lock === null) return resolve(false);
        return new Promise((release) => resolve(() => { release(); return released; }));
      });
      released.catch(reject);
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


def pyodide_js() -> tuple[Any, Any, Any]:
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


async def call(obj: Any, method: str, *args: Any) -> Any:
    """The awaited result of ``obj.method(*args)`` on a JS object; any rejection raises ``JsException``."""
    _, helpers, _ = pyodide_js()
    return await helpers.call(obj, method, *args)


def js_object(value: dict[str, Any]) -> Any:
    import js  # type: ignore[import-not-found]
    from pyodide.ffi import to_js  # type: ignore[import-not-found]

    return to_js(value, dict_converter=js.Object.fromEntries)


def u8(data: bytes) -> Any:
    import js  # type: ignore[import-not-found]

    arr = js.Uint8Array.new(len(data))
    if data:
        arr.assign(data)
    return arr


def to_bytes(arr: Any) -> bytes:
    out = bytearray(arr.byteLength)
    if out:
        arr.assign_to(out)
    return bytes(out)


def store_error(what: str, exc: BaseException) -> StoreError:
    text = str(exc)
    if "QuotaExceeded" in text or "quota" in text.lower():
        return StoreError(f"{what}: storage quota exceeded ({text}); nothing was written, the last committed "
                          "checkpoint is intact")
    return StoreError(f"{what}: {text}")


async def request_persistence() -> bool:
    """Ask the browser to keep this origin's storage under pressure; True if granted."""
    js, _, JsException = pyodide_js()
    storage = getattr(js.navigator, "storage", None)
    if storage is None or not hasattr(storage, "persist"):
        return False
    try:
        return bool(await call(storage, "persist"))
    except JsException:
        return False


class BrowserStore(Store):
    """What both browser stores share: a name, the persistence answer, and Web Locks named for them (the writer
    lock ``kvckpt:<kind>:<name>``, the claim of checkpoint name N ``kvckpt:<kind>:<name>:claim:N``)."""

    KIND = ""

    def __init__(self, name: str, *, read_only: bool, lock_timeout: float, persisted: bool) -> None:
        super().__init__(read_only=read_only, lock_timeout=lock_timeout)
        self.name = check_instance("name", name, str, "a str")
        self.persisted = persisted
        self._lock_name = f"kvckpt:{self.KIND.lower()}:{name}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, read_only={self.read_only})"

    @property
    def location(self) -> str:
        return f"{self.KIND.lower()}:{self.name}"

    @staticmethod
    def check_open(name: str, read_only: bool, lock_timeout: float, persist: bool) -> None:
        """FieldError for an argument of ``open`` of the wrong type or value, before anything is opened."""
        check_instance("name", name, str, "a str")
        check_store_options(read_only, lock_timeout)
        check_bool("persist", persist)

    @staticmethod
    def _web_locks(what: str) -> tuple[Any, Any]:
        """The JS helpers and JsException, once the Web Locks API is known to be there (else StoreError naming
        ``what``)."""
        js, helpers, JsException = pyodide_js()
        if getattr(js.navigator, "locks", None) is None:
            raise StoreError(f"{what}: the Web Locks API is unavailable")
        return helpers, JsException

    @asynccontextmanager
    async def _lock(self, timeout: float) -> AsyncIterator[None]:
        helpers, JsException = self._web_locks(f"lock {self._lock_name}")
        try:
            release = await call(helpers, "lock", self._lock_name, int(timeout * 1000))
        except JsException as exc:
            raise StoreError(f"lock {self._lock_name}: not acquired within {timeout} s (held by another writer, "
                             f"tab or worker: {exc})") from None
        try:
            yield
        finally:
            release()

    async def _claim(self, name: str) -> Callable[[], Awaitable[None]]:
        lock_name = f"{self._lock_name}:claim:{name}"
        helpers, JsException = self._web_locks(f"claim {lock_name}")
        try:
            release_lock = await call(helpers, "claim", lock_name)
        except JsException as exc:
            raise StoreError(f"claim {lock_name}: {exc}") from None
        if release_lock is False:
            raise self._claimed(name)

        async def release() -> None:
            await release_lock()  # the lock is free once it resolves

        return release
