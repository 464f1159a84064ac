"""Resume: a generation cut anywhere continues with the tokens of an uninterrupted run, from its K/V where
they can be used, else by running its saved tokens again in the forward calls of the original run.

The model is the test double of ``lm_double.py`` (a restore wrong anywhere changes the tokens). Crashes of real
processes chatting through the engine are in ``tests/engine/test_engine_crash.py``.
"""

from __future__ import annotations

import pytest

from kvckpt_web import MemoryStore, save
from kvckpt_web.durable.catalog import load_manifest
from kvckpt_web.errors import FormatError, NotFoundError, SequenceError, UnusableCheckpointError
from kvckpt_web.generation.app_state import StopRules
from kvckpt_web.generation.autosave import Autosave
from kvckpt_web.generation.resume import resume

from lm_double import DoubleLM
from runs import GREEDY, PROMPT, TEXT, TOP_K_PENALTY, TOP_P, interrupted, resumed, start, uninterrupted
from support.kvmodel import run


# ----- resume identity ------------------------------------------------------------------------------


@pytest.mark.parametrize("settings", [GREEDY, TOP_P, TOP_K_PENALTY], ids=["greedy", "top-p", "top-k+penalty"])
def test_a_resumed_generation_gives_the_tokens_of_an_uninterrupted_run(make_cache, settings):
    want = uninterrupted(make_cache, settings)
    store = MemoryStore()
    interrupted(make_cache, store, settings, produced=13)
    gen = resumed(make_cache, store)
    assert gen.resume_report.kv_restored and gen.resume_report.reason is None
    assert 0 < len(gen.generated_tokens) <= 13
    got = run(gen.run())
    assert got.generated_tokens == want.generated_tokens
    assert got.text == want.text


def test_the_test_sampler_settings_draw_different_tokens_than_greedy(make_cache):
    greedy = uninterrupted(make_cache, GREEDY).generated_tokens
    assert uninterrupted(make_cache, TOP_P).generated_tokens != greedy
    assert uninterrupted(make_cache, TOP_K_PENALTY).generated_tokens != greedy


def test_a_generation_saved_during_prefill_resumes_to_the_uninterrupted_tokens(make_cache):
    want = uninterrupted(make_cache, TOP_P)
    store = MemoryStore()
    model = DoubleLM()
    gen = start(model, make_cache(model), TOP_P, autosave=Autosave(store, "chat", every=8))
    run(gen.step())
    run(gen.step())  # two prefill chunks of 8: one save after the second
    assert gen.last_save is not None and gen.last_save.seq_length == 16 and not gen.generated_tokens
    again = resumed(make_cache, store)
    assert again.kv_length == 16 and again.resume_report.kv_restored
    assert run(again.run()).generated_tokens == want.generated_tokens


def test_the_double_continues_differently_from_k_v_that_differ_in_one_early_token(make_cache):
    """Guards the tests above: a resume that restored wrong K/V would show in the tokens."""
    store = MemoryStore()
    interrupted(make_cache, store, GREEDY, produced=6)
    want = run(resumed(make_cache, store).run()).generated_tokens
    manifest, _ = run(load_manifest(store, "chat"))
    state = manifest.app_state
    tokens = state["prompt_tokens"] + state["generated_tokens"]
    tokens[3] += 1  # the checkpoint's K/V of token 3 will be another token's; its app_state stays as it was
    model = DoubleLM()
    wrong = make_cache(model)
    wrong.add_sequence(0)
    for i in range(0, state["kv_length"], 8):
        run(model.forward(wrong, 0, tokens[i:min(i + 8, state["kv_length"])]))
    run(save(wrong, 0, store, "wrong", app_state=state))
    got = run(resume(store, "wrong", model, make_cache(model), decode=TEXT.decode))
    assert got.resume_report.kv_restored
    assert run(got.run()).generated_tokens != want


# ----- resume falls back to running the saved tokens again ------------------------------------------------


def _damage_a_chunk(store, how):
    manifest, _ = run(load_manifest(store, "chat"))
    key = manifest.chunks[1][0].key
    if how == "missing":
        run(store.delete(key))
    else:
        data = bytearray(run(store.get(key)))
        data[0] ^= 0xFF
        run(store.set(key, bytes(data)))


@pytest.mark.parametrize("how", ["corrupt", "missing"])
def test_a_damaged_chunk_makes_resume_rerun_the_saved_tokens_with_the_same_continuation(make_cache, how):
    want = uninterrupted(make_cache, TOP_P)
    store = MemoryStore()
    interrupted(make_cache, store, TOP_P, produced=11)
    _damage_a_chunk(store, how)
    gen = resumed(make_cache, store)
    report = gen.resume_report
    assert not report.kv_restored and report.reason == "corrupt"
    assert ("missing" in report.message) == (how == "missing")
    assert report.kv_length == gen.kv_length == len(gen.tokens) - 1
    assert run(gen.run()).generated_tokens == want.generated_tokens


def test_a_checkpoint_of_another_layout_is_rerun_with_the_same_continuation(make_cache):
    want = uninterrupted(make_cache, TOP_P)
    store = MemoryStore()
    interrupted(make_cache, store, TOP_P, produced=9)
    gen = resumed(make_cache, store, page_size=8)
    assert not gen.resume_report.kv_restored and gen.resume_report.reason == "layout"
    assert "layout_hash" in gen.resume_report.message
    assert run(gen.run()).generated_tokens == want.generated_tokens


