"""Cross-environment: checkpoints move between the browser (Pyodide, SwiftShader) and desktop (wgpu-py) byte for byte."""

from __future__ import annotations

import base64
import json

from . import kvtest
from .browser_harness import run_desktop
from kvckpt_web import PagedKVCache
from kvckpt_web.durable.restore import restore
from kvckpt_web.durable.save import save
from kvckpt_web.stores.memory import MemoryStore


def test_browser_checkpoint_loads_on_desktop(py_page, device):
    out = py_page.run("""
        from kvckpt_web import PagedKVCache
        lay = kvtest.layout(num_layers=3)
        cache = PagedKVCache(dev, lay, kvtest.limits())
        cache.add_sequence(2)
        kvtest.append(cache, 2, 11, 0, 21)
        result = {"meta": cache.get_checkpoint_metadata(2),
                  "groups": [kvtest.b64(g) for g in await cache.export_groups(2)]}
        cache.close()
    """)
    groups = [base64.b64decode(g) for g in out["groups"]]
    lay = kvtest.layout(num_layers=3)
    assert groups == kvtest.expected_groups(lay, 11, 21)

    async def desktop():
        cache = PagedKVCache.from_metadata(device, out["meta"])
        try:
            await cache.load_checkpoint(out["meta"], groups)
            k, v = await cache.debug_get_kv(2, 0, 21)
            return cache.get_checkpoint_metadata(2), [bytes(g) for g in await cache.export_groups(2)], k, v
        finally:
            cache.close()

    meta, again, k, v = run_desktop(desktop())
    assert meta == out["meta"]
    assert again == groups
    assert k.data == b"".join(kvtest.token_bytes(11, layer, 0, 0, 21, lay) for layer in range(3))
    assert v.data == b"".join(kvtest.token_bytes(11, layer, 1, 0, 21, lay) for layer in range(3))


def test_desktop_checkpoint_loads_in_browser(py_page, device):
    lay = kvtest.layout(dtype="float32", qk_head_dim=4)

    async def desktop():
        cache = PagedKVCache(device, lay, kvtest.limits())
        try:
            cache.add_sequence(0)
            kvtest.append(cache, 0, 5, 0, 17)
            return cache.get_checkpoint_metadata(0), [bytes(g) for g in await cache.export_groups(0)]
        finally:
            cache.close()

    meta, groups = run_desktop(desktop())
    assert groups == kvtest.expected_groups(lay, 5, 17)
    out = py_page.run(f"""
        from kvckpt_web import PagedKVCache
        meta = {meta!r}
        groups = [kvtest.unb64(g) for g in {[kvtest.b64(g) for g in groups]!r}]
        cache = PagedKVCache.from_metadata(dev, meta)
        await cache.load_checkpoint(meta, groups)
        again = [bytes(g) for g in await cache.export_groups(0)]
        result = {{"same": again == groups, "meta": cache.get_checkpoint_metadata(0) == meta,
                  "len": cache.get_sequence_length(0)}}
        cache.close()
    """)
    assert out == {"same": True, "meta": True, "len": 17}


def test_persisted_container_moves_both_ways(py_page, device):
    """A save() container written in the browser restores on desktop, and back."""
    out = py_page.run("""
        from kvckpt_web import PagedKVCache
        from kvckpt_web.durable.save import save
        from kvckpt_web.stores.memory import MemoryStore
        cache = PagedKVCache(dev, kvtest.layout(), kvtest.limits())
        cache.add_sequence(0)
        kvtest.append(cache, 0, 21, 0, 14)
        data = {}
        await save(cache, 0, MemoryStore(data), "chat", app_state={"from": "browser"})
        result = {k: kvtest.b64(v) for k, v in data.items()}
        cache.close()
    """)
    data = {k: base64.b64decode(v) for k, v in out.items()}
    lay = kvtest.layout()

    async def desktop():
        cache = PagedKVCache(device, lay, kvtest.limits())
        try:
            r = await restore(MemoryStore(data), "chat", cache)
            groups = [bytes(g) for g in await cache.export_groups(0)]
            kvtest.append(cache, 0, 21, 14, 6)
            back: dict[str, bytes] = {}
            await save(cache, 0, MemoryStore(back), "chat", app_state={"from": "desktop"})
            return r, groups, back
        finally:
            cache.close()

    r, groups, back = run_desktop(desktop())
    assert r.app_state == {"from": "browser"} and r.seq_length == 14
    assert groups == kvtest.expected_groups(lay, 21, 14)
    res = py_page.run(f"""
        from kvckpt_web import PagedKVCache
        from kvckpt_web.durable.restore import restore
        from kvckpt_web.stores.memory import MemoryStore
        data = {{k: kvtest.unb64(v) for k, v in {json.dumps({k: kvtest.b64(v) for k, v in back.items()})}.items()}}
        cache = PagedKVCache(dev, kvtest.layout(), kvtest.limits())
        r = await restore(MemoryStore(data), "chat", cache)
        groups = [bytes(g) for g in await cache.export_groups(0)]
        result = {{"app": r.app_state, "same": groups == kvtest.expected_groups(cache.layout, 21, 20)}}
        cache.close()
    """)
    assert res == {"app": {"from": "desktop"}, "same": True}
