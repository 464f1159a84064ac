"""The hyper-parameters of a GGUF model the runner implements, read from its metadata.

Four architectures (``general.architecture``) run, each a llama-style decoder with its variations as llama.cpp
builds them (``src/llama-model.cpp``):

- ``llama``: q/k rows stored permuted for ggml's adjacent-pair RoPE; optional linear RoPE scaling
  (``llama.rope.scaling.type``) and Llama 3's RoPE frequency factors (the ``rope_freqs.weight`` tensor);
- ``qwen2``: biases on the q/k/v projections, rotate-half RoPE (rows in Hugging Face order);
- ``qwen3``: per-head RMSNorm of Q and K before RoPE (``attn_q_norm`` / ``attn_k_norm``), no biases;
- ``gemma3``: QK norm, norms after attention and the FFN as well as before, GeGLU (GELU, tanh approximation), the
  embedding scaled by sqrt(embedding_length), and sliding-window layers (every 6th layer global), whose RoPE base is
  10000 (the global layers': the file's ``rope.freq_base``).

Every number comes from the ``<arch>.*`` metadata keys (the vocabulary size from the token embedding's shape);
anything missing, of the wrong type, inconsistent or a variant the runner does not implement (another
architecture, partial rotary, another RoPE scaling) is a :class:`~kvckpt_web.errors.FormatError` naming the key,
the expected and the got value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import FormatError
from .gguf import GGUFFile

DEFAULT_ROPE_THETA = 10000.0
"""``<arch>.rope.freq_base`` when a file leaves it out (llama.cpp's default); also Gemma 3's local layers' base."""

GEMMA3_SLIDING_PATTERN = 6
"""Gemma 3: layer ``i`` is global when ``i % 6 == 5``, sliding otherwise (llama.cpp's ``set_swa_pattern(6)``)."""

GEMMA3_27B_LAYERS = 62
"""Gemma 3 27B scales attention by 1/sqrt(embedding_length / head_count) (its query_pre_attn_scalar), the others
by 1/sqrt(key_length), as llama.cpp tells them apart: by their number of layers."""


@dataclass(frozen=True)
class Architecture:
    """What an architecture adds to the llama block."""

    permuted_qk: bool  # attn_q / attn_k rows stored permuted for adjacent-pair RoPE (llama.cpp's LLAMA_ROPE_TYPE_NORM)
    qkv_bias: bool
    qk_norm: bool
    post_norms: bool
    activation: str
    scaled_embedding: bool
    sliding_pattern: int  # 0: no sliding-window layers


ARCHITECTURES = {
    "llama": Architecture(True, False, False, False, "silu", False, 0),
    "qwen2": Architecture(False, True, False, False, "silu", False, 0),
    "qwen3": Architecture(False, False, True, False, "silu", False, 0),
    "gemma3": Architecture(False, False, True, True, "gelu_tanh", True, GEMMA3_SLIDING_PATTERN),
}
"""The architectures that run, by ``general.architecture``."""


@dataclass(frozen=True)
class LlamaConfig:
    """The shape and constants of a model of one of :data:`ARCHITECTURES`."""

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
    architecture: str = "llama"
    rope_scaling: str = "none"
    """``<arch>.rope.scaling.type``: "none" or "linear" (positions times :attr:`rope_scale`)."""
    rope_scale: float = 1.0
    """1 / ``<arch>.rope.scaling.factor`` with linear scaling (on Gemma 3's global layers only), else 1."""
    permuted_qk: bool = True
    qkv_bias: bool = False
    qk_norm: bool = False
    post_norms: bool = False
    activation: str = "silu"
    """The FFN's gate activation: "silu" (SwiGLU) or "gelu_tanh" (GeGLU)."""
    embedding_scale: float = 1.0
    sliding_window: int = 0
    """Keys a sliding layer's query sees (itself included); 0: no sliding layers."""
    sliding_pattern: int = 0
    rope_theta_local: float = DEFAULT_ROPE_THETA
    """The RoPE base of sliding layers."""
    attention_scale: float = 0.0
    """The factor of Q.K (0: 1/sqrt(head_dim))."""

    def __post_init__(self) -> None:
        if not self.attention_scale:
            object.__setattr__(self, "attention_scale", 1 / math.sqrt(self.head_dim))

    @property
    def q_rows(self) -> int:
        """Rows of the query projection (all query heads)."""
        return self.num_qo_heads * self.head_dim

    @property
    def kv_rows(self) -> int:
        """Rows of the key (or value) projection (all K/V heads)."""
        return self.num_kv_heads * self.head_dim

    def sliding(self, layer: int) -> bool:
        """Whether ``layer``'s queries see only the last :attr:`sliding_window` keys."""
        return self.sliding_window > 0 and layer % self.sliding_pattern < self.sliding_pattern - 1

    def layer_rope(self, layer: int) -> tuple[float, float]:
        """(RoPE base, position scale) of ``layer``."""
        return (self.rope_theta_local, 1.0) if self.sliding(layer) else (self.rope_theta, self.rope_scale)

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "LlamaConfig":
        """The configuration in ``f``'s metadata; FormatError naming the key of anything unsupported."""
        name = f.field("general.architecture", str)
        arch = ARCHITECTURES.get(name)
        if arch is None:
            raise FormatError("general.architecture", " or ".join(map(repr, ARCHITECTURES)), name,
                              "unsupported architecture")

        def key(k: str) -> str:
            return f"{name}.{k}"

        def count(k: str) -> int:
            value = f.field(key(k), int)
            if value < 1:
                raise FormatError(key(k), "an integer >= 1", value)
            return value

        def number(k: str, default: float) -> float:
            value = float(f.field(key(k), (float, int))) if key(k) in f.metadata else default
            if not 0 < value < math.inf:
                raise FormatError(key(k), "a finite positive number", value)
            return value

        hidden, heads = count("embedding_length"), count("attention.head_count")
        kv_heads = count("attention.head_count_kv") if key("attention.head_count_kv") in f.metadata else heads
        if heads % kv_heads:
            raise FormatError(key("attention.head_count_kv"), f"a divisor of {key('attention.head_count')}={heads}",
                              kv_heads)
        if key("attention.key_length") in f.metadata:
            head_dim = count("attention.key_length")
        elif hidden % heads:
            raise FormatError(key("embedding_length"), f"a multiple of {key('attention.head_count')}={heads}", hidden)
        else:
            head_dim = hidden // heads
        if key("attention.value_length") in f.metadata and count("attention.value_length") != head_dim:
            raise FormatError(key("attention.value_length"), f"the key length {head_dim}",
                              f.metadata[key("attention.value_length")])
        if key("rope.dimension_count") in f.metadata and count("rope.dimension_count") != head_dim:
            raise FormatError(key("rope.dimension_count"), f"the head dimension {head_dim} (partial rotary is "
                              "not supported)", f.metadata[key("rope.dimension_count")])
        scaling = f.field(key("rope.scaling.type"), str) if key("rope.scaling.type") in f.metadata else "none"
        if scaling not in ("none", "linear"):
            raise FormatError(key("rope.scaling.type"), "'none' or 'linear'", scaling, "unsupported rope scaling")
        scale = 1 / number("rope.scaling.factor", 1.0) if scaling == "linear" else 1.0
        eps = float(f.field(key("attention.layer_norm_rms_epsilon"), (float, int)))
        if not 0 < eps < 1:
            raise FormatError(key("attention.layer_norm_rms_epsilon"), "a number in (0, 1)", eps)
        embedding = f.tensors.get("token_embd.weight")
        if embedding is None or len(embedding.shape) != 2:
            raise FormatError("token_embd.weight", f"a 2-D tensor ({key('embedding_length')}, vocabulary)",
                              None if embedding is None else embedding.shape)
        layers = count("block_count")
        window = count("attention.sliding_window") if arch.sliding_pattern else 0
        attention_scale = 1 / math.sqrt(hidden / heads if name == "gemma3" and layers == GEMMA3_27B_LAYERS
                                        else head_dim)
        return cls(num_layers=layers, hidden=hidden, ffn=count("feed_forward_length"), num_qo_heads=heads,
                   num_kv_heads=kv_heads, head_dim=head_dim, rope_theta=number("rope.freq_base", DEFAULT_ROPE_THETA),
                   rms_eps=eps, max_context=count("context_length"), vocab=embedding.shape[1], architecture=name,
                   rope_scaling=scaling, rope_scale=scale, permuted_qk=arch.permuted_qk, qkv_bias=arch.qkv_bias,
                   qk_norm=arch.qk_norm, post_norms=arch.post_norms, activation=arch.activation,
                   embedding_scale=math.sqrt(hidden) if arch.scaled_embedding else 1.0, sliding_window=window,
                   sliding_pattern=arch.sliding_pattern, attention_scale=attention_scale)
