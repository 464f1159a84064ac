"""Quick start: fill a paged KV cache on the GPU, checkpoint it to disk, restore it into a fresh cache.

Run: ``python examples/quickstart.py [DIRECTORY]`` (default: a temporary directory). Prints what it did
and exits non-zero if the restored K/V differs from what was appended.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile

import numpy as np

from kvckpt_web import CacheLimits, FileStore, KVLayout, PagedKVCache, open_device, restore, save

LAYOUT = KVLayout(page_size=16, num_layers=2, num_qo_heads=8, num_kv_heads=2, qk_head_dim=64, dtype="float16")
TOKENS = 20


async def main(directory: str) -> int:
    device = open_device()  # wgpu-py; DeviceError if there is no adapter
    cache = PagedKVCache(device, LAYOUT, CacheLimits(reserved_num_seqs=4, max_total_seq_len=1024))
    cache.add_sequence(0)
    rng = np.random.default_rng(0)
    shape = (TOKENS, LAYOUT.num_kv_heads, LAYOUT.head_dim)
    appended = [(rng.standard_normal(shape).astype("float16"), rng.standard_normal(shape).astype("float16"))
                for _ in range(LAYOUT.num_layers)]
    cache.begin_forward([0], [TOKENS])
    for layer, (k, v) in enumerate(appended):
        cache.append_kv(layer, k, v)
    cache.end_forward()

    store = FileStore(directory)
    saved = await save(cache, 0, store, "chat", app_state={"tokens": list(range(TOKENS))})
    print(f"saved generation {saved.generation} of 'chat': {saved.seq_length} tokens, "
          f"{saved.chunks_written} chunks, {saved.bytes_written} bytes, in {directory}")

    fresh = PagedKVCache(device, LAYOUT, CacheLimits(max_total_seq_len=1024))
    result = await restore(store, "chat", fresh)  # verifies every checksum before touching `fresh`
    k, v = await fresh.debug_get_kv(0, 0, TOKENS)
    same = all(np.array_equal(k.numpy()[layer], ak) and np.array_equal(v.numpy()[layer], av)
               for layer, (ak, av) in enumerate(appended))
    print(f"restored generation {result.generation}: {fresh.get_sequence_length(0)} tokens, "
          f"app_state tokens {result.app_state['tokens'][:5]}..., K/V identical: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="kvckpt-quickstart.") as tmp:
        sys.exit(asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else tmp)))
