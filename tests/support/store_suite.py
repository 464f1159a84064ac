"""The behaviour every Store backend must have, as one inheritable test class.

A backend's test module subclasses :class:`StoreTests` (name it ``Test...``)
and supplies only :meth:`StoreTests.open_store`. Tests of what a backend may not offer ask its capability flags
(``supports_overwrites``, ``supports_deletes``): a create-only store must refuse such calls and keep its values.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvckpt_web.errors import ConflictError, FieldError, StoreError
from kvckpt_web.stores.file import TEMP_PREFIX
from kvckpt_web.stores.base import Store
from kvckpt_web.stores.leases import CLOCK_SKEW_SECONDS, DEFAULT_LEASE_SECONDS

T = TypeVar("T")


def takes_direct_io(directory: str) -> bool:
    """Whether files in ``directory`` can be opened with O_DIRECT (Linux, not every file system)."""
    flag = getattr(os, "O_DIRECT", None)
    if flag is None or sys.platform != "linux":
        return False
    probe = os.path.join(directory, f"{TEMP_PREFIX}direct-probe.{os.getpid()}")
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | flag, 0o644))
    except OSError:
        return False
    finally:
        if os.path.exists(probe):
            os.unlink(probe)
    return True


needs_direct_io = pytest.mark.skipif(not takes_direct_io(tempfile.gettempdir()),
                                     reason="the temp directory's file system takes no O_DIRECT")


def spy_writes(monkeypatch: pytest.MonkeyPatch, refuse_direct: int | None = None) -> list[tuple[int, bool]]:
    """(bytes, whether O_DIRECT was on) of each os.write from now on; with ``refuse_direct``, a direct
    write raises that errno as a disk that cannot take the memory directly does."""
    import fcntl

    seen: list[tuple[int, bool]] = []
    real_write = os.write

    def write(fd: int, data: Any) -> int:
        direct = bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT)
        seen.append((memoryview(data).nbytes, direct))
        if direct and refuse_direct is not None:
            raise OSError(refuse_direct, os.strerror(refuse_direct))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    return seen


BAD_KEYS = [
    "",
    "/abs",
    "trailing/",
    "a//b",
    ".",
    "..",
    "a/../b",
    "a/./b",
    "../escape",
    "sp ace",
    "back\\slash",
    "t~ilde",
    "nul\x00",
    "ünïcode",
    "x" * 201,
    "a/" * 600 + "b",
]

BAD_PREFIXES = ["/abs", "a//b", "../x", "a/../", "sp ace", "t~", "a/./b"]


def needs(store: Store, *flags: str) -> None:
    """Skip the test unless ``store`` has every capability flag of ``flags``."""
    missing = [flag for flag in flags if not getattr(store, flag)]
    if missing:
        pytest.skip(f"{type(store).__name__} lacks {', '.join(missing)}")


def never_called(view: memoryview) -> None:
    raise AssertionError(f"then called with {len(view)} bytes")


def run(coro: Awaitable[T]) -> T:
    """Run one coroutine to completion on a fresh event loop."""
    return asyncio.run(coro)  # type: ignore[arg-type]


async def try_claim(store: Store, name: str) -> str:
    """"taken" if another writer could take (and at once release) ``store``'s claim of ``name`` now, else
    "refused"."""
    try:
        async with store.claim(name):
            return "taken"
    except ConflictError:
        return "refused"


class Clock:
    """A clock the test moves (``offset`` seconds ahead of the real one): what ages of stored values and leases of
    claims are measured with."""

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset

    def __call__(self) -> float:
        return time.time() + self.offset


LEASE_RUN_OUT = DEFAULT_LEASE_SECONDS + CLOCK_SKEW_SECONDS + 1
"""Seconds after which a claim taken with the default lease and not renewed may be taken over."""


class StoreTests:
    """Shared Store tests; subclasses define :meth:`open_store`."""

    def open_store(self, location: Path, **kwargs: Any) -> Store:
        """Open the backend at ``location``; stores opened at one location see the same data."""
        raise NotImplementedError

    def open_other_writer(self, location: Path) -> Store:
        """Another store object on the storage at ``location``, standing for another process's writer."""
        return self.open_store(location)

    def open_leased(self, location: Path, clock: Clock) -> Store:
        """The backend at ``location`` with its claims' leases (the storage's included) measured by ``clock``;
        skips where claims hold until released."""
        pytest.skip(f"claims of {type(self).__name__} hold until released")

    @pytest.fixture
    def store(self, tmp_path: Path) -> Store:
        return self.open_store(tmp_path)

    def test_it_names_its_location_for_messages(self, store: Store) -> None:
        assert isinstance(store.location, str) and store.location

    # -- get / set / delete / exists -------------------------------------------

    def test_missing_key(self, store: Store) -> None:
        async def body() -> None:
            assert await store.get("nope") is None
            assert await store.exists("nope") is False

        run(body())

    def test_deleting_a_missing_key_is_fine(self, store: Store) -> None:
        needs(store, "supports_deletes")
        run(store.delete("nope"))

    def test_a_create_only_store_refuses_to_overwrite_and_keeps_the_value(self, store: Store) -> None:
        if store.supports_overwrites:
            pytest.skip("the store overwrites")
        run(store.set("k", b"first"))
        with pytest.raises(ConflictError, match="'k'"):
            run(store.set("k", b"second"))
        assert run(store.get("k")) == b"first"
        assert store.bytes_written == 5

    def test_a_store_without_deletes_refuses_them_and_keeps_the_value(self, store: Store) -> None:
        if store.supports_deletes:
            pytest.skip("the store deletes")
        run(store.set("k", b"kept"))
        with pytest.raises(StoreError, match="'k'"):
            run(store.delete("k"))
        assert run(store.get("k")) == b"kept"

    def test_set_get_overwrite_delete(self, store: Store) -> None:
        needs(store, "supports_overwrites", "supports_deletes")
        async def body() -> None:
            await store.set("a", b"one")
            assert await store.get("a") == b"one"
            assert await store.exists("a")
            await store.set("a", b"two!")
            assert await store.get("a") == b"two!"
            await store.delete("a")
            assert await store.get("a") is None
            assert not await store.exists("a")

        run(body())

    def test_empty_and_binary_values(self, store: Store) -> None:
        async def body() -> None:
            await store.set("empty", b"")
            assert await store.get("empty") == b""
            assert await store.exists("empty")
            blob = bytes(range(256)) * 1000
            await store.set("blob", blob)
            assert await store.get("blob") == blob

        run(body())

    def test_bytes_like_values(self, store: Store) -> None:
        async def body() -> None:
            await store.set("ba", bytearray(b"xyz"))
            await store.set("mv", memoryview(b"abcdef")[1:4])
            assert await store.get("ba") == b"xyz"
            value = await store.get("mv")
            assert value == b"bcd" and type(value) is bytes

        run(body())

    def test_get_into_reads_a_value_of_the_buffers_length_in_place(self, store: Store) -> None:
        async def body() -> None:
            blob = bytes(range(256)) * 40
            await store.set("blob", blob)
            out = bytearray(len(blob) + 8)
            assert await store.get_into("blob", memoryview(out)[4:-4]) == len(blob)
            assert out == bytes(4) + blob + bytes(4)

        run(body())

    @pytest.mark.parametrize("size", [0, 9, 11])
    def test_get_into_reports_another_length_and_leaves_the_buffer_alone(self, store: Store, size: int) -> None:
        async def body() -> None:
            await store.set("ten", b"0123456789")
            out = bytearray(b"\xee" * size)
            assert await store.get_into("ten", memoryview(out)) == 10
            assert out == b"\xee" * size

        run(body())

    def test_get_into_of_a_missing_key_is_none(self, store: Store) -> None:
        assert run(store.get_into("nope", memoryview(bytearray(3)))) is None

    def test_get_into_then_hands_the_whole_value_to_then_and_returns_what_it_returns(self, store: Store) -> None:
        async def body() -> None:
            blob = bytes(range(256)) * 40
            await store.set("blob", blob)
            out = bytearray(len(blob))
            assert await store.get_into_then("blob", memoryview(out), bytes) == (len(blob), blob)
            assert out == blob

        run(body())

    @pytest.mark.parametrize("size", [0, 9, 11])
    def test_get_into_then_of_another_length_does_not_call_then(self, store: Store, size: int) -> None:
        async def body() -> None:
            await store.set("ten", b"0123456789")
            out = bytearray(b"\xee" * size)
            assert await store.get_into_then("ten", memoryview(out), never_called) == (10, None)
            assert out == b"\xee" * size

        run(body())

    def test_get_into_then_of_a_missing_key_does_not_call_then(self, store: Store) -> None:
        assert run(store.get_into_then("nope", memoryview(bytearray(3)), never_called)) == (None, None)

    def test_get_into_then_passes_on_what_then_raises(self, store: Store) -> None:
        def fails(view: memoryview) -> None:
            raise ZeroDivisionError(f"{len(view)} bytes")

        run(store.set("k", b"abc"))
        with pytest.raises(ZeroDivisionError, match="3 bytes"):
            run(store.get_into_then("k", memoryview(bytearray(3)), fails))
        assert run(store.get("k")) == b"abc"

    @pytest.mark.parametrize("then", [None, "sha256", 3])
    def test_get_into_then_refuses_a_then_that_is_no_function_before_reading(self, store: Store, then: Any) -> None:
        run(store.set("k", b"abc"))
        out = bytearray(b"xyz")
        with pytest.raises(FieldError) as info:
            run(store.get_into_then("k", memoryview(out), then))
        assert info.value.field == "then" and out == b"xyz"
        assert run(store.get("k")) == b"abc"

    @pytest.mark.parametrize("out", [b"abc", memoryview(b"abc"), "abc", None])
    def test_get_into_refuses_a_buffer_it_cannot_write(self, store: Store, out: Any) -> None:
        run(store.set("k", b"abc"))
        with pytest.raises(FieldError) as info:
            run(store.get_into("k", out))
        assert info.value.field == "out"
        assert run(store.get("k")) == b"abc"

    @pytest.mark.parametrize("data", ["text", 5, None, [1, 2]])
    def test_non_bytes_value_rejected(self, store: Store, data: Any) -> None:
        with pytest.raises(FieldError, match="data"):
            run(store.set("k", data))

    def test_set_if_absent_stores_a_new_value(self, store: Store) -> None:
        async def body() -> tuple[bool, bytes | None, int]:
            stored = await store.set_if_absent("chunks/new", memoryview(b"payload"))
            return stored, await store.get("chunks/new"), store.bytes_written

        assert run(body()) == (True, b"payload", 7)

    def test_set_if_absent_leaves_a_present_value_alone(self, store: Store) -> None:
        async def body() -> tuple[bool, bytes | None, int]:
            await store.set("chunks/old", b"first")
            stored = await store.set_if_absent("chunks/old", b"second")
            return stored, await store.get("chunks/old"), store.bytes_written

        assert run(body()) == (False, b"first", 5)

    @pytest.mark.parametrize("data", ["text", 5, None])
    def test_set_if_absent_refuses_non_bytes_and_stores_nothing(self, store: Store, data: Any) -> None:
        with pytest.raises(FieldError, match="data"):
            run(store.set_if_absent("k", data))
        assert run(store.exists("k")) is False

    def test_value_is_a_snapshot_of_the_callers_buffer(self, store: Store) -> None:
        async def body() -> None:
            buffer = bytearray(b"first")
            await store.set("a", memoryview(buffer))
            buffer[:] = b"later"
            assert await store.get("a") == b"first"

        run(body())

    def test_nested_keys(self, store: Store) -> None:
        async def body() -> None:
            await store.set("m/seq-1/00000000000000000001", b"m1")
            await store.set("c/" + "ab" * 32, b"c")
            assert await store.get("m/seq-1/00000000000000000001") == b"m1"
            # a directory of other keys holds no value itself
            assert await store.get("m/seq-1") is None
            assert not await store.exists("m")

        run(body())

    def test_values_survive_reopen(self, tmp_path: Path) -> None:
        run(self.open_store(tmp_path).set("p/q", b"kept"))
        assert run(self.open_store(tmp_path).get("p/q")) == b"kept"

    def test_concurrent_sets(self, store: Store) -> None:
        async def body() -> None:
            await asyncio.gather(*(store.set(f"k/{i:03d}", bytes([i]) * i) for i in range(50)))
            for i in range(50):
                assert await store.get(f"k/{i:03d}") == bytes([i]) * i

        run(body())

    # -- keys ------------------------------------------------------------------

    @pytest.mark.parametrize("key", BAD_KEYS)
    def test_bad_keys_rejected(self, store: Store, key: str) -> None:
        for call in (store.get(key), store.set(key, b"x"), store.set_if_absent(key, b"x"), store.delete(key),
                     store.exists(key)):
            with pytest.raises(FieldError) as info:
                run(call)
            assert info.value.field == "key"

    @pytest.mark.parametrize("key", [None, 7, b"bytes"])
    def test_non_str_key_rejected(self, store: Store, key: Any) -> None:
        with pytest.raises(FieldError, match="key"):
            run(store.get(key))

    def test_odd_but_valid_keys(self, store: Store) -> None:
        async def body() -> None:
            for key in ["...", ".hidden", "-dash", "a.b_c-D9", "x" * 200]:
                await store.set(key, key.encode())
                assert await store.get(key) == key.encode()

        run(body())

    # -- list_prefix -----------------------------------------------------------

    def test_list_prefix(self, store: Store) -> None:
        keys = ["b", "a/2", "a/1", "a/10/x", "ab", "c/d/e/f", "manifests/s/01", "manifests/s2/01"]

        async def body() -> None:
            for key in keys:
                await store.set(key, b"v")
            assert await store.list_prefix("") == sorted(keys)
            assert await store.list_prefix("a/") == ["a/1", "a/10/x", "a/2"]
            assert await store.list_prefix("a") == ["a/1", "a/10/x", "a/2", "ab"]
            assert await store.list_prefix("a/1") == ["a/1", "a/10/x"]
            assert await store.list_prefix("manifests/s/") == ["manifests/s/01"]
            assert await store.list_prefix("manifests/s") == ["manifests/s/01", "manifests/s2/01"]
            assert await store.list_prefix("c/d/e/f") == ["c/d/e/f"]
            assert await store.list_prefix("zzz") == []
            assert await store.list_prefix("b/") == []  # "b" is a value, not a directory
            if store.supports_deletes:
                await store.delete("a/1")
                assert await store.list_prefix("a/") == ["a/10/x", "a/2"]

        run(body())

    @pytest.mark.parametrize("prefix", BAD_PREFIXES)
    def test_bad_prefix_rejected(self, store: Store, prefix: str) -> None:
        with pytest.raises(FieldError, match="prefix"):
            run(store.list_prefix(prefix))

    # -- read-only and byte counter --------------------------------------------

    def test_read_only(self, tmp_path: Path) -> None:
        run(self.open_store(tmp_path).set("k", b"v"))
        ro = self.open_store(tmp_path, read_only=True)
        assert ro.read_only
        assert run(ro.get("k")) == b"v"
        assert run(ro.list_prefix("")) == ["k"]
        with pytest.raises(StoreError, match="read-only"):
            run(ro.set("k", b"w"))
        with pytest.raises(StoreError, match="read-only"):
            run(ro.set_if_absent("new", b"w"))
        with pytest.raises(StoreError, match="read-only"):
            run(ro.delete("k"))
        with pytest.raises(StoreError, match="read-only"):
            ro.lock()
        with pytest.raises(StoreError, match="read-only"):
            ro.claim("k")
        assert run(ro.get("k")) == b"v"
        assert ro.bytes_written == 0

    def test_bytes_written(self, store: Store) -> None:
        needs(store, "supports_overwrites", "supports_deletes")

        async def body() -> None:
            assert store.bytes_written == 0
            await store.set("a", b"12345")
            await store.set("a", b"123")
            await store.set("b", b"")
            await store.get("a")
            await store.delete("a")
            assert store.bytes_written == 8
            with pytest.raises(FieldError):
                await store.set("../bad", b"xxxx")
            assert store.bytes_written == 8

        run(body())

    def test_batch_writes_are_read_back_inside_and_after_it(self, store: Store) -> None:
        needs(store, "supports_deletes")

        async def body() -> tuple[bytes | None, list[str]]:
            async with store.batch():
                await store.set("b/1", b"one")
                await store.set("b/2", b"two")
                await store.delete("b/1")
                inside = await store.get("b/2")
            return inside, await store.list_prefix("b/")

        assert run(body()) == (b"two", ["b/2"])

    # -- lock --------------------------------------------------------------------

    def test_lock_acquire_release_reacquire(self, store: Store) -> None:
        async def body() -> None:
            async with store.lock(timeout=1):
                await store.set("k", b"v")
            async with store.lock(timeout=1):
                pass

        run(body())

    def test_lock_excludes_second_holder(self, store: Store) -> None:
        async def body() -> None:
            async with store.lock(timeout=1):
                with pytest.raises(StoreError, match="lock") as info:
                    async with store.lock(timeout=0.05):
                        pytest.fail("second holder got the lock")
                assert "within" in str(info.value)
            async with store.lock(timeout=0.05):
                pass

        run(body())

    def test_lock_waiter_gets_it_after_release(self, store: Store) -> None:
        events: list[str] = []

        async def holder(started: asyncio.Event) -> None:
            async with store.lock(timeout=1):
                started.set()
                events.append("A in")
                await asyncio.sleep(0.1)
                events.append("A out")

        async def waiter(started: asyncio.Event) -> None:
            await started.wait()
            async with store.lock(timeout=5):
                events.append("B in")

        async def body() -> None:
            started = asyncio.Event()
            await asyncio.gather(holder(started), waiter(started))

        run(body())
        assert events == ["A in", "A out", "B in"]

    def test_lock_released_on_exception(self, store: Store) -> None:
        async def body() -> None:
            with pytest.raises(RuntimeError):
                async with store.lock(timeout=1):
                    raise RuntimeError("boom")
            async with store.lock(timeout=0.05):
                pass

        run(body())

    # -- claim -------------------------------------------------------------------

    def test_a_claim_refuses_a_second_claim_of_the_name_at_once_naming_name_and_store(self, store: Store) -> None:
        async def body() -> str:
            async with store.claim("chat"):
                with pytest.raises(ConflictError) as info:
                    async with store.claim("chat"):
                        pytest.fail("a second holder got the claim")
            return str(info.value)

        message = run(body())
        assert "'chat'" in message and store.location in message

    def test_a_claim_refuses_another_task_while_held(self, store: Store) -> None:
        async def other() -> str:
            try:
                async with store.claim("chat"):
                    return "claimed"
            except ConflictError:
                return "refused"

        async def body() -> str:
            async with store.claim("chat"):
                return await asyncio.create_task(other())

        assert run(body()) == "refused"

    def test_a_claim_is_released_on_exit(self, store: Store) -> None:
        async def body() -> None:
            async with store.claim("chat"):
                pass
            async with store.claim("chat"):
                pass

        run(body())

    def test_a_claim_is_released_when_its_holder_raises(self, store: Store) -> None:
        async def body() -> None:
            with pytest.raises(RuntimeError):
                async with store.claim("chat"):
                    raise RuntimeError("boom")
            async with store.claim("chat"):
                pass

        run(body())

    def test_a_claim_stays_held_across_event_loops_until_it_is_left(self, store: Store) -> None:
        async def other() -> None:
            async with store.claim("chat"):
                pass

        held = store.claim("chat")
        run(held.__aenter__())  # a generation holds its name's claim while the loops it runs in come and go
        with pytest.raises(ConflictError):
            run(other())
        run(held.__aexit__(None, None, None))
        run(other())

    def test_a_claim_outlasts_the_writer_locks_taken_while_it_is_held(self, store: Store) -> None:
        async def body() -> None:
            async with store.claim("chat"):
                async with store.lock(timeout=1):
                    await store.set("k", b"v")
                with pytest.raises(ConflictError):
                    async with store.claim("chat"):
                        pass

        run(body())

    def test_claims_of_different_names_do_not_interfere(self, store: Store) -> None:
        async def body() -> None:
            async with store.claim("chat"), store.claim("chat-2"), store.lock(timeout=1):
                await store.set("k", b"v")

        run(body())

    def test_a_claim_leaves_the_keys_as_they_were(self, store: Store) -> None:
        async def body() -> tuple[list[str], list[str]]:
            await store.set("manifests/chat/1", b"m")
            async with store.claim("chat"):
                inside = await store.list_prefix("")
            return inside, await store.list_prefix("")

        assert run(body()) == (["manifests/chat/1"], ["manifests/chat/1"])

    @pytest.mark.parametrize("name", ["", "a/b", "..", "t~ilde", None])
    def test_a_claim_of_a_name_that_is_no_key_segment_is_refused(self, store: Store, name: Any) -> None:
        with pytest.raises(FieldError) as info:
            store.claim(name)
        assert info.value.field == "name"
        with pytest.raises(FieldError) as info:
            run(store.renew_claim(name))
        assert info.value.field == "name"

    def test_a_claim_refuses_a_writer_of_another_process_until_it_is_released(self, tmp_path: Path) -> None:
        first, second = self.open_store(tmp_path), self.open_other_writer(tmp_path)
        held = first.claim("chat")
        run(held.__aenter__())
        with pytest.raises(ConflictError, match="'chat'"):
            run(second.claim("chat").__aenter__())
        run(held.__aexit__(None, None, None))
        run(second.claim("chat").__aenter__())

    def test_renewing_a_claim_this_object_does_not_hold_does_nothing(self, store: Store) -> None:
        async def body() -> list[str]:
            await store.renew_claim("chat")
            async with store.claim("chat"):
                await store.renew_claim("chat")
            return await store.list_prefix("")

        assert run(body()) == []

    def test_a_claim_whose_writer_died_is_taken_over_once_its_lease_ran_out(self, tmp_path: Path) -> None:
        clock = Clock()
        dead, second = self.open_leased(tmp_path, clock), self.open_leased(tmp_path, clock)
        run(dead.claim("chat").__aenter__())  # never left: its process was killed
        clock.offset = LEASE_RUN_OUT - 2
        with pytest.raises(ConflictError, match="'chat'"):
            run(second.claim("chat").__aenter__())
        clock.offset = LEASE_RUN_OUT
        run(second.claim("chat").__aenter__())

    def test_a_holder_whose_lease_ran_out_and_was_taken_over_writes_nothing_more(self, tmp_path: Path) -> None:
        clock = Clock()
        slow, second = self.open_leased(tmp_path, clock), self.open_leased(tmp_path, clock)
        held = slow.claim("chat")
        run(held.__aenter__())
        clock.offset = LEASE_RUN_OUT
        taken = second.claim("chat")
        run(taken.__aenter__())
        with pytest.raises(ConflictError, match="'chat'.*lease ran out"):
            run(slow.renew_claim("chat"))
        run(held.__aexit__(None, None, None))  # leaves the claim of the writer that took it over
        with pytest.raises(ConflictError, match="'chat'"):
            run(self.open_leased(tmp_path, clock).claim("chat").__aenter__())
        run(second.renew_claim("chat"))
        run(taken.__aexit__(None, None, None))

    def test_a_holder_that_renews_its_claim_keeps_the_name_past_its_first_lease(self, tmp_path: Path) -> None:
        clock = Clock()
        holder, second = self.open_leased(tmp_path, clock), self.open_leased(tmp_path, clock)
        run(holder.claim("chat").__aenter__())
        for step in range(1, 5):  # each renewal, past half of the lease, runs a whole lease from then
            clock.offset = step * DEFAULT_LEASE_SECONDS * 0.6
            run(holder.renew_claim("chat"))
        clock.offset += DEFAULT_LEASE_SECONDS * 0.9
        with pytest.raises(ConflictError, match="'chat'"):
            run(second.claim("chat").__aenter__())

    def test_renewals_of_one_claim_at_once_renew_it_once_and_each_succeeds(self, tmp_path: Path) -> None:
        clock = Clock()
        holder = self.open_leased(tmp_path, clock)

        async def body() -> None:
            async with holder.claim("chat"):
                clock.offset = DEFAULT_LEASE_SECONDS * 0.6  # due: the concurrent writes of one save all ask
                await asyncio.gather(*(holder.renew_claim("chat") for _ in range(8)))
                clock.offset = DEFAULT_LEASE_SECONDS * 1.5  # within the lease renewed at 0.6
                with pytest.raises(ConflictError, match="'chat'"):
                    await self.open_leased(tmp_path, clock).claim("chat").__aenter__()

        run(body())

    # -- model-based -------------------------------------------------------------

    # each backend subclass is its own executor of this one inherited test: that is intended
    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.differing_executors])
    @given(
        ops=st.lists(
            st.tuples(
                st.sampled_from(["set", "delete"]),
                st.sampled_from(["a", "b", "a/x", "b/y/z", "c.d", "c-d/e"]),
                st.binary(max_size=64),
            ),
            max_size=25,
        )
    )
    def test_matches_dict_model(self, ops: list[tuple[str, str, bytes]]) -> None:
        model: dict[str, bytes] = {}
        written = 0
        with tempfile.TemporaryDirectory() as tmp:
            store = self.open_store(Path(tmp))
            needs(store, "supports_overwrites", "supports_deletes")

            async def body() -> None:
                nonlocal written
                for op, key, data in ops:
                    # a key may not be both a value and a directory; skip such ops
                    if op == "set" and any(k.startswith(key + "/") or key.startswith(k + "/") for k in model):
                        continue
                    if op == "set":
                        await store.set(key, data)
                        model[key] = data
                        written += len(data)
                    else:
                        await store.delete(key)
                        model.pop(key, None)
                assert await store.list_prefix("") == sorted(model)
                for key, value in model.items():
                    assert await store.get(key) == value
                assert store.bytes_written == written

            run(body())
