"""Store backends: the shared suite for each, then FileStore's crash-safety and locking."""

from __future__ import annotations

import asyncio
import errno
import os
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from support.store_suite import StoreTests, needs_direct_io, run, spy_writes

from kvckpt_web.errors import ConflictError, FieldError, FormatError, StoreError
from kvckpt_web.gpu.tensors import zeroed
from kvckpt_web.stores import file_writes
from kvckpt_web.stores.base import Store
from kvckpt_web.stores.file import (CLAIM_PREFIX, DIRECT_IO_BLOCK, FAULT_STEPS, LOCK_NAME, TEMP_PREFIX, FileStore,
                                    takes_unnamed_files)
from kvckpt_web.stores.indexeddb import IndexedDBStore
from kvckpt_web.stores.memory import MemoryStore
from kvckpt_web.stores.opfs import OPFSStore

REPO = Path(__file__).resolve().parents[2]


class TestMemoryStore(StoreTests):
    def setup_method(self) -> None:
        self.backing: dict[Path, dict[str, bytes]] = {}

    def open_store(self, location: Path, **kwargs: Any) -> Store:
        return MemoryStore(self.backing.setdefault(location, {}), **kwargs)

    def open_other_writer(self, location: Path) -> Store:
        pytest.skip("a MemoryStore's storage is its process's, and its claims belong to the store object")


class TestFileStore(StoreTests):
    def open_store(self, location: Path, **kwargs: Any) -> Store:
        return FileStore(location / "store", **kwargs)


class TestFileStoreWithNamedTempFiles(StoreTests):
    def open_store(self, location: Path, **kwargs: Any) -> Store:
        return FileStore(location / "store", unnamed_files=False, **kwargs)


# -- FileStore specifics ----------------------------------------------------------


def temp_files(directory: Path) -> list[Path]:
    return [p for p in directory.rglob("*") if p.name.startswith(TEMP_PREFIX)]


class Boom(Exception):
    pass


