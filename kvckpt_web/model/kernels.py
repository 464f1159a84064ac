"""Dispatch builders for the dense model kernels (``shaders/model/*.wgsl``).

Each function builds the dispatches of one kernel, its uniform parameters packed to match the ``Params`` struct of
the shader; the device keeps their bind groups (``Dispatch.keep_bindings``): the buffers and textures a model binds
(weights, activations) live as long as the model. The products read their input ``x`` from an activation texture
(:func:`activation_texture`: f32 bits in rgba32uint texels, a token a row), which a CPU adapter fetches 16 bytes a
lane; RMSNorm, the attention and the gated product write such textures, the other products storage buffers of f32
rows (tokens, features). Their workgroups are tiles of 64 rows (8 invocations of :data:`ROWS` rows, as
``weights`` lays the matrices out): many small workgroups, which a CPU adapter shares out evenly over its threads.
How they fetch and unpack depends on the adapter (:data:`FLAVOURS`).
"""

from __future__ import annotations

import functools
import struct

from ..errors import TensorError
from ..gpu.device import Buffer, Device, Dispatch, Kernel, Texture
from ..gpu.specialize import specialize
from ..gpu.wgsl import source
from .weights import BLOCK, DEVICE_FORMS, Q4_1, Q4_K, Q5_K, Q8_0, TILE_ROWS, DenseTensor, QuantizedTensor

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


