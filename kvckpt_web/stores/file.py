"""FileStore: a store in a directory of a desktop file system, crash-safe (new file, fsync, link or
rename, directory fsync), locked with ``fcntl.flock``; and the file helpers it shares (``fsync_dir``,
``file_kind``).

This module imports only what Pyodide has; the POSIX-only ``fcntl`` is imported inside
:class:`FileStore` when it locks or writes with ``O_DIRECT``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import errno
import os
import secrets
import stat
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from ..checks import check_bool, check_callable, check_each, check_instance, check_path
from ..errors import FormatError, StoreError
from .base import CLAIM_PREFIX, DEFAULT_LOCK_TIMEOUT, Store, check_value_size, is_segment, poll_acquire

__all__ = ["CLAIM_PREFIX", "DIRECT_IO_BLOCK", "FAULT_STEPS", "LOCK_NAME", "TEMP_PREFIX", "FileStore", "file_kind",
           "fsync_dir"]

_T = TypeVar("_T")


TEMP_PREFIX = "~tmp."
"""FileStore temp files start with this; '~' is no key character, so no key can clash."""

LOCK_NAME = "~kvckpt.lock"
"""Name of FileStore's lock file in its directory."""


FAULT_STEPS = ("write", "fsync", "link", "rename", "dirsync")
"""The steps of a :class:`FileStore` write, in order, as passed to its ``fault`` hook. An unnamed file is
linked under its key ("link"); a named temp file, or an unnamed file replacing a value, is renamed over the
key's file ("rename"); in a :meth:`~Store.batch`, "dirsync" comes once per directory when the batch exits."""

DIRECT_IO_BLOCK = 4096
"""A :class:`FileStore` value in memory aligned to this many bytes, and a whole multiple of them long, is
written with ``O_DIRECT`` where it can be: the largest logical block size of common disks, to which direct
I/O needs both aligned."""

_O_DIRECT: int = getattr(os, "O_DIRECT", 0) if sys.platform.startswith("linux") else 0  # macOS, Pyodide: none

_NOFOLLOW: int = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY: int = getattr(os, "O_DIRECTORY", 0)
_SUBDIR = os.O_RDONLY | _DIRECTORY | _NOFOLLOW
"""How a directory under a store's directory is opened: never through a symbolic link."""


def _block_aligned(view: memoryview) -> bool:
    """Whether ``view`` is whole :data:`DIRECT_IO_BLOCK` blocks of memory, as ``O_DIRECT`` takes them."""
    if not view.nbytes or view.nbytes % DIRECT_IO_BLOCK:
        return False
    import numpy as np  # only where there is O_DIRECT: on desktop, never in Pyodide

    return np.frombuffer(view, np.uint8).ctypes.data % DIRECT_IO_BLOCK == 0


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


def link_unnamed(fd: int, path: str, dir_fd: int | None = None) -> None:
    """Give the unnamed file ``fd`` (opened with ``O_TMPFILE``) the name ``path`` (relative to ``dir_fd``)."""
    # an absolute source makes linkat ignore src_dir_fd; passing one makes os.link call linkat with
    # AT_SYMLINK_FOLLOW, which links the file /proc/self/fd/N stands for rather than that symlink
    os.link(f"/proc/self/fd/{fd}", path, src_dir_fd=fd, dst_dir_fd=dir_fd, follow_symlinks=True)


def takes_unnamed_files(directory: str) -> bool:
    """Whether a file can be created unnamed in ``directory`` (Linux ``O_TMPFILE``) and then linked there."""
    flag, link = getattr(os, "O_TMPFILE", None), getattr(os, "link", None)  # Pyodide has no os.link
    if flag is None or link is None or link not in os.supports_dir_fd:  # link_unnamed needs linkat
        return False
    probe = os.path.join(directory, f"{TEMP_PREFIX}probe.{secrets.token_hex(8)}")
    try:
        fd = os.open(directory, flag | os.O_WRONLY, 0o644)
        try:
            link_unnamed(fd, probe)
        finally:
            os.close(fd)
        os.unlink(probe)
    except OSError:  # no such files on this file system, no /proc, or no new files here: writes will say
        return False
    return True


