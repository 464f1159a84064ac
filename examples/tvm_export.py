"""TVM interop: write a sequence as a TVM export directory and load it back, byte for byte.

The directory (``metadata.json`` + ``group_<i>.bin``) is what Apache TVM's PagedAttentionKVCache
checkpoint primitives produce and accept (format_version 1). Run:
``python examples/tvm_export.py [DIRECTORY]``, then try ``kvckpt inspect DIRECTORY``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile

from kvckpt_web import CacheLimits, KVLayout, PagedKVCache, open_device, read_tvm_export, write_tvm_export

# SmolLM2-135M's KV layout: 30 layers, 9 query / 3 KV heads, head_dim 64, page 16, float16
LAYOUT = KVLayout(page_size=16, num_layers=30, num_qo_heads=9, num_kv_heads=3, qk_head_dim=64, dtype="float16",
                  rotary_theta=100000.0)
TOKENS = 100


async def main(directory: str) -> int:
    device = open_device()
    limits = CacheLimits(reserved_num_seqs=1, max_total_seq_len=512)
    cache = PagedKVCache(device, LAYOUT, limits)
    cache.add_sequence(0)
    cache.begin_forward([0], [TOKENS])
    token_bytes = TOKENS * LAYOUT.num_kv_heads * LAYOUT.head_dim * LAYOUT.elem_bytes
    for layer in range(LAYOUT.num_layers):
        cache.append_kv(layer, os.urandom(token_bytes), os.urandom(token_bytes))
    cache.end_forward()

    metadata = cache.get_checkpoint_metadata(0)  # TVM's exact JSON text
    groups = await cache.export_groups(0)  # one page group per layer, tail of the last page zeroed
    path = write_tvm_export(directory, metadata, groups, overwrite=True)
    print(f"wrote {path}: metadata.json ({len(metadata)} bytes, layout hash {cache.get_layout_hash()}) "
          f"and {len(groups)} page groups of {len(groups[0])} bytes")

    export = read_tvm_export(path)
    fresh = PagedKVCache.from_metadata(device, export.metadata_json)  # layout and limits from the metadata
    await fresh.load_checkpoint(export.metadata_json, export.groups)  # prepare_import, import, finish_import
    same = [bytes(g) for g in await fresh.export_groups(0)] == [bytes(g) for g in groups]
    print(f"loaded it into a fresh cache: {fresh.get_sequence_length(0)} tokens, re-export identical: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="kvckpt-tvm.") as tmp:
        sys.exit(asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(tmp, "export"))))
