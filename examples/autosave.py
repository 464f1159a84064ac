"""Incremental autosave: checkpoint a growing sequence every few tokens, then resume after a "crash".

Each save writes only the chunks whose pages changed (the new tokens and the partial last page), so
its cost follows the new tokens, not the sequence length. Run: ``python examples/autosave.py [DIRECTORY]``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile

from kvckpt_web import CacheLimits, FileStore, KVLayout, PagedKVCache, list_generations, open_device, restore, save

LAYOUT = KVLayout(page_size=16, num_layers=4, num_qo_heads=8, num_kv_heads=2, qk_head_dim=64, dtype="float16")
LIMITS = CacheLimits(reserved_num_seqs=1, max_total_seq_len=4096)
PROMPT, STEP, STEPS = 1024, 32, 4
PAGES_PER_CHUNK = 8  # 128 tokens of one layer per chunk (the default, about 1 MiB, suits larger layers)


def append(cache: PagedKVCache, n: int) -> None:
    """One forward pass of ``n`` tokens of (random) K/V on every layer."""
    nbytes = n * LAYOUT.num_kv_heads * LAYOUT.head_dim * LAYOUT.elem_bytes
    cache.begin_forward([0], [n])
    for layer in range(LAYOUT.num_layers):
        cache.append_kv(layer, os.urandom(nbytes), os.urandom(nbytes))
    cache.end_forward()


async def main(directory: str) -> int:
    device = open_device()
    store = FileStore(directory)
    cache = PagedKVCache(device, LAYOUT, LIMITS)
    cache.add_sequence(0)
    append(cache, PROMPT)
    tokens = list(range(PROMPT))
    for step in range(STEPS + 1):
        if step:
            append(cache, STEP)
            tokens += range(len(tokens), len(tokens) + STEP)
        saved = await save(cache, 0, store, "chat", app_state={"tokens": tokens}, keep=3,
                           pages_per_chunk=PAGES_PER_CHUNK)
        print(f"save {saved.generation}: {saved.seq_length} tokens, wrote {saved.chunks_written} of "
              f"{saved.num_chunks} chunks ({saved.bytes_written} bytes)")
    expected = [bytes(g) for g in await cache.export_groups(0)]
    cache.close()  # the "crash": every GPU page is gone

    resumed = PagedKVCache(device, LAYOUT, LIMITS)
    result = await restore(store, "chat", resumed)
    same = [bytes(g) for g in await resumed.export_groups(0)] == expected
    kept = [info.generation for info in await list_generations(store, "chat")]
    print(f"resumed generation {result.generation}: {resumed.get_sequence_length(0)} tokens, "
          f"{len(result.app_state['tokens'])} token ids, K/V identical: {same}; generations kept: {kept}")
    return 0 if same and result.app_state["tokens"] == tokens else 1


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="kvckpt-autosave.") as tmp:
        sys.exit(asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else tmp)))
