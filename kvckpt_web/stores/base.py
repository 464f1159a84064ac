"""The store contract: an async key/value map of bytes, the durable layer under checkpoints.

A store knows nothing about KV caches. Keys are ``'/'``-separated relative
names whose segments use only ``[A-Za-z0-9._-]`` (``"."`` and ``".."`` are not
segments). Values are bytes. :meth:`Store.set` is atomic: a reader sees the
old value or the new one, never a mix.

Implementations, one module each: :class:`~kvckpt_web.stores.memory.MemoryStore`,
:class:`~kvckpt_web.stores.file.FileStore`, on desktop :class:`~kvckpt_web.stores.objects.ObjectStore` (object
storage through obstore), :class:`~kvckpt_web.stores.http.HTTPStore` (a store ``kvckpt serve --store`` serves),
and in the browser :class:`~kvckpt_web.stores.indexeddb.IndexedDBStore` and
:class:`~kvckpt_web.stores.opfs.OPFSStore`.

Capability flags (class attributes, as zarr-python's stores have) say what a backend offers, so callers and the
shared test suite ask them instead of probing: :attr:`Store.supports_overwrites`, :attr:`Store.supports_deletes`
and :attr:`Store.exclusive_lock`.
"""

from __future__ import annotations

import asyncio
import re
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from typing import Any, TypeVar

from ..checks import check_bool, check_instance, check_int, check_seconds, check_writable, type_name
from ..errors import ConflictError, FieldError, FormatError, StoreError
from ..threads import offload

__all__ = [
    "CLAIM_PREFIX",
    "DEFAULT_LOCK_TIMEOUT",
    "LocalClaims",
    "LocalLock",
    "Store",
    "check_store",
    "check_store_options",
    "check_value_size",
    "poll_acquire",
    "validate_key",
    "validate_prefix",
]


MAX_SEGMENT_CHARS = 200
"""Longest key segment; leaves room for FileStore's temp-name decoration within 255 bytes."""

MAX_KEY_CHARS = 1024
"""Longest key."""

DEFAULT_LOCK_TIMEOUT = 10.0
"""Seconds :meth:`Store.lock` waits for the lock unless told otherwise."""

CLAIM_PREFIX = "~kvckpt.claim."
"""A store that keeps the claim of a checkpoint name in its storage keeps it under this followed by the name, beside
its keys and never one of them (``~`` is no key character): FileStore's claim file, ObjectStore's claim object."""

_T = TypeVar("_T")

_SEGMENT_RE = re.compile(r"[A-Za-z0-9._-]+")
_PARTIAL_RE = re.compile(r"[A-Za-z0-9._-]*")
_KEY_RULE = "'/'-separated segments of [A-Za-z0-9._-], none '.' or '..'"


def is_segment(segment: str) -> bool:
    return (
        len(segment) <= MAX_SEGMENT_CHARS
        and segment not in (".", "..")
        and _SEGMENT_RE.fullmatch(segment) is not None
    )


def validate_key(key: str) -> str:
    """Return ``key`` if it is a valid store key, else raise :class:`FieldError`."""
    if not isinstance(key, str):
        raise FieldError("key", "a str", type(key).__name__)
    if not key or len(key) > MAX_KEY_CHARS:
        raise FieldError("key", f"1 to {MAX_KEY_CHARS} characters", key)
    for segment in key.split("/"):
        if not is_segment(segment):
            raise FieldError("key", _KEY_RULE, key, f"bad segment {segment!r}")
    return key


def _check_name(name: Any) -> None:
    """FieldError unless ``name`` can be claimed: a key segment, as every checkpoint name is."""
    if not isinstance(name, str) or not is_segment(name):
        raise FieldError("name", f"1 to {MAX_SEGMENT_CHARS} characters of [A-Za-z0-9._-], not '.' or '..'",
                          name if isinstance(name, str) else type(name).__name__)


