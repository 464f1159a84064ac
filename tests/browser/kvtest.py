"""Helpers that run INSIDE Pyodide in the test page (copied into its file system as ``kvtest``), and on the
desktop where a test compares both.

Pure Python, no numpy: deterministic K/V bytes, the expected page groups of a sequence,
base64 transport, a tiny model of a cache being filled, and one generation with a loaded model.
"""

from __future__ import annotations

import base64
import hashlib

from kvckpt_web import CacheLimits, KVLayout, PagedKVCache
from kvckpt_web.generation.app_state import StopRules
from kvckpt_web.generation.generator import Generator
from kvckpt_web.model.caches import new_cache
from kvckpt_web.model.sampler import SamplingSettings

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



def chat_prompt(loaded, content: str) -> list[int]:
    """The prompt token ids of one user message ``content`` for ``loaded`` (a LoadedModel)."""
    return loaded.text.encode_chat([{"role": "user", "content": content}])


def generation_cache(loaded, device, prompt: list[int], max_tokens: int) -> PagedKVCache:
    """A fresh one-sequence cache for ``prompt`` and ``max_tokens`` more: 16-token prefill chunks and pages."""
    return new_cache(loaded.model, device, max_tokens=len(prompt) + max_tokens, prefill_chunk=16, page_size=16)


async def start_generation(loaded, cache: PagedKVCache, prompt: list[int], settings: dict, max_tokens: int,
                           autosave=None) -> Generator:
    """A generation of exactly ``max_tokens`` tokens (no end-of-sequence stop) sampled under ``settings``
    (SamplingSettings fields)."""
    return await Generator.start(loaded.model, cache, prompt, SamplingSettings(**settings), stop=StopRules(max_tokens),
                                 autosave=autosave)


async def generate(loaded, device, content: str, settings: dict, max_tokens: int) -> list[int]:
    """The ``max_tokens`` tokens ``loaded`` (a LoadedModel on ``device``) generates after one user message
    ``content``, run uninterrupted in a fresh :func:`generation_cache`."""
    prompt = chat_prompt(loaded, content)
    cache = generation_cache(loaded, device, prompt, max_tokens)
    try:
        async with await start_generation(loaded, cache, prompt, settings, max_tokens) as gen:
            return list((await gen.run()).generated_tokens)
    finally:
        cache.close()


async def greedy_logits(loaded, device, content: str, steps: int) -> list[list[float]]:
    """The logits (indexed by token id) ``loaded`` gives after one user message ``content`` and after each of
    ``steps`` greedy tokens that follow it."""
    prompt = chat_prompt(loaded, content)
    model = loaded.model
    cache = generation_cache(loaded, device, prompt, steps)
    cache.add_sequence(0)
    try:
        logits = await model.forward(cache, 0, prompt)
        out = []
        for step in range(steps + 1):
            values = [0.0] * model.vocab_size
            for token, value in await logits.top_k(model.vocab_size):
                values[token] = value
            out.append(values)
            if step < steps:
                logits = await model.forward(cache, 0, [await logits.argmax()])
        return out
    finally:
        cache.close()
