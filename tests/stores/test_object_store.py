"""ObjectStore: the shared suite against a real S3 server (moto) and obstore's in-memory store, the S3 server's
conditional PUT on the wire, and when values settle for gc."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any

import pytest
from support.s3_server import BUCKET, NO_RETRIES
from support.store_suite import LEASE_RUN_OUT, Clock, StoreTests, run

from kvckpt_web.errors import ConflictError, FieldError, StoreError
from kvckpt_web.stores.base import Store
from kvckpt_web.stores.leases import CLOCK_SKEW_SECONDS

obstore = pytest.importorskip("obstore")

from kvckpt_web.stores.objects import ObjectStore  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


class TestObjectStoreOnS3(StoreTests):
    @pytest.fixture(autouse=True)
    def _server(self, s3_server: Any) -> None:
        self.server = s3_server
        self.urls: dict[Path, str] = {}

    def open_store(self, location: Path, **kwargs: Any) -> Store:
        url = self.urls.setdefault(location, self.server.new_url())
        return self.server.store(url, **kwargs)

    def open_leased(self, location: Path, clock: Clock) -> Store:
        return self.open_store(location, clock=clock)


class TestObjectStoreInMemory(StoreTests):
    def setup_method(self) -> None:
        self.backing: dict[Path, Any] = {}

    def open_store(self, location: Path, **kwargs: Any) -> Store:
        from obstore.store import MemoryStore

        return ObjectStore(self.backing.setdefault(location, MemoryStore()), **kwargs)

    def open_leased(self, location: Path, clock: Clock) -> Store:
        return self.open_store(location, clock=clock)


def test_a_store_opened_on_an_obstore_object_names_its_location_as_a_url(s3_server, tmp_path):
    url = s3_server.new_url()
    assert ObjectStore(s3_server.obstore(url)).location == url
    assert ObjectStore(obstore.store.LocalStore(tmp_path)).location == f"file://{tmp_path}"
    assert ObjectStore(obstore.store.MemoryStore()).location == "memory:///"


def test_the_s3_server_refuses_a_conditional_put_of_a_key_that_holds_a_value(s3_server):
    import boto3
    from botocore.exceptions import ClientError

    client = boto3.client("s3", endpoint_url=s3_server.endpoint, aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="us-east-1")
    key = s3_server.new_url().rpartition("/")[2] + "/k"
    client.put_object(Bucket=BUCKET, Key=key, Body=b"first", IfNoneMatch="*")
    with pytest.raises(ClientError) as info:
        client.put_object(Bucket=BUCKET, Key=key, Body=b"second", IfNoneMatch="*")
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert client.get_object(Bucket=BUCKET, Key=key)["Body"].read() == b"first"


def test_set_if_absent_leaves_a_value_another_writer_stored_first(s3_server):
    url = s3_server.new_url()
    first, second = s3_server.store(url), s3_server.store(url)
    assert run(first.set_if_absent("manifests/chat/1", b"one")) is True
    assert run(second.set_if_absent("manifests/chat/1", b"two")) is False
    assert run(first.get("manifests/chat/1")) == b"one"
    assert second.bytes_written == 0


def test_a_fresh_value_is_not_settled_and_an_old_one_is():
    clock = Clock()
    store = ObjectStore(obstore.store.MemoryStore(), grace_seconds=3600, clock=clock)
    run(store.set("chunks/a", b"a"))
    assert run(store.settled(["chunks/a", "chunks/missing"])) == set()
    clock.offset = 3601
    assert run(store.settled(["chunks/a", "chunks/missing"])) == {"chunks/a"}


def test_set_if_absent_of_a_value_older_than_half_the_grace_period_writes_it_again():
    clock, steps = Clock(), []
    store = ObjectStore(obstore.store.MemoryStore(), grace_seconds=3600, clock=clock, fault=steps.append)
    run(store.set("chunks/a", b"a"))
    clock.offset = 1801
    assert run(store.set_if_absent("chunks/a", b"a")) is False
    assert steps == ["put", "put", "put"]  # the set, the refused conditional put, the freshening put
    assert run(store.get("chunks/a")) == b"a"


def test_set_if_absent_of_other_bytes_over_an_old_value_leaves_the_stored_value(s3_server):
    url, clock = s3_server.new_url(), Clock(1801)
    run(s3_server.store(url).set("manifests/alpha/2", b"real"))
    assert run(s3_server.store(url, clock=clock).set_if_absent("manifests/alpha/2", b"forged")) is False
    assert run(s3_server.store(url).get("manifests/alpha/2")) == b"real"


def at_the_freshening_write(change: Callable[[], Any]) -> Callable[[str], None]:
    """A fault hook that calls ``change`` before the second write of a set_if_absent of a stored key: after the
    refused conditional put and the freshening read, just before the freshening write."""
    steps: list[str] = []

    def fault(step: str) -> None:
        steps.append(step)
        if len(steps) == 2:
            change()

    return fault


def test_freshening_leaves_a_value_replaced_after_it_was_read_as_replaced(s3_server):
    url = s3_server.new_url()
    backing = s3_server.obstore(url)
    run(s3_server.store(url).set("chunks/a", b"a"))
    store = ObjectStore(backing, clock=Clock(1801),
                        fault=at_the_freshening_write(lambda: obstore.put(backing, "chunks/a", b"other")))
    assert run(store.set_if_absent("chunks/a", b"a")) is False
    assert run(store.get("chunks/a")) == b"other"


def test_freshening_leaves_a_value_deleted_after_it_was_read_deleted(s3_server):
    url = s3_server.new_url()
    backing = s3_server.obstore(url)
    run(s3_server.store(url).set("chunks/a", b"a"))
    store = ObjectStore(backing, clock=Clock(1801),
                        fault=at_the_freshening_write(lambda: obstore.delete(backing, "chunks/a")))
    assert run(store.set_if_absent("chunks/a", b"a")) is False
    assert run(store.get("chunks/a")) is None


def test_freshening_in_a_local_directory_restarts_the_age_and_writes_no_bytes(tmp_path):
    store = ObjectStore.from_url(f"file://{tmp_path}")
    run(store.set("chunks/a", b"a"))
    os.utime(tmp_path / "chunks" / "a", (1e9, 1e9))
    assert run(store.set_if_absent("chunks/a", b"a")) is False
    assert run(store.settled(["chunks/a"])) == set()
    os.utime(tmp_path / "chunks" / "a", (1e9, 1e9))
    assert run(store.set_if_absent("chunks/a", b"forged")) is False
    assert (tmp_path / "chunks" / "a").read_bytes() == b"a" and run(store.settled(["chunks/a"])) == {"chunks/a"}


def test_set_if_absent_of_a_young_value_writes_nothing():
    steps: list[str] = []
    store = ObjectStore(obstore.store.MemoryStore(), grace_seconds=3600, fault=steps.append)
    run(store.set("chunks/a", b"a"))
    run(store.set_if_absent("chunks/a", b"a"))
    assert steps == ["put", "put"]  # the first set, the refused conditional put: no third


def test_a_store_with_an_exclusive_lock_settles_every_key(tmp_path):
    from kvckpt_web.stores.memory import MemoryStore

    assert run(MemoryStore().settled(["chunks/a", "chunks/b"])) == {"chunks/a", "chunks/b"}


def test_from_url_refuses_a_scheme_it_does_not_open():
    with pytest.raises(FieldError) as info:
        ObjectStore.from_url("ftp://host/x")
    assert info.value.field == "url"


def test_a_server_that_is_gone_is_a_store_error_naming_the_key(s3_server):
    from obstore.store import S3Store

    gone = S3Store("b", endpoint="http://127.0.0.1:9", access_key_id="x", secret_access_key="y", region="us-east-1",
                   client_options={"allow_http": True}, retry_config=NO_RETRIES)
    with pytest.raises(StoreError, match="'chunks/x'"):
        run(ObjectStore(gone).get("chunks/x"))


EXITING_WRITER = r"""
import asyncio, sys
from kvckpt_web.stores.objects import ObjectStore

