"""What a llama-style GGUF holds: every tensor of an architecture's configuration (its GGUF shape and allowed
ggml types) checked before anything is uploaded, each layer's RoPE rates, and the row order that puts a ``llama``
GGUF's q/k rows back in Hugging Face order.

Pure Python (struct-free byte slicing): it runs in Pyodide as on the desktop.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import FormatError
from .attention import rope_inv_freq
from .config import LlamaConfig
from .gguf import GGML_TYPES, GGUFFile, GGUFTensor
from .weights import DEVICE_FORMS, F32, check_finite

__all__ = ["BLOCK_NORMS", "POST_NORMS", "TensorSpec", "check_tensors", "hf_row_order", "reordered_rows", "rope_rates",
           "tensor_specs"]

BLOCK_NORMS = ("attn_norm", "ffn_norm")
POST_NORMS = ("post_attention_norm", "post_ffw_norm")
"""Gemma 3's norms of the attention's and the FFN's outputs (llama.cpp's attn_post_norm and ffn_post_norm)."""


@dataclass(frozen=True)
class TensorSpec:
    """What one tensor of the file must be: GGUF shape (ne0 first) and one of the allowed ggml types."""

    shape: tuple[int, ...]
    types: tuple[int, ...]


def tensor_specs(c: LlamaConfig, has_output: bool, has_rope_freqs: bool = False) -> dict[str, TensorSpec]:
    """Every tensor a GGUF of configuration ``c`` holds (``output.weight`` if ``has_output``, Llama 3's
    ``rope_freqs.weight`` if ``has_rope_freqs``)."""
    matrix = tuple(DEVICE_FORMS)
    specs = {"token_embd.weight": TensorSpec((c.hidden, c.vocab), matrix),
             "output_norm.weight": TensorSpec((c.hidden,), (F32,))}
    if has_output:
        specs["output.weight"] = TensorSpec((c.hidden, c.vocab), matrix)
    if has_rope_freqs:
        specs["rope_freqs.weight"] = TensorSpec((c.head_dim // 2,), (F32,))
    shapes = {"attn_q": (c.hidden, c.q_rows), "attn_k": (c.hidden, c.kv_rows), "attn_v": (c.hidden, c.kv_rows),
              "attn_output": (c.q_rows, c.hidden), "ffn_gate": (c.hidden, c.ffn), "ffn_up": (c.hidden, c.ffn),
              "ffn_down": (c.ffn, c.hidden)}
    vectors = {f"{name}.weight": (c.hidden,) for name in BLOCK_NORMS}
    if c.qkv_bias:
        vectors.update({"attn_q.bias": (c.q_rows,), "attn_k.bias": (c.kv_rows,), "attn_v.bias": (c.kv_rows,)})
    if c.qk_norm:
        vectors.update({"attn_q_norm.weight": (c.head_dim,), "attn_k_norm.weight": (c.head_dim,)})
    if c.post_norms:
        vectors.update({f"{name}.weight": (c.hidden,) for name in POST_NORMS})
    for i in range(c.num_layers):
        for name, shape in vectors.items():
            specs[f"blk.{i}.{name}"] = TensorSpec(shape, (F32,))
        for name, shape in shapes.items():
            specs[f"blk.{i}.{name}.weight"] = TensorSpec(shape, matrix)
    return specs


def check_tensors(f: GGUFFile, c: LlamaConfig) -> None:
    """FormatError naming the first tensor of ``f`` that is missing, unexpected, of another shape or type, or that
    holds an infinity or a NaN."""
    rope_freqs = c.architecture == "llama" and "rope_freqs.weight" in f.tensors
    specs = tensor_specs(c, "output.weight" in f.tensors, rope_freqs)
    for name, spec in specs.items():
        t = f.tensors.get(name)
        if t is None:
            raise FormatError(f"tensors[{name!r}]", "present", "missing")
        if t.type not in spec.types:
            raise FormatError(f"tensors[{name!r}].type", " or ".join(GGML_TYPES[x].name for x in spec.types),
                              t.type_name, "unsupported tensor type")
        if t.shape != spec.shape:
            raise FormatError(f"tensors[{name!r}].shape", spec.shape, t.shape)
        check_finite(name, t.type, t.data)
    extra = sorted(set(f.tensors) - set(specs))
    if extra:
        raise FormatError("tensors", f"only the {len(specs)} tensors of a {c.architecture} model",
                          f"also {extra[0]!r}", "unsupported tensor")


def rope_rates(c: LlamaConfig, factors: list[float] | None = None) -> list[list[float]]:
    """Per layer, RoPE's angle rate of each pair: the layer's scale / base^(2i / head_dim), divided by
    ``factors[i]`` (Llama 3's frequency factors, as llama.cpp's ``rope_freqs`` divides them) where given."""
    rates = []
    for layer in range(c.num_layers):
        theta, scale = c.layer_rope(layer)
        layer_rates = rope_inv_freq(c.head_dim, theta, scale)
        rates.append(layer_rates if factors is None else [r / f for r, f in zip(layer_rates, factors)])
    return rates


def hf_row_order(rows: int, head_dim: int) -> list[int]:
    """For each row of a Hugging Face q/k projection, the GGUF row it is stored in.

    GGUF's conversion interleaves the two halves of each head (HF row ``(head, half, i)`` is stored as row
    ``(head, i, half)``) so that ggml's RoPE rotates adjacent rows; this is the inverse.
    """
    half = head_dim // 2
    return [r - r % head_dim + 2 * (r % half) + (r % head_dim) // half for r in range(rows)]


def reordered_rows(t: GGUFTensor, order: list[int]) -> bytes:
    """The bytes of quantized tensor ``t``'s rows in ``order`` (each row is whole blocks)."""
    size = t.nbytes // t.shape[1]
    data = t.data
    return b"".join(data[r * size:(r + 1) * size] for r in order)
