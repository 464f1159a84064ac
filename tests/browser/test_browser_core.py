"""Core cache behaviours on the browser backend (Pyodide + navigator.gpu on SwiftShader)."""

from __future__ import annotations

import pytest


def test_device_is_webgpu_in_pyodide(py_page):
    info = py_page.run("""
        import sys
        result = {"platform": sys.platform, "backend": dev.info.backend, "cpu": dev.info.is_cpu,
                  "max_binding": dev.info.max_storage_binding,
                  "numpy": "numpy" in sys.modules}
    """)
    assert info["platform"] == "emscripten"
    assert info["backend"] == "browser/webgpu"
    assert info["max_binding"] >= 128 * 2**20
    assert info["numpy"] is False  # the browser path runs without numpy


def test_open_device_async_auto(py_page):
    assert py_page.run("""
        from kvckpt_web import open_device, open_device_async, DeviceError
        d2 = await open_device_async()
        try:
            open_device("browser"); refused = False
        except DeviceError:
            refused = True
        result = [type(d2).__name__, refused]
    """) == ["BrowserDevice", True]


@pytest.mark.parametrize("transfer", ["kernel", "copy"])
@pytest.mark.parametrize("dtype,head_dim", [("float16", 8), ("float32", 8), ("float16", 5)])
def test_export_equals_appended_kv_with_zero_tail(py_page, transfer, dtype, head_dim):
    out = py_page.run(f"""
        from kvckpt_web import PagedKVCache
        from kvckpt_web.gpu.tensors import DeviceArray
        from kvckpt_web.gpu.device import Copy, Usage
        lay = kvtest.layout(dtype={dtype!r}, qk_head_dim={head_dim})
        cache = PagedKVCache(dev, lay, kvtest.limits(), transfer={transfer!r})
        from kvckpt_web.kv.scatter import scatter_free_pages
        scatter_free_pages(cache, first_id=10)  # every page seq 0 gets stands apart
        cache.add_sequence(0); cache.add_sequence(1)
        # interleave two sequences; 13 tokens: partial last page
        kvtest.append(cache, 0, 7, 0, 5)
        kvtest.append(cache, 1, 8, 0, 6)
        kvtest.append(cache, 0, 7, 5, 8)
        groups = await cache.export_groups(0)
        want = kvtest.expected_groups(lay, 7, 13)
        # the TVM primitive: export_page_group into a device tensor, read back
        arr = cache.empty_group(4)
        cache.export_page_group(0, 1, arr)
        staging = dev.create_buffer(arr.buffer.size, Usage.MAP_READ | Usage.COPY_DST)
        dev.submit([Copy(arr.buffer, 0, staging, 0, arr.buffer.size)])
        prim = bytes(await dev.read(staging, 0, 4 * lay.page_bytes))
        k, v = await cache.debug_get_kv(0, 3, 11)
        n = kvtest.row_bytes(lay)
        want_k = b"".join(kvtest.token_bytes(7, layer, 0, 3, 8, lay) for layer in range(lay.num_layers))
        want_v = b"".join(kvtest.token_bytes(7, layer, 1, 3, 8, lay) for layer in range(lay.num_layers))
        tail = want[0][-lay.page_bytes:]
        result = {{"groups_equal": [bytes(g) == w for g, w in zip(groups, want)], "ngroups": len(groups),
                  "prim_equal": prim == want[1], "k": k.data == want_k, "v": v.data == want_v,
                  "len": cache.get_sequence_length(0), "seq1": cache.get_sequence_length(1),
                  "tail_zero": tail.count(0), "tail_expected_zero": len(tail) * 3 // 4,
                  "pages": cache.seqs.get(0).pages}}
        dev.destroy(staging); dev.destroy(arr.buffer); cache.close()
    """)
    assert out["ngroups"] == 2 and all(out["groups_equal"])
    assert out["prim_equal"] and out["k"] and out["v"]
    assert out["len"] == 13 and out["seq1"] == 6
    assert out["tail_zero"] >= out["tail_expected_zero"]  # 3 of 4 slots of the last page are zeros
    assert all(b - a > 1 for a, b in zip(out["pages"], out["pages"][1:]))


