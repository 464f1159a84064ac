"""IndexedDBStore and OPFSStore: the Store contract, persistence across navigation, quota errors, Web Locks."""

from __future__ import annotations

import pytest

from browser_harness import PyPage

STORES = ["IndexedDBStore", "OPFSStore"]


@pytest.fixture
def fresh_page(browser_context, web_server):
    """A new tab of the session's browser (same profile, so same storage), booted."""
    page = PyPage(browser_context.new_page(), web_server).boot()
    yield page
    page.page.close()


@pytest.mark.parametrize("kind", STORES)
def test_store_contract(py_page, kind):
    out = py_page.run(f"""
        from kvckpt_web.stores.browser import {kind} as S
        from kvckpt_web.errors import FormatError, StoreError
        s = await S.open("contract-{kind}")
        for k in await s.list_prefix(""):
            await s.delete(k)
        r = {{}}
        r["missing"] = await s.get("a/b")
        await s.set("a/b", b"one"); await s.set("a/b", b"two"); await s.set("a/c/d", bytearray(b"\\x00" * 70000))
        await s.set("top", memoryview(b"x"))
        r["get"] = (await s.get("a/b")).decode()
        r["big"] = len(await s.get("a/c/d"))
        r["exists"] = [await s.exists("a/b"), await s.exists("a/zz"), await s.exists("a")]
        r["list"] = await s.list_prefix("a/")
        r["list_all"] = await s.list_prefix("")
        await s.delete("a/c/d"); await s.delete("never")
        r["after_delete"] = await s.list_prefix("")
        try:
            await s.set("../x", b""); r["bad_key"] = "accepted"
        except FormatError:
            r["bad_key"] = "FormatError"
        ro = await S.open("contract-{kind}", read_only=True)
        try:
            await ro.set("z", b""); r["ro"] = "accepted"
        except StoreError:
            r["ro"] = "StoreError"
        async with s.batch():
            await s.set("in/batch", b"b")
        r["batch"] = (await s.get("in/batch")).decode()
        await s.delete("in/batch")
        r["if_absent"] = [await s.set_if_absent("top", b"y"), await s.set_if_absent("new", b"n"),
                          (await s.get("top")).decode(), (await s.get("new")).decode()]
        await s.delete("new")
        r["bytes_written"] = s.bytes_written
        result = r
    """)
    assert out == {"missing": None, "get": "two", "big": 70000, "exists": [True, False, False],
                   "list": ["a/b", "a/c/d"], "list_all": ["a/b", "a/c/d", "top"], "after_delete": ["a/b", "top"],
                   "bad_key": "FormatError", "ro": "StoreError", "batch": "b",
                   "if_absent": [False, True, "x", "n"], "bytes_written": 3 + 3 + 70000 + 1 + 1 + 1}


@pytest.mark.parametrize("kind", STORES)
def test_lock_excludes_other_holders_and_tabs(py_page, fresh_page, kind):
    py_page.run(f"""
        import asyncio
        from kvckpt_web.stores.browser import {kind} as S
        lock_store = await S.open("locked-{kind}")
        held, release = asyncio.Event(), asyncio.Event()
        async def hold():
            async with lock_store.lock():
                held.set()
                await release.wait()
        holder = asyncio.ensure_future(hold())
        await held.wait()
    """)
    lock_name = f"kvckpt:{'indexeddb' if kind == 'IndexedDBStore' else 'opfs'}:locked-{kind}"
    other_tab = fresh_page.page.evaluate("""(name) => navigator.locks.request(name, {ifAvailable: true},
        (lock) => lock !== null)""", lock_name)
    other_tab_py = fresh_page.run(f"""
        from kvckpt_web.stores.browser import {kind} as S
        from kvckpt_web.errors import StoreError
        s = await S.open("locked-{kind}")
        try:
            async with s.lock(timeout=0.3):
                result = "acquired"
        except StoreError as exc:
            result = "StoreError"
    """)
    same_tab = py_page.run(f"""
        from kvckpt_web.errors import StoreError
        try:
            async with lock_store.lock(timeout=0.2):
                result = "acquired"
        except StoreError:
            result = "StoreError"
        release.set(); await holder
        async with lock_store.lock(timeout=1):
            result = [result, "free again"]
    """)
    assert other_tab is False
    assert other_tab_py == "StoreError"
    assert same_tab == ["StoreError", "free again"]


