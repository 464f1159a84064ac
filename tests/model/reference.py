"""A numpy float64 reference of a llama-style model (SmolLM2-135M's architecture, and the variations of Llama 3,
Qwen2, Qwen 3 and Gemma 3 as llama.cpp's graphs compute them), for tests only.

Weights are the values the GGUF dequantizes to, held as float64 (``(out_features, in_features)`` like Hugging
Face), with attn_q/attn_k rows *un-permuted* back to Hugging Face's order, so RoPE is TVM's rope_mode "normal"
(rotate-half). Every product and sum is float64; K/V are rounded to float16 where they enter the cache, as
kvckpt_web's cache stores them. ``reference_forward`` runs a prefill chunk or a decode step on top of the K/V
of earlier calls.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Config:
    """The architecture numbers of a llama-style model."""

    num_layers: int
    hidden: int
    ffn: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_eps: float
    vocab: int
    activation: str = "silu"
    """The FFN gate's activation: "silu" or "gelu_tanh"."""
    embedding_scale: float = 1.0
    sliding_window: int = 0
    """Keys a query of a sliding layer sees, itself included (0: no sliding layers)."""
    sliding_pattern: int = 0
    """Layer i is global where i % sliding_pattern == sliding_pattern - 1, sliding otherwise."""
    rope_theta_local: float = 10000.0
    """The RoPE base of sliding layers (their scale is 1)."""
    rope_scale: float = 1.0
    """Positions times this in global layers (linear RoPE scaling)."""
    rope_factors: tuple[float, ...] | None = None
    """Llama 3's frequency factors: pair i's angle divided by factor i."""

    def sliding(self, layer: int) -> bool:
        return self.sliding_window > 0 and layer % self.sliding_pattern < self.sliding_pattern - 1


@dataclass
class LayerWeights:
    """One block's weights; matrices are ``(out_features, in_features)``, q/k rows in Hugging Face order."""

    attn_norm: np.ndarray
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    o: np.ndarray
    ffn_norm: np.ndarray
    gate: np.ndarray
    up: np.ndarray
    down: np.ndarray
    q_bias: np.ndarray | None = None
    k_bias: np.ndarray | None = None
    v_bias: np.ndarray | None = None
    q_norm: np.ndarray | None = None
    """Per-head RMSNorm weights of Q (and ``k_norm`` of K), applied before RoPE."""
    k_norm: np.ndarray | None = None
    post_attention_norm: np.ndarray | None = None
    """RMSNorm of the attention's output before it joins the residual (and ``post_ffw_norm`` of the FFN's)."""
    post_ffw_norm: np.ndarray | None = None


@dataclass
class Weights:
    """A whole model: token embedding (also the output head unless ``head``), blocks, final norm."""

    embedding: np.ndarray
    layers: list[LayerWeights]
    output_norm: np.ndarray
    head: np.ndarray | None = None
    """The output head where it is not the embedding (``output.weight``)."""


#: Per layer, K and V of every token so far: two float64 arrays ``(tokens, num_kv_heads, head_dim)`` holding
#: float16 values.
KV = list[tuple[np.ndarray, np.ndarray]]


# ----- the GGUF row permutation of attn_q / attn_k ---------------------------------------------------------


def gguf_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf ``permute``: Hugging Face q/k rows of each head, ``(half, i)``, reordered
    to ``(i, half)`` so that adjacent rows form RoPE pairs (its adjacent-pair rotation)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of :func:`gguf_permute`: GGUF attn_q/attn_k rows back in Hugging Face order."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# ----- the pieces -----------------------------------------------------------------------------------------


def inv_freq(head_dim: int, theta: float, scale: float = 1.0) -> np.ndarray:
    """RoPE's angle per position of each pair ``i < head_dim / 2``: ``scale / theta ** (2 i / head_dim)``."""
    return scale / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)


