"""Tiny random GGUFs of the architectures beside SmolLM2's llama (Llama 3's RoPE, Qwen2, Qwen 3, Gemma 3), for
tests, and the float64 weights their tensors dequantize to (for tests/model/reference.py).

:func:`write_tiny_arch` writes one with tiny_llama's tokenizer and ``gguf.GGUFWriter``, in the types the runner
loads (Q4_1 matrices, a Q8_0 embedding tied as the head, F32 vectors), rows in each architecture's GGUF order
(permuted for adjacent-pair RoPE only in ``llama``, as llama.cpp's converter writes them).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from reference import Config, LayerWeights, Weights, gguf_permute, random_model
from tiny_llama import F32, Q4_1, Q8_0, vocabulary, write_tiny_llama


def llama3_factors(head_dim: int, theta: float, factor: float = 8.0, low: float = 1.0, high: float = 4.0,
                   original_context: int = 64) -> tuple[float, ...]:
    """Llama 3's RoPE frequency factors as llama.cpp's converter computes them into ``rope_freqs.weight`` (a short
    original context, so that a tiny model's positions reach every kind of factor: 1, ``factor`` and smoothed)."""
    out = []
    for i in range(0, head_dim, 2):
        wavelength = 2 * math.pi * theta ** (i / head_dim)
        if wavelength < original_context / high:
            out.append(1.0)
        elif wavelength > original_context / low:
            out.append(factor)
        else:
            smooth = (original_context / wavelength - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return tuple(out)


BASE = dict(num_layers=3, hidden=192, ffn=256, num_qo_heads=6, num_kv_heads=2, head_dim=32, rms_eps=1e-6, vocab=0)
KINDS: dict[str, tuple[str, Config, dict[str, Any]]] = {
    "llama3": ("llama", Config(**{**BASE, "rms_eps": 1e-5}, rope_theta=500000.0,
                               rope_factors=llama3_factors(32, 500000.0)), {}),
    "qwen2": ("qwen2", Config(**BASE, rope_theta=1000000.0), {}),
    "qwen3": ("qwen3", Config(**{**BASE, "head_dim": 48}, rope_theta=1000000.0),
              {"attention.key_length": 48, "attention.value_length": 48}),
    # 7 layers: sliding 0-4, global 5, sliding 6; 4/1 heads of 64 (key_length, not embedding_length / head_count)
    "gemma3": ("gemma3", Config(**{**BASE, "num_layers": 7, "num_qo_heads": 4, "num_kv_heads": 1, "head_dim": 64},
                                rope_theta=1000000.0, activation="gelu_tanh", embedding_scale=math.sqrt(192),
                                sliding_window=5, sliding_pattern=6, rope_theta_local=10000.0),
               {"attention.key_length": 64, "attention.value_length": 64, "attention.sliding_window": 5}),
}
"""Per kind: (general.architecture, the reference's config, further ``<arch>.`` metadata)."""


def stored(values: np.ndarray, qtype: Any) -> np.ndarray:
    """What ``values`` read back as once written as ``qtype``, in float64."""
    values = np.asarray(values, np.float32)
    if qtype == F32:
        return values.astype(np.float64)
    return gguf.quants.dequantize(gguf.quants.quantize(values, qtype), qtype).astype(np.float64)


def tiny_arch(kind: str, seed: int = 0, types: dict[str, Any] | None = None) -> tuple[
        str, Config, dict[str, Any], dict[str, tuple[np.ndarray, Any]], Weights]:
    """(architecture, config, metadata, GGUF tensors as (float32 values in GGUF row order, type), and the float64
    weights they dequantize to) of the tiny model ``kind`` of :data:`KINDS`; ``types`` changes the type of the
    tensors whose names end in its keys."""
    arch, config, metadata = KINDS[kind]
    c = replace(config, vocab=len(vocabulary()[0]))
    w = random_model(c, seed)
    rng = np.random.default_rng(seed + 1)
    tensors: dict[str, tuple[np.ndarray, Any]] = {"token_embd.weight": (w.embedding * 0.15, Q8_0),
                                                   "output_norm.weight": (w.output_norm, F32)}
    if c.rope_factors is not None:
        tensors["rope_freqs.weight"] = (np.asarray(c.rope_factors), F32)
    for i, layer in enumerate(w.layers):
        blk = f"blk.{i}"
        permute = gguf_permute if arch == "llama" else (lambda m, heads: m)
        tensors.update({f"{blk}.attn_norm.weight": (layer.attn_norm, F32),
                        f"{blk}.attn_q.weight": (permute(layer.q, c.num_qo_heads), Q4_1),
                        f"{blk}.attn_k.weight": (permute(layer.k, c.num_kv_heads), Q4_1),
                        f"{blk}.attn_v.weight": (layer.v, Q4_1), f"{blk}.attn_output.weight": (layer.o, Q4_1),
                        f"{blk}.ffn_norm.weight": (layer.ffn_norm, F32), f"{blk}.ffn_gate.weight": (layer.gate, Q4_1),
                        f"{blk}.ffn_up.weight": (layer.up, Q4_1), f"{blk}.ffn_down.weight": (layer.down, Q4_1)})
        if arch == "qwen2":
            for name, rows in (("q", c.num_qo_heads), ("k", c.num_kv_heads), ("v", c.num_kv_heads)):
                tensors[f"{blk}.attn_{name}.bias"] = (0.5 * rng.standard_normal(rows * c.head_dim), F32)
        if arch in ("qwen3", "gemma3"):
            for name in ("attn_q_norm", "attn_k_norm"):
                tensors[f"{blk}.{name}.weight"] = (1 + 0.3 * rng.standard_normal(c.head_dim), F32)
        if arch == "gemma3":
            for name in ("post_attention_norm", "post_ffw_norm"):
                tensors[f"{blk}.{name}.weight"] = (1 + 0.3 * rng.standard_normal(c.hidden), F32)

    for name, (values, _) in list(tensors.items()):
        for suffix, qtype in (types or {}).items():
            if name.endswith(suffix):
                tensors[name] = (values, qtype)

    def get(name: str) -> np.ndarray | None:
        return stored(*tensors[name]) if name in tensors else None

    layers = []
    for i in range(c.num_layers):
        blk = f"blk.{i}"
        q, k = get(f"{blk}.attn_q.weight"), get(f"{blk}.attn_k.weight")
        if arch == "llama":  # back in Hugging Face order for the reference's rotate-half RoPE
            q, k = (m.reshape(h, m.shape[0] // h // 2, 2, -1).swapaxes(1, 2).reshape(m.shape)
                    for m, h in ((q, c.num_qo_heads), (k, c.num_kv_heads)))
        layers.append(LayerWeights(
            get(f"{blk}.attn_norm.weight"), q, k, get(f"{blk}.attn_v.weight"), get(f"{blk}.attn_output.weight"),
            get(f"{blk}.ffn_norm.weight"), get(f"{blk}.ffn_gate.weight"), get(f"{blk}.ffn_up.weight"),
            get(f"{blk}.ffn_down.weight"), q_bias=get(f"{blk}.attn_q.bias"), k_bias=get(f"{blk}.attn_k.bias"),
            v_bias=get(f"{blk}.attn_v.bias"), q_norm=get(f"{blk}.attn_q_norm.weight"),
            k_norm=get(f"{blk}.attn_k_norm.weight"), post_attention_norm=get(f"{blk}.post_attention_norm.weight"),
            post_ffw_norm=get(f"{blk}.post_ffw_norm.weight")))
    weights = Weights(get("token_embd.weight"), layers, get("output_norm.weight"))  # type: ignore[arg-type]
    if c.rope_factors is not None:
        c = replace(c, rope_factors=tuple(get("rope_freqs.weight")))  # type: ignore[arg-type]
    return arch, c, metadata, tensors, weights


def write_tiny_arch(path: Path, kind: str, seed: int = 0, metadata: dict[str, Any] | None = None,
                    types: dict[str, Any] | None = None) -> tuple[Path, Config, Weights]:
    """Write the tiny model ``kind`` to ``path`` (``metadata`` changing its ``<arch>.`` keys, ``types`` the types of
    tensors as :func:`tiny_arch`); (path, the reference's config and weights)."""
    arch, config, keys, tensors, weights = tiny_arch(kind, seed, types)
    write_tiny_llama(path, arch=arch, config=config, tensors=tensors, metadata={**keys, **(metadata or {})})
    return path, config, weights
