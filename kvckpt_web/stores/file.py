"""FileStore: a store in a directory of a desktop file system, crash-safe (new file, fsync, link or
rename, directory fsync), locked with ``fcntl.flock``. Its reads are in :mod:`.file_reads`, its durable writes
in :mod:`.file_writes`, its locks and claims in :mod:`.file_locks`; the names they share are exported here too.

This module imports only what Pyodide has; the POSIX-only ``fcntl`` is imported inside
:class:`FileStore` when it locks or writes with ``O_DIRECT``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from ..checks import check_bool, check_callable, check_each, check_instance, check_path
from ..errors import FormatError, StoreError
from .base import CLAIM_PREFIX, DEFAULT_LOCK_TIMEOUT, Store, check_value_size, is_segment
from .file_locks import LOCK_NAME, claim_file, flock_held
from .file_reads import file_kind
from .file_writes import (DIRECT_IO_BLOCK, FAULT_STEPS, O_DIRECT, TEMP_PREFIX, DurableWrites, fsync_dir,
                          takes_unnamed_files)

__all__ = ["CLAIM_PREFIX", "DIRECT_IO_BLOCK", "FAULT_STEPS", "LOCK_NAME", "TEMP_PREFIX", "FileStore", "file_kind",
           "fsync_dir"]

_T = TypeVar("_T")


IO_THREADS = 16
"""Worker threads shared by every FileStore: enough blocking writes and fsyncs in flight to keep a disk busy."""

_io_pool: concurrent.futures.ThreadPoolExecutor | None = None


def _run_io(fn: Callable[..., Any], *args: Any) -> "asyncio.Future[Any]":
    """Run blocking file work on the FileStore thread pool (not the loop's default one, kept for CPU work)."""
    global _io_pool
    if _io_pool is None:
        _io_pool = concurrent.futures.ThreadPoolExecutor(IO_THREADS, thread_name_prefix="kvckpt-filestore")
    return asyncio.get_running_loop().run_in_executor(_io_pool, fn, *args)


_BATCHES: "contextvars.ContextVar[dict[FileStore, set[str]]]" = contextvars.ContextVar("kvckpt_batches", default={})
"""Per task: each FileStore with an open batch, and the directories that batch changed, not fsynced yet."""


class FileStore(DurableWrites, Store):
    """A store in a directory of a POSIX desktop file system; each key is a file.

    A write fills a new file and fsyncs it, gives it the key's name and fsyncs
    the directory, so a crash at any point leaves the old or the new value.
    Where :attr:`unnamed_files` (Linux), the new file is created without a name,
    linked under the key (or under a temp name renamed over an old value) and
    fsynced again for its link count; elsewhere it is a temp file beside the
    target, renamed over it. A crash leaves at worst a stray temp file that
    ``list_prefix`` never returns and :meth:`cleanup_temp` removes (as does the
    first :meth:`lock` taken through each FileStore object); an unnamed file
    goes with the process. Where :attr:`direct_io` (Linux), a value that is
    whole :data:`DIRECT_IO_BLOCK` blocks of memory goes from the caller's
    memory to the disk without a copy in the page cache (``O_DIRECT``); where
    the file system or the disk refuses, it is written through the page cache.
    In a :meth:`~Store.batch` the directory fsyncs wait for the end of the
    batch, one per directory. ``fault``, if given, is called
    with each step name of :data:`FAULT_STEPS` before that step, for
    fault-injection tests.

    A key cannot both hold a value and be a directory of other keys (``a`` and
    ``a/b``); such a ``set`` raises :class:`StoreError`. ``delete`` removes the
    directories it leaves empty.

    No symbolic link under the directory is followed (``O_NOFOLLOW``, each
    directory of a key opened one at a time): a value that is one is damage
    (:class:`FormatError` naming the key), and a key with one in its path is
    refused (:class:`StoreError`), so nothing outside the directory is read or
    written through the store. The directory itself may be a link.

    A :meth:`~Store.claim` of a name is an ``flock`` on the file
    :data:`CLAIM_PREFIX` + name in the directory (so it excludes other processes
    and other FileStore objects too); its holder removes the file on release,
    and a killed holder's lock goes with its process.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        read_only: bool = False,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
        fault: Callable[[str], None] | None = None,
        unnamed_files: bool = True,
        direct_io: bool = True,
    ) -> None:
        super().__init__(read_only=read_only, lock_timeout=lock_timeout)
        self.directory = os.path.abspath(check_path("directory", directory))
        self.fault = check_callable("fault", fault)
        check_bool("unnamed_files", unnamed_files)
        check_bool("direct_io", direct_io)
        self._swept = False  # temp files of crashed writers are removed under the first lock
        self._unsynced_lock = threading.Lock()
        try:
            if not read_only:
                os.makedirs(self.directory, exist_ok=True)
            is_dir = os.path.isdir(self.directory)
        except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
            raise StoreError(f"store directory {self.directory}: cannot create ({exc})") from exc
        if not is_dir:
            raise StoreError(f"store directory {self.directory}: expected a directory, got none")
        self._unnamed = unnamed_files and not read_only and takes_unnamed_files(self.directory)
        self._direct = direct_io and not read_only and bool(O_DIRECT)

    def __repr__(self) -> str:
        return f"FileStore({self.directory!r}, read_only={self.read_only})"

    @property
    def location(self) -> str:
        return self.directory

    @staticmethod
    def check_directory(directory: str | os.PathLike[str], tops: Collection[str], *, new: bool = False) -> None:
        """Raise :class:`FormatError` naming ``directory`` and what it holds unless it is a FileStore directory
        whose keys all start with one of the segments ``tops``: it holds only such directories and FileStore's
        own files (its lock, claim files, temp files), at least one of them. With ``new``, a missing or empty
        directory, where a FileStore may be made, passes too.
        """
        path = check_path("directory", directory)
        check_bool("new", new)
        tops = check_each("tops", tops, "key segments", lambda field, top: check_instance(field, top, str, "a str"))
        expected = f"a store directory (only {', '.join(t + '/' for t in tops)} and {LOCK_NAME})"
        try:
            entries = sorted(os.listdir(path)) if os.path.isdir(path) and not os.path.islink(path) else None
        except (OSError, ValueError) as exc:
            raise FormatError(path, expected, f"a directory that cannot be listed ({exc})") from exc
        if entries is None:
            if new and not os.path.lexists(path):
                return
            got = "nothing" if not os.path.lexists(path) else (
                "a symbolic link" if os.path.islink(path) else file_kind(os.stat(path).st_mode))
            raise FormatError(path, expected, got)
        if not entries:
            if new:
                return
            raise FormatError(path, expected, "an empty directory")
        foreign = [e for e in entries if not (e == LOCK_NAME or e.startswith((TEMP_PREFIX, CLAIM_PREFIX))
                                              or (e in tops and os.path.isdir(os.path.join(path, e))))]
        if foreign:
            shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
            raise FormatError(path, expected, f"a directory holding {shown}")

    @property
    def unnamed_files(self) -> bool:
        """Whether writes create their file unnamed and link it under the key: asked for (``unnamed_files``)
        and the directory takes such files (Linux ``O_TMPFILE``). Otherwise each write uses a named temp file."""
        return self._unnamed

    @property
    def direct_io(self) -> bool:
        """Whether values of whole blocks are written with ``O_DIRECT``: asked for (``direct_io``), the
        platform has it (Linux) and the store's file system has not refused it."""
        return self._direct

    @property
    def lock_path(self) -> str:
        """Path of the lock file."""
        return os.path.join(self.directory, LOCK_NAME)

    def claim_path(self, name: str) -> str:
        """Path of the claim file of checkpoint name ``name``."""
        return os.path.join(self.directory, CLAIM_PREFIX + name)

    def cleanup_temp(self) -> int:
        """Remove the stray temp files of interrupted writes; return how many.

        Call it only while no other writer is active, e.g. holding :meth:`lock`.
        """
        self._check_writable("cleanup_temp")
        removed = 0
        for root, dirs, files in os.walk(self.directory):
            dirs[:] = [d for d in dirs if is_segment(d)]
            for name in files:
                if name.startswith(TEMP_PREFIX):
                    try:
                        os.unlink(os.path.join(root, name))
                        removed += 1
                    except FileNotFoundError:
                        pass
                    except OSError as exc:
                        raise StoreError(f"cleanup_temp: cannot remove {os.path.join(root, name)} ({exc})") from exc
        return removed

    # -- Store interface -----------------------------------------------------

    async def _get(self, key: str) -> bytes | None:
        return await _run_io(self._read, key)

    async def _get_bounded(self, key: str, max_bytes: int) -> bytes | None:
        data = await _run_io(self._read, key, max_bytes)
        if data is not None:
            check_value_size(key, len(data), max_bytes)  # grew while being read
        return data

    async def _get_into(self, key: str, out: memoryview) -> int | None:
        return await _run_io(self._read_into, key, out)

    async def _get_into_then(self, key: str, out: memoryview, then: Callable[[memoryview], _T]
                             ) -> tuple[int | None, _T | None]:
        def read_then() -> tuple[int | None, _T | None]:
            length = self._read_into(key, out)
            return length, (then(out) if length == len(out) else None)

        return await _run_io(read_then)

    async def _set(self, key: str, data: memoryview) -> None:
        await _run_io(self._write, key, data, _BATCHES.get().get(self))

    async def _set_if_absent(self, key: str, data: memoryview) -> bool:
        return await _run_io(self._write_if_absent, key, data, _BATCHES.get().get(self))

    async def _delete(self, key: str) -> None:
        await _run_io(self._remove, key, _BATCHES.get().get(self))

    async def _exists(self, key: str) -> bool:
        return await _run_io(self._holds, key)

    async def _list_prefix(self, prefix: str) -> list[str]:
        return await _run_io(self._walk, prefix)

    @asynccontextmanager
    async def _batch(self) -> AsyncIterator[None]:
        unsynced: set[str] = set()
        token = _BATCHES.set({**_BATCHES.get(), self: unsynced})  # this task and the tasks it starts inside it
        try:
            yield
        finally:
            _BATCHES.reset(token)
            await _run_io(self._sync_dirs, unsynced)

    @asynccontextmanager
    async def _lock(self, timeout: float) -> AsyncIterator[None]:
        async with flock_held(self.lock_path, timeout):
            if not self._swept:
                await _run_io(self.cleanup_temp)
                self._swept = True
            yield

    async def _claim(self, name: str) -> Callable[[], Awaitable[None]]:
        """Hold the flock of the name's claim file (see :func:`~.file_locks.claim_file`)."""
        release = claim_file(self.claim_path(name), name)
        if release is None:
            raise self._claimed(name)
        return release
