"""The model runner on the browser backend (Pyodide, SwiftShader WebGPU) against the desktop (wgpu-py, lavapipe).

Kernels: weights are made on the host (gguf's quantizer, or random blocks of every type) and passed in as hex;
the page uploads them with the same pure-Python code as the desktop (no numpy there) and runs the kernels; rows
must be gguf's bits. Tolerance of the products: f32 sums of K terms, 8 * K * 2^-24 * sum (|w| + 2 |c|) |x|, c a
weight's offset, 0 for Q4_1 and Q8_0 (as in tests/model/test_quant_products.py).

Generation: the GGUF file is written into the page's file system and loaded there with ``load_model``; the
same ``kvtest`` helpers generate in the page and on the desktop, from the same prompt, settings and seed, and
the tokens must be equal. The logits are not bitwise equal: SwiftShader's ``cos``/``sin`` (RoPE) are less exact
than lavapipe's (WGSL bounds their error at 2^-11 absolute), so about 9% of the tiny model's layer-0 K halves
differ by one float16 ulp and, measured, its logits (up to ~6.5) differ by up to 1.6e-3 between the two --
while the desktop's differ from a float64 forward by under 1e-4. The smallest top-two logit gap on the tiny
model's greedy path here was 0.023, 15x that difference, so its tokens are compared exactly; the logits
test bounds the difference at 5e-3 so that a drift shows before it can flip a token.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from kvckpt_web.model.loader import load_model

from . import kvtest
from .browser_harness import run_desktop

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))
from tiny_llama import write_tiny_llama  # noqa: E402
from kernel_io import offsets, random_blocks  # noqa: E402

from kvckpt_web.model.weights import DEVICE_FORMS  # noqa: E402

PROMPT = "tell me a story about the sea."
REAL_PROMPT = "Tell me a story about the sea."
TOKENS = 24
SEEDED = {"temperature": 0.9, "top_p": 0.9, "seed": 11}
LOGIT_STEPS = 10
LOGIT_ATOL = 5e-3


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
        x = kernels.activation_texture(dev, 64, 1, "x")
        dev.write_texture(x, bytes.fromhex({x.tobytes().hex()!r}))
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



def test_every_weight_type_gives_gguf_rows_bit_for_bit_and_products_within_tolerance(py_page):
    rng = np.random.default_rng(1)
    blocks = {t: random_blocks(rng, t, 5, DEVICE_FORMS[t].weights) for t in sorted(DEVICE_FORMS)}
    x = rng.standard_normal(256).astype(np.float32)
    got = py_page.run(f"""
        import struct
        from kvckpt_web.gpu.device import Copy, Usage
        from kvckpt_web.model import kernels
        from kvckpt_web.model.weights import upload_tensor
        result = {{}}
        for t, cols, raw in {[(t, DEVICE_FORMS[t].weights, raw.tobytes().hex()) for t, (raw, _) in blocks.items()]!r}:
            w = upload_tensor(dev, "w", t, (cols, 5), bytes.fromhex(raw))
            x = kernels.activation_texture(dev, cols, 1, "x")
            dev.write_texture(x, bytes.fromhex({x.tobytes().hex()!r})[:4 * cols])
            y = dev.create_buffer(4 * 5, Usage.STORAGE | Usage.COPY_SRC, "y")
            ids = dev.create_buffer(4 * 5, Usage.STORAGE | Usage.COPY_DST, "ids")
            dev.write(ids, 0, struct.pack("<5I", 0, 1, 2, 3, 4))
            rows = dev.create_buffer(4 * 5 * cols, Usage.STORAGE | Usage.COPY_SRC, "rows")
            staging = dev.create_buffer(20 + 20 * cols, Usage.MAP_READ | Usage.COPY_DST, "staging")
            dev.submit([*kernels.matvec(dev, w, x, y), kernels.embed(dev, w, ids, rows, 5), Copy(y, 0, staging, 0, 20),
                        Copy(rows, 0, staging, 20, 20 * cols)])
            result[t] = bytes(await dev.read(staging, 0, 20 + 20 * cols)).hex()
    """)
    for t, (raw, w) in blocks.items():
        data = bytes.fromhex(got[str(t)])  # JSON keys are strings
        products = np.frombuffer(data[:20], np.float32).astype(np.float64)
        rows = np.frombuffer(data[20:], np.float32).reshape(5, -1)
        assert np.array_equal(rows.view(np.uint32), w.astype(np.float32).view(np.uint32)), DEVICE_FORMS[t].name
        xs = x[:w.shape[1]].astype(np.float64)
        # as tests/model/test_quant_products.py: 8 * K * 2^-24 * sum (|w| + 2 |c|) |x|
        bound = 8 * w.shape[1] * 2.0 ** -24 * ((np.abs(w) + 2 * np.abs(offsets(raw, t))) @ np.abs(xs))
        assert np.all(np.abs(products - w @ xs) <= bound), DEVICE_FORMS[t].name


# ----- generation: the same tokens in the browser as on the desktop -----------------------------------------


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama") / "tiny.gguf")


@pytest.fixture(scope="module")
def tiny_page(py_page, tiny_path):
    """The page with the tiny GGUF in its file system and ``tiny`` (its LoadedModel on ``dev``) in its globals."""
    py_page.write_file("/home/pyodide/tiny.gguf", tiny_path.read_bytes())
    py_page.run("""
        from kvckpt_web.model.loader import load_model
        tiny = load_model("/home/pyodide/tiny.gguf", dev)
    """)
    return py_page


@pytest.mark.parametrize("settings", [{}, SEEDED], ids=["greedy", "seeded-top-p"])
def test_the_tiny_model_generates_the_desktop_tokens_in_the_browser(tiny_page, tiny_path, device, settings):
    want = run_desktop(kvtest.generate(load_model(tiny_path, device), device, PROMPT, settings, TOKENS))
    got = tiny_page.run(f"result = await kvtest.generate(tiny, dev, {PROMPT!r}, {settings!r}, {TOKENS})")
    assert got == want


def test_the_tiny_models_logits_in_the_browser_are_the_desktops_within_tolerance(tiny_page, tiny_path, device):
    want = run_desktop(kvtest.greedy_logits(load_model(tiny_path, device), device, PROMPT, LOGIT_STEPS))
    got = tiny_page.run(f"result = await kvtest.greedy_logits(tiny, dev, {PROMPT!r}, {LOGIT_STEPS})")
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_allclose(g, w, rtol=0, atol=LOGIT_ATOL, err_msg=f"step {step}")


def test_a_generation_checkpointed_to_indexeddb_resumes_in_a_fresh_cache_to_the_uninterrupted_tokens(tiny_page):
    """Seeded sampling: the tiny model's greedy reply settles on one repeated token before the resume point, so
    it could not tell a wrong continuation from the right one."""
    out = tiny_page.run(f"""
        from kvckpt_web.generation.autosave import Autosave
        from kvckpt_web.generation.resume import resume
        from kvckpt_web.stores.indexeddb import IndexedDBStore
        want = await kvtest.generate(tiny, dev, {PROMPT!r}, {SEEDED!r}, {TOKENS})
        prompt = kvtest.chat_prompt(tiny, {PROMPT!r})
        cache = kvtest.generation_cache(tiny, dev, prompt, {TOKENS})
        gen = await kvtest.start_generation(tiny, cache, prompt, {SEEDED!r}, {TOKENS},
                                            Autosave(await IndexedDBStore.open("generation"), "seeded", every=8))
        async for event in gen:
            if event.index + 1 == 13:
                break  # abandoned, as a closed tab abandons it (and its Web Locks)
        await gen.close()
        cache.close()
        again = kvtest.generation_cache(tiny, dev, prompt, {TOKENS})
        gen = await resume(await IndexedDBStore.open("generation"), "seeded", tiny.model, again)
        async with gen:
            result = {{"want": want, "restored": gen.resume_report.kv_restored,
                      "resumed_at": len(gen.generated_tokens), "got": list((await gen.run()).generated_tokens)}}
        again.close()
    """)
    assert out["restored"] and 0 < out["resumed_at"] < 13
    assert out["got"] == out["want"]


@pytest.mark.real_model
def test_smollm2_generates_the_desktop_greedy_tokens_in_the_browser(py_page, smollm_path, device):
    """12 greedy tokens of SmolLM2-135M for a chat prompt (its 98 MB GGUF goes into the page in 8 MB pieces:
    about 30 s here; the 12 tokens about 40 s on SwiftShader)."""
    want = run_desktop(kvtest.generate(load_model(smollm_path, device), device, REAL_PROMPT, {}, 12))
    py_page.write_file("/home/pyodide/smollm2.gguf", smollm_path.read_bytes())
    got = py_page.run(f"""
        from kvckpt_web.model.loader import load_model
        result = await kvtest.generate(load_model("/home/pyodide/smollm2.gguf", dev), dev, {REAL_PROMPT!r}, {{}}, 12)
    """)
    assert got == want
