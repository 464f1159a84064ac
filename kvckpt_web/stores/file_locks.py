"""The ``flock`` locks of a FileStore: its store lock (:data:`LOCK_NAME`, waited for) and the claims of
checkpoint names (a claim file each, taken at once or not at all).

This module imports only what Pyodide has; the POSIX-only ``fcntl`` is imported when a lock is taken.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from ..errors import StoreError
from .base import poll_acquire
from .file_reads import NOFOLLOW

__all__ = ["LOCK_NAME", "claim_file", "flock_held"]

LOCK_NAME = "~kvckpt.lock"
"""Name of FileStore's lock file in its directory."""


@asynccontextmanager
async def flock_held(path: str, timeout: float) -> AsyncIterator[None]:
    """Hold the exclusive ``flock`` of the file at ``path`` (made if missing), waited for up to ``timeout``
    seconds as :func:`~kvckpt_web.stores.base.poll_acquire` waits."""
    import fcntl  # POSIX only: keep the module importable in Pyodide

    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | NOFOLLOW, 0o644)
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
        yield
    finally:
        os.close(fd)  # closing the only descriptor releases the flock


def claim_file(path: str, name: str) -> Callable[[], Awaitable[None]] | None:
    """Hold the ``flock`` of the claim file at ``path`` of checkpoint name ``name``: its release, or None if
    another holds it. The holder removes the file before it lets go of the lock, so a claimer that opened the
    file just before may lock a file no longer under its path: it then tries again with the file there now."""
    import fcntl  # POSIX only: keep the module importable in Pyodide

    async def release() -> None:
        try:
            os.unlink(path)  # while still locked
        except OSError:
            pass  # a claim file left behind is harmless: the next claim of the name takes it over
        os.close(fd)  # releases the flock

    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | NOFOLLOW, 0o644)
        except OSError as exc:
            raise StoreError(f"claim {name!r}: cannot open {path} ({exc})") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held = os.path.samestat(os.fstat(fd), os.stat(path))
        except BlockingIOError:
            os.close(fd)
            return None
        except FileNotFoundError:
            held = False
        except OSError as exc:
            os.close(fd)
            raise StoreError(f"claim {name!r}: flock of {path} failed ({exc})") from exc
        if held:
            return release
        os.close(fd)
