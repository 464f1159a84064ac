"""OPFSStore: a store in a directory of the Origin Private File System (Pyodide only).

Each key is a file under a per-store directory, written with ``createWritable()``, whose ``close()``
replaces the file atomically (an aborted or failed write leaves the old one).
"""

from __future__ import annotations

from contextlib import suppress
from typing import Any

from .base import DEFAULT_LOCK_TIMEOUT
from .js import BrowserStore, call, js_object, pyodide_js, request_persistence, store_error, to_bytes, u8

__all__ = ["OPFSStore"]


class OPFSStore(BrowserStore):
    """A :class:`~kvckpt_web.stores.base.Store` in a directory of the Origin Private File System.

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
        cls.check_open(name, read_only, lock_timeout, persist)
        js, _, JsException = pyodide_js()
        persisted = await request_persistence() if persist else False
        try:
            top = await call(js.navigator.storage, "getDirectory")
            root = await call(top, "getDirectoryHandle", name, js_object({"create": True}))
        except JsException as exc:
            raise store_error(f"open OPFS directory {name!r}", exc) from None
        return cls(root, name, read_only=read_only, lock_timeout=lock_timeout, persisted=persisted)

    async def _dir(self, parts: list[str], create: bool) -> Any:
        d = self._root
        for part in parts:
            d = await call(d, "getDirectoryHandle", part, js_object({"create": create}))
        return d

    @staticmethod
    def _missing(exc: BaseException) -> bool:
        text = str(exc)
        return "NotFoundError" in text or "TypeMismatchError" in text or "TypeError" in text

    async def _get(self, key: str) -> bytes | None:
        _, helpers, JsException = pyodide_js()
        *dirs, base = key.split("/")
        try:
            d = await self._dir(dirs, False)
            handle = await call(d, "getFileHandle", base)
            return to_bytes(await call(helpers, "bytes", handle))
        except JsException as exc:
            if self._missing(exc):
                return None
            raise store_error(f"get {key!r}", exc) from None

    async def _set(self, key: str, data: bytes) -> None:
        *dirs, base = key.split("/")
        _, _, JsException = pyodide_js()
        writable, created_in = None, None
        try:
            d = await self._dir(dirs, True)
            created_in = None if await self._exists(key) else d
            handle = await call(d, "getFileHandle", base, js_object({"create": True}))
            writable = await call(handle, "createWritable", js_object({"keepExistingData": False}))
            await call(writable, "write", u8(data))
            await call(writable, "close")  # atomically replaces the file's contents
        except JsException as exc:
            if writable is not None:
                with suppress(JsException):
                    await call(writable, "abort")
            if created_in is not None:  # the empty file it created would pass for a stored value
                with suppress(JsException):
                    await call(created_in, "removeEntry", base)
            raise store_error(f"set {key!r}", exc) from None

    async def _delete(self, key: str) -> None:
        *dirs, base = key.split("/")
        _, _, JsException = pyodide_js()
        try:
            chain = [self._root]
            for part in dirs:
                chain.append(await call(chain[-1], "getDirectoryHandle", part))
            await call(chain[-1], "removeEntry", base)
        except JsException as exc:
            if self._missing(exc):
                return
            raise store_error(f"delete {key!r}", exc) from None
        for i in range(len(dirs), 0, -1):  # prune directories left empty
            try:
                await call(chain[i - 1], "removeEntry", dirs[i - 1])  # fails unless empty (no recursive option)
            except JsException:
                break

    async def _exists(self, key: str) -> bool:
        *dirs, base = key.split("/")
        _, _, JsException = pyodide_js()
        try:
            d = await self._dir(dirs, False)
            await call(d, "getFileHandle", base)
            return True
        except JsException as exc:
            if self._missing(exc):
                return False
            raise store_error(f"exists {key!r}", exc) from None

    async def _list_prefix(self, prefix: str) -> list[str]:
        js, helpers, JsException = pyodide_js()
        try:
            keys = await call(helpers, "listFiles", self._root, "", js.Array.new())
        except JsException as exc:
            raise store_error(f"list {prefix!r}", exc) from None
        return [str(k) for k in keys if str(k).startswith(prefix)]
