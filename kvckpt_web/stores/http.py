"""HTTPStore: the store that ``kvckpt serve --store DIR|URL --token T`` serves, over HTTP, in the browser (through
Pyodide's ``fetch``) and on desktop (``urllib`` on a worker thread).

The served store is create-only: every key a checkpoint writes is written once (chunks are named by their
bytes, manifests and prefix index records by their generation), so nothing there is ever overwritten or deleted
through it (``supports_overwrites`` and ``supports_deletes`` are False; gc runs where its storage is). Its
:meth:`~Store.lock` excludes only the holders through this object (``exclusive_lock`` is False): writers elsewhere
are kept apart by their claims and the create-only commit, and the server refuses a manifest that names a chunk it
does not hold. A :meth:`~Store.claim` is a lease the server gives (and holds the claim of its storage for), which
:meth:`~Store.renew_claim` renews. See ``kvckpt_web/server/store_routes.py`` and ``claim_routes.py`` for the
protocol.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from ..checks import check_callable, check_instance, check_seconds
from ..errors import ConflictError, FieldError, FormatError, StoreError
from .base import DEFAULT_LOCK_TIMEOUT, LocalLock, Store, check_value_size
from .leases import Lease, Leases, check_lease_seconds, new_holder

__all__ = ["DEFAULT_TIMEOUT", "HTTPStore"]

DEFAULT_TIMEOUT = 60.0
"""Seconds a desktop request may take before it fails (the browser's own limits apply there)."""


@dataclass(frozen=True)
class _Answer:
    status: int
    length: int | None
    """The Content-Length the server declared, if any."""
    read: Callable[[], Awaitable[bytes]]
    """The body (read at most once)."""
    text: Callable[[], Awaitable[str]]
    """The body as text, for an error's message (its first line)."""


class HTTPStore(Store):
    """The store served at ``url`` (the ``kvckpt serve`` server's base URL) to holders of the bearer ``token``.

    ``bytes_read`` counts the value bytes this object fetched, as ``bytes_written`` counts those it stored.
    ``clock`` (default ``time.time``) times the leases of its claims. Requests that fail (no server, a lost
    connection, an answer other than the protocol's) raise :class:`StoreError` naming the key; a wrong token is a
    StoreError saying so (401, nothing written).
    """

    supports_overwrites = False
    supports_deletes = False
    exclusive_lock = False

    def __init__(self, url: str, *, token: str | None, read_only: bool = False,
                 lock_timeout: float = DEFAULT_LOCK_TIMEOUT, timeout: float = DEFAULT_TIMEOUT,
                 clock: Callable[[], float] | None = None) -> None:
        super().__init__(read_only=read_only, lock_timeout=lock_timeout)
        check_instance("url", url, str, "the http(s) URL of a kvckpt serve --store server")
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
            raise FieldError("url", "the http(s) URL of a kvckpt serve --store server (http://host:port/)", url)
        if not isinstance(token, str) or not token:
            raise FieldError("token", "the bearer token the store is served with (kvckpt serve --token)",
                             "none" if token is None else type(token).__name__)
        self.url = url.rstrip("/") + "/"
        self._headers = {"authorization": f"Bearer {token}"}
        self._timeout = check_seconds("timeout", timeout)
        self._lock_flag = LocalLock(f"{self!r} (this object's)")
        self._leases = Leases(check_callable("clock", clock) or time.time)
        self.bytes_read = 0

    def __repr__(self) -> str:
        return f"HTTPStore({self.url!r}, read_only={self.read_only})"

    @property
    def location(self) -> str:
        return self.url

    # -- requests ------------------------------------------------------------------------------------------

    def _value_url(self, key: str) -> str:
        return f"{self.url}store/v/{key}"

    async def _request(self, method: str, url: str, key: str, body: memoryview | None = None) -> _Answer:
        headers = dict(self._headers)
        if body is not None:
            headers["content-type"] = "application/octet-stream"
        fetch = _browser_fetch if sys.platform == "emscripten" else _desktop_fetch
        try:
            answer = await fetch(method, url, headers, body, self._timeout)
        except OSError as exc:
            raise StoreError(f"{method} {key!r} at {self.url}: no answer ({exc})") from exc
        except Exception as exc:  # the browser's fetch rejects with a JS TypeError ("Failed to fetch")
            if sys.platform != "emscripten":
                raise
            raise StoreError(f"{method} {key!r} at {self.url}: no answer ({exc})") from exc
        if answer.status == 401:
            raise StoreError(f"{method} {key!r} at {self.url}: the server refused the token (401); nothing written")
        return answer

    async def _failed(self, method: str, key: str, answer: _Answer) -> StoreError:
        text = (await answer.text()).strip().splitlines()
        return StoreError(f"{method} {key!r} at {self.url}: the server answered {answer.status}"
                          + (f" ({text[0]})" if text else ""))

    async def _fetch(self, key: str, max_bytes: int | None = None) -> bytes | None:
        answer = await self._request("GET", self._value_url(key), key)
        if answer.status == 404:
            return None
        if answer.status != 200:
            raise await self._failed("GET", key, answer)
        if max_bytes is not None and answer.length is not None:
            check_value_size(key, answer.length, max_bytes)  # before the body is read
        data = await answer.read()
        self.bytes_read += len(data)
        return data

    async def _put(self, key: str, data: memoryview) -> bool:
        """PUT ``data`` under ``key``; whether it was stored (False: the key held a value)."""
        answer = await self._request("PUT", self._value_url(key), key, data)
        if answer.status == 201:
            return True
        if answer.status == 412:
            return False
        if answer.status in (400, 409, 413):
            text = (await answer.text()).strip().splitlines()
            raise FormatError(key, "a value the store takes", f"refused with {answer.status}",
                              text[0] if text else "")
        raise await self._failed("PUT", key, answer)

    # -- the Store interface ---------------------------------------------------------------------------------

    async def _get(self, key: str) -> bytes | None:
        return await self._fetch(key)

    async def _get_bounded(self, key: str, max_bytes: int) -> bytes | None:
        data = await self._fetch(key, max_bytes)
        if data is not None:
            check_value_size(key, len(data), max_bytes)
        return data

    async def _set(self, key: str, data: memoryview) -> None:
        if not await self._put(key, data):
            raise ConflictError(f"set {key!r}: {self.location} holds a value there already and is create-only; "
                                "nothing was written")

    async def _set_if_absent(self, key: str, data: memoryview) -> bool:
        return await self._put(key, data)

    async def _delete(self, key: str) -> None:  # never called: supports_deletes is False
        raise StoreError(f"delete {key!r}: {self.location} deletes nothing")

    async def _exists(self, key: str) -> bool:
        answer = await self._request("HEAD", self._value_url(key), key)
        if answer.status in (200, 404):
            return answer.status == 200
        raise await self._failed("HEAD", key, answer)

    async def _settled(self, keys: list[str]) -> set[str]:
        return set()  # nothing is deleted through this store

    async def _list_prefix(self, prefix: str) -> list[str]:
        keys: list[str] = []
        after = ""
        while True:
            query = urllib.parse.urlencode({"prefix": prefix, "after": after})
            answer = await self._request("GET", f"{self.url}store/keys?{query}", prefix)
            if answer.status != 200:
                raise await self._failed("GET keys", prefix, answer)
            try:
                page = json.loads(await answer.read())
                listed, truncated = page["keys"], page["truncated"]
            except (ValueError, KeyError, TypeError) as exc:
                raise StoreError(f"list {prefix!r} at {self.url}: not a key listing ({exc})") from None
            keys += listed
            if not truncated or not listed:
                return keys
            after = listed[-1]

    def _lock(self, timeout: float) -> AbstractAsyncContextManager[None]:
        return self._lock_flag.hold(timeout)

    async def _claim(self, name: str) -> Callable[[], Awaitable[None]]:
        holder, started = new_holder(), self._leases.clock()
        seconds = await self._claim_request("POST", name, holder)
        if seconds is None:
            raise self._claimed(name)
        lease = Lease(holder, started, seconds, None)
        self._leases.hold(name, lease)

        async def release() -> None:
            self._leases.drop(name, lease)
            try:
                await self._claim_request("DELETE", name, holder)
            except StoreError:
                pass  # the server releases it once its lease runs out

        return release

    async def _renew_claim(self, name: str) -> None:
        async def put(lease: Lease) -> bool:
            started = self._leases.clock()
            seconds = await self._claim_request("PUT", name, lease.holder)
            if seconds is not None:
                lease.started, lease.seconds = started, seconds
            return seconds is not None

        if not await self._leases.renew(name, put):
            raise self._lost(name)

    async def _claim_request(self, method: str, name: str, holder: str) -> float | None:
        """Take (POST), renew (PUT) or release (DELETE) ``holder``'s claim of ``name`` at the server: the seconds
        of the lease it gave, None if it refused (409: another holder has the name); 0 for a release."""
        url = f"{self.url}store/claims/{name}"
        what = f"claim {name!r}"
        if method == "DELETE":
            answer = await self._request(method, f"{url}?{urllib.parse.urlencode({'holder': holder})}", what)
            if answer.status != 204:
                raise await self._failed(method, what, answer)
            return 0.0
        body = json.dumps({"holder": holder}).encode()
        answer = await self._request(method, url, what, memoryview(body))
        if answer.status == 409:
            return None
        if answer.status not in (200, 201):
            raise await self._failed(method, what, answer)
        try:
            return check_lease_seconds("seconds", json.loads(await answer.read())["seconds"])
        except (ValueError, KeyError, TypeError, FieldError) as exc:
            raise StoreError(f"{method} {what} at {self.url}: not a lease ({exc})") from None


# -- transports ------------------------------------------------------------------------------------------------


async def _desktop_fetch(method: str, url: str, headers: Mapping[str, str], body: memoryview | None,
                         timeout: float) -> _Answer:
    """One request with urllib on a worker thread; the body is read there too, when asked for."""
    request = urllib.request.Request(url, data=None if body is None else bytes(body), method=method,
                                     headers=dict(headers))

    def send() -> Any:
        try:
            return urllib.request.urlopen(request, timeout=timeout)
        except urllib.error.HTTPError as exc:
            return exc  # an answer all the same: its status and body

    response = await asyncio.to_thread(send)
    length = response.headers.get("content-length")

    async def read() -> bytes:
        try:
            return await asyncio.to_thread(response.read)
        finally:
            response.close()

    async def text() -> str:
        return (await read()).decode("utf-8", "replace")

    if method == "HEAD":
        response.close()
    return _Answer(response.status if hasattr(response, "status") else response.code,
                   int(length) if length is not None and length.isdigit() else None, read, text)


async def _browser_fetch(method: str, url: str, headers: Mapping[str, str], body: memoryview | None,
                         timeout: float) -> _Answer:
    """One request with the browser's ``fetch`` (Pyodide)."""
    from js import Object, fetch  # type: ignore[import-not-found]
    from pyodide.ffi import to_js  # type: ignore[import-not-found]

    init: dict[str, Any] = {"method": method, "headers": to_js(dict(headers), dict_converter=Object.fromEntries)}
    if body is not None:
        init["body"] = to_js(body)  # a Uint8Array copy
    response = await fetch(url, to_js(init, dict_converter=Object.fromEntries))
    length = response.headers.get("content-length")

    async def read() -> bytes:
        return (await response.arrayBuffer()).to_bytes()

    async def text() -> str:
        return str(await response.text())

    return _Answer(int(response.status), int(length) if length is not None and str(length).isdigit() else None,
                   read, text)