def _read_target(key: str, out: Any) -> memoryview:
    """``out`` as writable bytes to read the value of ``key`` into, once the key is valid."""
    validate_key(key)
    return check_writable("out", out, error=FieldError).cast("B")


def validate_prefix(prefix: str) -> str:
    """Return ``prefix`` if it can start a key (``""`` starts every key), else raise :class:`FieldError`."""
    if not isinstance(prefix, str):
        raise FieldError("prefix", "a str", type(prefix).__name__)
    if len(prefix) > MAX_KEY_CHARS:
        raise FieldError("prefix", f"at most {MAX_KEY_CHARS} characters", prefix)
    *dirs, last = prefix.split("/")
    for segment in dirs:
        if not is_segment(segment):
            raise FieldError("prefix", _KEY_RULE, prefix, f"bad segment {segment!r}")
    if _PARTIAL_RE.fullmatch(last) is None:
        raise FieldError("prefix", _KEY_RULE, prefix, f"bad segment {last!r}")
    return prefix


def check_value_size(key: str, nbytes: int, max_bytes: int) -> None:
    """Raise :class:`FormatError` naming ``key`` if its value of ``nbytes`` bytes is longer than ``max_bytes``."""
    if nbytes > max_bytes:
        raise FormatError(f"{key} length", f"at most {max_bytes} bytes", nbytes)


def _as_view(data: Any) -> memoryview:
    if isinstance(data, (bytes, bytearray, memoryview)):
        return memoryview(data).cast("B")
    raise FieldError("data", "bytes, bytearray or memoryview", type(data).__name__)


def check_store_options(read_only: bool, lock_timeout: float) -> None:
    """FieldError unless ``read_only`` is a bool and ``lock_timeout`` a finite number of seconds >= 0."""
    check_bool("read_only", read_only)
    check_seconds("lock_timeout", lock_timeout)


def check_store(store: Any, field: str = "store") -> "Store":
    """``store`` if it is a :class:`Store`, else FieldError naming ``field``."""
    return check_instance(field, store, Store,
                          "a Store (MemoryStore, FileStore, ObjectStore, HTTPStore, IndexedDBStore or OPFSStore)")