@pytest.mark.parametrize("transfer", ["kernel", "copy"])
def test_round_trip(py_page, transfer):
    out = py_page.run(f"""
        from kvckpt_web import PagedKVCache
        lay = kvtest.layout()
        src = PagedKVCache(dev, lay, kvtest.limits(), transfer={transfer!r})
        src.add_sequence(0)
        kvtest.append(src, 0, 3, 0, 10); kvtest.append(src, 0, 3, 10, 9)
        meta = src.get_checkpoint_metadata(0)
        groups = [bytes(g) for g in await src.export_groups(0)]
        dst = PagedKVCache(dev, lay, kvtest.limits(), transfer={transfer!r})
        dst.add_sequence(5)
        kvtest.append(dst, 5, 99, 0, 30)  # garbage in pages the import may reuse
        await dst.load_checkpoint(meta, groups)
        again = [bytes(g) for g in await dst.export_groups(0)]
        # primitives one by one, into seq 2 of a third cache, then keep appending after the import
        third = PagedKVCache(dev, lay, kvtest.limits(), transfer={transfer!r})
        third.prepare_import(0, meta)
        for gid, g in enumerate(groups):
            arr = third.empty_group(len(g) // lay.page_bytes)
            dev.write(arr.buffer, 0, g)
            third.import_page_group(0, gid, arr)
        third.finish_import(0)
        kvtest.append(third, 0, 3, 19, 4)
        cont = [bytes(g) for g in await third.export_groups(0)]
        result = {{"same": again == groups == kvtest.expected_groups(lay, 3, 19),
                  "seqs": dst.sequence_ids(), "meta_same": dst.get_checkpoint_metadata(0) == meta,
                  "continued": cont == kvtest.expected_groups(lay, 3, 23), "len": third.get_sequence_length(0)}}
        for c in (src, dst, third): c.close()
    """)
    assert out == {"same": True, "seqs": [0], "meta_same": True, "continued": True, "len": 23}


def test_validation_errors(py_page):
    out = py_page.run("""
        import json
        from kvckpt_web import PagedKVCache, errors
        lay = kvtest.layout()
        cache = PagedKVCache(dev, lay, kvtest.limits())
        cache.add_sequence(0)
        kvtest.append(cache, 0, 1, 0, 6)
        meta = cache.get_checkpoint_metadata(0)
        groups = [bytes(g) for g in await cache.export_groups(0)]
        seen = {}

        async def expect(name, exc_type, coro_or_fn):
            try:
                r = coro_or_fn()
                if hasattr(r, "__await__"):
                    await r
                seen[name] = "no error"
            except exc_type as exc:
                seen[name] = type(exc).__name__
            except Exception as exc:
                seen[name] = "wrong: " + repr(exc)

        other = PagedKVCache(dev, kvtest.layout(qk_head_dim=16), kvtest.limits())
        await expect("layout", errors.MetadataError, lambda: other.prepare_import(0, meta))
        tampered = json.loads(meta); tampered["layout_hash"] = "0123456789abcdef"
        await expect("hash", errors.LayoutHashMismatch, lambda: cache.prepare_import(0, json.dumps(tampered)))
        await expect("json", errors.MetadataError, lambda: cache.prepare_import(0, "{not json"))
        bad = json.loads(meta); bad["seq_length"] = 10**9
        await expect("too_long", errors.KVCkptError, lambda: cache.prepare_import(0, json.dumps(bad)))
        await expect("group_id", errors.TensorError, lambda: cache.export_page_group(0, 2, cache.empty_group(2)))
        await expect("shape", errors.TensorError, lambda: cache.export_page_group(0, 0, cache.empty_group(3)))
        await expect("no_import", errors.CheckpointStateError, lambda: cache.finish_import(0))
        await expect("size", errors.TensorError, lambda: cache.load_checkpoint(meta, [groups[0][:-2], groups[1]], exclusive=False))
        await expect("count", errors.TensorError, lambda: cache.load_checkpoint(meta, groups[:1], exclusive=False))
        unchanged = [bytes(g) for g in await cache.export_groups(0)] == groups
        cache.prepare_import(0, meta, exclusive=False)
        await cache.import_group_bytes(0, 0, groups[0])
        await expect("missing_group", errors.CheckpointStateError, lambda: cache.finish_import(0))
        await expect("twice", errors.CheckpointStateError, lambda: cache.import_group_bytes(0, 0, groups[0]))
        await expect("export_during_import", errors.CheckpointStateError, lambda: cache.get_checkpoint_metadata(0))
        cache.abort_import(0)
        result = {"seen": seen, "unchanged": unchanged, "after_abort": cache.sequence_ids(),
                  "kept": [bytes(g) for g in await cache.export_groups(0)] == groups}
        cache.close(); other.close()
    """)
    assert out["unchanged"] is True and out["kept"] is True and out["after_abort"] == [0]
    assert out["seen"] == {"layout": "MetadataError", "hash": "LayoutHashMismatch", "json": "MetadataError", "too_long": out["seen"]["too_long"],
                           "group_id": "TensorError", "shape": "TensorError", "no_import": "CheckpointStateError",
                           "size": "TensorError", "count": "TensorError", "missing_group": "CheckpointStateError",
                           "twice": "CheckpointStateError", "export_during_import": "CheckpointStateError"}
    assert not out["seen"]["too_long"].startswith(("no error", "wrong"))
