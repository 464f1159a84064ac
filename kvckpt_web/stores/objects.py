"""ObjectStore: a store in object storage through ``obstore`` (Rust's object_store): S3 and S3-compatible
servers, Google Cloud Storage, Azure Blob Storage, a local directory or memory. Desktop only, from the optional
``remote`` extra; nothing imports this module in Pyodide.

Object storage has no lock that every writer sees, so this store's :meth:`~Store.lock` excludes only the holders
through one ``ObjectStore`` object (``exclusive_lock`` is False). A :meth:`~Store.claim` of a name excludes every
writer: it is a lease held in the claim object ``~kvckpt.claim.<name>`` (created only if absent, renewed and
taken over only if unchanged since read: conditional PUTs, ``If-None-Match: *`` and ``If-Match`` on S3; see
:mod:`.leases` and ``kvckpt_web/durable/FORMAT.md`` section 10). Writers on other processes or machines are kept
apart by those claims and by the commit protocol:

* chunks, manifests and prefix index records are written create-only (a conditional PUT, ``If-None-Match: *``
  on S3), so a manifest is never overwritten and a generation number belongs to whoever created its manifest
  first: a second writer of that generation fails with :class:`ConflictError` and has changed nothing anyone
  uses (its chunks are unreferenced, and collected once settled);
* gc and retention delete a chunk only once it is :meth:`settled`: last written more than ``grace_seconds``
  ago (default one hour, measured against the object's last-modified time, so the clocks of the machines
  must agree within that), asked before they list the manifests whose chunks they keep and again just
  before each delete. A writer's new chunks are younger than that while its save lasts; a chunk it reuses
  that is older than half the grace period is freshened by :meth:`set_if_absent` (as git freshens an object
  it would have written), so its age restarts: if the stored bytes are the ones it would have written, they
  are written again, conditional on the ETag they were read with (in a local directory its file's time is
  set). Freshening never writes the caller's bytes, so create-only stays create-only.

What this leaves open, as git's gc leaves it: a writer that rewrites an old unreferenced chunk in the moment
between gc's last look at that chunk and its delete (object storage offers no delete conditional on the
object's age, and a rewritten chunk has the same ETag). A save that lasts longer than half the grace period is
not protected. See ``kvckpt_web/durable/FORMAT.md`` section 8.
"""

from __future__ import annotations

import asyncio
import os
import time
from datetime import datetime, timezone
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager
from functools import partial
from typing import Any

from ..checks import check_callable, check_instance, check_seconds
from ..errors import ConflictError, FieldError, StoreError
from .base import CLAIM_PREFIX, DEFAULT_LOCK_TIMEOUT, LocalLock, Store, check_value_size
from .leases import (CLOCK_SKEW_SECONDS, DEFAULT_LEASE_SECONDS, MAX_CLAIM_BYTES, ClaimValue, Lease, Leases,
                     check_lease_seconds, check_writer, claim_runs_until, decode_claim, default_writer, encode_claim,
                     new_holder)

__all__ = ["DEFAULT_GRACE_SECONDS", "FAULT_STEPS", "REQUEST_THREADS", "SETTLE_CONCURRENCY", "ObjectStore"]

DEFAULT_GRACE_SECONDS = 3600.0
"""How long after its last write gc and retention leave an unreferenced chunk alone (see the module docstring)."""

FAULT_STEPS = ("put", "delete")
"""The steps an :class:`ObjectStore` passes to its ``fault`` hook, before each request that changes storage."""

SETTLE_CONCURRENCY = 16
"""Requests in flight while :meth:`ObjectStore.settled` asks for the ages of values."""

REQUEST_THREADS = 16
"""Threads of one :class:`ObjectStore` that wait on its requests. obstore's blocking calls run there, not its
``*_async`` ones: those hand their answer to Python from obstore's own runtime threads, and one of those still
in Python as the interpreter exits aborts the process (SIGABRT after the program's work was done: 9 of 25
short runs on a loaded 2-core machine)."""

