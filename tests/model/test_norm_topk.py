"""RMSNorm and top-k (shaders/model/norm.wgsl, topk.wgsl)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from kvckpt_web.gpu.device import Usage
from kvckpt_web.errors import TensorError
from kvckpt_web.model import kernels
from kvckpt_web.model.weights import F32, upload_tensor

from kernel_io import rows, run, run_texture


def test_rms_norm_matches_float64_per_token(device):
    rng = np.random.default_rng(5)
    tokens, dim, eps = 3, 76, 1e-5
    x = rng.standard_normal((tokens, dim)) * 3
    g = rng.standard_normal(dim)
    weight = upload_tensor(device, "norm", F32, (dim,), memoryview(g.astype(np.float32).tobytes()))
    out = kernels.activation_texture(device, dim, tokens, "test.out")
    x32 = x.astype(np.float32).astype(np.float64)
    g32 = g.astype(np.float32).astype(np.float64)
    got = run_texture(device, [kernels.rms_norm(device, rows(device, x), weight, out, tokens, eps)], out).astype(np.float64)
    want = x32 / np.sqrt((x32 ** 2).mean(axis=1, keepdims=True) + eps) * g32
    # the f32 sum of dim squares is within dim * 2^-24 relative (all terms positive); sqrt halves that, and
    # the division and two products add 4 roundings: relative (dim / 2 + 4) * 2^-24, times 2 for slack
    assert np.all(np.abs(got - want) <= 2 * (dim / 2 + 4) * 2.0 ** -24 * np.abs(want))


def _topk(device, values: np.ndarray, k: int, first: int = 0) -> list[tuple[float, int]]:
    """The top ``k`` of ``values`` from value ``first`` on."""
    n = len(values) - first
    buffer = device.create_buffer(4 * len(values), Usage.STORAGE | Usage.COPY_DST, "test.values")
    device.write(buffer, 0, values.astype(np.float32).tobytes())
    candidates = device.create_buffer(kernels.topk_candidates_bytes(n, k), Usage.STORAGE, "test.candidates")
    best = device.create_buffer(8 * k, Usage.STORAGE | Usage.COPY_SRC, "test.best")
    data = run(device, kernels.topk(device, buffer, n, k, candidates, best, first=first), best, 8 * k)
    return [(v, i) for v, i in struct.iter_unpack("<fI", data)]


def _reference(values: np.ndarray, k: int) -> list[tuple[float, int]]:
    v32 = values.astype(np.float32)
    order = sorted(range(len(v32)), key=lambda i: (-float(v32[i]), i))[:k]
    return [(float(v32[i]), i) for i in order]


@pytest.mark.parametrize("n,k", [(1, 1), (49152, 1), (49152, 40), (1000, 64), (300, 7)])
def test_topk_is_the_k_largest_in_order(device, n, k):
    values = np.random.default_rng(n + k).standard_normal(n)
    assert _topk(device, values, k) == _reference(values, k)


def test_argmax_of_equal_maxima_is_the_lowest_index(device):
    values = np.zeros(49152)
    values[[40000, 777, 30000, 12345]] = 2.5  # in different chunks of the first pass, out of order
    assert _topk(device, values, 1) == [(2.5, 777)]


def test_topk_orders_ties_by_index_across_and_within_chunks(device):
    values = np.random.default_rng(6).integers(-3, 4, 5000).astype(np.float64)  # many equal values
    assert _topk(device, values, 50) == _reference(values, 50)


def test_topk_of_a_later_row_reads_that_row_and_counts_indices_from_its_start(device):
    values = np.random.default_rng(8).standard_normal(3 * 1000)
    values[500] = 10.0  # the largest of row 0, which the top k of row 2 must not see
    assert _topk(device, values, 7, first=2000) == _reference(values[2000:], 7)


def test_topk_gives_the_same_result_twice(device):
    values = np.random.default_rng(7).standard_normal(49152)
    assert _topk(device, values, 20) == _topk(device, values, 20)


def test_topk_refuses_k_past_its_maximum(device):
    buffer = device.create_buffer(4 * 100, Usage.STORAGE, "test.values")
    with pytest.raises(TensorError, match="k"):
        kernels.topk(device, buffer, 100, kernels.TOPK_MAX + 1, buffer, buffer)
