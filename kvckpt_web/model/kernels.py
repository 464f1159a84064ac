"""Dispatch builders for the dense model kernels (``shaders/model/*.wgsl``).

Each function builds the dispatches of one kernel, its uniform parameters packed to match the ``Params`` struct of
the shader; the device keeps their bind groups (``Dispatch.keep_bindings``): the buffers a model binds (weights,
activations) live as long as the model. Activations are f32, row-major (tokens, features). The products read their
input ``x`` as a uniform binding of :data:`X_WINDOW` bytes (loads that all invocations share are scalar loads on a
CPU adapter, where storage loads go lane by lane), so the buffers they read come from :func:`activations`, and a
call over more tokens than one window holds is split into one dispatch per window. Their workgroups are tiles of
64 rows (8 invocations of :data:`ROWS` rows, as ``weights`` lays the matrices out): many small workgroups, which
a CPU adapter shares out evenly over its threads.
"""

from __future__ import annotations

import functools
import math
import struct

from ..errors import TensorError
from ..gpu.device import UNIFORM_ALIGN, Buffer, Device, Dispatch, Kernel, Region, Usage
from ..gpu.specialize import specialize
from ..gpu.wgsl import pack_params, source
from .weights import Q4_1, Q8_0, TILE_ROWS, DenseTensor, QuantizedTensor

X_WINDOW = 65536
"""Bytes of ``x`` a product binds (WebGPU's default maxUniformBufferBindingSize; ``x`` in quant.wgsl)."""

ROWS = 8
"""Rows per invocation of the products (``ROWS`` in quant.wgsl); 8 invocations make a workgroup, a tile of
:data:`~kvckpt_web.model.weights.TILE_ROWS` rows."""

TILE = 4
"""Tokens per invocation of the tiled products, for several tokens (``TILE`` in quant.wgsl)."""

WORKGROUP = 64
"""Invocations per workgroup of the norm and the first top-k pass (``@workgroup_size``)."""

TOPK_CHUNK = 256
"""Values per invocation of the first top-k pass."""

TOPK_MAX = 64
"""Largest k of :func:`topk` (``K_MAX`` in topk.wgsl)."""


def activations(device: Device, floats: int, label: str) -> Buffer:
    """A buffer of ``floats`` f32 activations that kernels write and products read (with :data:`X_WINDOW`
    bytes of slack, so that a product can bind a whole window from any token of it)."""
    return device.create_buffer(4 * floats + X_WINDOW,
                                Usage.STORAGE | Usage.UNIFORM | Usage.COPY_DST | Usage.COPY_SRC, label)


def matvec(device: Device, weight: QuantizedTensor, x: Buffer, y: Buffer, tokens: int = 1,
           accumulate: bool = False) -> list[Dispatch]:
    """``y[t] = W x[t]`` (or ``y[t] += W x[t]`` with ``accumulate``: the residual add) for each of ``tokens``
    rows of ``x``, ``W`` a Q4_1 or Q8_0 matrix (the tied embedding as the output head). ``x`` (from
    :func:`activations`) and ``y`` are different buffers."""
    _check_type(weight, Q4_1, Q8_0)
    if weight.ggml_type == Q4_1:
        return _products(device, "q4_1_matvec", (weight,), x, y, tokens, accumulate, "q4_1_matmul")
    return _products(device, "q8_0_matvec", (weight,), x, y, tokens, accumulate)


def gated(device: Device, gate: QuantizedTensor, up: QuantizedTensor, x: Buffer, y: Buffer,
          tokens: int = 1) -> list[Dispatch]:
    """``y[t] = silu(G x[t]) * (U x[t])``, the gated MLP's hidden activations, for Q4_1 ``gate`` and ``up``."""
    _check_type(gate, Q4_1)
    _check_type(up, Q4_1)
    if (up.rows, up.blocks) != (gate.rows, gate.blocks):
        raise TensorError(f"{up.name}: shape", (gate.rows, gate.cols), (up.rows, up.cols))
    return _products(device, "q4_1_gated", (gate, up), x, y, tokens, False, "q4_1_gated_matmul")


def embed(device: Device, table: QuantizedTensor, ids: Buffer, out: Buffer, tokens: int) -> Dispatch:
    """``out[t] = table[ids[t]]`` dequantized, for ``tokens`` u32 token ids (a Q8_0 ``table``)."""
    _check_type(table, Q8_0)
    _check_size("out", out, 4 * tokens * table.cols)
    _check_size("ids", ids, 4 * tokens)
    return Dispatch(quant_kernel(device, "q8_0_rows"), _quant_params(table, tokens), (table.texels, ids, out),
                    tokens * table.blocks * 8, keep_bindings=True)


