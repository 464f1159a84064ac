"""A checkpoint name belongs to one conversation and one writer at a time.

Every save of a reply records the conversation it belongs to; a generator holds its autosave name's claim
until it is closed, so a second writer of the name is refused while it runs, and a new reply is refused on a
name that holds another conversation: no reply's retention drops another reply's generations.
"""

from __future__ import annotations

import re

import pytest

from kvckpt_web import MemoryStore, list_generations, save
from kvckpt_web.durable.catalog import load_manifest
from kvckpt_web.errors import CheckpointStateError, ConflictError, FormatError
from kvckpt_web.generation.app_state import StopRules
from kvckpt_web.generation.autosave import Autosave
from kvckpt_web.generation.conversation import Conversation, conversation_of
from kvckpt_web.generation.generator import Generator
from kvckpt_web.generation.resume import resume
from kvckpt_web.model.sampler import SamplingSettings
from kvckpt_web.stores.file import FileStore
from kvckpt_web.stores.http import HTTPStore
from kvckpt_web.stores.leases import DEFAULT_LEASE_SECONDS

from lm_double import DoubleLM, DoubleText
from support.counting_store import CountingStore, count
from support.kvmodel import run
from support.store_suite import LEASE_RUN_OUT, Clock

TEXT = DoubleText()
PROMPT = TEXT.encode_chat([{"role": "user", "content": "tell me about the sea, please."}])
OTHER_PROMPT = TEXT.encode_chat([{"role": "user", "content": "and now about ships."}])
SETTINGS = SamplingSettings(temperature=0.9, top_p=0.85, seed=11)


def start(make_cache, store, *, prompt=PROMPT, name="chat", every=4, keep=2, **kwargs):
    model = DoubleLM()
    return run(Generator.start(model, make_cache(model), prompt, SETTINGS, stop=StopRules(20), prefill_chunk=8,
                               autosave=Autosave(store, name, every, keep), decode=TEXT.decode, **kwargs))


def finished(gen):
    """Run ``gen`` to its end and close it; its result."""
    async def body():
        async with gen:
            return await gen.run()

    return run(body())


def saved_directly(make_cache, store, name, app_state):
    """A checkpoint of the prompt's first ``app_state["kv_length"]`` tokens (default 8) saved as ``name`` through
    the library with ``app_state``, as another writer (or an older version) may have left it."""
    model = DoubleLM()
    cache = make_cache(model)
    cache.add_sequence(0)
    run(model.forward(cache, 0, PROMPT[:app_state.get("kv_length", 8)]))
    run(save(cache, 0, store, name, app_state=app_state))


def first_save(make_cache, store):
    """The app_state of a reply's first autosave (after its first prefill chunk) as 'chat' in ``store``."""
    gen = start(make_cache, store)
    run(gen.step())
    run(gen.close())
    manifest, _ = run(load_manifest(store, "chat"))
    return manifest.app_state


def snapshot(store):
    return {key: run(store.get(key)) for key in run(store.list_prefix(""))}


def conversations(store, name="chat"):
    return [info.app_state.get("conversation") for info in run(list_generations(store, name))]


# ----- the conversation a reply records -------------------------------------------------------------------


def test_every_save_of_a_reply_records_the_one_conversation_made_when_it_started(make_cache):
    store = MemoryStore()
    gen = start(make_cache, store, keep=100)
    finished(gen)
    recorded = conversations(store)
    assert len(recorded) > 3 and all(c == recorded[0] for c in recorded)
    assert re.fullmatch(r"[0-9a-f]{32}", recorded[0]["id"]) and recorded[0]["created_ms"] > 1_600_000_000_000
    assert recorded[0] == gen.conversation.to_json()


def test_two_replies_are_two_conversations(make_cache):
    first, second = MemoryStore(), MemoryStore()
    finished(start(make_cache, first))
    finished(start(make_cache, second))
    assert conversations(first)[0]["id"] != conversations(second)[0]["id"]


