"""The hyper-parameters of a llama-architecture GGUF model, read from its metadata.

Every number the runner needs comes from the ``llama.*`` metadata keys (the vocabulary size from the token
embedding's shape); anything missing, of the wrong type, inconsistent or a variant the runner does not
implement (another architecture, partial rotary, rope scaling) is a :class:`~kvckpt_web.errors.FormatError`
naming the key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import FormatError
from .gguf import GGUFFile

ARCHITECTURE = "llama"
DEFAULT_ROPE_THETA = 10000.0
"""``llama.rope.freq_base`` when a file leaves it out (llama.cpp's default)."""


@dataclass(frozen=True)
class LlamaConfig:
    """The shape and constants of a llama model."""

    num_layers: int
    hidden: int
    ffn: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_eps: float
    max_context: int
    vocab: int

    @property
    def q_rows(self) -> int:
        """Rows of the query projection (all query heads)."""
        return self.num_qo_heads * self.head_dim

    @property
    def kv_rows(self) -> int:
        """Rows of the key (or value) projection (all K/V heads)."""
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "LlamaConfig":
        """The configuration in ``f``'s metadata; FormatError naming the key of anything unsupported."""
        arch = f.field("general.architecture", str)
        if arch != ARCHITECTURE:
            raise FormatError("general.architecture", repr(ARCHITECTURE), arch, "only llama models run here")

        def count(key: str) -> int:
            value = f.field(f"llama.{key}", int)
            if value < 1:
                raise FormatError(f"llama.{key}", "an integer >= 1", value)
            return value

        hidden, heads = count("embedding_length"), count("attention.head_count")
        kv_heads = count("attention.head_count_kv") if "llama.attention.head_count_kv" in f.metadata else heads
        if hidden % heads:
            raise FormatError("llama.embedding_length", f"a multiple of llama.attention.head_count={heads}", hidden)
        if heads % kv_heads:
            raise FormatError("llama.attention.head_count_kv", f"a divisor of llama.attention.head_count={heads}",
                              kv_heads)
        head_dim = hidden // heads
        if "llama.rope.dimension_count" in f.metadata and count("rope.dimension_count") != head_dim:
            raise FormatError("llama.rope.dimension_count", f"the head dimension {head_dim} (partial rotary is "
                              "not supported)", f.metadata["llama.rope.dimension_count"])
        scaling = f.metadata.get("llama.rope.scaling.type", "none")
        if scaling != "none":
            raise FormatError("llama.rope.scaling.type", "'none' (rope scaling is not supported)", scaling)
        theta = float(f.field("llama.rope.freq_base", (float, int))) if "llama.rope.freq_base" in f.metadata \
            else DEFAULT_ROPE_THETA
        if not 0 < theta < math.inf:
            raise FormatError("llama.rope.freq_base", "a finite positive number", theta)
        eps = float(f.field("llama.attention.layer_norm_rms_epsilon", (float, int)))
        if not 0 < eps < 1:
            raise FormatError("llama.attention.layer_norm_rms_epsilon", "a number in (0, 1)", eps)
        embedding = f.tensors.get("token_embd.weight")
        if embedding is None or len(embedding.shape) != 2:
            raise FormatError("token_embd.weight", "a 2-D tensor (embedding_length, vocabulary)",
                              None if embedding is None else embedding.shape)
        return cls(num_layers=count("block_count"), hidden=hidden, ffn=count("feed_forward_length"),
                   num_qo_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, rope_theta=theta, rms_eps=eps,
                   max_context=count("context_length"), vocab=embedding.shape[1])
