"""Dispatch builders of the row-wise kernels that the architectures add to the llama block
(``shaders/model/rows.wgsl``, ``shaders/model/glu.wgsl``): Qwen2's q/k/v biases, the per-head RMSNorm of Q and K
(Qwen 3, Gemma 3), Gemma 3's embedding scale, its norms after attention and the FFN, GeGLU (and SwiGLU where the
fused Q4_1 product does not serve), and the placing of one matrix's product beside those of other types (q, k
and v of a file that quantizes them differently).

Each takes f32 storage buffers of ``tokens`` rows (the residual, the fused q/k/v rows, a product's output) and
changes them in place, except :func:`glu`, which writes the activation texture the down product reads.
"""

from __future__ import annotations

import struct

from ..errors import TensorError
from ..gpu.device import Buffer, Device, Dispatch, Kernel, Texture
from ..gpu.wgsl import source
from .weights import DenseTensor


def _kernel(device: Device, entry: str) -> Kernel:
    return device.kernel("model.rows", source("model", "rows"), entry)


def _params(tokens: int, width: int, heads: int = 0, head_dim: int = 0, q_heads: int = 0, value: float = 0.0,
            offset: int = 0, part: int = 0) -> bytes:
    return struct.pack("<5If2I", tokens, width, heads, head_dim, q_heads, value, offset, part)


def _check(name: str, buffer: Buffer, needed: int) -> None:
    if buffer.size < needed:
        raise TensorError(f"{name}: buffer bytes", f"at least {needed}", buffer.size)


def _check_weights(weights: DenseTensor, count: int) -> None:
    if weights.shape != (count,):
        raise TensorError(f"{weights.name}: shape", (count,), weights.shape)


def add_bias(device: Device, x: Buffer, bias: DenseTensor, tokens: int) -> Dispatch:
    """``x[t] += bias`` for each of ``tokens`` rows of ``x`` (rows of ``bias.shape[0]`` values)."""
    width = bias.shape[0]
    _check("x", x, 4 * tokens * width)
    return Dispatch(_kernel(device, "add_bias"), _params(tokens, width), (x, bias.buffer), tokens * width,
                    keep_bindings=True)


def scale(device: Device, x: Buffer, tokens: int, width: int, factor: float) -> Dispatch:
    """``x[t] *= factor`` for each of ``tokens`` rows of ``width`` values."""
    _check("x", x, 4 * tokens * width)
    return Dispatch(_kernel(device, "scale"), _params(tokens, width, value=factor), (x,), tokens * width,
                    keep_bindings=True)


def head_norm(device: Device, qkv: Buffer, weights: DenseTensor, tokens: int, q_heads: int, kv_heads: int,
              head_dim: int, eps: float) -> Dispatch:
    """RMSNorm of every Q and K head of ``tokens`` rows of fused ``qkv`` (Q, K then V heads of ``head_dim``), in
    place: Q heads times ``weights``' first ``head_dim`` values, K heads times the next ``head_dim``."""
    _check_weights(weights, 2 * head_dim)
    width = (q_heads + 2 * kv_heads) * head_dim
    _check("qkv", qkv, 4 * tokens * width)
    heads = q_heads + kv_heads
    return Dispatch(_kernel(device, "head_norm"), _params(tokens, width, heads, head_dim, q_heads, eps),
                    (qkv, weights.buffer), tokens * heads, keep_bindings=True)


def norm_add(device: Device, x: Buffer, weight: DenseTensor, y: Buffer, tokens: int, eps: float) -> Dispatch:
    """``x[t] += RMSNorm(y[t]) * weight`` for each of ``tokens`` rows: a norm after a block, into the residual."""
    width = weight.shape[0]
    _check("x", x, 4 * tokens * width)
    _check("y", y, 4 * tokens * width)
    return Dispatch(_kernel(device, "norm_add"), _params(tokens, width, value=eps), (x, weight.buffer, y), tokens,
                    keep_bindings=True)


def place(device: Device, x: Buffer, part: Buffer, tokens: int, width: int, offset: int, rows: int) -> Dispatch:
    """``x[t, offset:offset + rows] = part[t]`` for each of ``tokens`` rows of ``rows`` values of ``part`` (rows of
    ``width`` values of ``x``)."""
    if offset + rows > width:
        raise TensorError("offset + rows", f"at most the width {width}", offset + rows)
    _check("x", x, 4 * tokens * width)
    _check("part", part, 4 * tokens * rows)
    return Dispatch(_kernel(device, "place"), _params(tokens, width, offset=offset, part=rows), (x, part),
                    tokens * rows, keep_bindings=True)


ACTIVATIONS = ("silu", "gelu_tanh")
"""The gate activations of :func:`glu`."""


def glu(device: Device, gate_up: Buffer, hidden: Texture, tokens: int, ffn: int, activation: str) -> Dispatch:
    """``hidden[t] = act(G x_t) * (U x_t)`` from ``gate_up``'s rows (``ffn`` gate values, then ``ffn`` up values per
    token), ``act`` SiLU (``activation`` "silu") or GELU's tanh approximation ("gelu_tanh")."""
    if activation not in ACTIVATIONS:
        raise TensorError("activation", " or ".join(map(repr, ACTIVATIONS)), activation)
    _check("gate_up", gate_up, 8 * tokens * ffn)
    if ffn % 4 or hidden.width * 4 < ffn or hidden.height < tokens or hidden.channels != 4:
        raise TensorError("hidden: texture", f"{tokens} rows of {ffn} activations",
                          f"{hidden.width} x {hidden.height} of {hidden.channels}")
    kernel = device.kernel("model.glu", source("model", "glu"), "glu")
    params = struct.pack("<3I4x", tokens, ffn, int(activation == "gelu_tanh"))
    return Dispatch(kernel, params, (gate_up, hidden), tokens * ffn // 4, keep_bindings=True)