def page_aligned(nbytes: int) -> memoryview:
    view = zeroed(nbytes)
    view[:] = bytes(range(251)) * (nbytes // 251) + bytes(nbytes % 251)
    return view


VALUE_KINDS = ["bytes", "whole blocks"]


def new_value(kind: str) -> memoryview:
    """A new value for the crash tests: a few bytes (written through the page cache), or whole blocks of
    page-aligned memory, as a save's chunks are (written with O_DIRECT where the file system takes it)."""
    return page_aligned(2 * DIRECT_IO_BLOCK) if kind == "whole blocks" else memoryview(b"new")


def write_steps(unnamed: bool, replacing: bool = False) -> list[str]:
    """The fault steps of one FileStore set outside a batch: an unnamed file is linked under a new key, or
    linked under a temp name that is renamed over an old value; a named temp file is renamed."""
    publish = (["link", "rename"] if replacing else ["link"]) if unnamed else ["rename"]
    return ["write", "fsync", *publish, "dirsync"]


UNNAMED_HERE = takes_unnamed_files(tempfile.gettempdir())
"""Whether FileStore takes unnamed files where the tests' temp directories are (Linux)."""

WAYS = (True, False) if UNNAMED_HERE else (False,)
"""FileStore's ways to write here: unnamed files (``unnamed_files=True``, where taken) and named temp files."""

NAMINGS = [pytest.param(unnamed, id="unnamed" if unnamed else "named") for unnamed in WAYS]

needs_unnamed = pytest.mark.skipif(not UNNAMED_HERE, reason="no unnamed files here (Linux O_TMPFILE)")


def naming_and_steps(replacing: bool, stop: int | None = None) -> list[Any]:
    return [pytest.param(unnamed, step, id=f"{'unnamed' if unnamed else 'named'}-{step}")
            for unnamed in WAYS for step in write_steps(unnamed, replacing)[:stop]]


def raise_at(step: str) -> Any:
    def fault(name: str) -> None:
        assert name in FAULT_STEPS
        if name == step:
            raise Boom(step)

    return fault


@pytest.mark.parametrize("kind", VALUE_KINDS)
@pytest.mark.parametrize("unnamed, step", naming_and_steps(replacing=True))
def test_exception_mid_write_keeps_old_value(tmp_path: Path, unnamed: bool, step: str, kind: str) -> None:
    store = FileStore(tmp_path, unnamed_files=unnamed)
    run(store.set("d/k", b"old"))
    store.fault = raise_at(step)
    with pytest.raises(Boom):
        run(store.set("d/k", new_value(kind)))
    # before the rename the old value stays; after it the new one is already in place
    expected = bytes(new_value(kind)) if step == "dirsync" else b"old"
    assert run(store.get("d/k")) == expected
    assert temp_files(tmp_path) == []
    assert run(store.list_prefix("")) == ["d/k"]
    assert store.bytes_written == 3  # the failed set is not counted


@pytest.mark.parametrize("unnamed", NAMINGS)
def test_exception_mid_write_of_new_key(tmp_path: Path, unnamed: bool) -> None:
    store = FileStore(tmp_path, unnamed_files=unnamed, fault=raise_at(write_steps(unnamed)[-2]))
    with pytest.raises(Boom):
        run(store.set("fresh", b"new"))
    assert run(store.get("fresh")) is None
    assert temp_files(tmp_path) == []


@pytest.mark.parametrize("unnamed", NAMINGS)
def test_set_if_absent_of_a_present_key_takes_no_write_step(tmp_path: Path, unnamed: bool) -> None:
    seen: list[str] = []
    store = FileStore(tmp_path, unnamed_files=unnamed, fault=seen.append)
    run(store.set("k", b"v"))
    seen.clear()
    assert run(store.set_if_absent("k", b"v")) is False
    assert seen == []


@pytest.mark.parametrize("kind", VALUE_KINDS)
@pytest.mark.parametrize("unnamed, step", naming_and_steps(replacing=False, stop=-1))
def test_exception_mid_set_if_absent_leaves_the_key_absent(tmp_path: Path, unnamed: bool, step: str,
                                                           kind: str) -> None:
    store = FileStore(tmp_path, unnamed_files=unnamed, fault=raise_at(step))
    with pytest.raises(Boom):
        run(store.set_if_absent("chunks/c", new_value(kind)))
    assert run(store.exists("chunks/c")) is False
    assert temp_files(tmp_path) == []
    assert store.bytes_written == 0


@pytest.mark.parametrize("unnamed", NAMINGS)
def test_os_error_becomes_store_error(tmp_path: Path, unnamed: bool) -> None:
    def disk_full(step: str) -> None:
        if step == "write":
            raise OSError(28, "No space left on device")

    store = FileStore(tmp_path, unnamed_files=unnamed, fault=disk_full)
    with pytest.raises(StoreError, match="'k'.*No space left"):
        run(store.set("k", b"data"))
    assert temp_files(tmp_path) == []


@pytest.mark.parametrize("unnamed", NAMINGS)
def test_fault_steps_of_a_new_key_in_order(tmp_path: Path, unnamed: bool) -> None:
    seen: list[str] = []
    run(FileStore(tmp_path, unnamed_files=unnamed, fault=seen.append).set("k", b"v"))
    assert seen == write_steps(unnamed)
    assert [step for step in FAULT_STEPS if step in seen] == seen


@pytest.mark.parametrize("unnamed", NAMINGS)
def test_fault_steps_of_a_replaced_value_in_order(tmp_path: Path, unnamed: bool) -> None:
    seen: list[str] = []
    store = FileStore(tmp_path, unnamed_files=unnamed, fault=seen.append)
    run(store.set("k", b"v"))
    seen.clear()
    run(store.set("k", b"w"))
    assert seen == write_steps(unnamed, replacing=True)
    assert [step for step in FAULT_STEPS if step in seen] == seen
    assert run(store.get("k")) == b"w"


@pytest.mark.parametrize("unnamed", NAMINGS)
def test_batch_fsyncs_each_directory_once_when_it_ends(tmp_path: Path, unnamed: bool) -> None:
    seen: list[str] = []
    store = FileStore(tmp_path, unnamed_files=unnamed, fault=seen.append)

    async def two_sets() -> None:
        async with store.batch():
            await store.set("d/a", b"1")
            await store.set("d/b", b"2")
            assert "dirsync" not in seen  # nothing waits for the directory inside the batch

    run(two_sets())
    assert seen == write_steps(unnamed)[:-1] * 2 + ["dirsync"]
    assert run(store.get("d/a")) == b"1" and run(store.get("d/b")) == b"2"


def test_batch_fsyncs_every_changed_directory_at_its_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = FileStore(tmp_path)
    run(store.set("x/old", b"v"))
    synced: list[str] = []
    real = file_writes.fsync_dir

    def recording(path: str) -> None:
        real(path)
        synced.append(os.fspath(path))

    monkeypatch.setattr(file_writes, "fsync_dir", recording)

    async def changes() -> None:
        async with store.batch():
            await store.set("a/k", b"1")
            await store.set("b/k", b"2")
            await store.delete("x/old")  # x/ is left empty and pruned
            synced.append("<end of body>")

    run(changes())
    at_end = set(synced[synced.index("<end of body>") + 1:])
    assert at_end == {str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path)}


