"""A test double of a causal language model: small, deterministic, and honest about its K/V cache.

:class:`DoubleLM` honours :class:`kvckpt_web.model.protocol.CausalLM` over the real
:class:`~kvckpt_web.kv.cache.PagedKVCache`. Its forward appends K/V derived from each token and its
position (through ``append_kv``), then reads back *every* K/V of the sequence (``debug_get_kv``)
and computes the logits from them: one attention step plus a term seeded by the digest of all
their bytes, so a restore that loses, shifts or damages any token's K/V changes the tokens. :class:`DoubleText` is a
character-level codec over a small alphabet. :func:`load` is a model factory for the worker processes of
:mod:`kvckpt_web.cli.chat_worker` (``"lm_double:load"``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from kvckpt_web import FieldError, KVLayout
from kvckpt_web.model.protocol import LoadedModel, TokenLogprob

ALPHABET = "abcdefghijklmnopqrstuvwxyz .,!?'\n"
EOS, BOS = 0, 1
VOCAB = 2 + len(ALPHABET)
LAYERS, KV_HEADS, HEAD_DIM = 2, 2, 8


class DoubleLogits:
    """Logits held on the host."""

    def __init__(self, values: np.ndarray) -> None:
        self.values = values

    async def argmax(self) -> int:
        return int(np.argmax(self.values))  # the first of equal maxima: the lowest id

    async def top_k(self, k: int) -> list[tuple[int, float]]:
        ids = np.arange(len(self.values))
        order = np.lexsort((ids, -self.values))[:k]
        return [(int(i), float(self.values[i])) for i in order]

    async def logprobs(self, token: int, top: int) -> TokenLogprob:
        """The float64 log-softmax of the logits."""
        logprobs = self.values - self.values.max()
        logprobs = logprobs - np.log(np.exp(logprobs).sum())
        best = [(i, float(logprobs[i])) for i, _ in await self.top_k(top)] if top else []
        return TokenLogprob(token, float(logprobs[token]), tuple(best))

    async def pick(self, sampler: Any, previous: Sequence[int], generated: Sequence[int]) -> int:
        return sampler.pick(await self.top_k(len(self.values)), previous, generated)


class DoubleLM:
    """A deterministic 2-layer model over a paged cache; ``name`` changes its identity, not its outputs."""

    def __init__(self, seed: int = 0, max_context: int = 96, name: str = "double") -> None:
        rng = np.random.default_rng(seed)
        self.identity = f"lm-double:{name}:{seed}"
        self.kernels = "numpy"
        self.max_context = max_context
        self.vocab_size = VOCAB
        self.embed = rng.standard_normal((VOCAB, LAYERS, 2, KV_HEADS, HEAD_DIM)).astype(np.float32)
        self.freq = rng.uniform(0.05, 1.0, (LAYERS, 2, KV_HEADS, HEAD_DIM)).astype(np.float32)
        self.head = rng.standard_normal((VOCAB, LAYERS * KV_HEADS * HEAD_DIM)) * 1.5
        self.forwards: list[int] = []
        """The length of every run of every forward call, in order."""

    def close(self) -> None:
        """Nothing to release: the double keeps its weights on the host."""

    def kv_layout(self, page_size: int = 16) -> KVLayout:
        return KVLayout(page_size=page_size, num_layers=LAYERS, num_qo_heads=4, num_kv_heads=KV_HEADS,
                        qk_head_dim=HEAD_DIM, dtype="float32", rope_mode="none")

    def kv(self, tokens: Sequence[int], start: int) -> np.ndarray:
        """K/V of ``tokens`` at positions ``start...``: ``(layers, 2, n, heads, dim)`` float32."""
        pos = np.arange(start, start + len(tokens), dtype=np.float32)[:, None, None, None, None]
        kv = self.embed[np.asarray(tokens)] + np.sin(pos * self.freq[None])
        return np.ascontiguousarray(kv.transpose(1, 2, 0, 3, 4))

    async def forward(self, cache: Any, seq_id: int, tokens: list[int]) -> DoubleLogits:
        return (await self.forward_batch(cache, [(seq_id, tokens)]))[0]

    async def forward_batch(self, cache: Any, runs: list[tuple[int, list[int]]]) -> list[DoubleLogits]:
        """Each run's K/V appended in one forward pass of the cache, then each run's logits."""
        starts = [cache.get_sequence_length(seq_id) for seq_id, _ in runs]
        kv = np.concatenate([self.kv(tokens, start) for (_, tokens), start in zip(runs, starts)], axis=2)
        cache.begin_forward([seq_id for seq_id, _ in runs], [len(tokens) for _, tokens in runs])
        try:
            for layer in range(LAYERS):
                cache.append_kv(layer, kv[layer, 0], kv[layer, 1])
        finally:
            cache.end_forward()
        self.forwards += [len(tokens) for _, tokens in runs]
        return [await self._logits(cache, seq_id, start + len(tokens))
                for (seq_id, tokens), start in zip(runs, starts)]

    async def _logits(self, cache: Any, seq_id: int, end: int) -> DoubleLogits:
        """The logits after the first ``end`` tokens of ``seq_id``."""
        k, v = await cache.debug_get_kv(seq_id, 0, end)
        keys = np.frombuffer(k.data, np.float32).reshape(k.shape).astype(np.float64)
        values = np.frombuffer(v.data, np.float32).reshape(v.shape).astype(np.float64)
        query = keys[:, -1]
        scores = np.einsum("lnhd,lhd->lnh", keys, query) / np.sqrt(HEAD_DIM)
        weights = np.exp(scores - scores.max(axis=1, keepdims=True))
        weights /= weights.sum(axis=1, keepdims=True)
        context = np.einsum("lnh,lnhd->lhd", weights, values).reshape(-1)
        # and a term of every bit read back, so that K/V wrong anywhere change the tokens, not only the logits
        digest = hashlib.sha256(bytes(k.data) + bytes(v.data)).digest()
        bits = np.random.default_rng(list(digest)).standard_normal(VOCAB)
        return DoubleLogits(self.head @ context + 2.0 * bits)


class DoubleText:
    """A character-level codec: id 0 ends a reply, 1 starts one, then one id per character of ALPHABET."""

    eos_ids = (EOS,)

    def encode(self, text: str) -> list[int]:
        return [2 + ALPHABET.index(c) if c in ALPHABET else 2 + ALPHABET.index("?") for c in text.lower()]

    def encode_chat(self, messages: Sequence[dict[str, str]], *, max_tokens: int | None = None) -> list[int]:
        ids = []
        for m in messages:
            ids += self.encode_message(m["role"], m["content"])
        ids += self.reply_opening()
        if max_tokens is not None and len(ids) > max_tokens:
            raise FieldError("prompt", f"at most {max_tokens} tokens", f"{len(ids)} tokens")
        return ids

    def preamble(self, first_role: str) -> list[int]:
        return []

    def encode_message(self, role: str, content: str, *, previous: str | None = None,
                       max_tokens: int | None = None) -> list[int]:
        return self.encode_text(f"{role}\n{content}\n", bos=True, max_tokens=max_tokens)

    def encode_text(self, text: str, *, bos: bool = False, max_tokens: int | None = None) -> list[int]:
        ids = [BOS] * bos + self.encode(text)
        if max_tokens is not None and len(ids) > max_tokens:
            raise FieldError("prompt", f"at most {max_tokens} tokens", f"{len(ids)} tokens")
        return ids

    def reply_opening(self) -> list[int]:
        return [BOS] + self.encode("assistant\n")

    def encode_prefill(self, content: str, *, previous: str | None = None,
                       max_tokens: int | None = None) -> list[int]:
        ids = self.reply_opening() + self.encode(content)
        if max_tokens is not None and len(ids) > max_tokens:
            raise FieldError("prompt", f"at most {max_tokens} tokens", f"{len(ids)} tokens")
        return ids

    def reply_closing(self) -> list[int]:
        return self.encode("\n")

    def decode(self, tokens: Sequence[int]) -> str:
        return "".join(ALPHABET[t - 2] if t >= 2 else "" for t in tokens)

    def token_bytes(self, token_id: int) -> bytes:
        return self.decode([token_id]).encode()

    def token_pieces(self) -> list[bytes]:
        return [b"", b""] + [c.encode() for c in ALPHABET]


def load(device: Any) -> LoadedModel:
    """The demo's model factory: the double and its codec."""
    return LoadedModel(DoubleLM(), DoubleText())
