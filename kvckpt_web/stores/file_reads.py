"""Reading a FileStore directory without following a symbolic link: a key's path, the directories of its file
opened one segment at a time (``O_NOFOLLOW``), its value read, the keys under a prefix listed.

This module imports only what Pyodide has.
"""

from __future__ import annotations

import errno
import os
import stat

from ..errors import FormatError, StoreError
from .base import check_value_size, is_segment

__all__ = ["DIRECTORY", "NOFOLLOW", "SUBDIR", "FileReads", "file_kind"]

NOFOLLOW: int = getattr(os, "O_NOFOLLOW", 0)
DIRECTORY: int = getattr(os, "O_DIRECTORY", 0)
SUBDIR = os.O_RDONLY | DIRECTORY | NOFOLLOW
"""How a directory under a store's directory is opened: never through a symbolic link."""


def file_kind(mode: int) -> str:
    """What a file of ``mode`` is, for messages: "a FIFO", "a character device", ..."""
    for test, kind in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return kind
    return "a file of unknown type"


class FileReads:
    """The reads of a :class:`~kvckpt_web.stores.file.FileStore` in :attr:`directory`, blocking (run in a
    worker thread): none follows a symbolic link under the directory."""

    directory: str

    def _path(self, key: str) -> str:
        return os.path.join(self.directory, *key.split("/"))

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
            fd = os.open(os.path.basename(path), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | NOFOLLOW,
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
        directory one segment at a time, never through a symbolic link (``ONOFOLLOW``); None if a segment is
        missing (or a file), unless ``create``: then it is made, and its directory fsynced. StoreError naming
        the operation ``what`` and the key if a segment is a symbolic link (or, with ``create``, a file)."""
        try:
            fd = os.open(self.directory, os.O_RDONLY | DIRECTORY)
        except OSError as exc:
            raise StoreError(f"{what} {key!r}: cannot open {self.directory} ({exc})") from exc
        try:
            for segment in key.split("/")[:-1]:
                try:
                    below = os.open(segment, SUBDIR, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        os.close(fd)
                        return None
                    try:
                        os.mkdir(segment, 0o755, dir_fd=fd)
                        os.fsync(fd)
                    except FileExistsError:
                        pass
                    below = os.open(segment, SUBDIR, dir_fd=fd)
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
    def _is_value(directory: int, name: str) -> bool:
        """Whether ``name`` in the open ``directory`` is a regular file (a symbolic link is not followed)."""
        try:
            return stat.S_ISREG(os.stat(name, dir_fd=directory, follow_symlinks=False).st_mode)
        except (FileNotFoundError, NotADirectoryError):
            return False


    def _holds(self, key: str) -> bool:
        """Whether ``key``'s file is a regular file, reached without following a symbolic link."""
        directory = self._parent(key, "exists")
        if directory is None:
            return False
        try:
            return self._is_value(directory, os.path.basename(self._path(key)))
        finally:
            os.close(directory)


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
