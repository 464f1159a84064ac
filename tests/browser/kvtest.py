"""Helpers that run INSIDE Pyodide in the test page (copied into its file system as ``kvtest``).

Pure Python, no numpy: deterministic K/V bytes, the expected page groups of a sequence,
base64 transport, and a tiny model of a cache being filled.
"""

from __future__ import annotations

import base64
import hashlib

from kvckpt_web import CacheLimits, KVLayout, PagedKVCache

SMALL = dict(page_size=4, num_layers=2, num_qo_heads=4, num_kv_heads=2, qk_head_dim=8, dtype="float16",
             rope_mode="none")
SMALL_LIMITS = dict(reserved_num_seqs=4, max_total_seq_len=64, prefill_chunk_size=64)


def layout(**overrides) -> KVLayout:
    return KVLayout(**{**SMALL, **overrides})


def limits(**overrides) -> CacheLimits:
    return CacheLimits(**{**SMALL_LIMITS, **overrides})


def row_bytes(lay: KVLayout) -> int:
    """Bytes of one token's K (or V) of one layer: (num_kv_heads, head_dim)."""
    return lay.num_kv_heads * lay.head_dim * lay.elem_bytes


def token_bytes(seed: int, layer: int, which: int, start: int, count: int, lay: KVLayout) -> bytes:
    """Deterministic bytes of tokens [start, start+count) for (seed, layer, K=0/V=1): any token recomputable."""
    n = row_bytes(lay)
    out = bytearray()
    for t in range(start, start + count):
        block = b""
        i = 0
        while len(block) < n:
            block += hashlib.sha256(f"{seed}/{layer}/{which}/{t}/{i}".encode()).digest()
            i += 1
        out += block[:n]
    return bytes(out)


def append(cache: PagedKVCache, seq_id: int, seed: int, start: int, count: int) -> None:
    """Append tokens [start, start+count) of ``seed`` to ``seq_id`` (one forward pass)."""
    lay = cache.layout
    cache.begin_forward([seq_id], [count])
    for layer in range(lay.num_layers):
        cache.append_kv(layer, token_bytes(seed, layer, 0, start, count, lay),
                        token_bytes(seed, layer, 1, start, count, lay))
    cache.end_forward()


def expected_groups(lay: KVLayout, seed: int, length: int) -> list[bytes]:
    """The page groups TVM's export gives for ``length`` tokens of ``seed`` (unused tail zeroed)."""
    p, h, d, e = lay.page_size, lay.num_kv_heads, lay.head_dim, lay.elem_bytes
    npages = -(-length // p)
    row = d * e
    groups = []
    for layer in range(lay.num_layers):
        kv = [token_bytes(seed, layer, which, 0, length, lay) for which in (0, 1)]
        out = bytearray()
        for page in range(npages):
            for which in (0, 1):
                for head in range(h):
                    for slot in range(p):
                        t = page * p + slot
                        if t < length:
                            off = (t * h + head) * row
                            out += kv[which][off:off + row]
                        else:
                            out += bytes(row)
        groups.append(bytes(out))
    return groups


def b64(data) -> str:
    return base64.b64encode(bytes(data)).decode()


def unb64(text: str) -> bytes:
    return base64.b64decode(text)


def digest(groups) -> str:
    h = hashlib.sha256()
    for g in groups:
        h.update(bytes(g))
    return h.hexdigest()