SCHEMES = ("s3", "s3a", "gs", "az", "adl", "azure", "abfs", "abfss", "file", "memory")
"""URL schemes :meth:`ObjectStore.from_url` opens."""


def _obstore() -> Any:
    try:
        import obstore
    except ModuleNotFoundError as exc:
        if exc.name != "obstore":
            raise
        raise StoreError("object storage: expected the remote extra (obstore), got no module 'obstore': "
                         "pip install 'kvckpt_web[remote]'") from None
    return obstore


def _reason(exc: BaseException) -> str:
    """The first line of what obstore said (its messages go on with a debug dump)."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


class ObjectStore(Store):
    """A store in object storage (see the module docstring for what makes concurrent writers safe).

    ``store`` is an obstore store object (``obstore.store.S3Store(...)``, ``from_url(...)``); keys are paths
    under it (its ``prefix``, if any, in front). :meth:`from_url` opens one from a URL, with the endpoint and
    credentials from the usual environment variables. ``grace_seconds`` is the period of :meth:`settled`,
    ``lease_seconds`` how long a claim runs unless renewed, ``writer`` who its claims say holds them (default
    :func:`~.leases.default_writer`: the host name and process id); ``clock`` (default ``time.time``) is what ages and
    leases are measured with; ``fault``, if given, is called with
    each step name of :data:`FAULT_STEPS` before that request, for fault-injection tests.

    Every value is written in one request (no multipart upload), so a reader sees the old value or the new
    one. A key may both hold a value and start other keys (``a`` and ``a/b``), as object storage allows.
    """

    exclusive_lock = False

    def __init__(self, store: Any, *, url: str | None = None, read_only: bool = False,
                 lock_timeout: float = DEFAULT_LOCK_TIMEOUT, grace_seconds: float = DEFAULT_GRACE_SECONDS,
                 lease_seconds: float = DEFAULT_LEASE_SECONDS, writer: str | None = None,
                 clock: Callable[[], float] | None = None, fault: Callable[[str], None] | None = None) -> None:
        super().__init__(read_only=read_only, lock_timeout=lock_timeout)
        obstore = _obstore()
        self._obs = obstore
        self._store = check_instance("store", store, _store_types(obstore), "an obstore store object")
        self._url = url
        self.grace_seconds = check_seconds("grace_seconds", grace_seconds)
        self._clock = check_callable("clock", clock) or time.time
        self.fault = check_callable("fault", fault)
        self.lease_seconds = check_lease_seconds("lease_seconds", lease_seconds)
        self.writer = default_writer() if writer is None else check_writer("writer", writer)
        self._lock_flag = LocalLock(f"{self!r} (this object's)")
        self._leases = Leases(self._clock)
        self._threads: ThreadPoolExecutor | None = None

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> "ObjectStore":
        """The store at ``url``: ``s3://bucket/prefix`` (endpoint, region and credentials from ``AWS_ENDPOINT_URL``,
        ``AWS_REGION``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``; plain HTTP to a
        local server only with ``AWS_ALLOW_HTTP=true``), ``gs://bucket/prefix``, ``az://container/prefix``,
        ``file:///directory`` or ``memory:///``; ``kwargs`` as for the constructor. FieldError naming the URL
        for another scheme or one obstore cannot open."""
        obstore = _obstore()
        if not isinstance(url, str) or url.partition("://")[0].lower() not in SCHEMES or "://" not in url:
            raise FieldError("url", f"an object storage URL ({', '.join(s + '://' for s in SCHEMES)})",
                             url if isinstance(url, str) else type(url).__name__)
        options = {"mkdir": True} if url.lower().startswith("file://") else {}
        try:
            store = obstore.store.from_url(url, **options)
        except (obstore.exceptions.BaseError, ValueError, OSError) as exc:
            raise FieldError("url", "an object storage URL obstore can open", url, _reason(exc)) from None
        return cls(store, url=url, **kwargs)

    def __repr__(self) -> str:
        return f"ObjectStore({self._url or self._store!r}, read_only={self.read_only})"

    @property
    def location(self) -> str:
        return self._url or _location(self._obs, self._store)

    def _step(self, name: str) -> None:
        if self.fault is not None:
            self.fault(name)

    def _error(self, what: str, key: str, exc: BaseException) -> StoreError:
        return StoreError(f"{what} {key!r} in {self.location}: {_reason(exc)}")

    async def _request(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """What the blocking obstore ``call`` answers, run on this store's request threads."""
        if self._threads is None:
            self._threads = ThreadPoolExecutor(REQUEST_THREADS, thread_name_prefix="kvckpt-objects")
        return await asyncio.get_running_loop().run_in_executor(self._threads, partial(call, *args, **kwargs))

    async def _call(self, what: str, key: str, call: Callable[..., Any]) -> Any:
        """What obstore's ``call`` of ``key`` with this store answers; None if the key holds nothing; StoreError
        naming the key if the storage failed."""
        try:
            return await self._request(call, self._store, key)
        except FileNotFoundError:
            return None
        except (self._obs.exceptions.BaseError, OSError) as exc:
            raise self._error(what, key, exc) from exc

    async def _open(self, key: str) -> Any:
        """The answer of a GET of ``key`` (its ``meta``, its body not read yet); None if there is none."""
        return await self._call("get", key, self._obs.get)

    async def _body(self, key: str, answer: Any) -> bytes:
        try:
            return bytes(await self._request(answer.bytes))
        except (self._obs.exceptions.BaseError, OSError) as exc:
            raise self._error("get", key, exc) from exc

    async def _get(self, key: str) -> bytes | None:
        answer = await self._open(key)
        return None if answer is None else await self._body(key, answer)

    async def _get_bounded(self, key: str, max_bytes: int) -> bytes | None:
        answer = await self._open(key)
        if answer is None:
            return None
        check_value_size(key, answer.meta["size"], max_bytes)  # before the body is read
        data = await self._body(key, answer)
        check_value_size(key, len(data), max_bytes)
        return data

    async def _get_into(self, key: str, out: memoryview) -> int | None:
        answer = await self._open(key)
        if answer is None:
            return None
        if answer.meta["size"] != len(out):
            return answer.meta["size"]
        data = await self._body(key, answer)
        if len(data) == len(out):
            out[:] = data
        return len(data)

    async def _put(self, key: str, data: memoryview, mode: str) -> bool:
        """PUT ``data`` under ``key`` (``mode`` "create": only if it holds nothing); whether it was stored."""
        self._step("put")
        if isinstance(self._store, self._obs.store.MemoryStore):
            data = bytes(data)  # it would keep the caller's buffer, not a copy
        try:
            await self._request(self._obs.put, self._store, key, data, mode=mode, use_multipart=False)
        except self._obs.exceptions.AlreadyExistsError:
            return False
        except (self._obs.exceptions.BaseError, OSError) as exc:
            raise self._error("set", key, exc) from exc
        return True

    async def _set(self, key: str, data: memoryview) -> None:
        await self._put(key, data, "overwrite")

    async def _set_if_absent(self, key: str, data: memoryview) -> bool:
        if await self._put(key, data, "create"):
            return True
        age = await self._age(key)
        if age is not None and age > self.grace_seconds / 2:
            await self._freshen(key, data)  # a concurrent gc leaves it alone now
        return False

    async def _freshen(self, key: str, data: memoryview) -> None:
        """Restart the age of the value stored under ``key`` if it is ``data``, writing only what is stored: the
        stored bytes again, conditional on the ETag (and version) they were read with, so a value changed or
        deleted meanwhile is left as it is; in a local directory, whose store has no conditional overwrite, its
        file's modification time (as git freshens an object). Never the caller's bytes over another value."""
        answer = await self._open(key)
        stored = None if answer is None else await self._body(key, answer)
        if stored != data:
            return
        self._step("put")
        if isinstance(self._store, self._obs.store.LocalStore):
            try:
                os.utime(self._store.prefix / key, follow_symlinks=False)
            except FileNotFoundError:
                return
            except OSError as exc:
                raise self._error("freshen", key, exc) from exc
            return
        meta = answer.meta
        mode = {name: meta[name] for name in ("e_tag", "version") if meta.get(name) is not None}
        if not mode:
            return  # nothing to make the write conditional on: no freshening
        try:
            await self._request(self._obs.put, self._store, key, stored, mode=mode, use_multipart=False)
        except self._obs.exceptions.PreconditionError:
            return  # changed or deleted since it was read: not this writer's to freshen
        except NotImplementedError:
            return  # a storage without conditional overwrites (a WebDAV server): not freshened
        except (self._obs.exceptions.BaseError, OSError) as exc:
            raise self._error("freshen", key, exc) from exc

    async def _delete(self, key: str) -> None:
        self._step("delete")
        await self._call("delete", key, self._obs.delete)

    async def _head(self, key: str) -> dict[str, Any] | None:
        return await self._call("head", key, self._obs.head)

    async def _exists(self, key: str) -> bool:
        return await self._head(key) is not None

    async def _age(self, key: str) -> float | None:
        """Seconds since ``key`` was last written, by :attr:`clock`; None if it holds nothing."""
        meta = await self._head(key)
        return None if meta is None else self._clock() - meta["last_modified"].timestamp()

    async def _settled(self, keys: list[str]) -> set[str]:
        ages: dict[str, float | None] = {}
        semaphore = asyncio.Semaphore(SETTLE_CONCURRENCY)

        async def age(key: str) -> None:
            async with semaphore:
                ages[key] = await self._age(key)

        await asyncio.gather(*(age(key) for key in keys))
        return {key for key, seconds in ages.items() if seconds is not None and seconds > self.grace_seconds}

    async def _list_prefix(self, prefix: str) -> list[str]:
        """object_store lists whole path segments: list the directory ``prefix`` is in, keep what it starts."""
        directory = prefix.rpartition("/")[0]

        def listing() -> list[str]:  # claim objects are no keys
            return [meta["path"] for batch in self._obs.list(self._store, directory or None, chunk_size=1000)
                    for meta in batch if meta["path"].startswith(prefix) and not meta["path"].startswith(CLAIM_PREFIX)]

        try:
            return await self._request(listing)
        except (self._obs.exceptions.BaseError, OSError) as exc:
            raise self._error("list", prefix, exc) from exc

    def _lock(self, timeout: float) -> AbstractAsyncContextManager[None]:
        return self._lock_flag.hold(timeout)

    async def _claim(self, name: str) -> Callable[[], Awaitable[None]]:
        """Create the claim object of ``name``, or take over one that ran out; what releases it: deletes it while
        the lease still runs (after that, another writer may have taken it over: it is left to them)."""
        key = CLAIM_PREFIX + name
        lease = Lease(new_holder(), self._clock(), self.lease_seconds, None)
        value = encode_claim(ClaimValue(name, lease.holder, lease.expires_ms(), self.writer))
        lease.tag = await self._put_claim(key, value, "create")
        if lease.tag is None:
            lease.tag = await self._take_over(name, key, value)
        self._leases.hold(name, lease)

        async def release() -> None:
            if self._leases.drop(name, lease):
                try:
                    await self._delete(key)
                except StoreError:
                    pass  # left behind, it runs out by itself

        return release

    async def _take_over(self, name: str, key: str, value: bytes) -> str:
        """Replace the claim object of ``name`` with ``value`` if it ran out (``_claimed`` while it runs, or if
        another writer replaced it first); the ETag written."""
        answer = await self._open(key)
        if answer is None:  # released since it was found
            tag = await self._put_claim(key, value, "create")
        else:
            meta = answer.meta
            found = decode_claim(name, await self._body(key, answer)) if meta["size"] <= MAX_CLAIM_BYTES else None
            runs_until = claim_runs_until(found, meta["last_modified"].timestamp())
            if self._clock() <= runs_until + CLOCK_SKEW_SECONDS:
                raise self._held_by(name, found, runs_until)
            tag = await self._put_claim(key, value, {"e_tag": meta["e_tag"]})
        if tag is None:
            raise self._claimed(name)
        return tag

    def _held_by(self, name: str, found: ClaimValue | None, runs_until: float) -> ConflictError:
        """The error of a claim of ``name`` that the claim object ``found`` holds until ``runs_until``: who holds it
        and until when, and from when another writer may take it over if it is not renewed (``retry_at``)."""
        who = "another writer" if found is None or found.writer is None else f"writer {found.writer!r}"
        retry_at = runs_until + CLOCK_SKEW_SECONDS
        return ConflictError(f"claim {name!r} of {self.location}: held by {who} of that name until {_utc(runs_until)} "
                             f"unless renewed (another writer may take it over from {_utc(retry_at)}); nothing was "
                             "written", retry_at=retry_at)

    async def _renew_claim(self, name: str) -> None:
        async def put(lease: Lease) -> bool:
            started = self._clock()
            value = encode_claim(ClaimValue(name, lease.holder, int((started + lease.seconds) * 1000), self.writer))
            tag = await self._put_claim(CLAIM_PREFIX + name, value, {"e_tag": lease.tag})
            if tag is not None:
                lease.started, lease.tag = started, tag
            return tag is not None

        if not await self._leases.renew(name, put):
            raise self._lost(name)

    async def _put_claim(self, key: str, value: bytes, mode: Any) -> str | None:
        """PUT claim object ``value`` under ``key`` if its condition ``mode`` holds ("create", or unchanged since
        an ETag); the ETag written, or None if the condition failed."""
        self._step("put")
        try:
            answer = await self._request(self._obs.put, self._store, key, value, mode=mode, use_multipart=False)
        except (self._obs.exceptions.AlreadyExistsError, self._obs.exceptions.PreconditionError, FileNotFoundError):
            return None
        except NotImplementedError as exc:
            raise StoreError(f"claim {key!r} in {self.location}: this object storage writes nothing conditionally "
                             f"on an ETag ({_reason(exc)}), which a claim's renewal and take-over need; open a "
                             "directory as a plain path instead (FileStore)") from exc
        except (self._obs.exceptions.BaseError, OSError) as exc:
            raise self._error("claim", key, exc) from exc
        return answer["e_tag"]


def _utc(seconds: float) -> str:
    """Unix time ``seconds`` as an ISO 8601 UTC time to the second."""
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _location(obstore: Any, store: Any) -> str:
    """Where an obstore store object is, as the URL :meth:`ObjectStore.from_url` would open it from."""
    s = obstore.store
    if isinstance(store, s.MemoryStore):
        return "memory:///"
    if isinstance(store, s.LocalStore):
        return f"file://{os.fspath(store.prefix or '/')}"
    if isinstance(store, s.HTTPStore):
        return store.url
    scheme, container = {s.S3Store: ("s3", "bucket"), s.GCSStore: ("gs", "bucket"),
                         s.AzureStore: ("az", "container_name")}[type(store)]
    return f"{scheme}://{store.config[container]}/{store.prefix or ''}".rstrip("/")


def _store_types(obstore: Any) -> tuple[type, ...]:
    s = obstore.store
    return (s.S3Store, s.GCSStore, s.AzureStore, s.LocalStore, s.MemoryStore, s.HTTPStore)
