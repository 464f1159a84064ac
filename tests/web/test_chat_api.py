"""The crash-resume page's model runner (kvckpt_web.web.chat_api) on desktop: the conversation it generates is
its own (its name's claim) until it starts or resumes another, deletes it or closes; another tab's is not.

The browser's store and device are replaced by a MemoryStore per store name and the desktop device, the model
by the test double.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvckpt_web.durable.catalog import list_names
from kvckpt_web.errors import ConflictError
from kvckpt_web.model.protocol import LoadedModel
from kvckpt_web.stores.memory import MemoryStore
from kvckpt_web.web import chat_api

from kvmodel import run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))
from lm_double import DoubleLM, DoubleText  # noqa: E402

OPTIONS = {"store": "indexeddb", "storeName": "s", "every": 4, "context": 96}


@pytest.fixture
def store(monkeypatch, device):
    """The page's store (one MemoryStore for every call), with the double loaded into the runner."""
    memory = MemoryStore()

    async def open_store(kind, name):
        return memory

    async def this_device():
        return device

    monkeypatch.setattr(chat_api, "open_store", open_store)
    monkeypatch.setattr(chat_api, "device", this_device)
    chat_api._chat.loaded = LoadedModel(DoubleLM(), DoubleText())
    yield memory
    run(chat_api.close())


def snapshot(store):
    return {key: run(store.get(key)) for key in run(store.list_prefix(""))}


class OtherTab:
    """Another tab writing conversation ``name`` of the store (holding its claim) inside ``with``."""

    def __init__(self, store, name):
        self.claim = store.claim(name)

    def __enter__(self):
        run(self.claim.__aenter__())

    def __exit__(self, *exc_info):
        run(self.claim.__aexit__(*exc_info))


def test_its_own_finished_conversation_is_deleted(store):
    run(chat_api.start("tell me about the sea.", {**OPTIONS, "maxTokens": 6, "name": "a"}))
    run(chat_api.delete("indexeddb", "s", "a"))
    assert run(list_names(store)) == []


def test_starting_another_conversation_releases_the_one_before(store):
    run(chat_api.start("tell me about the sea.", {**OPTIONS, "maxTokens": 6, "name": "a"}))
    run(chat_api.start("and about ships.", {**OPTIONS, "maxTokens": 6, "name": "b"}))
    with OtherTab(store, "a"):
        pass
    with pytest.raises(ConflictError):
        with OtherTab(store, "b"):
            pass


def test_a_conversation_another_tab_writes_is_neither_resumed_nor_deleted(store):
    run(chat_api.start("tell me about the sea.", {**OPTIONS, "maxTokens": 6, "name": "a"}))
    run(chat_api.close())
    chat_api._chat.loaded = LoadedModel(DoubleLM(), DoubleText())
    before = snapshot(store)
    with OtherTab(store, "a"):
        with pytest.raises(ConflictError, match="'a'"):
            run(chat_api.resume_saved({**OPTIONS, "name": "a"}))
        with pytest.raises(ConflictError, match="'a'"):
            run(chat_api.delete("indexeddb", "s", "a"))
    assert snapshot(store) == before
