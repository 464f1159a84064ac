"""``kvckpt serve --store DIR|URL --token T`` in its own process: pushes (kvckpt_web.durable.sync to an HTTPStore)
that move each chunk once, a server killed with SIGKILL mid-push (the remote keeps its last committed generation;
the push resumes and sends only what is missing), and an S3 store behind the server."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvckpt_web.durable.catalog import load_manifest
from kvckpt_web.durable.prefix_records import PrefixKey
from kvckpt_web.durable.restore import restore
from kvckpt_web.durable.save import save
from kvckpt_web.durable.sync import sync
from kvckpt_web.errors import StoreError
from kvckpt_web.stores.file import FileStore
from kvckpt_web.stores.http import HTTPStore
from kvckpt_web.stores.memory import MemoryStore

from support.kvmodel import run, small_limits

REPO = Path(__file__).resolve().parents[2]
TOKEN = "push-pull-token-0123456789"


class ServeProcess:
    """``kvckpt serve --store STORE --token TOKEN --port 0`` in a subprocess (store only: no Pyodide given)."""

    def __init__(self, store: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kvckpt_web.cli", "serve", "--store", store, "--token", TOKEN, "--port", "0"],
            env={**os.environ, **(env or {}), "PYTHONPATH": str(REPO), "KVCKPT_PYODIDE": str(REPO / "no-pyodide")},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if " on http://" not in line:
            self.kill()
            raise RuntimeError(f"kvckpt serve did not start: {line}{self.proc.stderr.read()}")
        self.url = line.split(" on ")[1].split()[0]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=60)


@pytest.fixture
def serve() -> Any:
    started: list[ServeProcess] = []

    def start(store: str, env: dict[str, str] | None = None) -> ServeProcess:
        started.append(ServeProcess(store, env))
        return started[-1]

    yield start
    for server in started:
        server.kill()


LIMITS = small_limits(max_total_seq_len=256)


@pytest.fixture
def model(make_model):
    model = make_model(limits=LIMITS, seed=21)
    model.add(0, 60)
    return model


def saved(model: Any, store: Any) -> Any:
    ids = list(range(7, 7 + model.length(0)))
    return run(save(model.cache, 0, store, "chat", pages_per_chunk=2, prefix=PrefixKey("scope", ids)))


def generation_bytes(store: Any, chunks: set[str]) -> int:
    """Bytes of ``chunks`` plus the newest manifest of "chat" and its record."""
    _, envelope = run(load_manifest(store, "chat"))
    records = run(store.list_prefix("prefixes/"))
    return sum(len(run(store.get(k))) for k in chunks) + len(envelope) + len(run(store.get(records[-1])))


def chunks_of(store: Any) -> set[str]:
    return set(run(load_manifest(store, "chat"))[0].chunk_keys())


class KillsServerAfter(HTTPStore):
    """An HTTPStore that SIGKILLs its server once ``puts`` values were stored (the server dies mid-push); its puts
    go one at a time, so exactly that many arrive."""

    def __init__(self, url: str, server: ServeProcess, puts: int) -> None:
        super().__init__(url, token=TOKEN)
        self.server, self.puts = server, puts
        self.one_at_a_time = asyncio.Lock()

    async def _put(self, key: str, data: memoryview) -> bool:
        async with self.one_at_a_time:
            if self.puts == 0:
                self.server.kill()
            self.puts -= 1
            return await super()._put(key, data)


def test_a_push_moves_each_chunk_once_and_a_second_push_only_the_new_ones(model, serve, tmp_path):
    local = MemoryStore()
    saved(model, local)
    server = serve(str(tmp_path / "remote"))
    remote = HTTPStore(server.url, token=TOKEN)
    first = run(sync(local, remote))
    assert first.bytes_sent == generation_bytes(local, chunks_of(local)) == remote.bytes_written
    one = chunks_of(local)
    model.append({0: 16})
    saved(model, local)
    second = run(sync(local, remote))
    assert second.chunks_sent == len(chunks_of(local) - one) < len(chunks_of(local))
    assert second.bytes_sent == generation_bytes(local, chunks_of(local) - one)


def test_a_server_killed_mid_push_keeps_its_last_generation_and_the_push_resumes_with_what_is_missing(
        model, serve, tmp_path, make_cache):
    local = MemoryStore()
    saved(model, local)
    directory = tmp_path / "remote"
    run(sync(local, HTTPStore(serve(str(directory)).url, token=TOKEN)))
    model.append({0: 30})
    saved(model, local)
    new = chunks_of(local) - chunks_of(FileStore(directory))
    assert len(new) > 3
    dying = serve(str(directory))
    with pytest.raises(StoreError, match="no answer"):
        run(sync(local, KillsServerAfter(dying.url, dying, puts=3)))
    kept = FileStore(directory)
    assert run(load_manifest(kept, "chat"))[0].generation == 1
    target = make_cache(limits=LIMITS)
    run(restore(kept, "chat", target))  # the last committed generation restores
    arrived = {k for k in run(kept.list_prefix("chunks/")) if k in new}
    assert len(arrived) == 3
    result = run(sync(local, HTTPStore(serve(str(directory)).url, token=TOKEN)))
    assert result.chunks_sent == len(new) - 3
    assert result.bytes_sent == generation_bytes(local, new - arrived)
    assert run(load_manifest(FileStore(directory), "chat"))[0].generation == 2


def test_an_s3_store_behind_the_server_takes_a_push_and_gives_a_pull(model, serve, s3_server, make_cache):
    pytest.importorskip("obstore")
    local = MemoryStore()
    saved(model, local)
    url = s3_server.new_url()
    remote = HTTPStore(serve(url, s3_server.env).url, token=TOKEN)
    pushed = run(sync(local, remote))
    assert pushed.bytes_sent == generation_bytes(local, chunks_of(local))
    assert chunks_of(s3_server.store(url)) == chunks_of(local)  # in the bucket
    elsewhere = MemoryStore()
    pulled = run(sync(remote, elsewhere))
    assert pulled.bytes_sent == pushed.bytes_sent == remote.bytes_read
    target = make_cache(limits=LIMITS)
    run(restore(elsewhere, "chat", target))
    assert [bytes(g) for g in run(target.export_groups(0))] == model.expected_groups(0)


def test_serve_refuses_a_short_token_before_it_listens(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "kvckpt_web.cli", "serve", "--store", str(tmp_path / "s"), "--token",
                           "short", "--port", "0"], env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "--token: expected a bearer token of at least 16" in proc.stderr
    assert not (tmp_path / "s").exists()


def test_a_forged_manifest_put_over_an_old_one_is_refused_and_the_stored_one_kept(make_model, serve, tmp_path):
    pytest.importorskip("obstore")
    from kvckpt_web.stores.objects import ObjectStore

    directory = tmp_path / "remote"
    real, forged = make_model(limits=LIMITS, seed=21), make_model(limits=LIMITS, seed=22)
    real.add(0, 60)
    forged.add(0, 60)
    saved(real, ObjectStore.from_url(f"file://{directory}"))
    other = MemoryStore()
    saved(forged, other)
    [key] = run(other.list_prefix("manifests/chat/"))
    stored = (directory / key).read_bytes()
    os.utime(directory / key, (1e9, 1e9))  # older than half the grace period: freshened if the bytes match
    remote = HTTPStore(serve(f"file://{directory}").url, token=TOKEN)
    for chunk in chunks_of(other):
        run(remote.set_if_absent(chunk, run(other.get(chunk))))
    assert run(remote.set_if_absent(key, run(other.get(key)))) is False  # 412
    assert (directory / key).read_bytes() == stored
