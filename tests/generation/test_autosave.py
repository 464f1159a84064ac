"""Autosave of a generation: a failed save does not end it, and a resumed run keeps the checkpoint's settings.

A store here fails chosen calls (a manifest write with ENOSPC, a lock not had in time), so every failure is
where the test puts it; the model is the test double of ``lm_double.py``.
"""

from __future__ import annotations

import errno
from typing import Any

import pytest

from kvckpt_web.durable.catalog import list_generations
from kvckpt_web.durable.restore import restore
from kvckpt_web.durable.retention import gc
from kvckpt_web.durable.verify import verify
from kvckpt_web.errors import KVCkptError, StoreError
from kvckpt_web.generation.app_state import StopRules
from kvckpt_web.generation.autosave import Autosave
from kvckpt_web.generation.resume import resume
from kvckpt_web.stores.memory import MemoryStore

from lm_double import DoubleLM
from runs import PROMPT, TEXT, TOP_P, interrupted, start, uninterrupted
from support.kvmodel import run


class FailingStore(MemoryStore):
    """A MemoryStore whose manifest writes (commits) numbered in ``commits`` fail with ENOSPC, and whose lock
    requests numbered in ``locks`` fail as a lock not had in time (both counted from 1)."""

    def __init__(self, *, commits: set[int] = frozenset(), locks: set[int] = frozenset()) -> None:
        super().__init__()
        self.failing_commits, self.failing_locks = set(commits), set(locks)
        self.commits = self.locks = 0

    async def _set(self, key: str, data: memoryview) -> None:
        if key.startswith("manifests/"):
            self.commits += 1
            if self.commits in self.failing_commits:
                raise OSError(errno.ENOSPC, "No space left on device")
        await super()._set(key, data)

    def lock(self, timeout: float | None = None) -> Any:
        self.locks += 1
        if self.locks in self.failing_locks:
            raise StoreError("lock memory: not acquired within 10.0 s (held by another writer)")
        return super().lock(timeout)


def generate(make_cache, store, every=5, stop=StopRules(30)):
    """Generate the whole reply with autosave into ``store``; the generator, and each autosave it tried: the
    length it saved and its error (None: committed)."""
    model = DoubleLM()
    tries: list[tuple[int, Exception | None]] = []
    gen = start(model, make_cache(model), TOP_P, stop=stop, autosave=Autosave(store, "chat", every),
                on_save=lambda result: tries.append((result.seq_length, None)))
    gen.on_save_error = lambda exc: tries.append((gen.kv_length, exc))
    run(gen.run())
    return gen, tries


def kv_lengths(store: MemoryStore) -> list[int]:
    return [info.seq_length for info in run(list_generations(store, "chat"))]


# ----- a failed autosave --------------------------------------------------------------------------------------


@pytest.mark.parametrize("failing", [dict(commits={2}), dict(locks={2})], ids=["disk-full", "lock-timeout"])
def test_a_failed_autosave_is_reported_and_the_generation_goes_on_to_the_uninterrupted_tokens(make_cache, failing):
    want = uninterrupted(make_cache, TOP_P)
    gen, tries = generate(make_cache, FailingStore(**failing))
    assert gen.result().generated_tokens == want.generated_tokens
    failures = [exc for _, exc in tries if exc is not None]
    assert len(failures) == 1 and isinstance(failures[0], (OSError, StoreError))
    assert gen.save_error is None and gen.last_save.seq_length == tries[-1][0]


