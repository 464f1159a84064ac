"""The model tests' comparison of a runner against the float64 reference (tests/model/reference.py): the logits of a
prompt's last token and of greedy decode steps after it, from both."""

from __future__ import annotations

import asyncio

import numpy as np
from reference import reference_forward

from kvckpt_web.model.caches import new_cache


async def all_logits(logits, vocab: int) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Every logit of a forward's output, by token id."""
    values = np.empty(vocab)
    for token, value in await logits.top_k(vocab):
        values[token] = value
    return values


def compare_decode(loaded, device, weights, config, prompt, steps, *, chunk, page_size):  # type: ignore[no-untyped-def]
    """The runner's and the reference's logits of the prompt's last token and of ``steps`` greedy decode
    steps after it, and both greedy token lists (the runner's prefill in chunks of ``chunk`` tokens over pages of
    ``page_size``)."""
    model = loaded.model
    cache = new_cache(model, device, max_tokens=len(prompt) + steps + 1, prefill_chunk=chunk, page_size=page_size,
                      num_seqs=1)
    cache.add_sequence(0)

    async def ours() -> tuple[list[np.ndarray], list[int]]:
        out, tokens = [], []
        logits = await model.forward(cache, 0, prompt)
        for _ in range(steps + 1):
            out.append(await all_logits(logits, model.vocab_size))
            tokens.append(await logits.argmax())
            logits = await model.forward(cache, 0, [tokens[-1]])
        return out, tokens

    try:
        got, got_tokens = asyncio.run(ours())
    finally:
        cache.close()
    ref, kv = reference_forward(weights, config, prompt, last_only=True)
    want, want_tokens = [ref[-1]], [int(np.argmax(ref[-1]))]
    for _ in range(steps):
        ref, kv = reference_forward(weights, config, [want_tokens[-1]], kv)
        want.append(ref[-1])
        want_tokens.append(int(np.argmax(ref[-1])))
    return got, want, got_tokens, want_tokens
