"""The row kernels the architectures add (kvckpt_web.model.row_kernels: shaders/model/rows.wgsl, glu.wgsl) against
float64 numpy.

Tolerance: each is a few f32 operations per value, or (the norms) an f32 sum of at most a few hundred squares:
relative error a few hundred times 2^-24 at worst, so ATOL = 1e-5 on values of size ~1-10 (RTOL 1e-5 for the
larger ones); a wrong index, weight half or epsilon is off by far more.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvckpt_web.errors import TensorError
from kvckpt_web.model import kernels, row_kernels
from kvckpt_web.model.weights import F32, upload_tensor

from kernel_io import floats, rows, run, run_texture
from reference import gelu_tanh, rms_norm, silu

ATOL = RTOL = 1e-5


@pytest.fixture(autouse=True)
def destroyed_after(device, monkeypatch):  # type: ignore[no-untyped-def]
    """Every buffer and texture a test makes is destroyed after it (the device counts live ones for other tests)."""
    made = []
    for name in ("create_buffer", "create_texture"):
        create = getattr(device, name)

        def recording(*args, _create=create, **kwargs):  # type: ignore[no-untyped-def]
            made.append(_create(*args, **kwargs))
            return made[-1]

        monkeypatch.setattr(device, name, recording)
    yield
    monkeypatch.undo()
    for resource in made:
        device.destroy(resource)


def f32(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float32).astype(np.float64)


def vector(device, values: np.ndarray):  # type: ignore[no-untyped-def]
    return upload_tensor(device, "test.w", F32, (values.size,), memoryview(values.astype(np.float32).tobytes()))


def test_add_bias_adds_the_bias_row_to_every_token(device):
    rng = np.random.default_rng(1)
    x, bias = f32(rng.standard_normal((5, 96))), f32(rng.standard_normal(96))
    buffer = rows(device, x)
    got = floats(run(device, [row_kernels.add_bias(device, buffer, vector(device, bias), 5)], buffer, 4 * x.size))
    np.testing.assert_allclose(got.reshape(5, 96), x + bias, rtol=RTOL, atol=ATOL)


def test_scale_multiplies_every_value(device):
    x = f32(np.random.default_rng(2).standard_normal((3, 64)))
    buffer = rows(device, x)
    got = floats(run(device, [row_kernels.scale(device, buffer, 3, 64, 25.3)], buffer, 4 * x.size))
    np.testing.assert_allclose(got.reshape(3, 64), x * np.float32(25.3), rtol=RTOL, atol=ATOL)


def test_head_norm_normalizes_each_q_and_k_head_with_its_weights_and_leaves_v(device):
    rng = np.random.default_rng(3)
    tokens, q_heads, kv_heads, head_dim, eps = 4, 6, 2, 48, 1e-6
    qkv = f32(rng.standard_normal((tokens, q_heads + 2 * kv_heads, head_dim)) * 3)
    q_norm, k_norm = f32(1 + rng.standard_normal(head_dim)), f32(1 + rng.standard_normal(head_dim))
    buffer = rows(device, qkv)
    dispatch = row_kernels.head_norm(device, buffer, vector(device, np.concatenate([q_norm, k_norm])), tokens,
                                     q_heads, kv_heads, head_dim, eps)
    got = floats(run(device, [dispatch], buffer, 4 * qkv.size)).reshape(qkv.shape)
    want = qkv.copy()
    want[:, :q_heads] = rms_norm(qkv[:, :q_heads], q_norm, eps)
    want[:, q_heads:q_heads + kv_heads] = rms_norm(qkv[:, q_heads:q_heads + kv_heads], k_norm, eps)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_norm_add_adds_the_normalized_rows_into_the_residual(device):
    rng = np.random.default_rng(4)
    x, y, w = f32(rng.standard_normal((3, 192))), f32(rng.standard_normal((3, 192)) * 5), f32(rng.standard_normal(192))
    residual = rows(device, x)
    dispatch = row_kernels.norm_add(device, residual, vector(device, w), rows(device, y), 3, 1e-6)
    got = floats(run(device, [dispatch], residual, 4 * x.size)).reshape(x.shape)
    np.testing.assert_allclose(got, x + rms_norm(y, w, 1e-6), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("activation, act", [("gelu_tanh", gelu_tanh), ("silu", silu)])
def test_glu_multiplies_the_activated_gate_rows_by_the_up_rows(device, activation, act):
    rng = np.random.default_rng(5)
    tokens, ffn = 3, 64
    gate_up = f32(rng.standard_normal((tokens, 2 * ffn)) * 4)
    gate_up[0, :4] = [-40.0, 40.0, -9.0, 9.0]  # where tanh is +-1 in f32
    hidden = kernels.activation_texture(device, ffn, tokens, "test.hidden")
    got = run_texture(device, [row_kernels.glu(device, rows(device, gate_up), hidden, tokens, ffn, activation)],
                      hidden)
    np.testing.assert_allclose(got.astype(np.float64), act(gate_up[:, :ffn]) * gate_up[:, ffn:], rtol=RTOL, atol=ATOL)


def test_place_writes_a_part_into_its_columns_of_each_row_and_leaves_the_rest(device):
    rng = np.random.default_rng(6)
    x, part = f32(rng.standard_normal((4, 80))), f32(rng.standard_normal((4, 24)))
    buffer = rows(device, x)
    got = floats(run(device, [row_kernels.place(device, buffer, rows(device, part), 4, 80, 40, 24)], buffer,
                     4 * x.size)).reshape(x.shape)
    want = x.copy()
    want[:, 40:64] = part
    np.testing.assert_array_equal(got, want)


def test_head_norm_weights_of_another_size_are_refused(device):
    with pytest.raises(TensorError, match=r"shape: expected \(96,\), got \(48,\)"):
        row_kernels.head_norm(device, rows(device, np.zeros((1, 10, 48))), vector(device, np.ones(48)), 1, 6, 2,
                              48, 1e-6)