@pytest.mark.parametrize("kind", STORES)
def test_save_navigate_away_and_back_restore(fresh_page, web_server, kind):
    saved = fresh_page.run(f"""
        from kvckpt_web import PagedKVCache
        from kvckpt_web.gpu.browser import BrowserDevice
        from kvckpt_web.stores.browser import {kind} as S
        from kvckpt_web.durable.persist import save
        dev = await BrowserDevice.open()
        store = await S.open("nav-{kind}")
        cache = PagedKVCache(dev, kvtest.layout(), kvtest.limits())
        cache.add_sequence(0)
        kvtest.append(cache, 0, 31, 0, 9)
        await save(cache, 0, store, "chat", app_state={{"turn": 1}})
        kvtest.append(cache, 0, 31, 9, 10)
        r = await save(cache, 0, store, "chat", app_state={{"turn": 2}})
        result = {{"generation": r.generation, "persisted": store.persisted}}
    """)
    fresh_page.page.goto("about:blank")
    fresh_page.boot()
    out = fresh_page.run(f"""
        from kvckpt_web import PagedKVCache
        from kvckpt_web.gpu.browser import BrowserDevice
        from kvckpt_web.stores.browser import {kind} as S
        from kvckpt_web.durable.persist import restore
        dev = await BrowserDevice.open()
        store = await S.open("nav-{kind}")
        cache = PagedKVCache(dev, kvtest.layout(), kvtest.limits())
        r = await restore(store, "chat", cache)
        groups = [bytes(g) for g in await cache.export_groups(0)]
        result = {{"generation": r.generation, "app": r.app_state, "len": r.seq_length,
                  "same": groups == kvtest.expected_groups(cache.layout, 31, 19)}}
    """)
    assert out == {"generation": saved["generation"], "app": {"turn": 2}, "len": 19, "same": True}


# Chromium's real quota cannot be forced reliably here (CDP Storage.overrideQuotaForOrigin left IndexedDB
# transactions hanging), so the browser's own QuotaExceededError is injected at the API the store uses.
QUOTA_PATCH = """(limit) => {
  const err = () => new DOMException("The quota has been exceeded.", "QuotaExceededError");
  const put = IDBObjectStore.prototype.put;
  IDBObjectStore.prototype.put = function (value, key) {
    if (value && value.byteLength > limit) throw err();
    return put.call(this, value, key);
  };
  const write = FileSystemWritableFileStream.prototype.write;
  FileSystemWritableFileStream.prototype.write = function (data) {
    if (data && data.byteLength > limit) return Promise.reject(err());
    return write.call(this, data);
  };
}"""


@pytest.mark.parametrize("kind", STORES)
def test_quota_exceeded_is_store_error_and_keeps_last_checkpoint(fresh_page, kind):
    fresh_page.run(f"""
        from kvckpt_web import PagedKVCache
        from kvckpt_web.gpu.browser import BrowserDevice
        from kvckpt_web.stores.browser import {kind} as S
        from kvckpt_web.durable.persist import save
        dev = await BrowserDevice.open()
        store = await S.open("quota-{kind}")
        for k in await store.list_prefix(""):
            await store.delete(k)
        lay = kvtest.layout()
        cache = PagedKVCache(dev, lay, kvtest.limits())
        cache.add_sequence(0)
        kvtest.append(cache, 0, 1, 0, 6)
        await save(cache, 0, store, "q", app_state={{"n": 6}}, pages_per_chunk=1)
        keys_before = await store.list_prefix("")
    """)
    fresh_page.page.evaluate(QUOTA_PATCH, 2048)
    out = fresh_page.run(f"""
        import random
        from kvckpt_web.errors import StoreError
        from kvckpt_web.durable.persist import restore, save
        big = PagedKVCache(dev, lay, kvtest.limits())
        big.add_sequence(0)
        kvtest.append(big, 0, 9, 0, 60)
        try:
            await save(big, 0, store, "q", app_state={{"n": 60}}, pages_per_chunk=15)   # one 3.75 KiB chunk per layer
            err = "no error"
        except StoreError as exc:
            err = str(exc)
        other = PagedKVCache(dev, lay, kvtest.limits())
        r = await restore(store, "q", other)
        groups = [bytes(g) for g in await other.export_groups(0)]
        result = {{"err": err, "app": r.app_state, "same": groups == kvtest.expected_groups(lay, 1, 6)}}
    """)
    assert "quota exceeded" in out["err"], out["err"]
    assert out["app"] == {"n": 6} and out["same"] is True
