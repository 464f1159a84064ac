"""Continue on another device: two Chromium profiles (two persistent user-data directories, as two devices) against
one ``kvckpt serve`` server that also serves a store (``--store``, ``--token``): a directory, or an S3 bucket. Profile A chats a 2,000-token
conversation with the tiny model (Engine over IndexedDB in Pyodide), pushes it through an HTTPStore; profile B
pulls it and continues with the tokens A's uninterrupted run gives, its history restored (usage.cached_tokens),
not computed again; A's second push after one more turn moves only the new chunks.

The page is the runtime's own minimal page (``kvckpt_web/web/index.html``: Pyodide and the wheel, nothing else);
what a page calls is the Python below (``kvckpt_web.engine.push`` / ``pull`` with an ``HTTPStore``).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from .browser_harness import CHROMIUM_FLAGS, PyPage, run_desktop

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))
from tiny_llama import CORPUS, write_tiny_llama  # noqa: E402

TOKEN = "two-profiles-one-store-token"
LONG = " ".join(random.Random(0).choice(CORPUS.split()) for _ in range(1960))  # 2,000 tokens with the template
SETTINGS = "temperature=1.0, seed=11, max_tokens=24"  # the random tiny model repeats one token when greedy

SETUP = f"""
    from js import location
    from kvckpt_web.durable.catalog import load_manifest
    from kvckpt_web.engine import Engine, EngineConfig, pull, push
    from kvckpt_web.model.loader import load_model
    from kvckpt_web.stores.http import HTTPStore
    from kvckpt_web.stores.indexeddb import IndexedDBStore
    tiny = load_model("/home/pyodide/tiny.gguf", dev)
    store = await IndexedDBStore.open("conversations")
    engine = Engine(tiny, dev, store=store, config=EngineConfig(prefill_chunk=512, sequences=2))
    remote = lambda: HTTPStore(location.origin + "/", token={TOKEN!r})

    async def generation(name, before=frozenset()):
        manifest, envelope = await load_manifest(store, name)
        refs = {{r.key: r.nbytes for r in manifest.chunk_refs()}}
        records = [k for k in await store.list_prefix("prefixes/") if k.endswith(manifest.key.partition("/")[2])]
        extra = len(envelope) + sum([len(await store.get(k)) for k in records])
        new = set(refs) - set(before)
        return sorted(refs), len(new), sum(refs[k] for k in new) + extra
"""


@pytest.fixture(scope="module", params=["directory", "s3"])
def server(request, browser_prereqs, fresh_wheel, tmp_path_factory):
    """``kvckpt serve``'s app serving the runtime and a store: a directory, or an S3 bucket (moto) behind it."""
    from kvckpt_web.server.run import serve_in_thread
    from kvckpt_web.server.store_routes import StoreRoutes
    from kvckpt_web.stores.file import FileStore

    if request.param == "s3":
        pytest.importorskip("obstore")
        s3 = request.getfixturevalue("s3_server")
        backing = s3.store(s3.new_url())
    else:
        backing = FileStore(tmp_path_factory.mktemp("remote"))
    server, url = serve_in_thread(browser_prereqs["pyodide"], [fresh_wheel, browser_prereqs["wheels"]], port=0,
                                  routes=StoreRoutes(backing, TOKEN).routes())
    yield url, backing
    server.shutdown()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> bytes:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny.gguf",
                            metadata={"context_length": 4096}).read_bytes()


def profile(playwright_instance, browser_prereqs, tmp_path_factory, url: str, tiny: bytes, name: str):
    context = playwright_instance.chromium.launch_persistent_context(
        str(tmp_path_factory.mktemp(name)), executable_path=browser_prereqs["chromium"], headless=True,
        args=CHROMIUM_FLAGS)
    page = PyPage(context.new_page(), url).boot()
    page.page.set_default_timeout(600_000)
    page.write_file("/home/pyodide/tiny.gguf", tiny)
    page.run("""
        from kvckpt_web.gpu.browser import BrowserDevice
        dev = await BrowserDevice.open()
    """)
    page.run(SETUP)
    return context, page


@pytest.fixture(scope="module")
def devices(playwright_instance, browser_prereqs, tmp_path_factory, server, tiny):
    made = [profile(playwright_instance, browser_prereqs, tmp_path_factory, server[0], tiny, name)
            for name in ("device-a", "device-b")]
    yield [page for _, page in made]
    for context, _ in made:
        context.close()


def test_a_conversation_pushed_from_one_profile_continues_in_another_with_the_uninterrupted_tokens(devices, server):
    a, b = devices
    held = set(run_desktop(server[1].list_prefix("chunks/")))  # none, unless a first try of this test pushed them
    first = a.run(f"""
        messages = [{{"role": "user", "content": {LONG!r}}}]
        reply = await engine.chat(messages, {SETTINGS})
        name = reply.conversation
        messages += [{{"role": "assistant", "content": reply.text}}, {{"role": "user", "content": "and then?"}}]
        chunks, count, moved = await generation(name, {held!r})
        to_remote = remote()
        pushed = await push(engine, name, to_remote)
        result = {{"name": name, "messages": messages, "tokens": reply.usage.prompt_tokens + len(reply.token_ids),
                  "chunks": chunks, "count": count, "moved": moved, "sent": pushed.chunks_sent,
                  "bytes": pushed.bytes_sent, "written": to_remote.bytes_written}}
    """)
    assert first["tokens"] >= 2000
    assert (first["sent"], first["bytes"], first["written"]) == (first["count"], first["moved"], first["moved"])
    assert run_desktop(server[1].list_prefix("chunks/")) == first["chunks"]  # the remote holds exactly its chunks

    name, messages = first["name"], first["messages"]
    pulled = b.run(f"""
        from_remote = remote()
        pulled = await pull(engine, {name!r}, from_remote)
        reply = await engine.chat({messages!r}, {SETTINGS}, conversation={name!r})
        result = {{"bytes": pulled.bytes_sent, "read": from_remote.bytes_read, "ids": list(reply.token_ids),
                  "cached": reply.usage.cached_tokens, "prefilled": reply.usage.timings.prefill_tokens,
                  "prompt": reply.usage.prompt_tokens}}
    """)
    assert pulled["bytes"] == pulled["read"] == first["moved"]  # each chunk moved once, each way

    again = a.run(f"""
        reply = await engine.chat({messages!r}, {SETTINGS}, conversation={name!r})  # the uninterrupted run
        chunks, count, moved = await generation({name!r}, set({first["chunks"]!r}))
        pushed = await push(engine, {name!r}, remote())
        result = {{"ids": list(reply.token_ids), "cached": reply.usage.cached_tokens,
                  "prefilled": reply.usage.timings.prefill_tokens, "count": count, "moved": moved,
                  "sent": pushed.chunks_sent, "bytes": pushed.bytes_sent, "all": len(chunks)}}
    """)
    assert pulled["ids"] == again["ids"] and len(set(again["ids"])) > 1
    assert pulled["cached"] == again["cached"] >= first["tokens"] - 16  # the history came from the store
    assert pulled["prefilled"] == again["prefilled"] == pulled["prompt"] - pulled["cached"]
    assert (again["sent"], again["bytes"]) == (again["count"], again["moved"])  # only the new chunks
    assert 0 < again["sent"] < again["all"]