def test_a_resumed_reply_saves_under_the_conversation_it_resumed(make_cache):
    store = MemoryStore()
    gen = start(make_cache, store)
    run(gen.step())
    run(gen.step())
    run(gen.close())
    model = DoubleLM()
    again = run(resume(store, "chat", model, make_cache(model), autosave=Autosave(store, "chat", 4),
                       decode=TEXT.decode))
    finished(again)
    assert again.conversation == gen.conversation
    assert {c["id"] for c in conversations(store)} == {gen.conversation.id}


def test_a_checkpoint_without_a_conversation_still_resumes_and_goes_on_without_one(make_cache):
    store = MemoryStore()
    older = first_save(make_cache, store)
    del older["conversation"]  # as a checkpoint written before generations recorded one
    saved_directly(make_cache, store, "old", older)
    model = DoubleLM()
    again = run(resume(store, "old", model, make_cache(model), autosave=Autosave(store, "old", 4),
                       decode=TEXT.decode))
    finished(again)
    assert again.conversation is None and conversations(store, "old")[-1] is None


@pytest.mark.parametrize("value, field", [("text", "app_state.conversation"),
                                          ({"id": "AB" * 16, "created_ms": 1}, "app_state.conversation.id"),
                                          ({"id": "ab" * 16, "created_ms": -1}, "app_state.conversation.created_ms")])
def test_resume_of_a_checkpoint_whose_conversation_is_malformed_names_the_field(make_cache, value, field):
    store = MemoryStore()
    saved_directly(make_cache, store, "bad", {**first_save(make_cache, store), "conversation": value})
    model = DoubleLM()
    with pytest.raises(FormatError) as info:
        run(resume(store, "bad", model, make_cache(model)))
    assert info.value.field == field


# ----- one conversation per name ----------------------------------------------------------------------------


def test_a_new_reply_on_a_name_holding_another_conversation_is_refused_and_writes_nothing(make_cache):
    store = MemoryStore()
    done = finished(start(make_cache, store))
    before = snapshot(store)
    model = DoubleLM()
    cache = make_cache(model)
    with pytest.raises(ConflictError) as info:
        run(Generator.start(model, cache, OTHER_PROMPT, SETTINGS, autosave=Autosave(store, "chat", 4)))
    message = str(info.value)
    assert "'chat'" in message and "another conversation" in message
    assert f"{len(done.prompt_tokens) + len(done.generated_tokens)} tokens" in message and "started " in message
    assert "resume it" in message and "another name" in message and "delete" in message
    assert snapshot(store) == before and cache.sequence_ids() == []
    finished(start(make_cache, store, prompt=OTHER_PROMPT, name="chat-2"))  # another name takes it


def test_a_new_reply_on_a_name_holding_checkpoints_of_no_conversation_is_refused(make_cache):
    store = MemoryStore()
    saved_directly(make_cache, store, "chat", {"note": "not a generation"})
    before = snapshot(store)
    with pytest.raises(ConflictError, match="'chat'.*no conversation id"):
        start(make_cache, store)
    assert snapshot(store) == before


def test_a_new_reply_on_a_name_whose_generations_cannot_be_read_is_refused(make_cache):
    store = MemoryStore()
    finished(start(make_cache, store))
    for key in run(store.list_prefix("manifests/chat/")):
        run(store.set(key, b"damaged"))
    before = snapshot(store)
    with pytest.raises(ConflictError, match="none of them readable"):
        start(make_cache, store)
    assert snapshot(store) == before


def test_resume_saving_under_another_name_that_holds_another_conversation_is_refused(make_cache):
    store = MemoryStore()
    finished(start(make_cache, store))
    finished(start(make_cache, store, prompt=OTHER_PROMPT, name="other"))
    before = snapshot(store)
    model = DoubleLM()
    with pytest.raises(ConflictError, match="'other'"):
        run(resume(store, "chat", model, make_cache(model), autosave=Autosave(store, "other", 4)))
    assert snapshot(store) == before