class Store(ABC):
    """An async store of bytes under validated keys.

    The public methods validate keys, enforce ``read_only`` and the capability flags and count
    ``bytes_written``; backends implement the underscored methods, which get keys already validated.
    """

    supports_overwrites: bool = True
    """Whether :meth:`set` replaces a value already stored. If False the store is create-only: such a ``set``
    raises :class:`ConflictError` naming the key and leaves the value as it was (every key a checkpoint writes
    is written once: chunks are named by their bytes, manifests and prefix records by their generation)."""

    supports_deletes: bool = True
    """Whether :meth:`delete` removes values. If False it raises :class:`StoreError` and removes nothing
    (retention and gc then run where the store's storage is, on a store that deletes)."""

    exclusive_lock: bool = True
    """Whether :meth:`lock` excludes every writer of the storage (other processes, tabs, machines), as
    :meth:`claim` does on every store. If False it excludes only the holders through this store object, and
    writers elsewhere are kept apart by their claims and the commit protocol: chunks, manifests and prefix
    records written create-only (:meth:`set_if_absent`; a save whose generation another writer took first fails
    with ConflictError), and values deleted by gc or retention only once :meth:`settled` (see there)."""

    def __init__(self, *, read_only: bool = False, lock_timeout: float = DEFAULT_LOCK_TIMEOUT) -> None:
        check_store_options(read_only, lock_timeout)
        self._read_only = read_only
        self._lock_timeout = float(lock_timeout)
        self._bytes_written = 0

    @property
    def read_only(self) -> bool:
        """True if :meth:`set`, :meth:`delete`, :meth:`lock` and :meth:`claim` refuse with :class:`StoreError`."""
        return self._read_only

    @property
    @abstractmethod
    def location(self) -> str:
        """Where the store is, as its user named it (for messages): the URL it was opened from (``s3://bucket/prefix``,
        ``http://host:port/``), its directory, ``indexeddb:<database>``, ``opfs:<directory>`` or ``memory``."""

    @property
    def bytes_written(self) -> int:
        """Total payload bytes of the successful :meth:`set` calls on this object."""
        return self._bytes_written

    def _check_writable(self, what: str) -> None:
        if self._read_only:
            raise StoreError(f"{what}: store {self.location} is read-only")

    async def get(self, key: str, *, max_bytes: int | None = None) -> bytes | None:
        """The value under ``key``, or None if there is none.

        ``max_bytes`` bounds what the caller can take: a longer value raises :class:`FormatError` naming
        the key, and backends that can tell the length first (FileStore) read none of it.
        """
        validate_key(key)
        if max_bytes is None:
            return await self._get(key)
        check_int("max_bytes", max_bytes, 0)
        return await self._get_bounded(key, max_bytes)

    async def get_into(self, key: str, out: memoryview) -> int | None:
        """The length of the value under ``key`` (None if there is none), read into ``out`` if it is that long.

        If the lengths differ, ``out`` is left as it was.
        """
        return await self._get_into(key, _read_target(key, out))

    async def get_into_then(self, key: str, out: memoryview, then: Callable[[memoryview], _T]
                            ) -> tuple[int | None, _T | None]:
        """:meth:`get_into`, and what ``then(out)`` returns once ``out`` holds the whole value (else None).

        ``then`` (CPU work over the bytes, such as a digest) runs on the thread that read them, while they
        are still in the CPU's caches, where the store reads on threads (FileStore); elsewhere on a worker
        thread after the read, or inline where there are no threads (the browser).
        """
        target = _read_target(key, out)
        if not callable(then):
            raise FieldError("then", "a function of the bytes read", type_name(then))
        return await self._get_into_then(key, target, then)

    def _payload(self, key: str, data: Any) -> memoryview:
        """``data`` to store under ``key``, once the key, the data and the store allow it."""
        validate_key(key)
        payload = _as_view(data)  # backends that keep it copy it; the caller's buffer is only read during set
        self._check_writable(f"set {key!r}")
        return payload

    async def set(self, key: str, data: bytes | bytearray | memoryview) -> None:
        """Store ``data`` under ``key`` atomically, replacing any old value."""
        payload = self._payload(key, data)
        await self._set(key, payload)
        self._bytes_written += len(payload)

    async def set_if_absent(self, key: str, data: bytes | bytearray | memoryview) -> bool:
        """Store ``data`` under ``key`` as :meth:`set` does, unless ``key`` holds a value already; True if it stored.

        Meant for content-addressed values, where a value already there is the same bytes. Between
        the check and the write it excludes other writers only while the caller holds :meth:`lock`.
        """
        payload = self._payload(key, data)
        stored = await self._set_if_absent(key, payload)
        if stored:
            self._bytes_written += len(payload)
        return stored

    async def delete(self, key: str) -> None:
        """Remove ``key``; a missing key is not an error."""
        validate_key(key)
        self._check_writable(f"delete {key!r}")
        if not self.supports_deletes:
            raise StoreError(f"delete {key!r}: store {self.location} is create-only and deletes nothing "
                             "(run gc where its storage is)")
        await self._delete(key)

    async def settled(self, keys: Collection[str]) -> set[str]:
        """Those of ``keys`` that retention and gc may delete once no manifest listed after this call uses them.

        With an :attr:`exclusive_lock` (held by the caller), every key. Without one, only values last written
        longer ago than the store's grace period: a writer elsewhere may be about to commit a manifest naming a
        value it just wrote, or one it found stored (and, by :meth:`set_if_absent`, wrote again if it was older
        than half that period). Callers ask this before they list the manifests whose chunks they keep, and
        again just before they delete.
        """
        for key in keys:
            validate_key(key)
        return set(keys) if self.exclusive_lock else await self._settled(list(keys))

    async def exists(self, key: str) -> bool:
        """Whether ``key`` holds a value."""
        return await self._exists(validate_key(key))

    async def list_prefix(self, prefix: str) -> list[str]:
        """All keys that start with the string ``prefix``, sorted by code point."""
        return sorted(await self._list_prefix(validate_prefix(prefix)))

    def lock(self, timeout: float | None = None) -> AbstractAsyncContextManager[None]:
        """An async context manager holding the writer lock of this store.

        It excludes every other holder (another task, process or tab), is not
        re-entrant, and raises :class:`StoreError` naming the lock if it cannot
        be had within ``timeout`` seconds (the store's ``lock_timeout`` if None).
        """
        self._check_writable("lock")
        return self._lock(self._lock_timeout if timeout is None else check_seconds("timeout", timeout))

    def claim(self, name: str) -> AbstractAsyncContextManager[None]:
        """An async context manager holding the exclusive write claim on checkpoint name ``name`` while it is held.

        A writer holds it for as long as it writes the name (a generation's autosaves, a convert, a delete);
        :meth:`lock` stays the short lock of each write. It excludes every other claim of ``name`` on the
        storage (another task's, or this task's again: it is not re-entrant; another store object's, process's,
        tab's, worker's or machine's) and never waits: while another holder has it, entering raises
        :class:`ConflictError` naming the name and the store. Where no lock reaches every writer (ObjectStore,
        HTTPStore) the claim is a lease (:mod:`~kvckpt_web.stores.leases`): it runs for a while unless
        :meth:`renew_claim` renews it, and a writer that died without releasing it holds the name until then.
        ``name`` is a key segment (every checkpoint name is one); a read-only store refuses with
        :class:`StoreError`.
        """
        _check_name(name)
        self._check_writable(f"claim {name!r}")
        return _Claim(lambda: self._claim(name))

    async def renew_claim(self, name: str) -> None:
        """Make sure the claim of ``name`` this store object holds is still its own: a claim held as a lease that is
        past half its time is renewed, and :class:`ConflictError` (naming the name and the store) says that it ran
        out and another writer took the name over. Nothing if this object holds no claim of ``name``, or holds it
        until released (a lock every writer sees). A save calls it before it writes anything, before each chunk it
        writes and just before it commits."""
        _check_name(name)
        await self._renew_claim(name)

    def _lost(self, name: str) -> ConflictError:
        """The error of a claim of ``name`` whose lease ran out and that another writer took over."""
        return ConflictError(f"claim {name!r} of {self.location}: its lease ran out and another writer took the name "
                             "over; this writer writes nothing more under it")

    def _claimed(self, name: str) -> ConflictError:
        """The error of a claim of ``name`` another holder has."""
        return ConflictError(f"claim {name!r} of {self.location}: held by another writer of that name (another "
                             "task, process, tab or worker); nothing was written")

    def batch(self) -> AbstractAsyncContextManager[None]:
        """An async context manager in which each :meth:`set` and :meth:`delete` stays atomic but may leave
        making itself durable to the end of the batch.

        When it exits (also by an error), every set and delete that completed inside it is durable,
        so a group of writes costs one durability barrier instead of one each: a save writes its
        chunks in one batch and commits its manifest after it. Writes must complete before it exits.
        A batch covers the task that opens it and the tasks started inside it; other tasks' writes
        stay durable when they return.
        """
        return self._batch()

    @abstractmethod
    async def _get(self, key: str) -> bytes | None: ...

    async def _get_bounded(self, key: str, max_bytes: int) -> bytes | None:
        data = await self._get(key)
        if data is not None:
            check_value_size(key, len(data), max_bytes)
        return data

    async def _get_into_then(self, key: str, out: memoryview, then: Callable[[memoryview], _T]
                             ) -> tuple[int | None, _T | None]:
        length = await self._get_into(key, out)
        if length != len(out):
            return length, None
        return length, await offload(then, out)

    async def _get_into(self, key: str, out: memoryview) -> int | None:
        data = await self._get(key)
        if data is not None and len(data) == len(out):
            out[:] = data
        return None if data is None else len(data)

    @abstractmethod
    async def _set(self, key: str, data: memoryview) -> None: ...

    async def _set_if_absent(self, key: str, data: memoryview) -> bool:
        if await self._exists(key):
            return False
        await self._set(key, data)
        return True

    @abstractmethod
    async def _delete(self, key: str) -> None: ...

    @abstractmethod
    async def _exists(self, key: str) -> bool: ...

    async def _settled(self, keys: list[str]) -> set[str]:
        raise NotImplementedError(f"{type(self).__name__} has no exclusive lock and must say when values settle")

    @abstractmethod
    async def _list_prefix(self, prefix: str) -> list[str]: ...

    @abstractmethod
    def _lock(self, timeout: float) -> AbstractAsyncContextManager[None]: ...

    @abstractmethod
    async def _claim(self, name: str) -> Callable[[], Awaitable[None]]:
        """Take the claim of ``name`` (``self._claimed(name)`` if another holder has it); what releases it (done
        once it returns: a claim of the name right after succeeds)."""

    async def _renew_claim(self, name: str) -> None:
        return None  # claims held until released

    def _batch(self) -> AbstractAsyncContextManager[None]:
        return nullcontext()  # backends whose writes are durable when they return


