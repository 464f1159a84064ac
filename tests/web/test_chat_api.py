"""The engine's worker side (kvckpt_web.web.chat_api.BrowserEngine) on desktop: OpenAI-shaped chunks with usage,
the next turn costing only its own tokens, resumes that say how their K/V came back, commits and failed autosaves
reported with the store's name, a re-prefill measured only when asked, and a conversation handed to another tab.

The browser's store and device are replaced by one MemoryStore per store name and the desktop device, the model by
the test double; two BrowserEngines on one store are two tabs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kvckpt_web.engine import PRESETS
from kvckpt_web.errors import ConflictError, FieldError, NotFoundError
from kvckpt_web.model.protocol import LoadedModel
from kvckpt_web.stores.memory import MemoryStore
from kvckpt_web.web import chat_api
from kvckpt_web.web.chat_api import BrowserEngine

from support.kvmodel import run
from support.stores_that_fail import FullAfter

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))
from lm_double import DoubleLM, DoubleText  # noqa: E402
from tiny_llama import write_tiny_llama  # noqa: E402

OPEN = {"store": "indexeddb", "store_name": "s", "context": 256, "autosave_every": 4, "prefill_chunk": 8}
GREEDY = {"temperature": 0, "max_tokens": 12}


@pytest.fixture
def stores(monkeypatch, device):
    """The stores the workers open, by (kind, name); each test may put its own in first."""
    opened: dict[tuple[str, str], MemoryStore] = {}

    async def open_store(kind, name):
        return opened.setdefault((kind, name), MemoryStore())

    async def this_device():
        return device

    monkeypatch.setattr(chat_api, "open_store", open_store)
    monkeypatch.setattr(chat_api, "device", this_device)
    return opened


@pytest.fixture
def tab(stores):
    """``tab()``: a BrowserEngine with the double loaded and its engine open (closed after the test); its events are
    in ``.events``."""
    made = []

    def make(**options):
        events: list[dict] = []
        worker = BrowserEngine(lambda text: events.append(json.loads(text)))
        worker.events = events
        worker.loaded = LoadedModel(DoubleLM(max_context=1024), DoubleText())
        run(worker.open({**OPEN, **options}))
        made.append(worker)
        return worker

    yield make
    for worker in made:
        run(worker.close())


def body(*turns, **settings):
    """A chat-completions body: user and assistant turns alternating, the user's first."""
    roles = ["user", "assistant"]
    return {"messages": [{"role": roles[i % 2], "content": t} for i, t in enumerate(turns)], "stream": True,
            **GREEDY, **settings}


async def chunks_of(worker, started):
    handle = json.loads(started)["stream"]
    out = []
    while text := await worker.next_chunk(handle):
        out.append(json.loads(text))
    return out


def reply(worker, *turns, **settings):
    """The chunks of the reply to ``turns``."""
    return run(chunks_of(worker, run(worker.create(json.dumps(body(*turns, **settings))))))


def text_of(chunks):
    return "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)


def ids_of(chunks):
    return [t for c in chunks for t in c["kvckpt"]["token_ids"]]


def cut(worker, *turns, after=5):
    """A reply interrupted once it holds ``after`` tokens: its conversation's name."""
    async def body_():
        handle = json.loads(await worker.create(json.dumps(body(*turns))))["stream"]
        got = 0
        while text := await worker.next_chunk(handle):
            chunk = json.loads(text)
            got += len(chunk["kvckpt"]["token_ids"])
            if got >= after:
                worker.interrupt()
        return chunk

    last = run(body_())
    assert last["choices"][0]["finish_reason"] == "abort"
    return last["kvckpt"]["conversation"]


def test_a_streamed_reply_is_openai_chunks_the_last_with_usage_cached_tokens_and_timings(tab):
    chunks = reply(tab(), "tell me about the sea.")
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0 and usage["completion_tokens"] == len(ids_of(chunks))
    assert {"prefill_tokens_per_s", "decode_tokens_per_s", "restore_s"} <= set(usage["timings"])


def test_the_whole_reply_at_once_is_a_chat_completion(tab):
    worker = tab()
    streamed = reply(worker, "tell me about the sea.")
    whole = json.loads(run(worker.complete(json.dumps(body("tell me about the sea.", stream=False)))))
    assert whole["object"] == "chat.completion"
    assert whole["choices"][0]["message"]["content"] == text_of(streamed)