def test_batch_still_syncs_when_its_body_fails(tmp_path: Path) -> None:
    seen: list[str] = []
    store = FileStore(tmp_path, fault=seen.append)

    async def failing() -> None:
        async with store.batch():
            await store.set("k", b"v")
            raise Boom("after the set")

    with pytest.raises(Boom):
        run(failing())
    assert seen[-1] == "dirsync"
    assert run(store.get("k")) == b"v"


@pytest.mark.parametrize("unnamed", NAMINGS)
def test_set_outside_a_batch_is_durable_at_once_again(tmp_path: Path, unnamed: bool) -> None:
    seen: list[str] = []
    store = FileStore(tmp_path, unnamed_files=unnamed, fault=seen.append)

    async def batch_then_set() -> None:
        async with store.batch():
            await store.set("a", b"1")
        seen.clear()
        await store.set("b", b"2")

    run(batch_then_set())
    assert seen == write_steps(unnamed)


@pytest.mark.parametrize("unnamed", NAMINGS)
def test_batch_does_not_defer_writes_of_tasks_outside_it(tmp_path: Path, unnamed: bool) -> None:
    seen: list[str] = []
    store = FileStore(tmp_path, unnamed_files=unnamed, fault=seen.append)

    async def other_task_during_a_batch() -> None:
        go, done = asyncio.Event(), asyncio.Event()

        async def outsider() -> None:  # started before the batch opens
            await go.wait()
            seen.append("<outsider>")
            await store.set("o", b"2")
            seen.append("</outsider>")
            done.set()

        task = asyncio.create_task(outsider())
        async with store.batch():
            await store.set("a", b"1")
            go.set()
            await done.wait()
        await task

    run(other_task_during_a_batch())
    outsider = seen[seen.index("<outsider>") + 1:seen.index("</outsider>")]
    assert outsider == write_steps(unnamed)  # its set was durable when it returned


