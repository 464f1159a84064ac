"""Each architecture beside SmolLM2's (Llama 3's RoPE frequency factors, Qwen2, Qwen 3, Gemma 3) on a tiny random
GGUF (tests/model/tiny_archs.py) against the numpy float64 reference forward (tests/model/reference.py) over the
same dequantized weights: a prefill in chunks, then greedy decode steps.

Tolerances as in test_llama.py: float32 sums against float64 ones and float16 K/V on both sides. Measured largest
differences of logits over the prefill and five decode steps: 1.6e-4 (llama3), 2.5e-4 (qwen2), 1.2e-4 (qwen3),
4.8e-4 (gemma3, logits up to ~14). The bound leaves a margin of 6x over those and stays far under what a missing
bias, norm, window or RoPE factor moves (a test below shows that those this prompt exercises move the logits by
0.6 to 12). The same on files whose q/k/v or gate/up matrices are of several types, and (``real_model``) on the
real Gemma 3 270M Q4_K_M file, past its 512-token window.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from greedy_check import compare_decode  # noqa: E402
from reference import load_gguf, reference_forward  # noqa: E402
from tiny_archs import KINDS, write_tiny_arch  # noqa: E402
from tiny_llama import Q4_1, Q8_0  # noqa: E402

from kvckpt_web.model.loader import load_model  # noqa: E402

LOGIT_ATOL = 3e-3
REAL_LOGIT_ATOL = 2e-2
"""The real Gemma 3 270M Q4_K_M: measured largest differences 3.9e-3 (logits up to ~40) over both prompts and three
decode steps; 5x that."""
PROMPT = [int(t) for t in np.random.default_rng(7).integers(3, 300, 37)]
"""37 tokens: more than a Gemma window (5) and than two key ranges of the attention (16 keys each)."""
STEPS = 5


@pytest.fixture(scope="module", params=sorted(KINDS))
def tiny_arch(request, device, tmp_path_factory):  # type: ignore[no-untyped-def]
    """(kind, loaded model, reference config, reference weights) of each tiny architecture."""
    path, config, weights = write_tiny_arch(tmp_path_factory.mktemp("arch") / f"{request.param}.gguf", request.param)
    loaded = load_model(path, device)
    yield request.param, loaded, config, weights
    loaded.model.close()


def assert_as_the_reference(compared: tuple, atol: float, what: str) -> None:
    """The logits of each step within ``atol`` of the reference's, and the same greedy tokens."""
    got, want, got_tokens, want_tokens = compared
    for step, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, w, rtol=0, atol=atol, err_msg=f"{what}, step {step}")
    assert got_tokens == want_tokens


def test_each_architecture_prefills_and_decodes_as_the_float64_reference(device, tiny_arch):
    kind, loaded, config, weights = tiny_arch
    # prefill chunks of 12 over pages of 8: chunks start mid-page
    assert_as_the_reference(compare_decode(loaded, device, weights, config, PROMPT, STEPS, chunk=12, page_size=8),
                            LOGIT_ATOL, kind)


@pytest.mark.parametrize("kind, types", [
    ("llama3", {"attn_v.weight": Q8_0, "ffn_up.weight": Q8_0}),  # mixed q/k/v and gate/up of a SwiGLU model
    ("qwen3", {"ffn_gate.weight": Q8_0, "ffn_up.weight": Q8_0, "token_embd.weight": Q4_1}),  # SwiGLU, not Q4_1
    ("gemma3", {"attn_q.weight": Q8_0, "ffn_gate.weight": Q8_0}),  # mixed q/k/v and gate/up of a GeGLU model
])
def test_matrices_of_several_types_in_one_product_follow_the_float64_reference(device, tmp_path, kind, types):
    path, config, weights = write_tiny_arch(tmp_path / "m.gguf", kind, types=types)
    loaded = load_model(path, device)
    try:
        compared = compare_decode(loaded, device, weights, config, PROMPT, 2, chunk=12, page_size=8)
    finally:
        loaded.model.close()
    assert_as_the_reference(compared, LOGIT_ATOL, kind)


@pytest.mark.parametrize("kind, without", [
    ("llama3", {"rope_factors": None}),
    ("gemma3", {"sliding_window": 0}),
    ("gemma3", {"rope_theta_local": 1000000.0}),
    ("gemma3", {"embedding_scale": 1.0}),
])
def test_the_features_under_test_move_the_reference_far_beyond_the_tolerance(tmp_path, kind, without):
    _, config, weights = write_tiny_arch(tmp_path / "m.gguf", kind)
    with_feature = reference_forward(weights, config, PROMPT)[0][-1]
    without_feature = reference_forward(weights, replace(config, **without), PROMPT)[0][-1]
    assert np.abs(with_feature - without_feature).max() > 50 * LOGIT_ATOL


def test_a_gemma3_cache_marks_its_sliding_layers_and_its_checkpoint_continues_as_the_uninterrupted_run(device,
                                                                                                        tmp_path):
    from kvckpt_web.durable.restore import restore
    from kvckpt_web.durable.save import save
    from kvckpt_web.model.caches import new_cache
    from kvckpt_web.stores.memory import MemoryStore

    path, config, _ = write_tiny_arch(tmp_path / "gemma3.gguf", "gemma3")
    loaded = load_model(path, device)
    try:
        model = loaded.model
        layout = model.kv_layout(8)
        assert [kind == "mha_sliding" for kind in layout.attn_kinds] == [
            config.sliding_window > 0 and i % 6 != 5 for i in range(config.num_layers)]
        assert (layout.sliding_window, layout.sliding_rotary_theta) == (config.sliding_window, config.rope_theta_local)

        async def body() -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
            store, uninterrupted, restored = MemoryStore(), new_cache(model, device, page_size=8), None
            try:
                uninterrupted.add_sequence(0)
                await model.forward(uninterrupted, 0, PROMPT)  # more tokens than the window
                await save(uninterrupted, 0, store, "chat")
                want = await (await model.forward(uninterrupted, 0, [5])).top_k(4)
                restored = new_cache(model, device, page_size=8)
                await restore(store, "chat", restored, seq_id=0)
                got = await (await model.forward(restored, 0, [5])).top_k(4)
                return got, want
            finally:  # a cache left open leaks its buffers into the device's count of live ones
                for cache in (uninterrupted, restored):
                    if cache is not None:
                        cache.close()

        got, want = asyncio.run(body())
        assert got == want
    finally:
        loaded.model.close()


GEMMA_PROMPTS = ["Paris is the capital of",
                 "The lighthouse keeper climbed the stairs every evening to light the lamp for the ships. " * 40]
"""A short prompt, and one of ~700 tokens: past Gemma 3's 512-token window, so its sliding layers mask keys."""


@pytest.mark.real_model
@pytest.mark.parametrize("text", GEMMA_PROMPTS, ids=["short", "past-the-window"])
def test_the_real_gemma3_decodes_greedily_as_the_float64_reference(device, gemma_path, text):
    loaded = load_model(gemma_path, device)
    try:
        prompt = loaded.text.encode_text(text)
        weights, config = load_gguf(gemma_path)
        compared = compare_decode(loaded, device, weights, config, prompt, 3, chunk=128, page_size=16)
    finally:
        loaded.model.close()
    assert_as_the_reference(compared, REAL_LOGIT_ATOL, "gemma3")