def activation_texture(device: Device, features: int, tokens: int, label: str) -> Texture:
    """A texture of ``tokens`` rows of ``features`` f32 activations (a multiple of 4), as kernels write them and
    products read them."""
    if features % 4:
        raise TensorError(f"{label}: features", "a multiple of 4", features)
    return device.create_texture(features // 4, tokens, 4, label)


def matvec(device: Device, weight: QuantizedTensor, x: Texture, y: Buffer, tokens: int = 1,
           accumulate: bool = False) -> list[Dispatch]:
    """``y[t] = W x[t]`` (or ``y[t] += W x[t]`` with ``accumulate``: the residual add) for each of ``tokens``
    rows of ``x``, ``W`` a matrix of any :data:`~kvckpt_web.model.weights.DEVICE_FORMS` type (the tied embedding
    as the output head)."""
    _check_size("y", y, 4 * tokens * weight.rows)
    form = "q8_0_" if weight.ggml_type == Q8_0 else ""  # Q8_0's own forms (quant.wgsl)
    return _products(device, f"{form}matvec", (weight,), x, y, tokens, accumulate, f"{form}matmul")


def gated(device: Device, gate: QuantizedTensor, up: QuantizedTensor, x: Texture, hidden: Texture,
          tokens: int = 1) -> list[Dispatch]:
    """``hidden[t] = silu(G x[t]) * (U x[t])``, the gated MLP's hidden activations, for Q4_1 ``gate`` and ``up``."""
    _check_type(gate, Q4_1)
    _check_type(up, Q4_1)
    if (up.rows, up.blocks) != (gate.rows, gate.blocks):
        raise TensorError(f"{up.name}: shape", (gate.rows, gate.cols), (up.rows, up.cols))
    _check_texture("hidden", hidden, gate.rows, tokens)
    return _products(device, "q4_1_gated", (gate, up), x, hidden, tokens, False, "q4_1_gated_matmul")


def embed(device: Device, table: QuantizedTensor, ids: Buffer, out: Buffer, tokens: int) -> Dispatch:
    """``out[t] = table[ids[t]]`` dequantized (the bits of ``gguf.quants.dequantize``), for ``tokens`` u32 token
    ids, ``table`` of any type."""
    _check_size("out", out, 4 * tokens * table.cols)
    _check_size("ids", ids, 4 * tokens)
    params = struct.pack("<6I8x", table.rows, table.blocks, tokens, 0, table.shift, table.scale_base)
    return Dispatch(quant_kernel(device, "rows", table.ggml_type), params, (table.texels, ids, out), tokens * table.blocks * 8,
                    keep_bindings=True)


def rms_norm(device: Device, x: Buffer, weight: DenseTensor, out: Texture, tokens: int, eps: float) -> Dispatch:
    """``out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * weight`` for each of ``tokens`` rows of ``x``: the input of
    the products after an RMSNorm (one small dispatch: folded into each
    product, every invocation recomputed the norm of its tokens, a third of their time on lavapipe)."""
    dim = weight.shape[0]
    _check_size("x", x, 4 * tokens * dim)
    _check_texture("out", out, dim, tokens)
    kernel = device.kernel("model.norm", source("model", "norm"), "rms_norm")
    params = struct.pack("<2If4x", tokens, dim, eps)
    return Dispatch(kernel, params, (x, weight.buffer, out), workgroups=(-(-tokens // WORKGROUP), 1, 1),
                    keep_bindings=True)


def topk_candidates_bytes(n: int, k: int) -> int:
    """Bytes of the scratch buffer :func:`topk` needs for ``n`` values."""
    return 8 * k * -(-n // TOPK_CHUNK)


def topk(device: Device, values: Buffer, n: int, k: int, candidates: Buffer, best: Buffer,
         first: int = 0) -> list[Dispatch]:
    """The two dispatches that write the top ``k`` of ``n`` f32 ``values`` (from value ``first``: one row of
    several) to ``best``: k (f32 bits, u32 index from ``first``) pairs, larger values first, the lower index first
    among equal ones (k = 1: the argmax).

    ``candidates`` is scratch of :func:`topk_candidates_bytes` bytes."""
    if not 1 <= k <= min(TOPK_MAX, n):
        raise TensorError("k", f"1..{min(TOPK_MAX, n)}", k)
    _check_size("values", values, 4 * (first + n))
    _check_size("candidates", candidates, topk_candidates_bytes(n, k))
    _check_size("best", best, 8 * k)
    chunks = -(-n // TOPK_CHUNK)
    params = struct.pack("<5I12x", n, k, TOPK_CHUNK, chunks, first)
    shader = source("model", "topk")
    return [Dispatch(device.kernel("model.topk", shader, "chunk_topk"), params, (values, candidates),
                     workgroups=(-(-chunks // WORKGROUP), 1, 1), keep_bindings=True),
            Dispatch(device.kernel("model.topk", shader, "merge_topk"), params, (candidates, best),
                     workgroups=(1, 1, 1), keep_bindings=True)]


def _products(device: Device, entry: str, weights: tuple[QuantizedTensor, ...], x: Texture, y: Buffer | Texture,
              tokens: int, accumulate: bool, tiled: str | None = None) -> list[Dispatch]:
    """The dispatch of product ``entry`` of ``weights`` over ``tokens`` rows of ``x``; of its ``tiled`` form
    (:data:`TILE` tokens an invocation, fewer where the product has fewer: a decode step of 2 or 3 sequences
    computes no sums for tokens it does not have) for several tokens. Each (row, token) sum has the same bits
    whichever form and tile compute it."""
    first = weights[0]
    _check_texture("x", x, first.cols, tokens)
    if tiled is not None and tokens > 1:
        tile = min(TILE, tokens)
        kernel, groups = quant_kernel(device, tiled, first.ggml_type, tile), (-(-first.rows // TILE_ROWS),
                                                                               -(-tokens // tile), 1)
    else:
        kernel, groups = quant_kernel(device, entry, first.ggml_type), (-(-first.rows // TILE_ROWS), tokens, 1)
    params = struct.pack("<6I8x", first.rows, first.blocks, tokens, int(accumulate), first.shift, first.scale_base)
    return [Dispatch(kernel, params, (first.texels, x, y) + tuple(w.texels for w in weights[1:]), workgroups=groups,
                     keep_bindings=True)]


FLAVOURS = {"desktop": {"SAMPLED": 0, "MASKED": 0}, "browser": {"SAMPLED": 1, "MASKED": 1}}
"""The two ways quant.wgsl is built (its SAMPLED and MASKED constants), each what measured faster where it is used
(bench/notes/2026-12-05-model-kernels.md, bench/notes/2026-12-05-kernels-vs-llama-cpp.md): on lavapipe read-only
storage textures and shifted bytes (sampled textures took the decode products to 1.45x the CPU time, masked bytes a
prefill's to 1.16x); on SwiftShader (Chromium) sampled textures and bytes masked in place (storage textures took the
products to ~1.7x the time, shifts the head's to ~1.9x)."""

FLAVOUR = "model.quant_flavour"
"""``device.choices`` key: the name of the :data:`FLAVOURS` entry the products are built with on that device; set
it before the first product of a device to choose, else :func:`flavour` does."""


def flavour(device: Device) -> str:
    """The :data:`FLAVOURS` entry of ``device``: "browser" on the browser backend, "desktop" elsewhere."""
    return str(device.choices.setdefault(FLAVOUR, "browser" if device.info.backend.startswith("browser") else "desktop"))


def quant_kernel(device: Device, entry: str, ggml_type: int = Q4_1, tile: int = TILE) -> Kernel:
    """Entry ``entry`` of quant.wgsl with quant_types.wgsl, specialised to :data:`ROWS`, ``tile`` tokens an
    invocation of the tiled products, the device's :func:`flavour` and weights of ``ggml_type``."""
    return device.kernel("model.quant", _quant_source(ROWS, tile, flavour(device), ggml_type), entry)


@functools.cache
def _quant_source(rows: int, tile: int, name: str, ggml_type: int) -> str:
    form = DEVICE_FORMS[ggml_type]
    types = {f"IS_{f.name}": int(t == ggml_type) for t, f in DEVICE_FORMS.items()}
    types["BLOCKED"] = int(ggml_type not in (Q4_1, Q8_0))
    types["HAS_MIN"] = int(ggml_type in (Q4_1, Q4_K, Q5_K))
    return specialize(source("model", "quant") + source("model", "quant_types"),
                      dict(ROWS=rows, TILE=tile, **FLAVOURS[name], UNIT=form.weights // BLOCK, TEXELS=form.texels,
                           WORDS=form.words, **types))


def _check_type(weight: QuantizedTensor, *types: int) -> None:
    if weight.ggml_type not in types:
        raise TensorError(f"{weight.name}: ggml type", " or ".join(map(str, types)), weight.ggml_type)


def _check_size(name: str, buffer: Buffer, needed: int) -> None:
    if buffer.size < needed:
        raise TensorError(f"{name}: buffer bytes", f"at least {needed}", buffer.size)


def _check_texture(name: str, texture: Texture, features: int, tokens: int) -> None:
    """TensorError unless ``texture`` holds ``tokens`` rows of ``features`` activations (a multiple of 4)."""
    if features % 4 or texture.width < features // 4 or texture.height < tokens or texture.channels != 4:
        raise TensorError(f"{name}: texture", f"{tokens} rows of {features} activations (at least "
                                               f"{-(-features // 4)} x {tokens} texels of 4 channels)",
                          f"{texture.width} x {texture.height} of {texture.channels}")