def test_temp_files_hidden_and_swept(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    run(store.set("a/b", b"v"))
    (tmp_path / f"{TEMP_PREFIX}x.123").write_bytes(b"junk")
    (tmp_path / "a" / f"{TEMP_PREFIX}b.456").write_bytes(b"junk")
    assert run(store.list_prefix("")) == ["a/b"]
    assert store.cleanup_temp() == 2
    assert temp_files(tmp_path) == []
    assert run(store.get("a/b")) == b"v"


def test_first_lock_sweeps_temp_files(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    (tmp_path / f"{TEMP_PREFIX}x.123").write_bytes(b"junk")

    async def body() -> None:
        async with store.lock(timeout=1):
            assert temp_files(tmp_path) == []

    run(body())


def test_lock_file_not_listed(tmp_path: Path) -> None:
    store = FileStore(tmp_path)

    async def body() -> list[str]:
        async with store.lock(timeout=1):
            await store.set("k", b"v")
        return await store.list_prefix("")

    assert run(body()) == ["k"]
    assert (tmp_path / LOCK_NAME).exists()


def test_two_filestores_exclude_each_other(tmp_path: Path) -> None:
    first, second = FileStore(tmp_path), FileStore(tmp_path)

    async def body() -> None:
        async with first.lock(timeout=1):
            with pytest.raises(StoreError, match=LOCK_NAME):
                async with second.lock(timeout=0.05):
                    pass
        async with second.lock(timeout=0.05):
            pass

    run(body())


@pytest.mark.parametrize("unnamed", NAMINGS)
def test_key_that_is_a_directory_cannot_be_set(tmp_path: Path, unnamed: bool) -> None:
    store = FileStore(tmp_path, unnamed_files=unnamed)
    run(store.set("a/b", b"v"))
    with pytest.raises(StoreError, match="'a'"):
        run(store.set("a", b"v"))
    with pytest.raises(StoreError, match="'a'"):
        run(store.set_if_absent("a", b"v"))
    assert temp_files(tmp_path) == []
    with pytest.raises(StoreError, match="'a/b/c'"):
        run(store.set("a/b/c", b"v"))


@pytest.mark.skipif(sys.platform != "linux", reason="unnamed files (O_TMPFILE) are Linux's")
def test_unnamed_files_are_taken_on_linux_unless_declined(tmp_path: Path) -> None:
    assert UNNAMED_HERE  # else the tests of unnamed files would not run
    assert FileStore(tmp_path).unnamed_files
    assert not FileStore(tmp_path, unnamed_files=False).unnamed_files
    assert not FileStore(tmp_path, read_only=True).unnamed_files


def _refuse_links(monkeypatch: pytest.MonkeyPatch) -> None:
    def cross_device(fd: int, path: str) -> None:
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(file_writes, "link_unnamed", cross_device)


WITHOUT_UNNAMED_FILES = {
    "no O_TMPFILE (macOS)": lambda mp: mp.delattr(os, "O_TMPFILE", raising=False),
    "no os.link (Pyodide)": lambda mp: mp.delattr(os, "link"),
    "os.link without linkat": lambda mp: mp.setattr(os, "supports_dir_fd", os.supports_dir_fd - {os.link}),
    "the link refused (no /proc, a cross-device error)": _refuse_links,
}


@pytest.mark.parametrize("lack", list(WITHOUT_UNNAMED_FILES))
def test_named_temp_files_where_unnamed_files_cannot_be_had(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            lack: str) -> None:
    WITHOUT_UNNAMED_FILES[lack](monkeypatch)
    store = FileStore(tmp_path)
    assert not store.unnamed_files
    assert list(tmp_path.iterdir()) == []  # the probe left nothing behind
    run(store.set("k", b"v"))
    assert run(store.get("k")) == b"v"


@needs_unnamed
def test_set_if_absent_leaves_a_value_that_appears_before_its_link(tmp_path: Path) -> None:
    def other_writer(step: str) -> None:
        if step == "link":
            (tmp_path / "c").write_bytes(b"theirs")

    store = FileStore(tmp_path, fault=other_writer)
    assert run(store.set_if_absent("c", b"mine")) is False
    assert run(store.get("c")) == b"theirs"
    assert store.bytes_written == 0
    assert temp_files(tmp_path) == []


@needs_unnamed
def test_concurrent_set_if_absent_of_one_key_stores_it_once(tmp_path: Path) -> None:
    store = FileStore(tmp_path)

    async def racing() -> list[bool]:
        return await asyncio.gather(*(store.set_if_absent("chunks/c", bytes([i]) * 4096) for i in range(16)))

    stored = run(racing())
    assert stored.count(True) == 1  # the link is the check: one wins even without the lock
    assert run(store.get("chunks/c")) == bytes([stored.index(True)]) * 4096
    assert store.bytes_written == 4096
    assert temp_files(tmp_path) == []


@needs_unnamed
def test_unnamed_file_is_fsynced_again_once_linked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = FileStore(tmp_path / "s")
    events: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        info = os.fstat(fd)
        events.append("fsync of the directory" if stat.S_ISDIR(info.st_mode) else f"fsync, {info.st_nlink} links")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    store.fault = lambda step: events.append(f"step {step}")
    run(store.set("k", b"v"))
    # the data is durable before the file has a name, and its link count (which a directory fsync does not
    # carry without a journal) before the directory's fsync makes the name durable
    assert events == ["step write", "step fsync", "fsync, 0 links", "step link", "fsync, 1 links", "step dirsync",
                      "fsync of the directory"]


@needs_unnamed
def test_unnamed_file_links_even_if_a_delete_pruned_its_directory(tmp_path: Path) -> None:
    def prune(step: str) -> None:
        if step == "link":
            (tmp_path / "d").rmdir()  # an unnamed file leaves its directory empty, so a delete may remove it

    store = FileStore(tmp_path, fault=prune)
    run(store.set("d/k", b"v"))
    assert run(store.get("d/k")) == b"v"


# -- direct I/O ------------------------------------------------------------------------


@needs_direct_io
@pytest.mark.parametrize("unnamed", NAMINGS)
def test_a_value_of_whole_blocks_goes_to_the_disk_with_direct_io(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 unnamed: bool) -> None:
    store = FileStore(tmp_path, unnamed_files=unnamed)
    value = page_aligned(4 * DIRECT_IO_BLOCK)
    seen = spy_writes(monkeypatch)
    run(store.set("chunks/c", value))
    assert seen == [(4 * DIRECT_IO_BLOCK, True)]
    assert run(store.get("chunks/c")) == bytes(value)
    assert store.direct_io


@needs_direct_io
@pytest.mark.parametrize("size, direct_io", [pytest.param(DIRECT_IO_BLOCK + 512, True, id="not whole blocks"),
                                             pytest.param(DIRECT_IO_BLOCK, False, id="direct_io=False")])
def test_other_values_go_through_the_page_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int,
                                                direct_io: bool) -> None:
    store = FileStore(tmp_path, direct_io=direct_io)
    value = page_aligned(size)
    seen = spy_writes(monkeypatch)
    run(store.set("k", value))
    assert seen == [(size, False)]
    assert run(store.get("k")) == bytes(value)


@needs_direct_io
def test_memory_not_aligned_for_the_disk_is_written_through_the_page_cache(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    store = FileStore(tmp_path)
    value = memoryview(bytearray(b"x" + bytes(range(256)) * 16))[1:]  # one byte past malloc's alignment
    seen = spy_writes(monkeypatch)
    run(store.set("k", value))
    assert seen == [(DIRECT_IO_BLOCK, False)]  # not even tried: the kernel would refuse it
    assert run(store.get("k")) == bytes(value)
    assert store.direct_io  # the next aligned value is written directly again


@needs_direct_io
@pytest.mark.parametrize("refusal", [pytest.param(errno.EINVAL, id="EINVAL, misaligned memory"),
                                     pytest.param(errno.EFAULT, id="EFAULT, a device mapping it cannot pin")])
def test_a_direct_write_the_disk_refuses_is_written_through_the_page_cache(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch,
                                                                           refusal: int) -> None:
    store = FileStore(tmp_path)
    value = page_aligned(2 * DIRECT_IO_BLOCK)
    seen = spy_writes(monkeypatch, refuse_direct=refusal)
    run(store.set("k", value))
    assert seen == [(2 * DIRECT_IO_BLOCK, True), (2 * DIRECT_IO_BLOCK, False)]
    assert run(store.get("k")) == bytes(value)
    assert temp_files(tmp_path) == []


@needs_direct_io
def test_a_file_system_without_direct_io_is_written_through_the_page_cache(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import fcntl

    real_fcntl = fcntl.fcntl
    attempts: list[int] = []

    def no_direct_io(fd: int, cmd: int, arg: int = 0) -> Any:
        if cmd == fcntl.F_SETFL and arg & os.O_DIRECT:
            attempts.append(fd)
            raise OSError(errno.EINVAL, "Invalid argument")  # what setting O_DIRECT on such a file gives
        return real_fcntl(fd, cmd, arg)

    monkeypatch.setattr(fcntl, "fcntl", no_direct_io)
    store = FileStore(tmp_path)
    seen = spy_writes(monkeypatch)
    for key in ("a", "b"):
        run(store.set(key, page_aligned(DIRECT_IO_BLOCK)))
    assert seen == [(DIRECT_IO_BLOCK, False)] * 2
    assert len(attempts) == 1  # the refusal holds for the store
    assert not store.direct_io
    assert run(store.get("b")) == bytes(page_aligned(DIRECT_IO_BLOCK))


@pytest.mark.skipif(sys.platform != "linux", reason="O_DIRECT is Linux's")
def test_direct_io_is_taken_on_linux_unless_declined(tmp_path: Path) -> None:
    assert FileStore(tmp_path).direct_io
    assert not FileStore(tmp_path, direct_io=False).direct_io
    assert not FileStore(tmp_path, read_only=True).direct_io


def test_delete_prunes_empty_directories(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    run(store.set("a/b/c", b"v"))
    run(store.set("a/d", b"v"))
    run(store.delete("a/b/c"))
    assert not (tmp_path / "a" / "b").exists()
    assert (tmp_path / "a").is_dir()
    run(store.delete("a/d"))
    assert not (tmp_path / "a").exists()
    run(store.set("a", b"now a value"))
    assert run(store.get("a")) == b"now a value"


def test_read_only_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="nowhere"):
        FileStore(tmp_path / "nowhere", read_only=True)


def test_directory_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"")
    with pytest.raises(StoreError, match="f"):
        FileStore(tmp_path / "f")


def test_bad_key_checked_before_read_only(tmp_path: Path) -> None:
    with pytest.raises(FieldError):
        run(FileStore(tmp_path, read_only=True).set("/etc/passwd", b""))


def test_a_directory_with_a_nul_in_its_name_is_a_store_error() -> None:
    with pytest.raises(StoreError, match="cannot create"):
        FileStore("a\x00b")


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_get_refuses_a_value_longer_than_max_bytes(tmp_path: Path, kind: str) -> None:
    store = MemoryStore() if kind == "memory" else FileStore(tmp_path / "store")
    run(store.set("k", b"12345"))
    assert run(store.get("k", max_bytes=5)) == b"12345"
    with pytest.raises(FormatError, match="k length: expected at most 4 bytes, got 5"):
        run(store.get("k", max_bytes=4))


def test_get_with_max_bytes_reads_nothing_of_a_longer_file(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "store")
    run(store.set("k", b"x"))
    os.truncate(tmp_path / "store" / "k", 20 << 30)  # sparse: reading it would need 20 GiB of memory
    with pytest.raises(FormatError, match=f"got {20 << 30}"):
        run(store.get("k", max_bytes=1 << 20))


def test_get_into_then_runs_then_on_the_io_thread_that_read_the_value(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "store")
    run(store.set("k", b"value"))
    readers: list[int] = []
    read_into = store._read_into

    def recorded_read(key: str, out: memoryview) -> int | None:
        readers.append(threading.get_ident())
        return read_into(key, out)

    store._read_into = recorded_read  # type: ignore[method-assign]
    got = run(store.get_into_then("k", memoryview(bytearray(5)), lambda view: threading.get_ident()))
    assert got == (5, readers[0]) and readers[0] != threading.get_ident()



@pytest.mark.parametrize("method", ["get", "get_into"])
def test_a_fifo_where_a_value_should_be_is_refused_without_blocking(tmp_path: Path, unblock_fifo: Any,
                                                                    method: str) -> None:
    store = FileStore(tmp_path / "store")
    unblock_fifo(tmp_path / "store" / "k")
    with pytest.raises(FormatError, match="k: expected a regular file .*, got 'a FIFO'"):
        run(store.get("k") if method == "get" else store.get_into("k", bytearray(11)))


def test_a_value_that_is_a_symbolic_link_is_refused_not_followed(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "store")
    (tmp_path / "store" / "k").symlink_to("/dev/zero")
    with pytest.raises(FormatError, match="symbolic link"):
        run(store.get("k"))
    assert not run(store.exists("k"))


def test_a_symbolic_link_in_a_keys_path_is_not_followed_for_reads_or_writes(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "k").write_bytes(b"not the store's")
    store = FileStore(tmp_path / "store")
    (tmp_path / "store" / "chunks").symlink_to(outside)
    with pytest.raises(StoreError, match="symbolic link"):
        run(store.get("chunks/k"))
    with pytest.raises(StoreError, match="symbolic link"):
        run(store.set_if_absent("chunks/new", b"v"))
    with pytest.raises(StoreError, match="symbolic link"):
        run(store.list_prefix("chunks/"))
    assert [(p.name, p.read_bytes()) for p in outside.iterdir()] == [("k", b"not the store's")]


def test_check_directory_takes_a_store_and_refuses_what_is_not_one(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "store")
    run(store.set("manifests/a", b"m"))
    FileStore.check_directory(tmp_path / "store", ("manifests", "chunks"))
    (tmp_path / "store" / "notes.txt").write_text("mine")
    with pytest.raises(FormatError, match="holding notes.txt"):
        FileStore.check_directory(tmp_path / "store", ("manifests", "chunks"))


@pytest.mark.parametrize("new", [False, True])
def test_check_directory_takes_a_missing_or_empty_directory_only_for_a_new_store(tmp_path: Path, new: bool) -> None:
    (tmp_path / "empty").mkdir()
    for path in (tmp_path / "missing", tmp_path / "empty"):
        if new:
            FileStore.check_directory(path, ("manifests",), new=True)
        else:
            with pytest.raises(FormatError, match="nothing|empty"):
                FileStore.check_directory(path, ("manifests",))


# -- crashes and other processes ----------------------------------------------------


def run_child(code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


KILL_AT_STEP = """
    import asyncio, os, sys
    from kvckpt_web.stores.file import FileStore
    from kvckpt_web.gpu.tensors import zeroed

    def fault(step):
        if step == sys.argv[2]:
            os._exit(137)  # like kill -9: no cleanup, no finally blocks

    value = zeroed(int(sys.argv[4]))  # page-aligned: whole blocks go to the disk with O_DIRECT
    value[:] = bytes(range(256)) * (len(value) // 256) + bytes(len(value) % 256)
    store = FileStore(sys.argv[1], fault=fault, unnamed_files=sys.argv[3] == "unnamed")
    asyncio.run(store.set("d/k", value))
"""


@pytest.mark.parametrize("size", [3000, 2 * DIRECT_IO_BLOCK], ids=["bytes", "whole-blocks"])
@pytest.mark.parametrize("unnamed, step", naming_and_steps(replacing=True) + [
    pytest.param(unnamed, "never", id=f"{'unnamed' if unnamed else 'named'}-never") for unnamed in WAYS])
def test_kill_at_every_step_leaves_old_or_new(tmp_path: Path, unnamed: bool, step: str, size: int) -> None:
    store = FileStore(tmp_path)
    run(store.set("d/k", b"old"))
    child = run_child(KILL_AT_STEP, str(tmp_path), step, "unnamed" if unnamed else "named", str(size))
    assert child.returncode == (0 if step == "never" else 137), child.stderr
    new = bytes(range(256)) * (size // 256) + bytes(size % 256)
    expected = new if step in ("dirsync", "never") else b"old"
    assert run(store.get("d/k")) == expected
    assert run(store.list_prefix("")) == ["d/k"]  # a stray temp file is never listed
    # a named temp file exists from its creation to its rename; an unnamed file, once linked under a temp name
    stray = {"rename"} if unnamed else {"write", "fsync", "rename"}
    assert len(temp_files(tmp_path)) == (step in stray)
    store.cleanup_temp()
    assert temp_files(tmp_path) == []
    assert run(store.get("d/k")) == expected


TRY_LOCK = """
    import asyncio, sys
    from kvckpt_web.errors import StoreError
    from kvckpt_web.stores.file import FileStore

    async def main():
        async with FileStore(sys.argv[1]).lock(timeout=float(sys.argv[2])):
            print("locked")

    try:
        asyncio.run(main())
    except StoreError as exc:
        print(exc)
        sys.exit(3)
"""

HOLD = """
    import asyncio, sys
    from kvckpt_web.stores.file import FileStore

    async def main():
        store = FileStore(sys.argv[1])
        async with store.lock(timeout=5) if sys.argv[2] == "lock" else store.claim(sys.argv[2]):
            print("held", flush=True)
            sys.stdin.readline()

    asyncio.run(main())
"""


def test_lock_excludes_other_process(tmp_path: Path) -> None:
    store = FileStore(tmp_path)

    async def body() -> None:
        async with store.lock(timeout=1):
            child = run_child(TRY_LOCK, str(tmp_path), "0.2")
            assert child.returncode == 3, child.stderr
            assert str(tmp_path / LOCK_NAME) in child.stdout
        child = run_child(TRY_LOCK, str(tmp_path), "5")
        assert child.returncode == 0, child.stderr
        assert child.stdout.strip() == "locked"

    run(body())


@contextmanager
def lock_holder(directory: Path, what: str = "lock") -> Iterator[subprocess.Popen[str]]:
    """A child process holding the lock of ``directory`` (or, ``what`` another name, the claim of that checkpoint
    name) until it reads a line (or is killed)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(HOLD), str(directory), what],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline().strip() == "held"
            yield holder
        finally:
            if holder.poll() is None:
                holder.kill()
            holder.wait()


async def take_lock(directory: Path, timeout: float) -> None:
    async with FileStore(directory).lock(timeout=timeout):
        pass


def test_other_process_lock_excludes_us(tmp_path: Path) -> None:
    with lock_holder(tmp_path) as holder:
        with pytest.raises(StoreError, match=LOCK_NAME):
            run(take_lock(tmp_path, 0.2))
        holder.communicate("\n", timeout=30)
        assert holder.returncode == 0
    run(take_lock(tmp_path, 5))


def test_lock_of_killed_process_is_released(tmp_path: Path) -> None:
    with lock_holder(tmp_path) as holder:
        holder.kill()  # SIGKILL: the kernel drops the flock with the process
        holder.wait()
    run(take_lock(tmp_path, 5))


# -- claims -------------------------------------------------------------------------


async def take_claim(directory: Path, name: str = "chat") -> None:
    async with FileStore(directory).claim(name):
        pass


def test_two_filestores_on_one_directory_exclude_each_others_claims(tmp_path: Path) -> None:
    async def body() -> None:
        async with FileStore(tmp_path).claim("chat"):
            with pytest.raises(ConflictError, match="'chat'"):
                await take_claim(tmp_path)
            await take_claim(tmp_path, "other")
        await take_claim(tmp_path)

    run(body())


def test_a_claim_of_another_process_refuses_ours_until_it_releases_it(tmp_path: Path) -> None:
    with lock_holder(tmp_path, "chat") as holder:
        with pytest.raises(ConflictError, match=f"'chat' of {tmp_path}: held by another writer"):
            run(take_claim(tmp_path))
        holder.communicate("\n", timeout=30)
        assert holder.returncode == 0
    run(take_claim(tmp_path))


def test_the_claim_of_a_killed_process_is_released(tmp_path: Path) -> None:
    with lock_holder(tmp_path, "chat") as holder:
        holder.kill()  # SIGKILL: the kernel drops the flock with the process
        holder.wait()
    assert (tmp_path / f"{CLAIM_PREFIX}chat").exists()  # left behind, and harmless:
    FileStore.check_directory(tmp_path, ("manifests", "chunks"))
    run(take_claim(tmp_path))
    assert not (tmp_path / f"{CLAIM_PREFIX}chat").exists()


def test_a_claim_file_is_the_stores_own_while_held_and_gone_after(tmp_path: Path) -> None:
    store = FileStore(tmp_path)

    async def body() -> list[str]:
        await store.set("manifests/chat/1", b"m")
        async with store.claim("chat"):
            FileStore.check_directory(tmp_path, ("manifests", "chunks"))
            return sorted(p.name for p in tmp_path.iterdir())

    assert run(body()) == ["manifests", f"{CLAIM_PREFIX}chat"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifests"]


def test_a_claimer_that_locked_a_claim_file_its_holder_removed_claims_the_file_there_now(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import fcntl

    path = tmp_path / f"{CLAIM_PREFIX}chat"
    real_flock, calls = fcntl.flock, []

    def flock(fd: int, operation: int) -> None:
        calls.append(fd)
        if len(calls) == 1:  # the holder lets go between our open and our flock: it removed the file first
            path.unlink()
        real_flock(fd, operation)

    store = FileStore(tmp_path)

    async def body() -> None:
        async with store.claim("chat"):
            monkeypatch.setattr(fcntl, "flock", real_flock)
            with pytest.raises(ConflictError):
                await take_claim(tmp_path)

    path.touch()  # as a killed holder leaves it
    monkeypatch.setattr(fcntl, "flock", flock)
    run(body())
    assert len(calls) == 2


def test_a_browser_store_names_its_location_by_its_kind_and_name():
    assert IndexedDBStore(None, "kvckpt-demo").location == "indexeddb:kvckpt-demo"
    assert OPFSStore(None, "kvckpt").location == "opfs:kvckpt"
