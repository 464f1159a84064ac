"""The dense model kernels on the browser backend (textures, uniform windows, kept bind groups on SwiftShader).

Weights are made on the host with gguf's quantizer and passed in as hex; the page uploads them with the same
pure-Python code as the desktop (no numpy there) and runs the kernels. Tolerance of the products: f32 sums of
K = 64 terms, 8 * K * 2^-24 * sum |w x| (as in tests/model/test_quant_products.py).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize


def test_products_embedding_and_topk_match_the_host_reference(py_page):
    rng = np.random.default_rng(0)
    raw4 = quantize(rng.standard_normal((5, 64)).astype(np.float32), GGMLQuantizationType.Q4_1)
    raw8 = quantize(rng.standard_normal((7, 64)).astype(np.float32), GGMLQuantizationType.Q8_0)
    x = rng.standard_normal(64).astype(np.float32)
    got = py_page.run(f"""
        import struct
        from kvckpt_web.gpu.device import Copy, Usage
        from kvckpt_web.model import kernels
        from kvckpt_web.model.weights import Q4_1, Q8_0, upload_tensor
        w4 = upload_tensor(dev, "w4", Q4_1, (64, 5), bytes.fromhex({raw4.tobytes().hex()!r}))
        w8 = upload_tensor(dev, "w8", Q8_0, (64, 7), bytes.fromhex({raw8.tobytes().hex()!r}))
        x = kernels.activations(dev, 64, "x")
        dev.write(x, 0, bytes.fromhex({x.tobytes().hex()!r}))
        y = dev.create_buffer(4 * 12, Usage.STORAGE | Usage.COPY_SRC, "y")
        ids = dev.create_buffer(8, Usage.STORAGE | Usage.COPY_DST, "ids")
        dev.write(ids, 0, struct.pack("<2I", 6, 2))
        rows = dev.create_buffer(4 * 128, Usage.STORAGE | Usage.COPY_SRC, "rows")
        y8 = dev.create_buffer(4 * 7, Usage.STORAGE | Usage.COPY_SRC, "y8")
        candidates = dev.create_buffer(kernels.topk_candidates_bytes(7, 3), Usage.STORAGE, "candidates")
        best = dev.create_buffer(24, Usage.STORAGE | Usage.COPY_SRC, "best")
        staging = dev.create_buffer(4 * 5 + 4 * 7 + 4 * 128 + 24, Usage.MAP_READ | Usage.COPY_DST, "staging")
        for _ in range(2):  # the second time with the bind groups the first one made
            dev.submit([*kernels.matvec(dev, w4, x, y), *kernels.matvec(dev, w8, x, y8),
                        kernels.embed(dev, w8, ids, rows, 2), *kernels.topk(dev, y8, 7, 3, candidates, best),
                        Copy(y, 0, staging, 0, 20), Copy(y8, 0, staging, 20, 28), Copy(rows, 0, staging, 48, 512),
                        Copy(best, 0, staging, 560, 24)])
            data = bytes(await dev.read(staging, 0, 584))
        result = [list(struct.unpack("<5f", data[:20])), list(struct.unpack("<7f", data[20:48])),
                  list(struct.unpack("<128f", data[48:560])), list(struct.unpack("<fIfIfI", data[560:584]))]
    """)
    w4 = dequantize(raw4, GGMLQuantizationType.Q4_1).astype(np.float64)
    w8 = dequantize(raw8, GGMLQuantizationType.Q8_0)
    for w, values in ((w4, got[0]), (w8.astype(np.float64), got[1])):
        want = w @ x.astype(np.float64)
        assert np.all(np.abs(np.array(values) - want) <= 8 * 64 * 2.0 ** -24 * (np.abs(w) @ np.abs(x)))
    assert np.array_equal(np.array(got[2], np.float32), w8[[6, 2]].reshape(-1))  # d * q: one f32 product, exact
    y8 = np.array(got[1], np.float32)
    order = sorted(range(7), key=lambda i: (-y8[i], i))[:3]
    best = got[3]
    assert [best[1], best[3], best[5]] == order and [best[0], best[2], best[4]] == [float(y8[i]) for i in order]