class _Claim(AbstractAsyncContextManager[None]):
    """What :meth:`Store.claim` returns. A plain object rather than an ``asynccontextmanager``: an event loop
    that shuts down finalizes the async generators still suspended in it, which would release a claim a
    generation holds across ``asyncio.run`` calls; only leaving it releases this one."""

    def __init__(self, take: Callable[[], Awaitable[Callable[[], Awaitable[None]]]]) -> None:
        self._take = take
        self._release: Callable[[], Awaitable[None]] | None = None

    async def __aenter__(self) -> None:
        self._release = await self._take()

    async def __aexit__(self, *exc_info: Any) -> None:
        release, self._release = self._release, None
        if release is not None:
            await release()


class LocalLock:
    """The writer lock of a store whose lock excludes only the holders through one store object: a flag polled
    by :func:`poll_acquire` (any event loop; a holder may enter on one loop and leave on another)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._held = False

    @property
    def held(self) -> bool:
        """Whether a holder has the lock now."""
        return self._held

    def _try(self) -> bool:
        if self._held:
            return False
        self._held = True
        return True

    @asynccontextmanager
    async def hold(self, timeout: float) -> AsyncIterator[None]:
        """Hold the lock (StoreError after ``timeout`` seconds), released when the block is left."""
        await poll_acquire(self._try, timeout, self._name)
        try:
            yield
        finally:
            self._held = False


class LocalClaims:
    """The claims of a store whose claims exclude only the holders through one store object: a set of names."""

    def __init__(self) -> None:
        self._names: set[str] = set()

    def take(self, name: str, refused: ConflictError) -> Callable[[], Awaitable[None]]:
        """Claim ``name`` (raise ``refused`` if it is held); what releases it."""
        if name in self._names:
            raise refused
        self._names.add(name)

        async def release() -> None:
            self._names.discard(name)

        return release


async def poll_acquire(try_acquire: Callable[[], bool], timeout: float, lock_name: str) -> None:
    """Call ``try_acquire`` until it returns True, or raise StoreError after ``timeout`` seconds."""
    deadline = time.monotonic() + max(timeout, 0.0)
    delay = 0.005
    while not try_acquire():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise StoreError(f"lock {lock_name}: not acquired within {timeout} s (held by another writer)")
        await asyncio.sleep(min(delay, remaining))
        delay = min(delay * 2, 0.1)

