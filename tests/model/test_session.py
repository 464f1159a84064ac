"""Generation sessions: streaming, stop rules, autosave, and resume giving the tokens of an uninterrupted run.

The model is the test double of ``lm_double.py``: its logits come from the K/V it reads back from the
real cache, so a restore that is wrong anywhere changes the tokens. Crashes of real processes chatting
through the engine are in ``tests/engine/test_engine_crash.py``.
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from kvckpt_web.errors import (CheckpointStateError, FieldError, FormatError, KVCkptError, NotFoundError, SequenceError,
                               UnusableCheckpointError)
from kvckpt_web.model.sampler import Sampler, SamplingSettings
from kvckpt_web.generation.app_state import APP_FORMAT, APP_VERSION, StopRules
from kvckpt_web.generation.autosave import Autosave
from kvckpt_web.model.caches import new_cache
from kvckpt_web.generation.generator import Generator
from kvckpt_web.model.sampler import candidate_count
from kvckpt_web.generation.resume import resume
from kvckpt_web import Ledger, MemoryStore, list_generations, save
from kvckpt_web.durable.catalog import load_manifest

from kvmodel import names_field, run
from lm_double import EOS, DoubleLM, DoubleText

TEXT = DoubleText()
PROMPT = TEXT.encode_chat([{"role": "user", "content": "tell me about the sea, please."}])
GREEDY = SamplingSettings()
TOP_P = SamplingSettings(temperature=0.9, top_p=0.85, seed=11)
TOP_K_PENALTY = SamplingSettings(temperature=0.8, top_k=6, repetition_penalty=1.3, seed=5)


def start(model, cache, settings=GREEDY, *, prompt=PROMPT, stop=StopRules(30), prefill_chunk=8, **kwargs):
    return run(Generator.start(model, cache, prompt, settings, stop=stop, prefill_chunk=prefill_chunk,
                               decode=TEXT.decode, **kwargs))


def uninterrupted(make_cache, settings=GREEDY, **kwargs):
    model = DoubleLM()
    gen = start(model, make_cache(model), settings, **kwargs)

    async def whole():
        async with gen:
            return await gen.run()

    return run(whole())


def interrupted(make_cache, store, settings, produced, *, every=5, **kwargs):
    """Generate with autosave and abandon the generator after ``produced`` tokens, as a crash would (which
    releases its name too)."""
    model = DoubleLM()
    gen = start(model, make_cache(model), settings, autosave=Autosave(store, "chat", every), **kwargs)

    async def some() -> None:
        async for event in gen:
            if event.index + 1 == produced:
                break
        await gen.close()

    run(some())
    return gen


def resumed(make_cache, store, *, model=None, **cache_kwargs):
    model = model or DoubleLM()
    return run(resume(store, "chat", model, make_cache(model, **cache_kwargs), decode=TEXT.decode))


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


def test_each_save_records_the_kv_length_of_its_checkpoint_and_the_pending_tokens(make_cache):
    store = MemoryStore()
    model = DoubleLM()
    gen = start(model, make_cache(model), TOP_P, autosave=Autosave(store, "chat", every=3, keep=100))
    run(gen.run())
    infos = run(list_generations(store, "chat"))
    assert len(infos) > 5
    for info in infos:
        state = info.app_state
        tokens = state["prompt_tokens"] + state["generated_tokens"]
        assert state["kv_length"] == info.seq_length < len(tokens)
        if state["generated_tokens"]:
            assert state["kv_length"] == len(tokens) - 1  # only the last picked token is pending
        picks = len(state["generated_tokens"])
        assert state["sampler"]["counter"] == picks  # one draw per sampled token: the state after the last
    assert infos[-1].app_state["finish_reason"] == "length"
    assert infos[-1].app_state["generated_tokens"] == list(gen.generated_tokens)


def test_app_state_carries_format_version_model_sampler_and_stop_rules(make_cache):
    store = MemoryStore()
    model = DoubleLM()
    stop = StopRules(12, (EOS,), ("zz",))
    gen = start(model, make_cache(model), TOP_P, stop=stop, autosave=Autosave(store, "chat", every=4))
    run(gen.run())
    manifest, _ = run(load_manifest(store, "chat"))
    state = manifest.app_state
    assert (state["format"], state["version"], state["model"]) == (APP_FORMAT, APP_VERSION, model.identity)
    assert state["prompt_tokens"] == PROMPT and state["prefill_chunk"] == 8
    assert state["sampler"]["settings"] == dataclasses.asdict(TOP_P)
    assert state["stop"] == {"max_tokens": 12, "eos_ids": [EOS], "stop_strings": ["zz"]}


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

    async def forward(self, cache, seq_id, tokens):
        logits = await super().forward(cache, seq_id, tokens)
        self.pending += 1
        model = self

        class Read:
            async def argmax(self):
                model.pending = 0
                return await logits.argmax()

            async def top_k(self, k):
                model.pending = 0
                return await logits.top_k(k)

        return Read()


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


def test_after_a_failed_forward_the_generator_refuses_to_go_on_and_its_last_checkpoint_resumes(make_cache):
    want = uninterrupted(make_cache, TOP_P)
    store = MemoryStore()
    model = DoubleLM()
    gen = start(model, make_cache(model), TOP_P, autosave=Autosave(store, "chat", every=4))
    for _ in range(10):
        run(gen.step())
    real = model.forward

    async def failing(cache, seq_id, tokens):
        await real(cache, seq_id, tokens)
        raise RuntimeError("device lost")

    model.forward = failing
    with pytest.raises(RuntimeError):
        run(gen.step())
    model.forward = real
    with pytest.raises(CheckpointStateError):
        run(gen.step())
    with pytest.raises(CheckpointStateError):
        run(gen.save())
    assert run(resumed(make_cache, store).run()).generated_tokens == want.generated_tokens


# ----- streaming and stopping ------------------------------------------------------------------------


def test_streamed_events_are_the_generated_tokens_and_their_text(make_cache):
    seen = []
    model = DoubleLM()
    gen = start(model, make_cache(model), TOP_P, on_token=seen.append)

    async def collect():
        return [event async for event in gen]

    events = run(collect())
    assert events == seen
    assert [e.token for e in events] == gen.generated_tokens
    assert [e.index for e in events] == list(range(len(events)))
    assert "".join(e.text for e in events) == gen.text == TEXT.decode(gen.generated_tokens)


def test_the_token_limit_ends_the_generation(make_cache):
    result = uninterrupted(make_cache, TOP_P, stop=StopRules(7))
    assert len(result.generated_tokens) == 7 and result.finish_reason == "length"


def test_an_eos_id_ends_the_generation_and_stays_out_of_the_text(make_cache):
    free = uninterrupted(make_cache, TOP_P).generated_tokens
    eos = free[5]  # as if that token were the end of sequence
    result = uninterrupted(make_cache, TOP_P, stop=StopRules(30, (eos,)))
    first = free.index(eos)
    assert result.generated_tokens == free[:first + 1] and result.finish_reason == "eos"
    assert result.text == TEXT.decode(free[:first])


def test_a_stop_string_ends_the_generation_and_cuts_the_text_before_it(make_cache):
    free = uninterrupted(make_cache, TOP_P, stop=StopRules(40))
    stop = free.text[12:15]
    at = free.text.index(stop)
    events = []
    result = uninterrupted(make_cache, TOP_P, stop=StopRules(40, (), (stop,)), on_token=events.append)
    assert result.finish_reason == "stop" and result.text == free.text[:at]
    assert "".join(e.text for e in events) == result.text  # the stop string's first characters were held back
    assert len(result.generated_tokens) == len(TEXT.decode(free.generated_tokens[:at + len(stop)]))


def test_a_full_context_ends_the_generation(make_cache):
    model = DoubleLM(max_context=len(PROMPT) + 5)
    result = run(start(model, make_cache(model), TOP_P, stop=StopRules(30)).run())
    assert result.finish_reason == "context" and len(result.generated_tokens) == 6


# ----- bad input ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("prompt, field", [([], "prompt"), (list(range(2, 34)) * 4, "prompt"),
                                           ([2, 3, 10_000], "prompt[2]"), ([2, -1], "prompt[1]"),
                                           ("text, not ids", "prompt")],
                         ids=["empty", "longer-than-context", "id-outside-vocabulary", "negative-id", "a-string"])
def test_a_bad_prompt_is_refused_before_the_cache_is_touched(make_cache, prompt, field):
    model = DoubleLM()
    cache = make_cache(model)
    with pytest.raises(FieldError) as info:
        start(model, cache, prompt=prompt)
    assert info.value.field == field
    assert cache.sequence_ids() == []


@pytest.mark.parametrize("settings, field", [
    (dict(temperature=-1.0), "temperature"), (dict(top_p=0.0), "top_p"), (dict(top_k=-2), "top_k"),
    (dict(repetition_penalty=0), "repetition_penalty"), (dict(seed=-1), "seed")])
def test_bad_sampler_settings_are_a_field_error(settings, field):
    with pytest.raises(FieldError) as info:
        SamplingSettings(**settings)
    assert info.value.field == field


@pytest.mark.parametrize("kwargs, field", [(dict(prefill_chunk=0), "prefill_chunk"),
                                           (dict(prefill_chunk=9), "prefill_chunk"),
                                           (dict(stop=StopRules(5, (), ("x",)), decode=None), "stop_strings")])
def test_bad_generation_options_are_refused_before_the_cache_is_touched(make_cache, kwargs, field):
    model = DoubleLM()
    cache = make_cache(model, prefill_chunk=8)
    decode = kwargs.pop("decode", TEXT.decode)
    with pytest.raises(FieldError) as info:
        run(Generator.start(model, cache, PROMPT, GREEDY, decode=decode, **{"prefill_chunk": 8, **kwargs}))
    assert info.value.field == field
    assert cache.sequence_ids() == []


@pytest.mark.parametrize("kwargs, field", [(dict(max_tokens=0), "max_tokens"), (dict(eos_ids=(-1,)), "eos_ids[0]"),
                                           (dict(stop_strings=("",)), "stop_strings[0]"),
                                           (dict(stop_strings="ab"), "stop_strings")])
def test_bad_stop_rules_are_a_field_error(kwargs, field):
    with pytest.raises(FieldError) as info:
        StopRules(**{"max_tokens": 5, **kwargs})
    assert info.value.field == field


@pytest.mark.parametrize("stop, field", [(dict(max_tokens=5, eos_ids=2), "app_state.stop.eos_ids"),
                                         (dict(max_tokens=5, stop_strings=None), "app_state.stop.stop_strings"),
                                         (dict(max_tokens="5"), "app_state.stop.max_tokens")],
                         ids=["eos_ids=int", "stop_strings=null", "max_tokens=str"])
def test_stop_rules_of_the_wrong_type_in_a_saved_app_state_are_a_format_error(stop, field):
    with pytest.raises(FormatError) as info:
        StopRules.from_json(stop, "app_state.stop")
    assert info.value.field == field


@pytest.mark.parametrize("kwargs", [dict(name="no/slash"), dict(every=0), dict(keep=0)])
def test_bad_autosave_options_are_a_kvckpt_error(kwargs):
    with pytest.raises(KVCkptError):
        Autosave(MemoryStore(), **{"name": "chat", **kwargs})


#: (id, the call given (model, cache, store holding a generation "chat"), the field its error names)
WRONG_ARGUMENTS = [
    ("start model=None", lambda m, c, s: Generator.start(None, c, PROMPT, GREEDY), "model"),
    ("start cache=None", lambda m, c, s: Generator.start(m, None, PROMPT, GREEDY), "cache"),
    ("start prompt=set", lambda m, c, s: Generator.start(m, c, set(PROMPT), GREEDY), "prompt"),
    ("start prompt=[float]", lambda m, c, s: Generator.start(m, c, [2, 3.0], GREEDY), "prompt[1]"),
    ("start sampler=dict", lambda m, c, s: Generator.start(m, c, PROMPT, {"temperature": 0}), "sampler"),
    ("start stop=int", lambda m, c, s: Generator.start(m, c, PROMPT, GREEDY, stop=30), "stop"),
    ("start seq_id=str", lambda m, c, s: Generator.start(m, c, PROMPT, GREEDY, seq_id="0"), "seq_id"),
    ("start autosave=store", lambda m, c, s: Generator.start(m, c, PROMPT, GREEDY, autosave=s), "autosave"),
    ("start decode=str", lambda m, c, s: Generator.start(m, c, PROMPT, GREEDY, decode="utf-8"), "decode"),
    ("start on_token=list", lambda m, c, s: Generator.start(m, c, PROMPT, GREEDY, on_token=[]), "on_token"),
    ("start on_save=int", lambda m, c, s: Generator.start(m, c, PROMPT, GREEDY, on_save=1), "on_save"),
    ("start progress=int", lambda m, c, s: Generator.start(m, c, PROMPT, GREEDY, progress=1), "progress"),
    ("start owner=dict", lambda m, c, s: Generator.start(m, c, PROMPT, GREEDY, owner={}), "owner"),
    ("resume store=None", lambda m, c, s: resume(None, "chat", m, c), "store"),
    ("resume name=None", lambda m, c, s: resume(s, None, m, c), "name"),
    ("resume model=None", lambda m, c, s: resume(s, "chat", None, c), "model"),
    ("resume cache=None", lambda m, c, s: resume(s, "chat", m, None), "cache"),
    ("resume seq_id=str", lambda m, c, s: resume(s, "chat", m, c, seq_id="0"), "seq_id"),
    ("resume generation=str", lambda m, c, s: resume(s, "chat", m, c, generation="1"), "generation"),
    ("resume autosave=int", lambda m, c, s: resume(s, "chat", m, c, autosave=1), "autosave"),
    ("resume max_tokens=0", lambda m, c, s: resume(s, "chat", m, c, max_tokens=0), "max_tokens"),
    ("resume on_save=int", lambda m, c, s: resume(s, "chat", m, c, on_save=1), "on_save"),
    ("resume replay=str", lambda m, c, s: resume(s, "chat", m, c, replay="no"), "replay"),
    ("resume ledger of another store", lambda m, c, s: resume(s, "chat", m, c, ledger=Ledger(MemoryStore())),
     "ledger"),
    ("StopRules max_tokens=float", lambda m, c, s: StopRules(5.0), "max_tokens"),
    ("StopRules eos_ids=int", lambda m, c, s: StopRules(5, 2), "eos_ids"),
    ("StopRules stop_strings=int", lambda m, c, s: StopRules(5, (), 1), "stop_strings"),
    ("StopRules stop_strings=[int]", lambda m, c, s: StopRules(5, (), ("x", 1)), "stop_strings[1]"),
    ("Autosave store=None", lambda m, c, s: Autosave(None, "chat"), "autosave.store"),
    ("Autosave every=float", lambda m, c, s: Autosave(s, "chat", 1.5), "autosave.every"),
    ("Autosave ledger=str", lambda m, c, s: Autosave(s, "chat", ledger="mine"), "autosave.ledger"),
    ("Autosave ledger of another store", lambda m, c, s: Autosave(s, "chat", ledger=Ledger(MemoryStore())),
     "autosave.ledger"),
    ("Sampler settings=dict", lambda m, c, s: Sampler({"temperature": 0}), "settings"),
    ("new_cache model=None", lambda m, c, s: new_cache(None, c.device), "model"),
    ("new_cache max_tokens=str", lambda m, c, s: new_cache(m, c.device, max_tokens="64"), "max_tokens"),
    ("new_cache num_seqs=str", lambda m, c, s: new_cache(m, c.device, num_seqs="2"), "num_seqs"),
    ("new_cache page_size=0", lambda m, c, s: new_cache(m, c.device, page_size=0), "page_size"),
    ("Sampler.pick candidates=int", lambda m, c, s: Sampler().pick(5), "candidates"),
    ("Sampler.pick previous=int",
     lambda m, c, s: Sampler(SamplingSettings(repetition_penalty=1.2)).pick([(1, 0.5)], 3), "previous"),
]


@pytest.mark.parametrize("call, field", [row[1:] for row in WRONG_ARGUMENTS], ids=[row[0] for row in WRONG_ARGUMENTS])
def test_a_wrong_argument_is_refused_naming_it_before_the_cache_or_store_changes(make_cache, call, field):
    model = DoubleLM()
    store = MemoryStore()
    run(start(model, make_cache(model), autosave=Autosave(store, "chat", 5), stop=StopRules(3)).run())
    cache = make_cache(model)
    cache.add_sequence(5)
    stored = {key: run(store.get(key)) for key in run(store.list_prefix(""))}
    with pytest.raises(KVCkptError) as info:
        result = call(model, cache, store)
        if inspect.isawaitable(result):
            run(result)
    assert names_field(info.value, field), f"{type(info.value).__name__}: {info.value}"
    assert cache.sequence_ids() == [5] and cache.get_sequence_length(5) == 0
    assert {key: run(store.get(key)) for key in run(store.list_prefix(""))} == stored


# ----- how many candidates the sampler needs ------------------------------------------------------------


@pytest.mark.parametrize("settings, previous, want", [
    (SamplingSettings(), [5, 5, 6], 0),
    (SamplingSettings(repetition_penalty=1.5), [5, 5, 6], 3),
    (SamplingSettings(temperature=1.0, top_k=4), [5, 6], 4),
    (SamplingSettings(temperature=1.0, top_k=4, repetition_penalty=1.2), [5, 6, 6, 7], 7),
    (SamplingSettings(temperature=1.0, top_p=0.5), [5], 35),
    (SamplingSettings(temperature=1.0, top_k=4, repetition_penalty=0.8), [5], 35),
])
def test_candidate_count_covers_every_token_the_sampler_could_pick(settings, previous, want):
    assert candidate_count(settings, previous, 35) == want


def test_candidate_count_picks_as_from_the_whole_vocabulary_under_a_penalty(make_cache):
    """Sampling from the shortlist gives what sampling from every logit gives, token for token."""
    import numpy as np

    from kvckpt_web.model.sampler import Sampler

    rng = np.random.default_rng(1)
    settings = SamplingSettings(temperature=0.7, top_k=3, repetition_penalty=1.8, seed=2)
    short, full = Sampler(settings), Sampler(settings)
    for _ in range(200):
        logits = rng.standard_normal(35)
        previous = list(rng.integers(0, 35, 6))
        ranked = sorted(((i, float(x)) for i, x in enumerate(logits)), key=lambda c: (-c[1], c[0]))
        k = candidate_count(settings, previous, 35)
        assert short.pick(ranked[:k], previous) == full.pick(ranked, previous)
