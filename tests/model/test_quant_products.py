"""The quantized products of shaders/model/quant.wgsl (and quant_types.wgsl) against float64 products of the
dequantized weights, for every weight type: one token (the decode products) and several (the prefill's tiled ones),
on random blocks and on matrices of the real Gemma 3 270M file.

Tolerance: the kernels sum K = 32 * blocks terms in f32: per block (per half block) a * dot(q, x) + c * sum(x),
q the stored integers, a the scale, c the part of a weight that does not scale with q (Q4_1's m, Q4_0's -8 d, a
K-quant's -dmin * m: ``kernel_io.offsets``), then block after block. A recursive f32 sum of K terms is off from
the exact one by at most about K * 2^-24 times the sum of the magnitudes it adds (each of the K additions and
products rounds once, relative 2^-24); here those are |a q_i x_i| + |c_i x_i| <= (|w_i| + 2 |c_i|) |x_i|, as
w_i = a q_i + c_i. The tests allow 8 times K * 2^-24 * sum (|w_i| + 2 |c_i|) |x_i|, as slack for the grouping into
vec4 dot products and block sums and the rounding of c, which add roundings of the same order.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from kvckpt_web.gpu.device import Usage
from kvckpt_web.model import kernels
from kvckpt_web.errors import TensorError
from kvckpt_web.model.gguf import open_gguf
from kvckpt_web.model.weights import DEVICE_FORMS, Q4_1, Q4_K, Q5_0, Q6_K, Q8_0, upload_stacked

from kernel_io import (activations, floats, offsets, random_blocks, random_matrix, rows, run, run_texture,
                       upload_matrix)

TYPES = pytest.mark.parametrize("ggml_type", sorted(DEVICE_FORMS), ids=lambda t: DEVICE_FORMS[t].name)


def _bound(w: np.ndarray, x: np.ndarray, c: np.ndarray | None = None) -> np.ndarray:
    """Per (token, row) bound of f32 summation error: K * 2^-24 * sum (|w| + 2 |c|) |x|, times 8 for slack (``c``:
    the weights' offsets, none if omitted)."""
    magnitude = np.abs(w) if c is None else np.abs(w) + 2 * np.abs(c)
    return 8 * w.shape[1] * 2.0 ** -24 * (np.abs(x) @ magnitude.T)


@TYPES
@pytest.mark.parametrize("rows,units,tokens", [(1, 1, 1), (7, 3, 1), (259, 5, 1), (259, 5, 6), (64, 18, 2)],
                         ids=["1x1", "7x3", "259x5", "259x5-tiled", "64x18-tiled"])
def test_a_product_matches_the_float64_product_of_the_dequantized_weights(device, flavour, ggml_type, rows, units,
                                                                          tokens):
    cols = units * DEVICE_FORMS[ggml_type].weights
    rng = np.random.default_rng(rows * 100 + units)
    raw, w = random_blocks(rng, ggml_type, rows, cols)
    x = rng.standard_normal((tokens, cols))
    weight = upload_matrix(device, raw, ggml_type)
    y = device.create_buffer(4 * tokens * rows, Usage.STORAGE | Usage.COPY_SRC, "test.y")
    got = floats(run(device, kernels.matvec(device, weight, activations(device, x), y, tokens), y, 4 * tokens * rows))
    want = x @ w.T
    assert np.all(np.abs(got.reshape(tokens, rows) - want) <= _bound(w, x, offsets(raw, ggml_type)))


def test_matvec_with_accumulate_adds_to_y(device):
    rng = np.random.default_rng(1)
    raw, w = random_matrix(rng, Q4_1, 37, 64)
    x = rng.standard_normal((1, 64))
    residual = rng.standard_normal(37)
    y = rows(device, residual)
    got = floats(run(device, kernels.matvec(device, upload_matrix(device, raw, Q4_1), activations(device, x), y,
                                            accumulate=True), y, 4 * 37))
    # one more f32 rounding of the sum (relative 2^-24 of |residual + product|) on top of the product's bound
    assert np.all(np.abs(got - (residual + (x @ w.T)[0])) <= _bound(w, x)[0] + 2.0 ** -23 * np.abs(got))


def test_matvec_over_many_tokens_of_wide_rows_is_one_dispatch_and_matches(device):
    rng = np.random.default_rng(2)
    cols, tokens = 1536, 23  # more than a 64 KiB uniform window held (10 such tokens): one texture, one dispatch
    raw, w = random_matrix(rng, Q4_1, 9, cols)
    x = rng.standard_normal((tokens, cols))
    y = device.create_buffer(4 * tokens * 9, Usage.STORAGE | Usage.COPY_SRC, "test.y")
    dispatches = kernels.matvec(device, upload_matrix(device, raw, Q4_1), activations(device, x), y, tokens)
    got = floats(run(device, dispatches, y, 4 * tokens * 9)).reshape(tokens, 9)
    assert len(dispatches) == 1
    assert np.all(np.abs(got - x @ w.T) <= _bound(w, x))


def test_gated_product_is_silu_of_gate_times_up(device, flavour):
    rng = np.random.default_rng(3)
    rows, cols, tokens = 44, 96, 2
    raw_g, g = random_matrix(rng, Q4_1, rows, cols)
    raw_u, u = random_matrix(rng, Q4_1, rows, cols)
    x = rng.standard_normal((tokens, cols))
    hidden = kernels.activation_texture(device, rows, tokens, "test.hidden")
    got = run_texture(device, kernels.gated(device, upload_matrix(device, raw_g, Q4_1, "g"),
                                            upload_matrix(device, raw_u, Q4_1, "u"), activations(device, x), hidden,
                                            tokens), hidden).astype(np.float64)
    gate, up = x @ g.T, x @ u.T
    want = gate / (1 + np.exp(-gate)) * up
    # silu(a) * b with a, b each within their product bound eg, eu: |d(silu(a) b)| <= |silu'(a)| eg |b| + |silu(a)| eu
    # + f32 rounding of exp, division and product (a few ulp of the result); |silu'| <= 1.1
    eg, eu = _bound(g, x), _bound(u, x)
    silu = gate / (1 + np.exp(-gate))
    assert np.all(np.abs(got - want) <= 1.1 * eg * np.abs(up) + np.abs(silu) * eu + 1e-6 * np.abs(want) + 1e-30)


@TYPES
def test_products_give_the_same_bits_twice(device, ggml_type):
    rng = np.random.default_rng(4)
    raw, _ = random_blocks(rng, ggml_type, 300, 768)
    weight = upload_matrix(device, raw, ggml_type)
    x = activations(device, rng.standard_normal((2, 768)))
    y = device.create_buffer(4 * 600, Usage.STORAGE | Usage.COPY_SRC, "test.y")
    first = run(device, kernels.matvec(device, weight, x, y, 2), y, 2400)
    assert run(device, kernels.matvec(device, weight, x, y, 2), y, 2400) == first


def test_a_stacked_matrix_gives_the_rows_of_its_parts_bit_for_bit(device):
    rng = np.random.default_rng(10)
    parts = [random_matrix(rng, Q4_1, rows, 96)[0] for rows in (36, 12, 13)]
    stacked = upload_stacked(device, "qkv", [(Q4_1, (96, p.shape[0]), memoryview(p.tobytes())) for p in parts])
    x = activations(device, rng.standard_normal((2, 96)))
    y = device.create_buffer(4 * 2 * 61, Usage.STORAGE | Usage.COPY_SRC, "test.y")
    got = np.frombuffer(run(device, kernels.matvec(device, stacked, x, y, 2), y, y.size), np.float32).reshape(2, 61)
    separate = []
    for part in parts:
        rows = part.shape[0]
        out = device.create_buffer(4 * 2 * rows, Usage.STORAGE | Usage.COPY_SRC, "test.part")
        separate.append(np.frombuffer(run(device, kernels.matvec(device, upload_matrix(device, part, Q4_1), x, out, 2),
                                          out, out.size), np.float32).reshape(2, rows))
    assert np.array_equal(got, np.concatenate(separate, axis=1))


def test_stacking_matrices_of_different_widths_is_refused(device):
    a = random_matrix(np.random.default_rng(11), Q4_1, 4, 64)[0]
    b = random_matrix(np.random.default_rng(12), Q4_1, 4, 96)[0]
    with pytest.raises(TensorError, match="columns"):
        upload_stacked(device, "qkv", [(Q4_1, (64, 4), memoryview(a.tobytes())),
                                       (Q4_1, (96, 4), memoryview(b.tobytes()))])


@pytest.mark.parametrize("ggml_type,gate", [pytest.param(t, False, id=f.name) for t, f in sorted(DEVICE_FORMS.items())]
                         + [pytest.param(Q4_1, True, id="Q4_1-gated")])
@pytest.mark.parametrize("tokens", [2, 3, 6])
def test_a_product_over_several_tokens_gives_each_token_the_bits_of_its_own_product(device, flavour, ggml_type,
                                                                                    gate, tokens):
    rng = np.random.default_rng(13)
    # three tiles of rows, the last partial; tiles of 2 or 3 tokens (a decode step of 2 or 3 sequences), or two
    # token tiles, the second partial
    rows, cols = 136, 3 * DEVICE_FORMS[ggml_type].weights
    weights = [upload_matrix(device, random_blocks(rng, ggml_type, rows, cols)[0], ggml_type, f"w{i}")
               for i in range(2)]
    x = rng.standard_normal((tokens, cols))

    def product(values: np.ndarray) -> np.ndarray:
        if gate:
            hidden = kernels.activation_texture(device, rows, len(values), "test.hidden")
            return run_texture(device, kernels.gated(device, *weights, activations(device, values), hidden,
                                                     len(values)), hidden)
        y = device.create_buffer(4 * len(values) * rows, Usage.STORAGE | Usage.COPY_SRC, "test.y")
        dispatches = kernels.matvec(device, weights[0], activations(device, values), y, len(values))
        return np.frombuffer(run(device, dispatches, y, y.size), np.float32).reshape(len(values), rows)

    together = product(x)
    assert all(np.array_equal(together[t], product(x[t:t + 1])[0]) for t in range(tokens))


@pytest.mark.parametrize("tokens", [1, 5], ids=["decode", "tiled"])
@pytest.mark.parametrize("ggml_type", [Q8_0, Q5_0, Q4_K, Q6_K], ids=lambda t: DEVICE_FORMS[t].name)
def test_a_product_of_a_real_gemma_matrix_matches_the_float64_product(device, gemma_path, ggml_type, tokens):
    t = next(t for t in open_gguf(gemma_path).tensors.values() if t.type == ggml_type and t.name.startswith("blk."))
    raw = np.frombuffer(t.data, np.uint8).reshape(t.shape[1], -1)
    w = dequantize(raw, GGMLQuantizationType(ggml_type)).astype(np.float64)
    x = np.random.default_rng(ggml_type).standard_normal((tokens, t.shape[0]))
    y = device.create_buffer(4 * tokens * t.shape[1], Usage.STORAGE | Usage.COPY_SRC, "test.y")
    weight = upload_matrix(device, raw, ggml_type, t.name)
    got = floats(run(device, kernels.matvec(device, weight, activations(device, x), y, tokens), y, y.size))
    assert np.all(np.abs(got.reshape(tokens, -1) - x @ w.T) <= _bound(w, x, offsets(raw, ggml_type))), t.name
