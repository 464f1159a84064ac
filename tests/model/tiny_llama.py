"""A tiny random llama GGUF (SmolLM2's architecture and quantization types, small dims, ~300 tokens), for tests.

:func:`write_tiny_llama` writes it with ``gguf.GGUFWriter``: Q4_1 block matrices (attn_q/attn_k rows permuted
as llama.cpp's converter does), a Q8_0 token embedding tied as the head, F32 norms, a byte-level BPE
tokenizer with a few merges and ChatML's special tokens, and a ChatML chat template. :func:`load` is a
model factory for :mod:`kvckpt_web.cli.chat_worker` worker processes (``"tiny_llama:load"``), reading the
file named by ``$TINY_LLAMA_GGUF``.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from reference import Config, gguf_permute, random_model

from kvckpt_web.model.tokenizer import _BYTE_CHARS
from kvckpt_web.model.tokenizer_base import TOKEN_CONTROL, TOKEN_NORMAL

CONFIG = Config(num_layers=3, hidden=192, ffn=256, num_qo_heads=6, num_kv_heads=2, head_dim=32,
                rope_theta=100000.0, rms_eps=1e-5, vocab=0)
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MERGES = 41
CONTEXT = 512
TEMPLATE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
            "{{ '<|im_start|>system\\nYou are a tiny test model.<|im_end|>\\n' }}{% endif %}"
            "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
CORPUS = ("the theory of the thing is that there are three other ones in the north. "
          "what is the weather there? tell me a story about the sea.")
Q4_1, Q8_0, F32 = gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.F32


def vocabulary() -> tuple[list[str], list[str]]:
    """Tokens (specials, the 256 byte symbols, then merged ones) and merges learnt greedily from CORPUS."""
    words = [[_BYTE_CHARS[b] for b in ((" " if i else "") + w).encode()] for i, w in enumerate(CORPUS.split(" "))]
    tokens, merges = list(SPECIALS) + list(_BYTE_CHARS), []
    for _ in range(MERGES):
        pairs = Counter((a, b) for w in words for a, b in zip(w, w[1:]))
        (a, b), _count = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append(f"{a} {b}")
        tokens.append(a + b)
        for w in words:
            i = 0
            while i < len(w) - 1:
                if (w[i], w[i + 1]) == (a, b):
                    w[i:i + 2] = [a + b]
                i += 1
    return tokens, merges


def tiny_tensors(seed: int = 0) -> dict[str, tuple[np.ndarray, Any]]:
    """The model's tensors as (float32 ``(rows, cols)`` values in GGUF row order, ggml type)."""
    tokens, _ = vocabulary()
    c = Config(**{**CONFIG.__dict__, "vocab": len(tokens)})
    w = random_model(c, seed)
    out: dict[str, tuple[np.ndarray, Any]] = {"token_embd.weight": (w.embedding * 0.15, Q8_0),
                                               "output_norm.weight": (w.output_norm, F32)}
    for i, layer in enumerate(w.layers):
        out.update({f"blk.{i}.attn_norm.weight": (layer.attn_norm, F32),
                    f"blk.{i}.attn_q.weight": (gguf_permute(layer.q, c.num_qo_heads), Q4_1),
                    f"blk.{i}.attn_k.weight": (gguf_permute(layer.k, c.num_kv_heads), Q4_1),
                    f"blk.{i}.attn_v.weight": (layer.v, Q4_1),
                    f"blk.{i}.attn_output.weight": (layer.o, Q4_1),
                    f"blk.{i}.ffn_norm.weight": (layer.ffn_norm, F32),
                    f"blk.{i}.ffn_gate.weight": (layer.gate, Q4_1),
                    f"blk.{i}.ffn_up.weight": (layer.up, Q4_1),
                    f"blk.{i}.ffn_down.weight": (layer.down, Q4_1)})
    return out


def write_tiny_llama(path: Path, seed: int = 0,
                     edit: Callable[[dict[str, tuple[np.ndarray, Any]]], None] | None = None,
                     metadata: dict[str, Any] | None = None, name: str | None = None,
                     chat_template: str | None = TEMPLATE, *, arch: str = "llama", config: Config = CONFIG,
                     tensors: dict[str, tuple[np.ndarray, Any]] | None = None) -> Path:
    """Write the tiny model to ``path``; ``edit`` may change its tensors and ``metadata`` its ``<arch>.`` keys
    first; ``name`` is its ``general.name`` (none by default); ``chat_template`` None writes a base model, without
    one. Another architecture ``arch`` (tests/model/tiny_archs.py) gives its ``config`` (its ``<arch>.`` keys) and
    ``tensors`` (instead of the llama's)."""
    tokens, merges = vocabulary()
    tensors = tiny_tensors(seed) if tensors is None else tensors
    if edit is not None:
        edit(tensors)
    c = config
    keys: dict[str, Any] = {"block_count": c.num_layers, "context_length": CONTEXT, "embedding_length": c.hidden,
                            "feed_forward_length": c.ffn, "attention.head_count": c.num_qo_heads,
                            "attention.head_count_kv": c.num_kv_heads, "rope.dimension_count": c.head_dim,
                            "rope.freq_base": c.rope_theta, "attention.layer_norm_rms_epsilon": c.rms_eps,
                            **(metadata or {})}
    w = gguf.GGUFWriter(path, arch)
    if name is not None:
        w.add_name(name)
    for key, value in keys.items():
        if isinstance(value, float):
            w.add_float32(f"{arch}.{key}", value)
        elif isinstance(value, int):
            w.add_uint32(f"{arch}.{key}", value)
        else:
            w.add_string(f"{arch}.{key}", value)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types([TOKEN_CONTROL if t in SPECIALS else TOKEN_NORMAL for t in tokens])
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    w.add_add_bos_token(False)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    for name, (values, qtype) in tensors.items():
        values = np.asarray(values, np.float32)
        if qtype == F32:
            w.add_tensor(name, values)
        else:
            w.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def load(device: Any) -> Any:
    """Model factory of the demo's workers: the tiny model at ``$TINY_LLAMA_GGUF``."""
    from kvckpt_web.model.loader import load_model

    return load_model(os.environ["TINY_LLAMA_GGUF"], device)
