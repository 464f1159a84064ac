"""SIGKILL Chromium while an autosave loop runs; relaunch on the same profile; restore byte for byte."""

from __future__ import annotations

import time

from .browser_harness import CDPChromium, PyPage

LAYOUT = "kvtest.layout(page_size=16, num_layers=4, qk_head_dim=32)"
LIMITS = "kvtest.limits(max_total_seq_len=8192, prefill_chunk_size=64)"
SEED = 77
STEP = 24


def test_sigkill_during_autosave_then_restore(browser_prereqs, playwright_instance, web_server, tmp_path):
    profile = tmp_path / "profile"
    browser = CDPChromium(browser_prereqs["chromium"], profile, playwright_instance)
    try:
        page = PyPage(browser.context.new_page(), web_server).boot()
        page.run(f"""
            import asyncio, js
            from kvckpt_web import PagedKVCache
            from kvckpt_web.gpu.browser import BrowserDevice
            from kvckpt_web.stores.indexeddb import IndexedDBStore
            from kvckpt_web.stores.opfs import OPFSStore
            from kvckpt_web.durable.save import save
            dev = await BrowserDevice.open()
            stores = {{"idb": await IndexedDBStore.open("crash"), "opfs": await OPFSStore.open("crash")}}
            cache = PagedKVCache(dev, {LAYOUT}, {LIMITS})
            cache.add_sequence(0)
            js.window.kvCommitted = js.Object.new()

            async def autosave():
                length = 0
                while length + {STEP} <= 8000:
                    kvtest.append(cache, 0, {SEED}, length, {STEP})
                    length += {STEP}
                    for kind, store in stores.items():
                        await save(cache, 0, store, "chat", app_state={{"length": length}})
                        setattr(js.window.kvCommitted, kind, length)   # committed: the save returned

            task = asyncio.ensure_future(autosave())
        """)
        deadline = time.monotonic() + 60
        committed = {}
        while time.monotonic() < deadline:
            committed = page.page.evaluate("() => ({...window.kvCommitted})")
            if min(committed.get("idb", 0), committed.get("opfs", 0)) >= 5 * STEP:
                break
            time.sleep(0.05)
        assert min(committed.get("idb", 0), committed.get("opfs", 0)) >= 5 * STEP, committed
    finally:
        browser.kill()  # SIGKILL, mid-loop

    browser = CDPChromium(browser_prereqs["chromium"], profile, playwright_instance)
    try:
        page = PyPage(browser.context.new_page(), web_server).boot()
        out = page.run(f"""
            from kvckpt_web import PagedKVCache
            from kvckpt_web.gpu.browser import BrowserDevice
            from kvckpt_web.stores.indexeddb import IndexedDBStore
            from kvckpt_web.stores.opfs import OPFSStore
            from kvckpt_web.durable.restore import restore
            dev = await BrowserDevice.open()
            result = {{}}
            for kind, opener in (("idb", IndexedDBStore.open), ("opfs", OPFSStore.open)):
                store = await opener("crash")
                cache = PagedKVCache(dev, {LAYOUT}, {LIMITS})
                r = await restore(store, "chat", cache)
                groups = [bytes(g) for g in await cache.export_groups(0)]
                length = r.app_state["length"]
                result[kind] = {{"length": length, "seq_length": r.seq_length, "generation": r.generation,
                                "same": groups == kvtest.expected_groups(cache.layout, {SEED}, length)}}
                cache.close()
        """)
    finally:
        browser.close()
    for kind in ("idb", "opfs"):
        got = out[kind]
        assert got["same"] is True, (kind, got)
        assert got["seq_length"] == got["length"]
        assert got["length"] >= committed[kind], (kind, got, committed)  # nothing committed was lost