def test_the_next_interval_retries_a_failed_autosave(make_cache):
    before = -(-len(PROMPT) // 8) + 1  # saves of all prefill chunks but the last, of the first token, one interval
    gen, tries = generate(make_cache, FailingStore(commits={before + 1}))  # the second interval's save fails
    failed = [i for i, (_, exc) in enumerate(tries) if exc is not None]
    assert failed == [before]
    (at, _), (next_try, error) = tries[failed[0]], tries[failed[0] + 1]
    assert next_try == at + 5 and error is None


def test_a_failed_final_save_is_kept_and_the_last_committed_generation_resumes_to_the_same_tokens(make_cache):
    want = uninterrupted(make_cache, TOP_P)
    store = FailingStore(commits=set(range(3, 100)))
    gen, tries = generate(make_cache, store)
    assert gen.finished and isinstance(gen.save_error, OSError) and tries[-1][1] is gen.save_error
    assert gen.committed_generation == gen.last_save.generation == 2
    store.failing_commits.clear()
    model = DoubleLM()
    again = run(resume(store, "chat", model, make_cache(model), decode=TEXT.decode))
    assert again.resume_report.kv_restored and again.resume_report.generation == 2
    assert run(again.run()).generated_tokens == want.generated_tokens


def test_gc_removes_the_chunks_a_failed_autosave_left(make_cache):
    store = FailingStore(commits=set(range(3, 100)))
    gen, _ = generate(make_cache, store)
    referenced = {key for info in run(list_generations(store)) for key in info.chunk_keys}
    orphans = set(run(store.list_prefix("chunks/"))) - referenced
    assert orphans
    result = run(gc(store))
    assert result.deleted_chunks == len(orphans) and set(run(store.list_prefix("chunks/"))) == referenced
    assert run(verify(store)).ok
    model = DoubleLM()
    assert run(restore(store, "chat", make_cache(model))).seq_length == gen.last_save.seq_length


# ----- a resumed run keeps the checkpoint's settings ----------------------------------------------------------


def test_a_resumed_generation_autosaves_at_the_interval_and_keep_of_its_checkpoint(make_cache):
    store = MemoryStore()
    model = DoubleLM()
    first = start(model, make_cache(model), TOP_P, autosave=Autosave(store, "chat", every=3, keep=5))
    for _ in range(6):
        run(first.step())
    run(first.close())  # as a crashed process lets go of its name
    model = DoubleLM()
    gen = run(resume(store, "chat", model, make_cache(model), autosave=Autosave(store, "chat"), decode=TEXT.decode))
    assert (gen.autosave.every, gen.autosave.keep) == (3, 5)
    run(gen.run())
    lengths = kv_lengths(store)
    assert len(lengths) == 5 and all(b - a == 3 for a, b in zip(lengths[:-2], lengths[1:-1]))


def test_an_autosave_setting_given_to_resume_replaces_the_checkpoints(make_cache):
    store = MemoryStore()
    interrupted(make_cache, store, TOP_P, produced=4, every=3)
    model = DoubleLM()
    gen = run(resume(store, "chat", model, make_cache(model), autosave=Autosave(store, "chat", every=7, keep=3)))
    assert (gen.autosave.every, gen.autosave.keep) == (7, 3)
    assert gen.app_state()["autosave_every"] == 7


def test_app_state_records_the_context_and_the_autosave_settings(make_cache):
    store = MemoryStore()
    model = DoubleLM()
    gen = start(model, make_cache(model, max_tokens=60), TOP_P, autosave=Autosave(store, "chat", every=4))
    run(gen.step())
    state = gen.app_state()
    assert (state["context"], state["autosave_every"], state["autosave_keep"]) == (60, 4, 2)


def test_a_resumed_generation_ends_at_its_checkpoints_context_in_a_larger_cache(make_cache):
    context = len(PROMPT) + 12
    model = DoubleLM()
    want = run(start(model, make_cache(model, max_tokens=context), TOP_P).run())
    assert want.finish_reason == "context"
    store = MemoryStore()
    model = DoubleLM()
    first = start(model, make_cache(model, max_tokens=context), TOP_P, autosave=Autosave(store, "chat", every=2))
    for _ in range(-(-len(PROMPT) // 8) + 5):
        run(first.step())  # 5 tokens generated of 12, as if it crashed then
    model = DoubleLM()
    gen = run(resume(store, "chat", model, make_cache(model), decode=TEXT.decode))  # the model's whole context
    got = run(gen.run())
    assert got.finish_reason == "context" and got.generated_tokens == want.generated_tokens


def test_a_context_given_to_resume_lets_a_generation_that_filled_its_context_go_on(make_cache):
    want = uninterrupted(make_cache, TOP_P, stop=StopRules(30))
    store = MemoryStore()
    model = DoubleLM()
    cache = make_cache(model, max_tokens=len(PROMPT) + 8)
    assert run(start(model, cache, TOP_P, autosave=Autosave(store, "chat", every=50)).run()).finish_reason == "context"
    model = DoubleLM()
    gen = run(resume(store, "chat", model, make_cache(model), context=model.max_context, decode=TEXT.decode))
    assert run(gen.run()).generated_tokens == want.generated_tokens


@pytest.mark.parametrize("kwargs", [dict(name="no/slash"), dict(every=0), dict(keep=0)])
def test_bad_autosave_options_are_a_kvckpt_error(kwargs):
    with pytest.raises(KVCkptError):
        Autosave(MemoryStore(), **{"name": "chat", **kwargs})