def test_the_next_turn_costs_only_its_own_tokens(tab):
    worker = tab()
    first = reply(worker, "tell me about the sea.")
    second = reply(worker, "tell me about the sea.", text_of(first), "and the wind?")
    usage, before = second[-1]["usage"], first[-1]["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == before["prompt_tokens"] + before["completion_tokens"] - 1
    assert second[-1]["kvckpt"]["conversation"] == first[-1]["kvckpt"]["conversation"]


def test_a_reopened_conversation_in_a_new_tab_costs_only_its_own_tokens_and_gives_the_same_tokens(tab):
    never_closed = tab(store_name="a")
    first = reply(never_closed, "tell me about the sea.")
    want = reply(never_closed, "tell me about the sea.", text_of(first), "and the wind?")
    writer = tab(store_name="b")
    first_b = reply(writer, "tell me about the sea.")
    run(writer.close())
    reopened = tab(store_name="b")
    info = json.loads(run(reopened.conversation(first_b[-1]["kvckpt"]["conversation"])))
    history = [m["content"] for m in info["messages"]]
    got = reply(reopened, *history, "and the wind?")
    assert ids_of(got) == ids_of(want)
    assert got[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] == \
        want[-1]["usage"]["prompt_tokens_details"]["cached_tokens"]


@pytest.fixture
def damaged(tab, stores):
    """A tab whose store holds one turn with every chunk damaged (written by a tab since closed), and the history of
    that turn."""
    writer = tab()
    first = reply(writer, "tell me about the sea.")
    run(writer.close())
    store = stores[("indexeddb", OPEN["store_name"])]
    for key in [k for k in store._data if k.startswith("chunks/")]:
        store._data[key] = store._data[key][:-1] + bytes([store._data[key][-1] ^ 0xFF])
    return tab(), ["tell me about the sea.", text_of(first)]


def test_a_streamed_reply_whose_stored_kv_cannot_be_used_says_so_in_its_first_chunk(damaged):
    worker, history = damaged
    chunks = reply(worker, *history, "and the wind?")
    warnings = chunks[0]["kvckpt"]["warnings"]
    assert warnings and all("cannot be used" in w and "prefilled the prompt instead" in w for w in warnings)
    assert all("warnings" not in c["kvckpt"] for c in chunks[1:])


def test_a_whole_reply_whose_stored_kv_cannot_be_used_says_so(damaged):
    worker, history = damaged
    completion = json.loads(run(worker.complete(json.dumps({**body(*history, "and the wind?"), "stream": False}))))
    warnings = completion["kvckpt"]["warnings"]
    assert warnings and all("cannot be used" in w for w in warnings)


def test_a_regenerated_reply_keeps_its_conversation_and_reuses_the_prompt(tab):
    worker = tab()
    first = reply(worker, "tell me about the sea.")
    name = first[-1]["kvckpt"]["conversation"]
    again = reply(worker, "tell me about the sea.", conversation=name, temperature=0.9, seed=3)
    usage = again[-1]["usage"]
    assert again[-1]["kvckpt"]["conversation"] == name
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1
    assert [c["name"] for c in json.loads(run(worker.conversations()))] == [name]


def test_an_interrupted_reply_is_unfinished_and_its_resume_says_how_its_kv_came_back(tab):
    want = reply(tab(store_name="clean"), "tell me about the sea.")
    worker = tab()
    name = cut(worker, "tell me about the sea.")
    assert [c["name"] for c in json.loads(run(worker.unfinished()))] == [name]
    run(worker.close())
    again = tab()
    started = run(again.resume(name))
    restored = json.loads(started)["restored"]
    got = run(chunks_of(again, started))
    assert restored["kv_restored"] is True and restored["tokens"] > 0 and restored["restore_ms"] >= 0
    assert ids_of(got) == ids_of(want) and got[-1]["choices"][0]["finish_reason"] == "length"


def test_a_reply_continued_from_the_cache_reports_no_restore(tab):
    worker = tab()
    name = cut(worker, "tell me about the sea.")
    started = run(worker.resume(name))
    run(chunks_of(worker, started))
    assert json.loads(started)["restored"] is None


def test_a_resume_says_its_kv_came_from_the_store_after_a_restart_and_from_the_cache_the_next_time(tab):
    worker = tab()
    name = cut(worker, "tell me about the sea.")
    run(worker.close())
    again = tab()

    async def resume_and_cut():
        started = await again.resume(name)
        handle = json.loads(started)["stream"]
        await again.next_chunk(handle)
        again.interrupt()
        while await again.next_chunk(handle):
            pass
        return json.loads(started)["restored"]

    assert run(resume_and_cut())["kv_restored"] is True
    assert run(resume_and_cut()) is None


def test_every_commit_is_reported_naming_the_conversation_and_the_store(tab):
    worker = tab(store="opfs", store_name="kept")
    chunks = reply(worker, "tell me about the sea.")
    saved = [e for e in worker.events if e["type"] == "saved"]
    assert saved and all(e["conversation"] == chunks[-1]["kvckpt"]["conversation"] for e in saved)
    assert {e["store"] for e in saved} == {"OPFS 'kept'"}
    assert saved[-1]["tokens"] > 0 and saved[-1]["bytes"] > 0


def test_a_failed_autosave_is_reported_and_the_reply_goes_on(tab, stores):
    want = reply(tab(store_name="clean"), "tell me about the sea.")
    stores[("indexeddb", "full")] = FullAfter(ok=1)
    worker = tab(store_name="full")
    got = reply(worker, "tell me about the sea.")
    failed = [e for e in worker.events if e["type"] == "save_failed"]
    assert failed and failed[0]["store"] == "IndexedDB 'full'" and "No space left" in failed[0]["error"]["message"]
    assert ids_of(got) == ids_of(want)


def test_a_reprefill_is_measured_over_the_conversations_kv_tokens_only_when_asked(tab):
    worker = tab()
    chunks = reply(worker, "tell me about the sea.")
    usage = chunks[-1]["usage"]
    forwards = len(worker.loaded.model.forwards)
    measured = json.loads(run(worker.measure_reprefill(chunks[-1]["kvckpt"]["conversation"])))
    assert measured["tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] - 1 and measured["ms"] > 0
    assert len(worker.loaded.model.forwards) > forwards  # it ran now, asked; no reply ran one
    part = json.loads(run(worker.measure_reprefill(chunks[-1]["kvckpt"]["conversation"], 9)))
    assert part["tokens"] == 9
    with pytest.raises(FieldError, match="tokens"):
        run(worker.measure_reprefill(chunks[-1]["kvckpt"]["conversation"], measured["tokens"] + 1))


def test_a_conversation_released_by_one_tab_is_continued_by_another(tab):
    want = reply(tab(store_name="clean"), "tell me about the sea.")
    first, second = tab(), tab()
    name = cut(first, "tell me about the sea.")
    with pytest.raises(ConflictError):
        run(second.resume(name))
    run(first.release(name))
    assert ids_of(run(chunks_of(second, run(second.resume(name))))) == ids_of(want)


def test_a_cancelled_stream_leaves_its_reply_unfinished_and_resumable(tab):
    worker = tab()

    async def first_chunk_then_cancel():
        handle = json.loads(await worker.create(json.dumps(body("tell me about the sea."))))["stream"]
        chunk = json.loads(await worker.next_chunk(handle))
        await worker.cancel(handle)
        return chunk["kvckpt"]["conversation"], handle

    name, handle = run(first_chunk_then_cancel())
    assert [c["name"] for c in json.loads(run(worker.unfinished()))] == [name]
    with pytest.raises(FieldError, match="stream"):
        run(worker.next_chunk(handle))


def test_two_streams_run_together_and_interrupting_one_by_name_stops_it_alone(tab):
    worker = tab()

    async def body_():
        handles = [json.loads(await worker.create(json.dumps(body(text, max_tokens=30))))["stream"]
                   for text in ("tell me about the sea.", "what is a boat?")]
        first = [json.loads(await worker.next_chunk(h)) for h in handles]
        worker.interrupt(first[0]["kvckpt"]["conversation"])
        rest = [[json.loads(t) async for t in _chunks(worker, h)] for h in handles]
        return [c[-1]["choices"][0]["finish_reason"] for c in rest], first[0]["kvckpt"]["conversation"]

    (stopped, other), name = run(body_())
    assert stopped == "abort" and other == "length"
    assert [c["name"] for c in json.loads(run(worker.unfinished()))] == [name]


async def _chunks(worker, handle):
    while text := await worker.next_chunk(handle):
        yield text


def test_a_bad_request_names_the_field_and_stores_nothing(tab, stores):
    worker = tab()
    with pytest.raises(FieldError, match=r"messages\[0\].role"):
        run(worker.create(json.dumps({"messages": [{"role": "robot", "content": "hi"}]})))
    with pytest.raises(FieldError, match="body"):
        run(worker.create("{not json"))
    assert run(stores[("indexeddb", "s")].list_prefix("")) == []


def test_an_unknown_engine_option_is_refused_naming_it(tab):
    with pytest.raises(FieldError, match="options.every"):
        tab(every=4)


def test_the_engine_runs_the_browser_preset_unless_an_option_replaces_a_field(stores):
    worker = BrowserEngine()
    worker.loaded = LoadedModel(DoubleLM(max_context=1024), DoubleText())
    opened = json.loads(run(worker.open({"store": "indexeddb"})))
    assert opened["config"] == worker.engine.config.to_json() == PRESETS["browser"].fitted(1024).to_json()
    opened = json.loads(run(worker.open({"store": "indexeddb", "context": 256, "prefill_chunk": 8})))
    assert worker.engine.config == PRESETS["browser"].replace(context=256, prefill_chunk=8).fitted(1024)
    assert opened["config"]["prefill_chunk"] == 8
    run(worker.close())


def test_an_engine_option_out_of_range_is_refused_naming_it_before_the_store_opens(tab, stores):
    with pytest.raises(FieldError) as caught:
        tab(store_name="other", prefill_chunk=0)
    assert (caught.value.field, caught.value.got) == ("prefill_chunk", 0)
    assert ("indexeddb", "other") not in stores


def test_the_inspect_panel_lists_every_stored_generation_and_names_the_store(tab):
    worker = tab()
    name = reply(worker, "tell me about the sea.")[-1]["kvckpt"]["conversation"]
    details = json.loads(run(worker.inspect(name)))
    assert details["store"] == "IndexedDB 's'" and details["generations"]
    assert all(g["bytes"] > 0 and g["error"] is None for g in details["generations"])
    with pytest.raises(NotFoundError):
        run(worker.inspect("chat-none"))


def test_without_a_model_the_saved_conversations_are_listed_with_their_messages(tab, stores):
    name = reply(tab(), "tell me about the sea.")[-1]["kvckpt"]["conversation"]
    rows = json.loads(run(chat_api.saved_conversations("indexeddb", "s")))
    assert [r["name"] for r in rows] == [name]
    assert rows[0]["messages"] == [{"role": "user", "content": "tell me about the sea."}]
    assert rows[0]["same_model"] is False and rows[0]["title"] == "tell me about the sea."


def test_a_resume_without_streaming_gives_the_whole_reply_and_how_its_kv_came_back(tab):
    want = reply(tab(store_name="clean"), "tell me about the sea.")
    worker = tab()
    name = cut(worker, "tell me about the sea.")
    run(worker.close())
    got = json.loads(run(tab().resume(name, None, False)))
    assert got["completion"]["object"] == "chat.completion" and got["restored"]["kv_restored"] is True
    assert got["completion"]["kvckpt"]["token_ids"] == ids_of(want)


def test_a_warm_up_runs_before_any_reply_and_changes_nothing_stored(tab, stores):
    worker = tab()
    assert json.loads(run(worker.warm_up()))["ms"] >= 0
    assert worker.loaded.model.forwards == [2, 1, worker.engine.prefill_chunk, 1]
    assert run(stores[("indexeddb", "s")].list_prefix("")) == []


@pytest.mark.parametrize("name", ["SmolLM2 135M Instruct", None], ids=["named", "unnamed"])
def test_a_loaded_model_is_named_as_its_file_names_it(tmp_path, name):
    worker = BrowserEngine()
    try:
        got = json.loads(run(worker.load_model(write_tiny_llama(tmp_path / "model.gguf", name=name).read_bytes())))
    finally:
        run(worker.close())
    assert got["name"] == name


def test_a_plain_completion_streams_text_completion_chunks_and_is_saved_with_its_prompt(tab):
    worker = tab()
    chunks = run(chunks_of(worker, run(worker.create(json.dumps({"prompt": "once upon a time", "stream": True,
                                                                 **GREEDY}), "completion"))))
    assert all(c["object"] == "text_completion" for c in chunks) and chunks[-1]["usage"]["completion_tokens"] >= 1
    whole = json.loads(run(worker.complete(json.dumps({"prompt": "once upon a time", **GREEDY}), "completion")))
    assert whole["object"] == "text_completion"
    assert whole["choices"][0]["text"] == "".join(c["choices"][0]["text"] for c in chunks)
    info = json.loads(run(worker.conversation(chunks[-1]["kvckpt"]["conversation"])))
    assert info["prompt"] == "once upon a time"


def test_a_base_model_is_loaded_without_a_chat_template_and_refuses_chat(tiny_base_path, stores):
    worker = BrowserEngine()
    try:
        got = json.loads(run(worker.load_model(tiny_base_path.read_bytes())))
        assert got["chat_template"] is None
        run(worker.open(OPEN))
        with pytest.raises(FieldError, match="^messages: expected a chat model.*a base model"):
            run(worker.create(json.dumps(body("hi"))))
    finally:
        run(worker.close())


def test_a_request_of_no_known_kind_is_refused_naming_it(tab):
    with pytest.raises(FieldError, match="^kind: expected 'chat' or 'completion'"):
        run(tab().create(json.dumps(body("hi")), "edit"))