def rope(x: np.ndarray, positions: np.ndarray, theta: float, scale: float = 1.0,
         factors: tuple[float, ...] | None = None) -> np.ndarray:
    """Rotate-half RoPE (Hugging Face llama, TVM "normal") of ``x`` ``(tokens, heads, head_dim)``; pair i's rate
    divided by ``factors[i]`` where given."""
    half = x.shape[-1] // 2
    rates = inv_freq(x.shape[-1], theta, scale) / (1.0 if factors is None else np.asarray(factors, np.float64))
    angles = np.asarray(positions, np.float64)[:, None] * rates[None, :]
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
    x = np.asarray(x, np.float64)
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def rope_adjacent(x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
    """llama.cpp's RoPE for llama GGUFs: pair ``(x[2i], x[2i+1])`` rotated by the angle of pair ``i``."""
    angles = np.asarray(positions, np.float64)[:, None] * inv_freq(x.shape[-1], theta)[None, :]
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
    x = np.asarray(x, np.float64)
    out = np.empty_like(x)
    out[..., 0::2] = x[..., 0::2] * cos - x[..., 1::2] * sin
    out[..., 1::2] = x[..., 1::2] * cos + x[..., 0::2] * sin
    return out


def causal_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, positions: np.ndarray,
                     window: int = 0) -> np.ndarray:
    """Grouped-query attention of ``q`` ``(n, num_qo_heads, d)`` over ``k``/``v`` ``(T, num_kv_heads, d)``:
    the query at position ``p`` sees keys ``0..p`` (with a ``window``, only ``p - window + 1..p``); scale
    ``1/sqrt(d)``; float64."""
    group = q.shape[1] // k.shape[1]
    k = np.repeat(np.asarray(k, np.float64), group, axis=1)
    v = np.repeat(np.asarray(v, np.float64), group, axis=1)
    scores = np.einsum("nhd,thd->hnt", np.asarray(q, np.float64), k) / np.sqrt(q.shape[-1])
    distance = np.asarray(positions)[:, None] - np.arange(k.shape[0])[None, :]
    visible = (distance >= 0) & ((distance < window) if window else True)
    scores = np.where(visible[None], scores, -np.inf)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights /= weights.sum(axis=-1, keepdims=True)
    return np.einsum("hnt,thd->nhd", weights, v)


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm over the last axis."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU in its tanh approximation (ggml_gelu, Hugging Face's gelu_pytorch_tanh)."""
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1 + np.exp(-x))


def as_cached(x: np.ndarray) -> np.ndarray:
    """``x`` rounded to float16 (what the cache stores), back in float64."""
    return x.astype(np.float16).astype(np.float64)


# ----- the model ------------------------------------------------------------------------------------------


def reference_forward(weights: Weights, config: Config, tokens: list[int] | np.ndarray,
                      past_kv: KV | None = None, *, adjacent_rope: bool = False,
                      last_only: bool = False) -> tuple[np.ndarray, KV]:
    """Logits ``(len(tokens), vocab)`` of ``tokens`` following the tokens whose K/V are ``past_kv`` (None: none),
    and the K/V with these tokens appended; with ``last_only`` those of the last token only, ``(1, vocab)`` (a
    long prompt's head over a large vocabulary is most of the work).

    ``adjacent_rope`` rotates adjacent pairs instead (llama.cpp's way, for weights still in GGUF row order).
    """
    c = config
    n = len(tokens)
    start = 0 if past_kv is None else past_kv[0][0].shape[0]
    positions = np.arange(start, start + n)
    x = weights.embedding[np.asarray(tokens)] * c.embedding_scale
    kv: KV = []
    for i, layer in enumerate(weights.layers):
        h = rms_norm(x, layer.attn_norm, c.rms_eps)
        q, k, v = (h @ w.T + (0 if b is None else b) for w, b in ((layer.q, layer.q_bias), (layer.k, layer.k_bias),
                                                                   (layer.v, layer.v_bias)))
        q = q.reshape(n, c.num_qo_heads, c.head_dim)
        k = k.reshape(n, c.num_kv_heads, c.head_dim)
        v = v.reshape(n, c.num_kv_heads, c.head_dim)
        if layer.q_norm is not None:
            q, k = rms_norm(q, layer.q_norm, c.rms_eps), rms_norm(k, layer.k_norm, c.rms_eps)
        if adjacent_rope:
            q, k = rope_adjacent(q, positions, c.rope_theta), rope_adjacent(k, positions, c.rope_theta)
        else:
            theta, scale = (c.rope_theta_local, 1.0) if c.sliding(i) else (c.rope_theta, c.rope_scale)
            q, k = (rope(t, positions, theta, scale, c.rope_factors) for t in (q, k))
        k, v = as_cached(k), as_cached(v)
        if past_kv is not None:
            k, v = np.concatenate([past_kv[i][0], k]), np.concatenate([past_kv[i][1], v])
        kv.append((k, v))
        window = c.sliding_window if c.sliding(i) else 0
        out = causal_attention(q, k, v, positions, window).reshape(n, c.num_qo_heads * c.head_dim) @ layer.o.T
        x = x + (out if layer.post_attention_norm is None else rms_norm(out, layer.post_attention_norm, c.rms_eps))
        h = rms_norm(x, layer.ffn_norm, c.rms_eps)
        gate, up = h @ layer.gate.T, h @ layer.up.T
        out = ((gelu_tanh if c.activation == "gelu_tanh" else silu)(gate) * up) @ layer.down.T
        x = x + (out if layer.post_ffw_norm is None else rms_norm(out, layer.post_ffw_norm, c.rms_eps))
    x = rms_norm(x, weights.output_norm, c.rms_eps)
    if last_only:
        x = x[-1:]
    return x @ (weights.embedding if weights.head is None else weights.head).T, kv


def greedy(weights: Weights, config: Config, prompt: list[int], steps: int) -> list[int]:
    """``steps`` greedy tokens after ``prompt``: one prefill, then one decode step per token."""
    logits, kv = reference_forward(weights, config, prompt)
    out = [int(np.argmax(logits[-1]))]
    for _ in range(steps - 1):
        logits, kv = reference_forward(weights, config, [out[-1]], kv)
        out.append(int(np.argmax(logits[-1])))
    return out


