"""Continuing a conversation on another device: push from one engine's store to a served store (HTTPStore on a
live ``store_routes`` server), pull into another engine's store, and continue there with the tokens an
uninterrupted run gives, the history restored rather than computed again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvckpt_web import MemoryStore
from kvckpt_web.durable.catalog import load_manifest
from kvckpt_web.engine import pull, push
from kvckpt_web.errors import ConflictError, FieldError, NotFoundError
from kvckpt_web.stores.file import FileStore

from lm_double import DoubleLM
from support.kvmodel import run
from test_engine import GREEDY, converse

pytest.importorskip("starlette")
from kvckpt_web.server.run import serve_routes_in_thread  # noqa: E402
from kvckpt_web.server.store_routes import StoreRoutes  # noqa: E402
from kvckpt_web.stores.http import HTTPStore  # noqa: E402

TOKEN = "device-to-device-token"
FIRST = "tell me a long story about the sea and the wind and the boats. " * 8


@pytest.fixture
def remote(tmp_path: Path) -> Any:
    """A served store (a directory behind a live server) and a factory of HTTPStores speaking to it."""
    server, url = serve_routes_in_thread(StoreRoutes(FileStore(tmp_path / "remote"), TOKEN).routes(), port=0)
    yield lambda: HTTPStore(url, token=TOKEN)
    server.shutdown()


async def generation_bytes(store: Any, name: str, chunks: set[str] | None = None) -> tuple[set[str], int]:
    """The chunk keys of ``name``'s newest generation, and the bytes a copy of it moves: ``chunks`` (default all
    of them), its manifest and its prefix index records."""
    manifest, envelope = await load_manifest(store, name)
    keys = set(manifest.chunk_keys())
    records = [k for k in await store.list_prefix("prefixes/") if k.endswith(manifest.key.partition("/")[2])]
    moved = keys if chunks is None else chunks
    sizes = {ref.key: ref.nbytes for ref in manifest.chunk_refs()}
    return keys, sum(sizes[k] for k in moved) + len(envelope) + sum([len(await store.get(k)) for k in records])


def test_a_pulled_conversation_continues_with_the_uninterrupted_tokens_without_computing_the_history(make_engine,
                                                                                                    remote):
    async def body() -> None:
        here, there = make_engine(store=MemoryStore()), make_engine(store=MemoryStore())
        replies, messages = await converse(here, [FIRST], GREEDY)
        name = replies[0].conversation
        keys, moved = await generation_bytes(here.store, name)
        pushed = await push(here, name, remote())
        assert (pushed.chunks_sent, pushed.bytes_sent) == (len(keys), moved)
        from_remote = remote()
        pulled = await pull(there, name, from_remote)
        assert pulled.bytes_sent == from_remote.bytes_read == moved  # each chunk moved once each way

        same = {**GREEDY, "conversation": name}  # what a page that pulled it sends
        mine, _ = await converse(here, ["and then?"], same, messages)  # the uninterrupted run
        theirs, _ = await converse(there, ["and then?"], same, messages)
        assert theirs[0].token_ids == mine[0].token_ids
        assert theirs[0].conversation == name
        assert theirs[0].usage.cached_tokens == mine[0].usage.cached_tokens > len(FIRST) // 2
        assert theirs[0].usage.timings.prefill_tokens == mine[0].usage.timings.prefill_tokens

        before = keys
        keys, _ = await generation_bytes(here.store, name)
        _, moved = await generation_bytes(here.store, name, keys - before)
        second = await push(here, name, remote())  # after one more turn: only the new chunks
        assert (second.chunks_sent, second.bytes_sent) == (len(keys - before), moved)
        assert 0 < second.chunks_sent < len(keys)

    run(body())


def test_a_second_push_of_a_conversation_shorter_than_a_chunk_writes_nothing(make_engine, remote):
    async def body() -> None:
        here = make_engine(store=MemoryStore(), chunk_tokens=256)
        replies, _ = await converse(here, ["hi"], GREEDY)
        name = replies[0].conversation
        manifest, _ = await load_manifest(here.store, name)
        assert manifest.num_logical_pages < manifest.pages_per_chunk  # each group's one chunk is partial
        first = await push(here, name, remote())
        again = remote()
        second = await push(here, name, again)
        assert first.chunks_sent == len(manifest.chunk_keys()) and second.up_to_date == first.copied
        assert (second.copied, second.chunks_sent, second.bytes_sent, again.bytes_written) == ((), 0, 0, 0)

    run(body())


async def continued_on_another_device(make_engine: Any, remote: Any) -> tuple[Any, str, list, list]:
    """A conversation pushed from one engine, pulled, continued and pushed by another: (the first engine, the name,
    its messages, the other's history)."""
    here, there = make_engine(store=MemoryStore()), make_engine(store=MemoryStore())
    replies, messages = await converse(here, [FIRST], GREEDY)
    name = replies[0].conversation
    await push(here, name, remote())
    await pull(there, name, remote())
    _, history = await converse(there, ["and then?"], {**GREEDY, "conversation": name}, messages)
    await push(there, name, remote())
    return here, name, messages, history


def test_a_push_onto_a_conversation_another_device_continued_is_a_conflict(make_engine, remote):
    async def body() -> None:
        here, name, _, _ = await continued_on_another_device(make_engine, remote)
        with pytest.raises(ConflictError, match=f"{name}: .* holds generation"):
            await push(here, name, remote())

    run(body())


def test_copies_that_went_apart_are_kept_beside_each_other_by_push_and_pull(make_engine, remote):
    async def body() -> None:
        here, name, messages, history = await continued_on_another_device(make_engine, remote)
        mine, _ = await converse(here, ["something else"], {**GREEDY, "conversation": name}, messages)
        theirs = (await load_manifest(remote(), name))[0]

        pushed = await push(here, name, remote())
        kept = pushed.kept_apart[name]
        assert kept.startswith(f"{name}.apart-") and pushed.copied[0].startswith(f"manifests/{kept}/")
        assert (await load_manifest(remote(), name))[0] == theirs  # the server's copy stays as it was
        assert (await load_manifest(remote(), kept))[0].app_state["generated_tokens"] == list(mine[0].token_ids)

        pulled = await pull(here, name, remote())  # the other device's copy comes in beside this one's
        assert pulled.kept_apart[name].startswith(f"{name}.apart-") and pulled.kept_apart[name] != kept
        assert (await load_manifest(here.store, name))[0].app_state["generated_tokens"] == list(mine[0].token_ids)
        assert (await load_manifest(here.store, pulled.kept_apart[name]))[0].app_state == theirs.app_state
        went_on, _ = await converse(here, ["and?"], {**GREEDY, "conversation": pulled.kept_apart[name]}, history)
        assert went_on[0].conversation == pulled.kept_apart[name] and went_on[0].usage.cached_tokens > len(FIRST) // 2

    run(body())


def test_a_pulled_conversation_of_another_model_is_refused_by_the_engine(make_engine, remote):
    async def body() -> None:
        here = make_engine(store=MemoryStore())
        replies, messages = await converse(here, [FIRST], GREEDY)
        name = replies[0].conversation
        await push(here, name, remote())
        other = make_engine(store=MemoryStore(), model=DoubleLM(max_context=1024, name="other"))
        await pull(other, name, remote())
        with pytest.raises(FieldError) as caught:
            await other.chat([*messages, {"role": "user", "content": "and then?"}], **GREEDY, conversation=name)
        assert caught.value.field == "conversation"

    run(body())


def test_a_refused_pull_into_object_storage_names_it_by_its_url(make_engine, s3_server):
    async def body() -> None:
        url = s3_server.new_url()
        here, elsewhere = make_engine(store=s3_server.store(url)), MemoryStore()
        replies, messages = await converse(here, [FIRST], GREEDY)
        name = replies[0].conversation
        await push(here, name, elsewhere)
        await converse(here, ["and then?"], {**GREEDY, "conversation": name}, messages)
        await here.release(name)
        with pytest.raises(ConflictError) as caught:
            await pull(here, name, elsewhere)  # this store's copy goes on from the other's
        assert f"{name}: {url} holds generation" in str(caught.value)

    run(body())


def test_pulling_a_conversation_the_remote_lacks_is_not_found(make_engine, remote):
    with pytest.raises(NotFoundError, match="'nope'"):
        run(pull(make_engine(store=MemoryStore()), "nope", remote()))


def test_push_needs_an_engine_with_a_store(make_engine, remote):
    with pytest.raises(FieldError) as caught:
        run(push(make_engine(), "chat", remote()))
    assert caught.value.field == "engine.store"