async def main():
    store = ObjectStore.from_url(sys.argv[1])
    await asyncio.gather(*(store.set_if_absent(f"chunks/{i}", bytes(4096)) for i in range(16)))
    await asyncio.gather(*(store.get(f"chunks/{i}") for i in range(16)))
    print(len(await store.list_prefix("chunks/")), flush=True)

asyncio.run(main())
"""


def test_a_process_that_used_the_store_exits_with_status_0(s3_server):
    # obstore's async calls answered from its runtime's threads, and one still in Python as the interpreter
    # exited aborted the process (SIGABRT) after its work was done: about one exit in three under load.
    for _ in range(6):
        proc = subprocess.run([sys.executable, "-c", EXITING_WRITER, s3_server.new_url()],
                              env={**os.environ, **s3_server.env, "PYTHONPATH": str(REPO)},
                              capture_output=True, text=True, timeout=120)
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, "16\n", "")


def test_every_request_waits_on_the_stores_own_threads(s3_server, monkeypatch):
    import obstore

    threads = []
    for name in ("get", "put", "head", "delete", "list"):
        call = getattr(obstore, name)
        monkeypatch.setattr(obstore, name, lambda *a, _call=call, **k: threads.append(
            threading.current_thread().name) or _call(*a, **k))
    for name in ("get_async", "put_async", "head_async", "delete_async"):
        monkeypatch.setattr(obstore, name, lambda *a, **k: pytest.fail("an async obstore call"))
    store = s3_server.store(s3_server.new_url())
    run(store.set_if_absent("chunks/a", b"1"))
    assert run(store.get("chunks/a")) == b"1" and run(store.exists("chunks/a"))
    assert run(store.list_prefix("chunks/")) == ["chunks/a"]
    run(store.delete("chunks/a"))
    assert len(threads) >= 5 and all(name.startswith("kvckpt-objects") for name in threads)


# -- claims: leases in claim objects (FORMAT.md section 9) -------------------------------------------------------


def claim_object(backing: Any, name: str = "chat") -> tuple[bytes, Any]:
    answer = obstore.get(backing, f"~kvckpt.claim.{name}")
    return bytes(answer.bytes()), answer.meta


def test_a_claim_is_an_object_beside_the_keys_holding_its_holder_its_writer_and_when_its_lease_runs_out():
    backing, clock = obstore.store.MemoryStore(), Clock()
    store = ObjectStore(backing, clock=clock, lease_seconds=30)
    held = store.claim("chat")
    before = clock()
    run(held.__aenter__())
    value = json.loads(claim_object(backing)[0])
    assert sorted(value) == ["expires_ms", "format", "holder", "name", "version", "writer"]
    assert (value["format"], value["version"], value["name"]) == ("kvckpt.claim", 1, "chat")
    assert value["writer"] == f"{socket.gethostname()} pid {os.getpid()}"
    assert re.fullmatch(r"[0-9a-f]{32}", value["holder"])
    assert int((before + 30) * 1000) <= value["expires_ms"] <= int((clock() + 30) * 1000)
    assert run(store.list_prefix("")) == []
    run(held.__aexit__(None, None, None))
    with pytest.raises(FileNotFoundError):
        claim_object(backing)


@pytest.mark.parametrize("value", [b"not json", b'{"format":"kvckpt.claim","version":2}', b"x" * 2000,
                                   b'{"expires_ms":99999999999999,"format":"kvckpt.claim","holder":"'
                                   + b"a" * 32 + b'","name":"chat","version":1}',
                                   b'{"expires_ms":1,"format":"kvckpt.claim","holder":"' + b"a" * 32
                                   + b'","name":"chat","version":1,"writer":""}'])
def test_a_claim_object_that_is_none_or_runs_for_longer_holds_its_name_an_hour_after_it_was_written(value):
    backing, clock = obstore.store.MemoryStore(), Clock()
    obstore.put(backing, "~kvckpt.claim.chat", value)
    store = ObjectStore(backing, clock=clock)
    clock.offset = LEASE_RUN_OUT
    with pytest.raises(ConflictError, match="'chat'"):
        run(store.claim("chat").__aenter__())
    assert claim_object(backing)[0] == value
    clock.offset = 3600 + LEASE_RUN_OUT
    run(store.claim("chat").__aenter__())


def test_a_claim_held_by_another_writer_is_refused_naming_that_writer_until_when_and_when_to_retry():
    backing, clock = obstore.store.MemoryStore(), Clock()
    first = ObjectStore(backing, clock=clock, lease_seconds=20, writer="replica-a")
    run(first.claim("chat").__aenter__())
    expires = json.loads(claim_object(backing)[0])["expires_ms"] / 1000
    with pytest.raises(ConflictError) as info:
        run(ObjectStore(backing, clock=clock, writer="replica-b").claim("chat").__aenter__())
    until = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires))
    assert f"held by writer 'replica-a' of that name until {until} unless renewed" in str(info.value)
    assert info.value.retry_at == expires + CLOCK_SKEW_SECONDS


@pytest.mark.parametrize("writer", ["", "x" * 129, "tab\there", 7])
def test_a_claims_writer_must_be_1_to_128_printable_characters(writer):
    with pytest.raises(FieldError) as info:
        ObjectStore(obstore.store.MemoryStore(), writer=writer)
    assert info.value.field == "writer"


def test_a_claim_on_storage_without_conditional_updates_is_taken_and_released_but_not_taken_over(tmp_path):
    clock = Clock()
    first, second = (ObjectStore(obstore.store.LocalStore(str(tmp_path)), clock=clock) for _ in range(2))
    held = first.claim("chat")
    run(held.__aenter__())
    with pytest.raises(ConflictError, match="'chat'"):
        run(second.claim("chat").__aenter__())
    run(held.__aexit__(None, None, None))
    run(first.claim("chat").__aenter__())  # and never released: its writer died
    clock.offset = LEASE_RUN_OUT
    with pytest.raises(StoreError, match="conditionally on an ETag.*FileStore"):
        run(second.claim("chat").__aenter__())


def test_a_lease_must_be_longer_than_0_and_at_most_an_hour():
    for seconds in (0, 3601, -1, float("nan"), True):
        with pytest.raises(FieldError) as info:
            ObjectStore(obstore.store.MemoryStore(), lease_seconds=seconds)
        assert info.value.field == "lease_seconds"