def test_an_autosave_on_top_of_another_conversations_generation_fails_and_is_not_reported_saved(make_cache):
    store = MemoryStore()
    reported = []
    gen = start(make_cache, store, on_save=reported.append)
    # another writer, which does not hold the name's claim (as one whose claim excluded only its own process), starts
    # a conversation of its own there while this reply runs
    other = Conversation.new()
    saved_directly(make_cache, store, "chat", {"conversation": other.to_json()})
    before = snapshot(store)
    with pytest.raises(ConflictError) as info:
        run(gen.step())
    message = str(info.value)
    assert "'chat'" in message and repr(gen.conversation.id) in message and repr(other.id) in message
    assert snapshot(store) == before and reported == [] and gen.last_save is None
    assert conversations(store) == [other.to_json()]
    run(gen.close())


# ----- one writer per name ----------------------------------------------------------------------------------


@pytest.mark.parametrize("second_store", ["same object", "another FileStore"])
def test_a_second_writer_of_a_name_is_refused_while_the_first_holds_it_and_the_firsts_generations_stay(
        make_cache, tmp_path, second_store):
    store = FileStore(tmp_path / "s")
    other = store if second_store == "same object" else FileStore(tmp_path / "s")
    first = start(make_cache, store)
    for _ in range(6):
        run(first.step())
    before = snapshot(store)
    with pytest.raises(ConflictError, match="'chat'.*held by another writer"):
        start(make_cache, other, prompt=OTHER_PROMPT)
    assert snapshot(store) == before
    done = finished(first)
    infos = run(list_generations(store, "chat"))
    assert infos[-1].app_state["generated_tokens"] == list(done.generated_tokens)
    assert {i.app_state["conversation"]["id"] for i in infos} == {first.conversation.id}


@pytest.fixture(params=["ObjectStore on S3", "served store"])
def two_writers(request, tmp_path):
    """Two store objects on one storage where claims are leases, standing for two processes, and the clock (theirs
    and the storage's) the test moves."""
    clock = Clock()
    if request.param == "ObjectStore on S3":
        server = request.getfixturevalue("s3_server")
        url = server.new_url()
        yield server.store(url, clock=clock), server.store(url, clock=clock), clock
        return
    pytest.importorskip("starlette")
    from kvckpt_web.server.run import serve_routes_in_thread
    from kvckpt_web.server.store_routes import StoreRoutes

    token = "t" * 24
    served, url = serve_routes_in_thread(StoreRoutes(FileStore(tmp_path / "s"), token, clock=clock).routes(), port=0)
    yield HTTPStore(url, token=token, clock=clock), HTTPStore(url, token=token, clock=clock), clock
    served.shutdown()


def test_a_second_process_is_refused_while_the_first_writes_and_takes_over_once_its_lease_ran_out(make_cache,
                                                                                                  two_writers):
    first_store, second_store, clock = two_writers
    first = start(make_cache, first_store)
    run(first.step())
    with pytest.raises(ConflictError, match=r"'chat'.*held by (another writer|writer '[^']+') of that name"):
        start(make_cache, second_store, prompt=OTHER_PROMPT)
    clock.offset = LEASE_RUN_OUT  # the first writer stalled past its lease: the second resumes its reply
    model = DoubleLM()
    second = run(resume(second_store, "chat", model, make_cache(model), autosave=Autosave(second_store, "chat", 4),
                        decode=TEXT.decode))
    before = snapshot(second_store)
    with pytest.raises(ConflictError, match="'chat'.*lease ran out"):
        run(first.step())  # its next autosave: the name is not its own any more
    assert snapshot(second_store) == before
    done = finished(second)
    infos = run(list_generations(second_store, "chat"))
    assert infos[-1].app_state["generated_tokens"] == list(done.generated_tokens)
    assert {i.app_state["conversation"]["id"] for i in infos} == {first.conversation.id}
    run(first.close())


