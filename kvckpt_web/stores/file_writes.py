"""Durable writes of a FileStore: a new file (unnamed with ``O_TMPFILE`` where it can be, else a temp file),
fsynced, linked or renamed under its key, its directory fsynced (at once, or once at the end of a batch); and
deletes that prune the directories they leave empty.

This module imports only what Pyodide has; the POSIX-only ``fcntl`` is imported where a write turns ``O_DIRECT``
on or off.
"""

from __future__ import annotations

import errno
import os
import secrets
import sys
import threading
from collections.abc import Callable
from typing import TypeVar

from ..errors import StoreError
from .file_reads import NOFOLLOW, FileReads

__all__ = ["DIRECT_IO_BLOCK", "FAULT_STEPS", "O_DIRECT", "TEMP_PREFIX", "DurableWrites", "fsync_dir", "link_unnamed",
           "takes_unnamed_files"]

_T = TypeVar("_T")

TEMP_PREFIX = "~tmp."
"""FileStore temp files start with this; '~' is no key character, so no key can clash."""

FAULT_STEPS = ("write", "fsync", "link", "rename", "dirsync")
"""The steps of a :class:`FileStore` write, in order, as passed to its ``fault`` hook. An unnamed file is
linked under its key ("link"); a named temp file, or an unnamed file replacing a value, is renamed over the
key's file ("rename"); in a :meth:`~Store.batch`, "dirsync" comes once per directory when the batch exits."""

DIRECT_IO_BLOCK = 4096
"""A :class:`FileStore` value in memory aligned to this many bytes, and a whole multiple of them long, is
written with ``O_DIRECT`` where it can be: the largest logical block size of common disks, to which direct
I/O needs both aligned."""

O_DIRECT: int = getattr(os, "O_DIRECT", 0) if sys.platform.startswith("linux") else 0  # macOS, Pyodide: none


def _block_aligned(view: memoryview) -> bool:
    """Whether ``view`` is whole :data:`DIRECT_IO_BLOCK` blocks of memory, as ``O_DIRECT`` takes them."""
    if not view.nbytes or view.nbytes % DIRECT_IO_BLOCK:
        return False
    import numpy as np  # only where there is O_DIRECT: on desktop, never in Pyodide

    return np.frombuffer(view, np.uint8).ctypes.data % DIRECT_IO_BLOCK == 0


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


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a directory's entries (a rename, a new file) durable (desktop file systems)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class DurableWrites(FileReads):
    """The writes and deletes of a :class:`~kvckpt_web.stores.file.FileStore`, blocking (run in a worker
    thread): a crash at any point leaves the old or the new value. ``fault``, if set, is called with each step
    of :data:`FAULT_STEPS` before it; ``_unnamed`` and ``_direct`` say whether writes use ``O_TMPFILE`` and
    ``O_DIRECT``."""

    fault: Callable[[str], None] | None
    _unnamed: bool
    _direct: bool
    _unsynced_lock: threading.Lock

    def _step(self, name: str) -> None:
        if self.fault is not None:
            self.fault(name)

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
                fd = self._in_dir(key, lambda d: os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW,
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
            fcntl.fcntl(fd, fcntl.F_SETFL, (flags | O_DIRECT) if on else (flags & ~O_DIRECT))
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
