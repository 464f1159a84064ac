"""Continue on another device, the worker side (BrowserEngine.push / pull, behind engine.push / pull in JavaScript):
two workers of their own stores (two devices) and one store served over HTTP with a token. What moved is reported
in counts, a pulled conversation's next turn costs only its own tokens and gives the tokens of a run that never
moved, and what goes wrong is an error of the engine's (a refused token, a name the server lacks, a conversation
another device continued) with nothing written."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kvckpt_web.errors import ConflictError, FieldError, NotFoundError, StoreError
from kvckpt_web.stores.file import FileStore

from support.kvmodel import run
from test_chat_api import chunks_of, cut, ids_of, reply, stores, tab, text_of  # noqa: F401 - fixtures and helpers

pytest.importorskip("starlette")
from kvckpt_web.server.run import serve_routes_in_thread  # noqa: E402
from kvckpt_web.server.store_routes import StoreRoutes  # noqa: E402

TOKEN = "chat-worker-device-token"
FIRST = "tell me about the sea. " * 3


@pytest.fixture
def served(tmp_path):
    """The served store: its base URL and the directory behind it."""
    backing = FileStore(tmp_path / "remote")
    server, url = serve_routes_in_thread(StoreRoutes(backing, TOKEN).routes(), port=0)
    yield url, backing
    server.shutdown()


def usage_of(chunks):
    usage = chunks[-1]["usage"]
    return usage["prompt_tokens_details"]["cached_tokens"], usage["prompt_tokens"]


def test_a_pushed_conversation_pulled_by_another_device_continues_with_its_own_tokens_only(tab, served):
    url, backing = served
    here, there = tab(store_name="here"), tab(store_name="there")
    first = reply(here, FIRST)
    name = first[-1]["kvckpt"]["conversation"]
    history = [FIRST, text_of(first), "and the wind?"]
    pushed = json.loads(run(here.push(name, url, TOKEN)))
    assert pushed["name"] == name and pushed["copied"] is True and pushed["chunks_present"] == 0
    assert pushed["chunks_sent"] == len(run(backing.list_prefix("chunks/"))) > 0 and pushed["bytes_sent"] > 0
    pulled = json.loads(run(there.pull(name, url, TOKEN)))
    assert (pulled["generation"], pulled["chunks_sent"], pulled["bytes_sent"]) == \
        (pushed["generation"], pushed["chunks_sent"], pushed["bytes_sent"])

    got = reply(there, *history)
    want = reply(here, *history)  # the run that never moved
    assert ids_of(got) == ids_of(want) and got[-1]["kvckpt"]["conversation"] == name
    assert usage_of(got) == usage_of(want) and usage_of(got)[0] >= len(FIRST)


def test_a_pull_lets_go_of_a_reply_stopped_here_so_the_other_devices_continuation_comes_in(tab, served):
    url, _ = served
    here, there = tab(store_name="here"), tab(store_name="there")
    name = cut(here, FIRST)  # stopped: `here` holds its slot and the name's claim, to continue it
    run(here.push(name, url, TOKEN))
    run(there.pull(name, url, TOKEN))
    continued = run(chunks_of(there, run(there.resume(name))))  # finished on the other device
    run(there.push(name, url, TOKEN))
    back = json.loads(run(here.pull(name, url, TOKEN)))
    assert back["copied"] is True and back["chunks_sent"] > 0
    info = json.loads(run(here.conversation(name)))
    assert info["finished"] is True and info["messages"][-1]["content"] == text_of(continued)
    assert not json.loads(run(here.unfinished()))


def test_a_refused_token_is_a_store_error_and_nothing_is_written(tab, served):
    url, backing = served
    worker = tab()
    name = reply(worker, FIRST)[-1]["kvckpt"]["conversation"]
    with pytest.raises(StoreError, match="401"):
        run(worker.push(name, url, "not-the-token-of-this-store"))
    assert run(backing.list_prefix("")) == []


def test_pulling_a_name_the_server_lacks_is_not_found(tab, served):
    with pytest.raises(NotFoundError, match="chat-none"):
        run(tab().pull("chat-none", served[0], TOKEN))


def continued_on_another_device(tab: Any, url: str) -> tuple[Any, list[dict], str]:
    """A conversation pushed from ``here``, pulled, continued and pushed by another device: (here, its first reply's
    chunks, the name)."""
    here, there = tab(store_name="here"), tab(store_name="there")
    first = reply(here, FIRST)
    name = first[-1]["kvckpt"]["conversation"]
    run(here.push(name, url, TOKEN))
    run(there.pull(name, url, TOKEN))
    reply(there, FIRST, text_of(first), "and the wind?")
    run(there.push(name, url, TOKEN))
    return here, first, name


def test_a_push_onto_a_conversation_another_device_continued_is_a_conflict(tab, served):
    url, _ = served
    here, _, name = continued_on_another_device(tab, url)
    with pytest.raises(ConflictError, match=name):
        run(here.push(name, url, TOKEN))


def test_a_push_and_a_pull_of_copies_that_went_apart_keep_both_and_say_under_which_name(tab, served):
    url, _ = served
    here, first, name = continued_on_another_device(tab, url)
    reply(here, FIRST, text_of(first), "and the boats?")
    pushed = json.loads(run(here.push(name, url, TOKEN)))
    assert pushed["apart_from"] == name and pushed["name"].startswith(f"{name}.apart-") and pushed["copied"]
    pulled = json.loads(run(here.pull(name, url, TOKEN)))
    assert pulled["apart_from"] == name and pulled["name"].startswith(f"{name}.apart-")
    listed = {c["name"] for c in json.loads(run(here.conversations()))}
    assert listed == {name, pulled["name"]}


def test_a_missing_token_or_a_bad_url_is_refused_naming_it_before_anything_moves(tab, served):
    url, backing = served
    worker = tab()
    name = reply(worker, FIRST)[-1]["kvckpt"]["conversation"]
    for bad_url, token, field in [(url, None, "token"), (url, "", "token"), ("ftp://x/", TOKEN, "url")]:
        with pytest.raises(FieldError) as caught:
            run(worker.push(name, bad_url, token))
        assert caught.value.field == field
    assert run(backing.list_prefix("")) == []
