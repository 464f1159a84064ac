"""The generator: tokens streamed as they come, the rules that end a reply, a step that failed, and the
arguments it refuses before the cache or the store changes.

The model is the test double of ``lm_double.py``.
"""

from __future__ import annotations

import inspect

import pytest

from kvckpt_web import Ledger, MemoryStore
from kvckpt_web.errors import CheckpointStateError, FieldError, KVCkptError
from kvckpt_web.generation.app_state import StopRules
from kvckpt_web.generation.autosave import Autosave
from kvckpt_web.generation.generator import Generator
from kvckpt_web.generation.resume import resume
from kvckpt_web.model.caches import new_cache
from kvckpt_web.model.sampler import Sampler, SamplingSettings

from lm_double import DoubleLM
from runs import GREEDY, PROMPT, TEXT, TOP_P, resumed, start, uninterrupted
from support.kvmodel import names_field, run


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
    ("start save_first=int", lambda m, c, s: Generator.start(m, c, PROMPT, GREEDY, save_first=1), "save_first"),
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



# ----- stepped by a scheduler --------------------------------------------------------------------------


def test_generators_whose_runs_a_scheduler_takes_in_turn_give_the_tokens_and_saves_each_gives_alone(make_cache):
    settings = {"a": GREEDY, "b": TOP_P}

    def started(model, cache, name, seq_id, saves):
        return start(model, cache, settings[name], seq_id=seq_id, autosave=Autosave(MemoryStore(), name, every=5),
                     on_save=lambda result: saves.append(result.seq_length))

    alone = {}
    for name in settings:
        model, saves = DoubleLM(), []
        alone[name] = run(started(model, make_cache(model), name, 0, saves).run()), saves
    model = DoubleLM()
    cache = make_cache(model, max_tokens=2 * model.max_context)
    saves = {name: [] for name in settings}
    gens = {name: started(model, cache, name, i, saves[name]) for i, name in enumerate(settings)}

    async def scheduled():
        while not all(g.finished for g in gens.values()):
            for gen in gens.values():
                if tokens := await gen.next_run():
                    await gen.take(tokens, await model.forward(cache, gen.seq_id, tokens))
            for gen in gens.values():
                await gen.save_if_due()

    run(scheduled())
    assert {name: (gen.result(), saves[name]) for name, gen in gens.items()} == alone