def file_kind(mode: int) -> str:
    """What a file of ``mode`` is, for messages: "a FIFO", "a character device", ..."""
    for test, kind in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return kind
    return "a file of unknown type"


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a directory's entries (a rename, a new file) durable (desktop file systems)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FileStore(Store):
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
        self._direct = direct_io and not read_only and bool(_O_DIRECT)

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

    def _path(self, key: str) -> str:
        return os.path.join(self.directory, *key.split("/"))

    def _step(self, name: str) -> None:
        if self.fault is not None:
            self.fault(name)

    # -- blocking work, run in a worker thread -------------------------------

    def _open_value(self, key: str) -> tuple[int, int] | None:
        """An open descriptor of the regular file of ``key`` and its length; None if there is no such file.

        It never blocks (a FIFO where a value should be) and raises :class:`FormatError` naming the key for
        anything but a regular file or a directory (a directory holds other keys, not a value).
        """
        path = self._path(key)
        parent = self._parent(key, "get")
        if parent is None:
            return None
        try:
            fd = os.open(os.path.basename(path), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | _NOFOLLOW,
                         dir_fd=parent)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise FormatError(key, f"a regular file ({path})", "a symbolic link (not followed)") from None
            raise StoreError(f"get {key!r}: cannot read {path} ({exc})") from exc
        finally:
            os.close(parent)
        value = None
        try:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode):
                value = fd, st.st_size
            elif not stat.S_ISDIR(st.st_mode):
                raise FormatError(key, f"a regular file ({path})", file_kind(st.st_mode))
            return value
        finally:
            if value is None:
                os.close(fd)

    def _read(self, key: str, max_bytes: int | None = None) -> bytes | None:
        opened = self._open_value(key)
        if opened is None:
            return None
        fd, size = opened
        with open(fd, "rb", buffering=0) as f:
            if max_bytes is not None:
                check_value_size(key, size, max_bytes)
            try:
                return f.read() if max_bytes is None else f.read(max_bytes + 1)
            except OSError as exc:
                raise StoreError(f"get {key!r}: cannot read {self._path(key)} ({exc})") from exc

    def _read_into(self, key: str, out: memoryview) -> int | None:
        opened = self._open_value(key)
        if opened is None:
            return None
        fd, size = opened
        with open(fd, "rb", buffering=0) as f:
            try:
                if size == len(out):
                    view = out
                    while view:
                        got = f.readinto(view)
                        if not got:
                            return size - len(view)  # shrank while being read
                        view = view[got:]
                return size
            except OSError as exc:
                raise StoreError(f"get {key!r}: cannot read {self._path(key)} ({exc})") from exc

    def _parent(self, key: str, what: str, create: bool = False) -> int | None:
        """A descriptor of the directory that holds (or will hold) the file of ``key``, opened from the store's
        directory one segment at a time, never through a symbolic link (``O_NOFOLLOW``); None if a segment is
        missing (or a file), unless ``create``: then it is made, and its directory fsynced. StoreError naming
        the operation ``what`` and the key if a segment is a symbolic link (or, with ``create``, a file)."""
        try:
            fd = os.open(self.directory, os.O_RDONLY | _DIRECTORY)
        except OSError as exc:
            raise StoreError(f"{what} {key!r}: cannot open {self.directory} ({exc})") from exc
        try:
            for segment in key.split("/")[:-1]:
                try:
                    below = os.open(segment, _SUBDIR, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        os.close(fd)
                        return None
                    try:
                        os.mkdir(segment, 0o755, dir_fd=fd)
                        os.fsync(fd)
                    except FileExistsError:
                        pass
                    below = os.open(segment, _SUBDIR, dir_fd=fd)
                os.close(fd)
                fd = below
            return fd
        except OSError as exc:
            try:
                link = exc.errno in (errno.ENOTDIR, errno.ELOOP) and stat.S_ISLNK(
                    os.stat(segment, dir_fd=fd, follow_symlinks=False).st_mode)
            except OSError:
                link = False
            finally:
                os.close(fd)
            if link:
                raise StoreError(f"{what} {key!r}: {self.directory} holds a symbolic link at {segment!r} in its "
                                 "path, which is not followed") from None
            if exc.errno == errno.ENOTDIR and not create:
                return None  # a value where a directory would be: no key below it
            raise StoreError(f"{what} {key!r}: cannot open the directories of {self._path(key)} ({exc})") from exc

    @staticmethod
    def _temp_name(base: str) -> str:
        return f"{TEMP_PREFIX}{base}.{secrets.token_hex(8)}"

    def _write(self, key: str, data: memoryview, unsynced: set[str] | None, replace: bool = True) -> bool:
        """Store ``data`` under ``key``; unless ``replace``, leave a value already there and return False."""
        path = self._path(key)
        parent, base = os.path.split(path)
        tmp: str | None = None
        try:
            if self._unnamed:
                fd = self._in_dir(key, lambda d: os.open(".", os.O_TMPFILE | os.O_WRONLY, 0o644, dir_fd=d))
                try:
                    self._fill(fd, data)
                    self._step("link")
                    try:
                        self._in_dir(key, lambda d: link_unnamed(fd, base, d))
                    except FileExistsError:
                        if not replace and self._in_dir(key, lambda d: self._is_value(d, base)):
                            return False
                        tmp = self._temp_name(base)  # replaced below, as a named temp file would be
                        self._in_dir(key, lambda d: link_unnamed(fd, tmp, d))
                    os.fsync(fd)  # its new link count: without a journal, the directory's fsync does not carry it
                finally:
                    os.close(fd)
            else:
                tmp = self._temp_name(base)
                fd = self._in_dir(key, lambda d: os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW,
                                                         0o644, dir_fd=d))
                try:
                    self._fill(fd, data)
                finally:
                    os.close(fd)
            if tmp is not None:
                self._step("rename")
                self._in_dir(key, lambda d: os.replace(tmp, base, src_dir_fd=d, dst_dir_fd=d))
            self._entries_changed(parent, unsynced)
            return True
        except BaseException as exc:
            if tmp is not None:
                try:
                    self._in_dir(key, lambda d: os.unlink(tmp, dir_fd=d))
                except (OSError, StoreError):
                    pass
            if isinstance(exc, OSError):
                raise StoreError(f"set {key!r}: cannot write {path} ({exc})") from exc
            raise

    def _in_dir(self, key: str, op: Callable[[int], _T]) -> _T:
        """``op(directory)``, ``directory`` a descriptor of the directory of ``key``'s file (see :meth:`_parent`),
        made first if it is missing; once more if a concurrent delete pruned it meanwhile."""
        def attempt() -> _T:
            directory = self._parent(key, "set", create=True)
            assert directory is not None  # made if missing
            try:
                return op(directory)
            finally:
                os.close(directory)

        try:
            return attempt()
        except FileNotFoundError:
            return attempt()

    @staticmethod
    def _is_value(directory: int, name: str) -> bool:
        """Whether ``name`` in the open ``directory`` is a regular file (a symbolic link is not followed)."""
        try:
            return stat.S_ISREG(os.stat(name, dir_fd=directory, follow_symlinks=False).st_mode)
        except (FileNotFoundError, NotADirectoryError):
            return False

    def _fill(self, fd: int, data: memoryview) -> None:
        self._step("write")
        view = memoryview(data)
        direct = self._direct and _block_aligned(view) and self._set_direct(fd, True)
        while view:
            try:
                view = view[os.write(fd, view) :]
            except OSError as exc:
                if not direct or exc.errno not in (errno.EINVAL, errno.EFAULT):
                    raise
                # memory the disk cannot take directly (misaligned, or a device mapping the kernel cannot
                # pin): the rest through the page cache
                direct = self._set_direct(fd, False)
        self._step("fsync")
        os.fsync(fd)

    def _set_direct(self, fd: int, on: bool) -> bool:
        """Turn ``O_DIRECT`` on or off for ``fd``; whether it is on. A refusal to turn it on holds for the store."""
        import fcntl

        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        try:
            fcntl.fcntl(fd, fcntl.F_SETFL, (flags | _O_DIRECT) if on else (flags & ~_O_DIRECT))
        except OSError as exc:
            if not on or exc.errno != errno.EINVAL:
                raise
            self._direct = False  # this file system takes no direct I/O
            return False
        return on

    def _write_if_absent(self, key: str, data: memoryview, unsynced: set[str] | None) -> bool:
        """:meth:`_write` unless ``key`` is a file already (one trip to an I/O thread for both)."""
        if self._holds(key):
            return False
        return self._write(key, data, unsynced, replace=False)

    def _holds(self, key: str) -> bool:
        """Whether ``key``'s file is a regular file, reached without following a symbolic link."""
        directory = self._parent(key, "exists")
        if directory is None:
            return False
        try:
            return self._is_value(directory, os.path.basename(self._path(key)))
        finally:
            os.close(directory)

    def _remove(self, key: str, unsynced: set[str] | None) -> None:
        path = self._path(key)
        directory = self._parent(key, "delete")
        if directory is None:
            return
        try:
            os.unlink(os.path.basename(path), dir_fd=directory)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return
        except OSError as exc:
            raise StoreError(f"delete {key!r}: cannot remove {path} ({exc})") from exc
        finally:
            os.close(directory)
        try:
            parent = os.path.dirname(path)
            self._entries_changed(parent, unsynced)
            while parent != self.directory:  # prune directories left empty
                try:
                    os.rmdir(parent)
                except OSError:
                    break
                parent = os.path.dirname(parent)
                self._entries_changed(parent, unsynced)
        except OSError as exc:
            raise StoreError(f"delete {key!r}: cannot fsync directory of {path} ({exc})") from exc

    def _entries_changed(self, directory: str, unsynced: set[str] | None) -> None:
        """Make a changed directory durable now, or (``unsynced``: the caller's open batch) at the batch's end."""
        if unsynced is not None:
            with self._unsynced_lock:
                unsynced.add(directory)
            return
        self._step("dirsync")
        fsync_dir(directory)

    def _sync_dirs(self, unsynced: set[str]) -> None:
        with self._unsynced_lock:
            directories = sorted(unsynced)
        for directory in directories:
            self._step("dirsync")
            try:
                fsync_dir(directory)
            except FileNotFoundError:  # pruned after the change: its parent's entry is what counts
                pass
            except OSError as exc:
                raise StoreError(f"batch: cannot fsync directory {directory} ({exc})") from exc

    def _walk(self, prefix: str) -> list[str]:
        base_key = prefix.rpartition("/")[0]
        top = self._path(base_key) if base_key else self.directory
        if base_key:  # a listing never goes through a symbolic link either
            directory = self._parent(f"{base_key}/", "list")
            if directory is None:
                return []
            os.close(directory)
        found = []
        for root, dirs, files in os.walk(top, onerror=self._walk_error):
            rel = os.path.relpath(root, self.directory)
            parts = [] if rel == "." else rel.split(os.sep)
            dirs[:] = [d for d in dirs if is_segment(d)]
            for name in files:
                key = "/".join([*parts, name])
                if is_segment(name) and key.startswith(prefix):
                    found.append(key)
        return found

    @staticmethod
    def _walk_error(exc: OSError) -> None:
        if not isinstance(exc, (FileNotFoundError, NotADirectoryError)):
            raise StoreError(f"list: cannot read {exc.filename} ({exc})") from exc

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
        import fcntl  # POSIX only: keep the module importable in Pyodide

        path = self.lock_path
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o644)
        except OSError as exc:
            raise StoreError(f"lock {path}: cannot open ({exc})") from exc

        def try_lock() -> bool:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                return False
            except OSError as exc:
                raise StoreError(f"lock {path}: flock failed ({exc})") from exc

        try:
            await poll_acquire(try_lock, timeout, path)
            if not self._swept:
                await _run_io(self.cleanup_temp)
                self._swept = True
            yield
        finally:
            os.close(fd)  # closing the only descriptor releases the flock

    async def _claim(self, name: str) -> Callable[[], Awaitable[None]]:
        """Hold the flock of the name's claim file. Its holder removes the file before it lets go of the lock, so
        a claimer that opened the file just before may lock a file no longer under its path: it then tries
        again with the file there now."""
        import fcntl  # POSIX only: keep the module importable in Pyodide

        path = self.claim_path(name)

        async def release() -> None:
            try:
                os.unlink(path)  # while still locked
            except OSError:
                pass  # a claim file left behind is harmless: the next claim of the name takes it over
            os.close(fd)  # releases the flock

        while True:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o644)
            except OSError as exc:
                raise StoreError(f"claim {name!r}: cannot open {path} ({exc})") from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = os.path.samestat(os.fstat(fd), os.stat(path))
            except BlockingIOError:
                os.close(fd)
                raise self._claimed(name) from None
            except FileNotFoundError:
                held = False
            except OSError as exc:
                os.close(fd)
                raise StoreError(f"claim {name!r}: flock of {path} failed ({exc})") from exc
            if held:
                return release
            os.close(fd)
