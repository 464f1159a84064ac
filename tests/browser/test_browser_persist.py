"""IndexedDBStore and OPFSStore: the Store contract, persistence across navigation, quota errors, Web Locks."""

from __future__ import annotations

import hashlib

import pytest

from .browser_harness import PyPage

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
        from kvckpt_web.stores.{kind.removesuffix('Store').lower()} import {kind} as S
        from kvckpt_web.errors import FieldError, StoreError
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
        except FieldError:
            r["bad_key"] = "FieldError"
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
                   "bad_key": "FieldError", "ro": "StoreError", "batch": "b",
                   "if_absent": [False, True, "x", "n"], "bytes_written": 3 + 3 + 70000 + 1 + 1 + 1}


@pytest.mark.parametrize("kind", STORES)
def test_lock_excludes_other_holders_and_tabs(py_page, fresh_page, kind):
    py_page.run(f"""
        import asyncio
        from kvckpt_web.stores.{kind.removesuffix('Store').lower()} import {kind} as S
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
        from kvckpt_web.stores.{kind.removesuffix('Store').lower()} import {kind} as S
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
def test_claim_refuses_other_holders_and_tabs_at_once_and_is_released_on_exit(py_page, fresh_page, kind):
    module = kind.removesuffix("Store").lower()
    py_page.run(f"""
        from kvckpt_web.stores.{module} import {kind} as S
        claim_store = await S.open("claimed-{kind}")
        held_claim = claim_store.claim("chat")
        await held_claim.__aenter__()
    """)
    other_tab = fresh_page.page.evaluate("""(name) => navigator.locks.request(name, {ifAvailable: true},
        (lock) => lock !== null)""", f"kvckpt:{module}:claimed-{kind}:claim:chat")
    other_tab_py = fresh_page.run(f"""
        from kvckpt_web.stores.{module} import {kind} as S
        from kvckpt_web.errors import ConflictError
        s = await S.open("claimed-{kind}")
        try:
            async with s.claim("chat"):
                result = "claimed"
        except ConflictError as exc:
            result = str(exc)
        async with s.claim("other"):
            result = [result, "another name claimed"]
    """)
    same_tab = py_page.run(f"""
        from kvckpt_web.errors import ConflictError, StoreError
        result = []
        try:
            async with claim_store.claim("chat"):
                result.append("claimed")
        except ConflictError:
            result.append("ConflictError")
        await held_claim.__aexit__(None, None, None)
        try:
            async with claim_store.claim("chat"):
                raise RuntimeError("boom")
        except RuntimeError:
            pass
        async with claim_store.claim("chat"):
            result.append("free again")
        try:
            (await S.open("claimed-{kind}", read_only=True)).claim("chat")
            result.append("read-only accepted")
        except StoreError:
            result.append("read-only StoreError")
    """)
    assert other_tab is False
    assert "'chat'" in other_tab_py[0] and "held by another writer" in other_tab_py[0]
    assert other_tab_py[1] == "another name claimed"
    assert same_tab == ["ConflictError", "free again", "read-only StoreError"]


@pytest.mark.parametrize("kind", STORES)
def test_save_navigate_away_and_back_restore(fresh_page, web_server, kind):
    saved = fresh_page.run(f"""
        from kvckpt_web import PagedKVCache
        from kvckpt_web.gpu.browser import BrowserDevice
        from kvckpt_web.stores.{kind.removesuffix('Store').lower()} import {kind} as S
        from kvckpt_web.durable.save import save
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
        from kvckpt_web.stores.{kind.removesuffix('Store').lower()} import {kind} as S
        from kvckpt_web.durable.restore import restore
        dev = await BrowserDevice.open()
        store = await S.open("nav-{kind}")
        cache = PagedKVCache(dev, kvtest.layout(), kvtest.limits())
        r = await restore(store, "chat", cache)
        groups = [bytes(g) for g in await cache.export_groups(0)]
        result = {{"generation": r.generation, "app": r.app_state, "len": r.seq_length,
                  "same": groups == kvtest.expected_groups(cache.layout, 31, 19)}}
    """)
    assert out == {"generation": saved["generation"], "app": {"turn": 2}, "len": 19, "same": True}


# A checkpoint over a real quota (CDP Storage.overrideQuotaForOrigin), driven through the JS API. Pages are
# 128 KiB per layer, so a checkpoint's chunks hold 8 pages (1 MiB). The committed checkpoint has one 128 KiB
# chunk per layer; the failing one two, of 1 MiB and 128 KiB: the big ones never fit in QUOTA_MARGIN, the small
# ones may (their writes race the big ones for the quota). Each test runs on an origin of its own (a name under
# .localhost) whose quota is set before its first write: IndexedDB grants writes from the free space it last
# asked the quota manager for during up to 30 s, so an origin that wrote before would not see the new quota.
QUOTA_LAYOUT = "{page_size: 32, num_layers: 2, num_qo_heads: 8, num_kv_heads: 8, qk_head_dim: 128, dtype: 'float16'}"
QUOTA_LIMITS = "{max_total_seq_len: 512, prefill_chunk_size: 512}"
QUOTA_MARGIN = 768 * 1024
COMMITTED, GROWN = 32, 288  # tokens of the committed checkpoint, and of the one that does not fit
HANG_MS = 30_000  # a promise still pending after this long never settles

QUOTA_SETUP = f"""async ([store, storeName]) => {{
    const kv = await window.kvckpt;
    const cache = await kv.createCache({QUOTA_LAYOUT}, {QUOTA_LIMITS});
    cache.addSequence(0);
    const tokens = (n) => [0, 1].map(() => [0, 1].map(() => {{
        const bytes = new Uint8Array(n * 8 * 128 * 2);
        for (let i = 0; i < bytes.length; i += 65536) crypto.getRandomValues(bytes.subarray(i, i + 65536));
        return bytes;
    }}));
    cache.append([0], [{COMMITTED}], tokens({COMMITTED}));
    await cache.checkpoint({{seqId: 0, store, storeName, name: "chat", appState: {{turn: 1}}}});
    cache.append([0], [{GROWN - COMMITTED}], tokens({GROWN - COMMITTED}));
    window.quotaCache = cache;
}}"""

QUOTA_CHECKPOINT = f"""async ([store, storeName]) => {{
    const saving = window.quotaCache.checkpoint({{seqId: 0, store, storeName, name: "chat", appState: {{turn: 2}}}})
        .then((r) => "saved generation " + r.generation, (e) => `${{e.name}}: ${{e.message}}`);
    return Promise.race([saving, new Promise((done) => setTimeout(() => done("still pending"), {HANG_MS}))]);
}}"""

QUOTA_RESTORE = f"""async ([store, storeName]) => {{
    const kv = await window.kvckpt;
    const other = await kv.createCache({QUOTA_LAYOUT}, {QUOTA_LIMITS});
    const restored = await other.restore({{store, storeName, name: "chat"}});
    const n = restored.seqLength;
    const a = await window.quotaCache.readKV(0, 0, n), b = await other.readKV(0, 0, n);
    const same = (x, y) => x.length === y.length && x.every((v, i) => v === y[i]);
    return {{generation: restored.generation, appState: restored.appState, length: n,
             same: same(a.k, b.k) && same(a.v, b.v)}};
}}"""

JS_STORES = ["indexeddb", "opfs"]
PY_STORES = {"indexeddb": "IndexedDBStore", "opfs": "OPFSStore"}


class QuotaPage(PyPage):
    """A booted page on an origin of its own, whose storage quota is set through CDP."""

    def __init__(self, page, base_url: str) -> None:
        super().__init__(page, base_url)
        self.boot()
        self.cdp = page.context.new_cdp_session(page)
        self.origin = page.evaluate("location.origin")

    def fill(self, store: str, store_name: str) -> None:
        """A quota of the origin's usage plus QUOTA_MARGIN, then a committed checkpoint of COMMITTED tokens
        and GROWN tokens in the page's cache (``window.quotaCache``)."""
        usage = self.cdp.send("Storage.getUsageAndQuota", {"origin": self.origin})["usage"]
        self.cdp.send("Storage.overrideQuotaForOrigin", {"origin": self.origin, "quotaSize": usage + QUOTA_MARGIN})
        self.page.evaluate(QUOTA_SETUP, [store, store_name])

    def lift(self) -> None:
        """The browser's own quota again."""
        self.cdp.send("Storage.overrideQuotaForOrigin", {"origin": self.origin})


@pytest.fixture(scope="module")
def used_origins() -> set[str]:
    """The origin labels quota pages of this module were given: a rerun of a test gets one its failed first
    attempt did not write to."""
    return set()


@pytest.fixture
def quota_page(browser_context, web_server, request, used_origins):
    attempt = 0
    while (label := hashlib.sha256(f"{request.node.nodeid}#{attempt}".encode()).hexdigest()[:12]) in used_origins:
        attempt += 1
    used_origins.add(label)
    page = QuotaPage(browser_context.new_page(), web_server.replace("127.0.0.1", f"q{label}.localhost"))
    yield page
    page.lift()
    page.page.close()


def chunk_keys(page: PyPage, store: str, store_name: str) -> list[str]:
    return page.run(f"""
        from kvckpt_web.stores.{store} import {PY_STORES[store]} as S
        result = await (await S.open("{store_name}")).list_prefix("chunks/")
    """)


def lock_is_free(page: PyPage, store: str, store_name: str) -> bool:
    return page.page.evaluate("""(name) => navigator.locks.request(name, {ifAvailable: true},
        (lock) => lock !== null)""", f"kvckpt:{store}:{store_name}")


@pytest.mark.parametrize("store", JS_STORES)
def test_checkpoint_over_a_full_quota_rejects_with_a_store_error_naming_the_quota(quota_page, store):
    quota_page.fill(store, f"quota-error-{store}")
    outcome = quota_page.page.evaluate(QUOTA_CHECKPOINT, [store, f"quota-error-{store}"])
    assert outcome.startswith("StoreError: ") and "storage quota exceeded" in outcome, outcome


@pytest.mark.parametrize("store", JS_STORES)
def test_checkpoint_over_a_full_quota_releases_the_store_lock(quota_page, store):
    quota_page.fill(store, f"quota-lock-{store}")
    quota_page.page.evaluate(QUOTA_CHECKPOINT, [store, f"quota-lock-{store}"])
    assert lock_is_free(quota_page, store, f"quota-lock-{store}")


@pytest.mark.parametrize("store", JS_STORES)
def test_checkpoint_over_a_full_quota_keeps_the_last_committed_generation(quota_page, store):
    quota_page.fill(store, f"quota-keep-{store}")
    quota_page.page.evaluate(QUOTA_CHECKPOINT, [store, f"quota-keep-{store}"])
    restored = quota_page.page.evaluate(QUOTA_RESTORE, [store, f"quota-keep-{store}"])
    assert restored == {"generation": 1, "appState": {"turn": 1}, "length": COMMITTED, "same": True}


def put_orphan_chunks(page: PyPage, store: str, store_name: str, count: int) -> list[str]:
    """Store ``count`` chunks no manifest names, as a save killed between its chunks and its manifest leaves."""
    return page.run(f"""
        import hashlib
        from kvckpt_web.durable.keys import chunk_key
        from kvckpt_web.stores.{store} import {PY_STORES[store]} as S
        s = await S.open("{store_name}")
        result = []
        for i in range({count}):
            data = bytes([i]) * 4096
            result.append(chunk_key(hashlib.sha256(data).hexdigest()))
            await s.set(result[-1], data)
        result.sort()
    """)


@pytest.mark.parametrize("store", JS_STORES)
def test_js_gc_removes_the_chunks_a_killed_save_left_and_keeps_the_committed_generation(quota_page, store):
    name = f"gc-orphans-{store}"
    quota_page.lift()  # the usual quota: only what gc does is under test
    quota_page.page.evaluate(QUOTA_SETUP, [store, name])
    committed = chunk_keys(quota_page, store, name)
    orphans = put_orphan_chunks(quota_page, store, name, 3)
    gc = quota_page.page.evaluate("""async ([store, storeName]) =>
        (await window.kvckpt).gc({store, storeName})""", [store, name])
    assert gc["deletedChunks"] == len(orphans) and len(gc["keptManifests"]) == 1
    assert chunk_keys(quota_page, store, name) == committed
    assert quota_page.page.evaluate(QUOTA_RESTORE, [store, name]) == {
        "generation": 1, "appState": {"turn": 1}, "length": COMMITTED, "same": True}


@pytest.mark.parametrize("store", JS_STORES)
def test_js_gc_after_a_checkpoint_over_quota_leaves_exactly_the_committed_chunks(quota_page, store):
    # Which of the failed save's concurrent writes fit before the quota stopped it varies from run to run;
    # whatever it stored, gc removes, and only that.
    name = f"quota-gc-{store}"
    quota_page.fill(store, name)
    committed = chunk_keys(quota_page, store, name)
    quota_page.page.evaluate(QUOTA_CHECKPOINT, [store, name])
    left = sorted(set(chunk_keys(quota_page, store, name)) - set(committed))
    gc = quota_page.page.evaluate("""async ([store, storeName]) =>
        (await window.kvckpt).gc({store, storeName})""", [store, name])
    assert gc["deletedChunks"] == len(left) and len(gc["keptManifests"]) == 1
    assert chunk_keys(quota_page, store, name) == committed
    assert quota_page.page.evaluate(QUOTA_RESTORE, [store, name]) == {
        "generation": 1, "appState": {"turn": 1}, "length": COMMITTED, "same": True}


@pytest.mark.parametrize("store", JS_STORES)
def test_checkpoint_after_one_over_quota_is_restorable_once_there_is_room(quota_page, store):
    name = f"quota-retry-{store}"
    quota_page.fill(store, name)
    quota_page.page.evaluate(QUOTA_CHECKPOINT, [store, name])
    quota_page.lift()
    outcome = quota_page.page.evaluate(QUOTA_CHECKPOINT, [store, name])
    restored = quota_page.page.evaluate(QUOTA_RESTORE, [store, name])
    assert outcome == "saved generation 2"
    assert restored == {"generation": 2, "appState": {"turn": 2}, "length": GROWN, "same": True}


@pytest.mark.parametrize("record", ["'text'", "42", "{bytes: [1, 2]}"])
def test_indexeddb_record_that_is_not_bytes_is_a_corruption_error_naming_the_key(fresh_page, record):
    fresh_page.run("""
        from kvckpt_web.stores.indexeddb import IndexedDBStore
        s = await IndexedDBStore.open("not-bytes")
        await s.set("chunks/x", b"placeholder")
    """)
    fresh_page.page.evaluate(f"""() => new Promise((resolve, reject) => {{
        const open = indexedDB.open("not-bytes");
        open.onsuccess = () => {{
            const tx = open.result.transaction("kv", "readwrite");
            tx.objectStore("kv").put({record}, "chunks/x");
            tx.oncomplete = () => {{ open.result.close(); resolve(); }};
            tx.onerror = () => reject(tx.error);
        }};
        open.onerror = () => reject(open.error);
    }})""")
    error = fresh_page.run("""
        from kvckpt_web.stores.indexeddb import IndexedDBStore
        from kvckpt_web.errors import CorruptionError
        s = await IndexedDBStore.open("not-bytes")
        try:
            await s.get("chunks/x")
            result = "no error"
        except CorruptionError as exc:
            result = str(exc)
    """)
    assert "'chunks/x'" in error and "expected bytes" in error, error