def rms_norm(device: Device, x: Buffer, weight: DenseTensor, out: Buffer, tokens: int, eps: float,
             first: int = 0) -> Dispatch:
    """``out[t] = x[first + t] / sqrt(mean(x[first + t]^2) + eps) * weight`` for each of ``tokens`` rows of
    ``x`` from row ``first``: the input of the products after an RMSNorm (one small dispatch: folded into each
    product, every invocation recomputed the norm of its tokens, a third of their time on lavapipe)."""
    dim = weight.shape[0]
    _check_size("x", x, 4 * (first + tokens) * dim)
    _check_size("out", out, 4 * tokens * dim)
    kernel = device.kernel("model.norm", source("model", "norm"), "rms_norm")
    params = struct.pack("<3If", tokens, dim, first, eps)
    return Dispatch(kernel, params, (x, weight.buffer, out), workgroups=(-(-tokens // WORKGROUP), 1, 1),
                    keep_bindings=True)


def topk_candidates_bytes(n: int, k: int) -> int:
    """Bytes of the scratch buffer :func:`topk` needs for ``n`` values."""
    return 8 * k * -(-n // TOPK_CHUNK)


def topk(device: Device, values: Buffer, n: int, k: int, candidates: Buffer, best: Buffer) -> list[Dispatch]:
    """The two dispatches that write the top ``k`` of ``n`` f32 ``values`` to ``best``: k (f32 bits, u32 index)
    pairs, larger values first, the lower index first among equal ones (k = 1: the argmax).

    ``candidates`` is scratch of :func:`topk_candidates_bytes` bytes."""
    if not 1 <= k <= min(TOPK_MAX, n):
        raise TensorError("k", f"1..{min(TOPK_MAX, n)}", k)
    _check_size("values", values, 4 * n)
    _check_size("candidates", candidates, topk_candidates_bytes(n, k))
    _check_size("best", best, 8 * k)
    chunks = -(-n // TOPK_CHUNK)
    params = pack_params(n, k, TOPK_CHUNK, chunks)
    shader = source("model", "topk")
    return [Dispatch(device.kernel("model.topk", shader, "chunk_topk"), params, (values, candidates),
                     workgroups=(-(-chunks // WORKGROUP), 1, 1), keep_bindings=True),
            Dispatch(device.kernel("model.topk", shader, "merge_topk"), params, (candidates, best),
                     workgroups=(1, 1, 1), keep_bindings=True)]


def _products(device: Device, entry: str, weights: tuple[QuantizedTensor, ...], x: Buffer, y: Buffer, tokens: int,
              accumulate: bool, tiled: str | None = None) -> list[Dispatch]:
    """The dispatches of product ``entry`` of ``weights`` over ``tokens`` rows of ``x``, one per window; of its
    ``tiled`` form (:data:`TILE` tokens an invocation) where a window has several tokens."""
    first = weights[0]
    token_bytes = 4 * first.cols
    # tokens per window: as many as fit, in steps that keep each window's offset aligned for a uniform binding
    step = UNIFORM_ALIGN // math.gcd(token_bytes, UNIFORM_ALIGN)
    per_window = X_WINDOW // token_bytes // step * step
    if per_window == 0:
        raise TensorError(f"{first.name}: columns", f"at most {X_WINDOW // 4}, in steps of 64", first.cols)
    last_window = (tokens - 1) // per_window * per_window * token_bytes
    if x.size < last_window + X_WINDOW:
        raise TensorError("x: buffer bytes", f"at least {last_window + X_WINDOW} (see activations())", x.size)
    _check_size("y", y, 4 * tokens * first.rows)
    if x is y:  # WebGPU refuses a buffer bound as uniform and as writable storage in one dispatch
        raise TensorError("y", "a buffer other than x", y.label)
    up = tuple(w.texels for w in weights[1:])
    tiles = -(-first.rows // TILE_ROWS)
    dispatches = []
    for start in range(0, tokens, per_window):
        count = min(per_window, tokens - start)
        if tiled is not None and count > 1:
            kernel, groups = quant_kernel(device, tiled), (tiles, -(-count // TILE), 1)
        else:
            kernel, groups = quant_kernel(device, entry), (tiles, count, 1)
        params = _quant_params(first, count, accumulate, start)
        dispatches.append(Dispatch(kernel, params, (first.texels, Region(x, start * token_bytes, X_WINDOW), y) + up,
                                   workgroups=groups, keep_bindings=True))
    return dispatches


def quant_kernel(device: Device, entry: str) -> Kernel:
    """Entry ``entry`` of quant.wgsl, specialised to :data:`ROWS` and :data:`TILE`."""
    return device.kernel("model.quant", _quant_source(ROWS, TILE), entry)


@functools.cache
def _quant_source(rows: int, tile: int) -> str:
    return specialize(source("model", "quant"), dict(ROWS=rows, TILE=tile))


def _quant_params(weight: QuantizedTensor, tokens: int, accumulate: bool = False, token_base: int = 0) -> bytes:
    """quant.wgsl's Params for ``weight`` (x's tokens ``weight.cols`` floats apart)."""
    return struct.pack("<8I", weight.rows, weight.blocks, tokens, int(accumulate), weight.shift, weight.scale_base,
                       weight.blocks * 8, token_base)


def _check_type(weight: QuantizedTensor, *types: int) -> None:
    if weight.ggml_type not in types:
        raise TensorError(f"{weight.name}: ggml type", " or ".join(map(str, types)), weight.ggml_type)


def _check_size(name: str, buffer: Buffer, needed: int) -> None:
    if buffer.size < needed:
        raise TensorError(f"{name}: buffer bytes", f"at least {needed}", buffer.size)