def test_a_reply_keeps_its_name_between_saves_by_renewing_its_lease_as_it_steps(make_cache, two_writers):
    first_store, second_store, clock = two_writers
    first = start(make_cache, first_store, every=1000)  # saved at its first token and at its end only
    while not first.generated_tokens:
        run(first.step())
    before = snapshot(first_store)
    for _ in range(4):  # 2.4 leases pass, no save among the steps
        clock.offset += DEFAULT_LEASE_SECONDS * 0.6
        run(first.step())
    assert clock.offset > LEASE_RUN_OUT and snapshot(first_store) == before
    with pytest.raises(ConflictError, match="'chat'"):
        start(make_cache, second_store, prompt=OTHER_PROMPT)
    finished(first)


def test_resume_by_a_second_writer_is_refused_at_once_and_changes_nothing(make_cache, tmp_path):
    store = FileStore(tmp_path / "s")
    first = start(make_cache, store)
    for _ in range(6):
        run(first.step())
    before = snapshot(store)
    model = DoubleLM()
    cache = make_cache(model)
    with pytest.raises(ConflictError, match="'chat'.*held by another writer"):
        run(resume(store, "chat", model, cache, autosave=Autosave(FileStore(tmp_path / "s"), "chat", 4)))
    assert snapshot(store) == before and cache.sequence_ids() == [] and model.forwards == []
    finished(first)


def test_closing_a_generator_releases_its_name_for_the_next_writer(make_cache):
    store = MemoryStore()
    gen = start(make_cache, store)
    run(gen.step())
    run(gen.close())
    run(gen.close())  # idempotent
    model = DoubleLM()
    finished(run(resume(store, "chat", model, make_cache(model), autosave=Autosave(store, "chat", 4),
                        decode=TEXT.decode)))


def test_a_closed_generator_steps_and_saves_no_more(make_cache):
    store = MemoryStore()
    gen = start(make_cache, store)
    run(gen.close())
    with pytest.raises(CheckpointStateError, match="closed"):
        run(gen.step())
    with pytest.raises(CheckpointStateError, match="closed"):
        run(gen.save())
    assert run(store.list_prefix("")) == []


def test_a_generator_without_autosave_claims_no_name(make_cache):
    store = MemoryStore()
    finished(start(make_cache, store))
    model = DoubleLM()
    reader = run(resume(store, "chat", model, make_cache(model), decode=TEXT.decode))  # reads, never writes
    finished(run(resume(store, "chat", model, make_cache(model), autosave=Autosave(store, "chat", 4),
                        decode=TEXT.decode)))
    run(reader.close())


def test_a_reply_saved_first_commits_its_prompt_before_any_token(make_cache):
    store = MemoryStore()
    gen = start(make_cache, store, save_first=True)
    manifest, _ = run(load_manifest(store, "chat"))
    assert (manifest.generation, manifest.app_state["prompt_tokens"], manifest.app_state["generated_tokens"]) == \
        (1, PROMPT, [])
    finished(gen)


def test_a_reply_saved_first_checks_the_names_conversation_once_at_that_saves_commit(make_cache):
    store = CountingStore()
    finished(start(make_cache, store))
    manifest, _ = run(load_manifest(store, "chat"))
    store.reset()
    gen = start(make_cache, store, conversation=conversation_of(manifest.app_state), save_first=True)
    calls = store.calls.copy()
    finished(gen)
    assert count(calls, "list", "manifests/chat/") == 1  # the save's, under its lock: no check of its own


def test_a_reply_saved_first_on_a_name_of_another_conversation_is_refused_leaving_store_and_cache(make_cache):
    store = MemoryStore()
    finished(start(make_cache, store))
    before = snapshot(store)
    model = DoubleLM()
    cache = make_cache(model)
    with pytest.raises(ConflictError, match="another writer's"):
        run(Generator.start(model, cache, PROMPT, SETTINGS, stop=StopRules(20), prefill_chunk=8,
                            autosave=Autosave(store, "chat", 4, 2), decode=TEXT.decode, save_first=True))
    assert snapshot(store) == before and cache.sequence_ids() == []
    finished(start(make_cache, store, conversation=conversation_of(run(load_manifest(store, "chat"))[0].app_state)))