def test_a_checkpoint_of_another_model_identity_is_rerun_with_the_same_continuation(make_cache):
    want = uninterrupted(make_cache, TOP_P)
    store = MemoryStore()
    interrupted(make_cache, store, TOP_P, produced=9)
    gen = resumed(make_cache, store, model=DoubleLM(name="renamed"))  # same weights, another identity
    assert not gen.resume_report.kv_restored and gen.resume_report.reason == "model"
    assert "lm-double:double:0" in gen.resume_report.message
    assert run(gen.run()).generated_tokens == want.generated_tokens


@pytest.mark.parametrize("how", ["corrupt", "model"])
def test_resume_without_replay_raises_the_reason_and_leaves_the_cache_and_checkpoint(make_cache, how):
    store = MemoryStore()
    interrupted(make_cache, store, TOP_P, produced=9)
    if how == "corrupt":
        _damage_a_chunk(store, "corrupt")
    before = {key: run(store.get(key)) for key in run(store.list_prefix(""))}
    model = DoubleLM(name="renamed") if how == "model" else DoubleLM()
    cache = make_cache(model)
    with pytest.raises(UnusableCheckpointError) as err:
        run(resume(store, "chat", model, cache, decode=TEXT.decode, replay=False))
    assert err.value.reason == how
    assert cache.sequence_ids() == [] and cache.get_num_available_pages() == cache.num_total_pages
    assert {key: run(store.get(key)) for key in run(store.list_prefix(""))} == before


class LazyLM(DoubleLM):
    """The double as a GPU runs it: a forward's work is pending until its logits are read."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.pending = 0

    async def forward_batch(self, cache, runs):
        logits = await super().forward_batch(cache, runs)
        self.pending += 1
        model = self

        class Read:
            def __init__(self, of):
                self.of = of

            async def argmax(self):
                model.pending = 0
                return await self.of.argmax()

            async def top_k(self, k):
                model.pending = 0
                return await self.of.top_k(k)

            async def pick(self, sampler, previous, generated):
                model.pending = 0
                return await self.of.pick(sampler, previous, generated)

        return [Read(of) for of in logits]


def test_a_replay_has_run_on_the_device_when_resume_returns_so_its_time_is_its_own(make_cache):
    store = MemoryStore()
    interrupted(make_cache, store, TOP_P, produced=9)
    model = LazyLM(name="renamed")
    gen = run(resume(store, "chat", model, make_cache(model), decode=TEXT.decode))
    assert gen.resume_report.reason == "model" and model.forwards
    assert model.pending == 0


def test_rerunning_the_saved_tokens_repeats_the_forward_calls_of_the_original_run(make_cache):
    store = MemoryStore()
    model = DoubleLM()
    gen = start(model, make_cache(model), GREEDY, autosave=Autosave(store, "chat", every=1))
    run(gen.run())  # its last save is at the end: every forward it made, its last token pending
    again = DoubleLM(name="renamed")
    run(resume(store, "chat", again, make_cache(again), decode=TEXT.decode))
    assert again.forwards == model.forwards
    assert again.forwards[:5] == [8, 8, 8, 8, 8]


def test_resume_without_a_checkpoint_raises_not_found(make_cache):
    with pytest.raises(NotFoundError):
        resumed(make_cache, MemoryStore())


def test_resume_of_a_checkpoint_not_written_by_a_generation_names_app_state_format(make_cache):
    store = MemoryStore()
    model = DoubleLM()
    cache = make_cache(model)
    cache.add_sequence(0)
    run(model.forward(cache, 0, PROMPT[:8]))
    run(save(cache, 0, store, "chat", app_state={"note": "not a generation"}))
    with pytest.raises(FormatError, match="app_state.format"):
        resumed(make_cache, store)


def test_resume_into_a_taken_sequence_id_raises_and_leaves_it(make_cache):
    store = MemoryStore()
    interrupted(make_cache, store, GREEDY, produced=3)
    model = DoubleLM()
    cache = make_cache(model)
    cache.add_sequence(0)
    with pytest.raises(SequenceError):
        run(resume(store, "chat", model, cache))
    assert cache.get_sequence_length(0) == 0


def test_a_finished_generation_resumes_finished_with_its_text(make_cache):
    store = MemoryStore()
    model = DoubleLM()
    done = run(start(model, make_cache(model), TOP_P, autosave=Autosave(store, "chat", every=50)).run())
    gen = resumed(make_cache, store)
    assert gen.finished and gen.finish_reason == "length"
    assert run(gen.run()) == done


def test_resume_with_a_higher_max_tokens_continues_as_a_longer_run(make_cache):
    want = uninterrupted(make_cache, TOP_P, stop=StopRules(30))
    store = MemoryStore()
    model = DoubleLM()
    run(start(model, make_cache(model), TOP_P, stop=StopRules(12), autosave=Autosave(store, "chat", every=50)).run())
    model = DoubleLM()
    gen = run(resume(store, "chat", model, make_cache(model), max_tokens=30, decode=TEXT.decode))
    assert run(gen.run()).generated_tokens == want.generated_tokens

