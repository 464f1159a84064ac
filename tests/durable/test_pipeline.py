"""The concurrency under saves and restores: bounded jobs and the shared hashing threads."""

from __future__ import annotations

import asyncio
import hashlib
import threading

import pytest

from kvckpt_web.durable.pipeline import HASH_THREADS, Hasher, HashState, continued_digest, run_bounded


def hash_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "kvckpt-hash"]


def test_digests_are_the_sha256_of_each_chunk() -> None:
    chunks = [bytes([i]) * (1000 + i) for i in range(40)]

    async def body() -> list[str]:
        hasher = Hasher()
        futures = [hasher.digest(memoryview(c)) for c in chunks]
        digests = [digest for digest, _ in await asyncio.gather(*futures)]
        await hasher.close()
        return digests

    assert asyncio.run(body()) == [hashlib.sha256(c).hexdigest() for c in chunks]


def test_a_digest_continued_from_a_kept_state_is_the_sha256_of_the_whole_chunk() -> None:
    grown = bytes(range(256)) * 64  # 16 KiB: a chunk whose first 8 KiB an earlier save hashed
    _, state = continued_digest(memoryview(grown[:10000]), keep=8192)
    assert state is not None and state.nbytes == 8192
    assert state.state.hexdigest() == hashlib.sha256(grown[:8192]).hexdigest()

    async def on_threads() -> tuple[str, HashState | None]:
        hasher = Hasher()
        result = await hasher.digest(memoryview(grown), state, 12288)
        await hasher.close()
        return result

    for digest, kept in (continued_digest(memoryview(grown), state, 12288), asyncio.run(on_threads())):
        assert digest == hashlib.sha256(grown).hexdigest()
        assert kept is not None and kept.nbytes == 12288
        assert kept.state.hexdigest() == hashlib.sha256(grown[:12288]).hexdigest()
    assert state.state.hexdigest() == hashlib.sha256(grown[:8192]).hexdigest()  # continued from copies only


def test_a_state_is_kept_only_at_or_past_the_bytes_already_hashed() -> None:
    data = memoryview(b"k" * 4096)
    _, start = continued_digest(data, keep=2048)
    digest, kept = continued_digest(data, start, keep=1024)
    assert digest == hashlib.sha256(data).hexdigest() and kept is None


def test_hashing_threads_are_started_once_and_shared_by_every_hasher() -> None:
    async def one_round() -> None:
        hasher = Hasher()
        await hasher.digest(memoryview(b"x" * 4096))
        await hasher.close()

    for _ in range(5):
        asyncio.run(one_round())  # each on a fresh event loop, as separate saves would be
    assert len(hash_threads()) == HASH_THREADS


def test_close_waits_for_queued_chunks_and_skips_cancelled_ones() -> None:
    async def body() -> tuple[bool, str]:
        hasher = Hasher()
        first = hasher.digest(memoryview(b"a" * (1 << 20)))
        skipped = hasher.digest(memoryview(b"b" * (1 << 20)))
        skipped.cancel()
        await hasher.close()  # returns only once no thread reads either buffer
        return skipped.cancelled(), first.result()[0]

    cancelled, digest = asyncio.run(body())
    assert cancelled and digest == hashlib.sha256(b"a" * (1 << 20)).hexdigest()


def test_run_bounded_never_runs_more_than_its_limit_at_once() -> None:
    running, peak = [0], [0]

    async def job() -> None:
        running[0] += 1
        peak[0] = max(peak[0], running[0])
        await asyncio.sleep(0.001)
        running[0] -= 1

    asyncio.run(run_bounded((job for _ in range(30)), 4))
    assert peak[0] == 4


def test_run_bounded_starts_no_more_jobs_after_a_failure_and_reraises_it() -> None:
    started = []

    async def job(i: int) -> None:
        started.append(i)
        if i == 2:
            raise ValueError("job 2")
        await asyncio.sleep(0.001)

    with pytest.raises(ValueError, match="job 2"):
        asyncio.run(run_bounded(((lambda i=i: job(i)) for i in range(100)), 2))
    assert len(started) < 10