def random_model(config: Config, seed: int = 0) -> Weights:
    """Small random weights of ``config``'s shapes (scaled so activations stay near unit size)."""
    rng = np.random.default_rng(seed)
    c = config

    def matrix(rows: int, cols: int) -> np.ndarray:
        return rng.standard_normal((rows, cols)) / np.sqrt(cols)

    def norm() -> np.ndarray:
        return 1 + 0.1 * rng.standard_normal(c.hidden)

    q_rows, kv_rows = c.num_qo_heads * c.head_dim, c.num_kv_heads * c.head_dim
    layers = [LayerWeights(norm(), matrix(q_rows, c.hidden), matrix(kv_rows, c.hidden), matrix(kv_rows, c.hidden),
                           matrix(c.hidden, q_rows), norm(), matrix(c.ffn, c.hidden), matrix(c.ffn, c.hidden),
                           matrix(c.hidden, c.ffn)) for _ in range(c.num_layers)]
    return Weights(rng.standard_normal((c.vocab, c.hidden)), layers, norm())


# ----- the real model -------------------------------------------------------------------------------------


@functools.cache
def gguf_reader(path: Path):  # type: ignore[no-untyped-def]
    """The ``gguf`` package's reader of ``path``, opened once (parsing the vocabulary takes seconds)."""
    import gguf

    return gguf.GGUFReader(str(path))


@functools.cache
def gguf_tensor(path: Path, name: str) -> np.ndarray:
    """Tensor ``name`` of ``path`` dequantized (``(rows, cols)``, reversed GGUF shape), held as float64."""
    import gguf

    t = next(t for t in gguf_reader(path).tensors if t.name == name)
    return gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64)


def _field(path: Path, key: str):  # type: ignore[no-untyped-def]
    field = gguf_reader(path).fields[key]
    return field.parts[field.data[0]][0]


def _has(path: Path, name: str) -> bool:
    return any(t.name == name for t in gguf_reader(path).tensors)


def load_gguf(path: Path, num_layers: int | None = None, *, permuted: bool = False) -> tuple[Weights, Config]:
    """The dequantized weights (float64) and config of a GGUF of architecture llama, qwen2, qwen3 or gemma3 (as
    llama.cpp reads them), its first ``num_layers`` blocks (None: all); a llama's q/k rows un-permuted to Hugging
    Face order unless ``permuted`` (then use ``adjacent_rope``)."""
    field = gguf_reader(path).fields["general.architecture"]
    arch = bytes(field.parts[field.data[0]]).decode()

    def key(name: str, default: float | None = None) -> float:
        if default is not None and f"{arch}.{name}" not in gguf_reader(path).fields:
            return default
        return float(_field(path, f"{arch}.{name}"))

    heads, hidden = int(key("attention.head_count")), int(key("embedding_length"))
    kv_heads = int(key("attention.head_count_kv", heads))
    embedding = gguf_tensor(path, "token_embd.weight")
    gemma = arch == "gemma3"
    factors = tuple(gguf_tensor(path, "rope_freqs.weight")) if _has(path, "rope_freqs.weight") else None
    config = Config(num_layers=num_layers or int(key("block_count")), hidden=hidden,
                    ffn=int(key("feed_forward_length")), num_qo_heads=heads, num_kv_heads=kv_heads,
                    head_dim=int(key("attention.key_length", hidden // heads)),
                    rope_theta=key("rope.freq_base", 10000.0), rms_eps=key("attention.layer_norm_rms_epsilon"),
                    vocab=embedding.shape[0], activation="gelu_tanh" if gemma else "silu",
                    embedding_scale=float(np.sqrt(hidden)) if gemma else 1.0,
                    sliding_window=int(key("attention.sliding_window")) if gemma else 0,
                    sliding_pattern=6 if gemma else 0, rope_factors=factors)
    order = gguf_unpermute if arch == "llama" and not permuted else (lambda w, n: w)
    layers = []
    for i in range(config.num_layers):
        def blk(name: str, suffix: str = "weight") -> np.ndarray | None:
            name = f"blk.{i}.{name}.{suffix}"  # noqa: B023 (used at once)
            return gguf_tensor(path, name) if _has(path, name) else None

        layers.append(LayerWeights(
            blk("attn_norm"), order(blk("attn_q"), heads), order(blk("attn_k"), kv_heads), blk("attn_v"),
            blk("attn_output"), blk("ffn_norm"), blk("ffn_gate"), blk("ffn_up"), blk("ffn_down"),
            q_bias=blk("attn_q", "bias"), k_bias=blk("attn_k", "bias"), v_bias=blk("attn_v", "bias"),
            q_norm=blk("attn_q_norm"), k_norm=blk("attn_k_norm"), post_attention_norm=blk("post_attention_norm"),
            post_ffw_norm=blk("post_ffw_norm")))
    head = gguf_tensor(path, "output.weight") if _has(path, "output.weight") else None
    return Weights(embedding, layers, gguf_tensor(path, "output_norm.weight"), head), config
