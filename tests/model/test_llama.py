"""The llama runner (kvckpt_web.model.llama) against the numpy float64 reference forward (tests/model/reference.py)
over the same dequantized weights: on a tiny random model of SmolLM2's architecture and on SmolLM2 itself.

Tolerances. The runner accumulates in float32 (dot products of at most 1536 terms, block by block), the reference
in float64; both round K/V to float16 where they enter the cache, and the two float16 roundings can differ by one
ulp where a float32 result straddles a rounding boundary. Measured largest differences of logits: 5e-5 on the
tiny model (logits up to ~6.5) and 6.5e-3 to 8.8e-3 on SmolLM2 (logits up to ~25, 30 layers of float16 K/V).
The bounds below leave a margin of 5-20x over those and stay far under what a real error does (a wrong RoPE
pairing, an un-permuted row or a missing norm moves logits by whole units); greedy tokens must also agree.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from greedy_check import compare_decode  # noqa: E402
from reference import load_gguf, reference_forward  # noqa: E402
from tiny_llama import CONFIG, CONTEXT, F32, write_tiny_llama  # noqa: E402

from kvckpt_web.errors import CheckpointStateError, FormatError, KVCkptError, SequenceError  # noqa: E402
from kvckpt_web.model.gguf import open_gguf  # noqa: E402
from kvckpt_web.model.loader import load_gguf as load_gguf_model  # noqa: E402
from kvckpt_web.model.loader import load_model  # noqa: E402
from kvckpt_web.model.caches import new_cache# noqa: E402

TINY_LOGIT_ATOL = 1e-3
REAL_LOGIT_ATOL = 5e-2
PROMPT = [{"role": "user", "content": "tell me a story about the sea."}]
REAL_PROMPT = [{"role": "user", "content": "What is the capital of France?"}]


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def tiny(device, tiny_llama_path):  # type: ignore[no-untyped-def]
    return load_model(tiny_llama_path, device)


@pytest.fixture(scope="module")
def tiny_reference(tiny_llama_path):  # type: ignore[no-untyped-def]
    return load_gguf(tiny_llama_path)


def test_tiny_model_logits_of_a_chat_prompt_and_four_decode_steps_follow_the_float64_reference(device, tiny,
                                                                                             tiny_reference):
    prompt = tiny.text.encode_chat(PROMPT)
    # prefill chunks of 24 over pages of 4 tokens: chunks start mid-page and cross page boundaries
    got, want, got_tokens, want_tokens = compare_decode(tiny, device, *tiny_reference, prompt, 4, chunk=24,
                                                        page_size=4)
    for step, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, w, rtol=0, atol=TINY_LOGIT_ATOL, err_msg=f"step {step}")
    assert got_tokens == want_tokens


def test_the_cache_holds_the_k_and_v_of_unpermuted_weights_with_rotate_half_rope(device, tiny, tiny_reference):
    weights, config = tiny_reference
    prompt = tiny.text.encode_chat(PROMPT)
    cache = new_cache(tiny.model, device, max_tokens=len(prompt), prefill_chunk=32, page_size=16, num_seqs=1)
    cache.add_sequence(0)
    run(tiny.model.forward(cache, 0, prompt))
    k, v = run(cache.debug_get_kv(0, 0, len(prompt)))
    cache.close()
    _, kv = reference_forward(weights, config, prompt)
    for layer, (ref_k, ref_v) in enumerate(kv):
        # float16 values: one ulp where float32 and float64 round differently
        np.testing.assert_allclose(k.numpy()[layer], ref_k, rtol=2e-3, atol=2e-3, err_msg=f"K of layer {layer}")
        np.testing.assert_allclose(v.numpy()[layer], ref_v, rtol=2e-3, atol=2e-3, err_msg=f"V of layer {layer}")


def test_the_kv_layout_declares_rope_normal_with_the_files_theta_and_float16_heads(tiny):
    layout = tiny.model.kv_layout(page_size=8)
    assert (layout.rope_mode, layout.rotary_theta, layout.rotary_scale, layout.dtype) == \
        ("normal", CONFIG.rope_theta, 1.0, "float16")
    assert (layout.page_size, layout.num_layers, layout.num_qo_heads, layout.num_kv_heads, layout.head_dim) == \
        (8, CONFIG.num_layers, CONFIG.num_qo_heads, CONFIG.num_kv_heads, CONFIG.head_dim)
    assert tiny.model.max_context == CONTEXT


def test_the_same_forwards_give_bitwise_identical_logits(device, tiny):
    prompt = tiny.text.encode_chat(PROMPT)

    async def logits() -> list[tuple[int, float]]:
        cache = new_cache(tiny.model, device, max_tokens=len(prompt) + 1, prefill_chunk=16, num_seqs=1)
        cache.add_sequence(0)
        out = await tiny.model.forward(cache, 0, prompt)
        token = await out.argmax()
        out = await (await tiny.model.forward(cache, 0, [token])).top_k(tiny.model.vocab_size)
        cache.close()
        return out

    assert run(logits()) == run(logits())


def test_loading_reports_the_upload_of_each_layer_then_of_the_rest(device, tiny_llama_path):
    heard = []
    model = load_gguf_model(open_gguf(tiny_llama_path), device, lambda done, total: heard.append((done, total)))
    model.model.close()
    parts = CONFIG.num_layers + 1
    assert heard == [(i, parts) for i in range(1, parts + 1)]


def test_logits_of_an_earlier_forward_are_refused(device, tiny):
    cache = new_cache(tiny.model, device, max_tokens=8, prefill_chunk=8, num_seqs=1)
    cache.add_sequence(0)

    async def stale() -> None:
        first = await tiny.model.forward(cache, 0, [5, 6])
        await tiny.model.forward(cache, 0, [7])
        await first.argmax()

    with pytest.raises(KVCkptError, match="logits"):
        run(stale())
    cache.close()


@pytest.fixture
def ran_model(device, tiny_llama_path):  # type: ignore[no-untyped-def]
    """A model of its own (loaded after counting the device's live resources) that ran a prefill and a decode
    step over a cache, which is closed: ``(model, live resources and bytes before loading it)``."""
    before = device.live_resources, device.live_bytes
    model = load_model(tiny_llama_path, device).model
    cache = new_cache(model, device, max_tokens=8, prefill_chunk=8, num_seqs=1)
    cache.add_sequence(0)

    async def generate() -> None:
        await (await model.forward(cache, 0, [5, 6, 7])).argmax()
        await (await model.forward(cache, 0, [8])).top_k(3)

    run(generate())
    cache.close()
    yield model, before
    model.close()


def test_closing_a_model_releases_every_buffer_and_texture_it_made(device, ran_model):
    model, before = ran_model
    assert (device.live_resources, device.live_bytes) != before
    model.close()
    assert model.closed and (device.live_resources, device.live_bytes) == before


def test_closing_a_model_again_does_nothing(device, ran_model):
    model, before = ran_model
    model.close()
    model.close()
    assert (device.live_resources, device.live_bytes) == before


def test_a_closed_model_refuses_forwards_with_a_state_error(device, ran_model):
    model, _ = ran_model
    model.close()
    cache = new_cache(model, device, max_tokens=8, prefill_chunk=8, num_seqs=1)
    cache.add_sequence(0)
    with pytest.raises(CheckpointStateError, match="forward: expected an open model, got a closed one"):
        run(model.forward(cache, 0, [5]))
    assert cache.get_sequence_length(0) == 0
    cache.close()


def test_logits_of_a_closed_model_are_refused(device, ran_model):
    model, _ = ran_model
    cache = new_cache(model, device, max_tokens=8, prefill_chunk=8, num_seqs=1)
    cache.add_sequence(0)
    logits = run(model.forward(cache, 0, [5]))
    cache.close()
    model.close()
    with pytest.raises(CheckpointStateError, match="top_k: expected an open model"):
        run(logits.argmax())


@pytest.mark.parametrize("tokens", [[], [5, 300], [-1]])
def test_a_forward_of_no_tokens_or_of_ids_outside_the_vocabulary_is_refused(device, tiny, tokens):
    cache = new_cache(tiny.model, device, max_tokens=8, prefill_chunk=8, num_seqs=1)
    cache.add_sequence(0)
    with pytest.raises(SequenceError, match="token"):
        run(tiny.model.forward(cache, 0, tokens))
    assert cache.get_sequence_length(0) == 0
    cache.close()


@pytest.mark.real_model
def test_smollm2_logits_of_a_chat_prompt_and_three_decode_steps_follow_the_float64_reference(device, smollm_path):
    loaded = load_model(smollm_path, device)
    prompt = loaded.text.encode_chat(REAL_PROMPT)
    weights, config = load_gguf(smollm_path)
    got, want, got_tokens, want_tokens = compare_decode(loaded, device, weights, config, prompt, 3, chunk=32,
                                                        page_size=16)
    for step, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, w, rtol=0, atol=REAL_LOGIT_ATOL, err_msg=f"step {step}")
    assert got_tokens == want_tokens
    assert loaded.text.decode(got_tokens).startswith("The capital")


# ----- bad model files ------------------------------------------------------------------------------------


def test_a_truncated_model_file_is_a_format_error(device, tiny_llama_path, tmp_path):
    path = tmp_path / "truncated.gguf"
    data = tiny_llama_path.read_bytes()
    path.write_bytes(data[:len(data) // 2])
    with pytest.raises(FormatError, match="tensors"):
        load_model(path, device)


def test_a_file_that_is_not_gguf_is_a_format_error(device, tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04" + bytes(64))
    with pytest.raises(FormatError, match="not a GGUF file"):
        load_model(path, device)


Q5_1 = gguf.GGMLQuantizationType.Q5_1
"""A type no Q4_K_M / Q5_K_M / Q6_K / Q8_0 file of the supported families holds: the runner has no kernel for it."""


def test_an_unsupported_tensor_type_is_refused_naming_the_tensor_and_type(device, tmp_path):
    def requantize(tensors):  # type: ignore[no-untyped-def]
        tensors["blk.1.ffn_up.weight"] = (tensors["blk.1.ffn_up.weight"][0], Q5_1)

    path = write_tiny_llama(tmp_path / "q5_1.gguf", edit=requantize)
    with pytest.raises(FormatError, match=r"blk\.1\.ffn_up\.weight.*expected Q4_0 or Q4_1 or .*, got 'Q5_1'"):
        load_model(path, device)


def test_a_tensor_of_the_wrong_shape_is_refused_naming_it(device, tmp_path):
    def narrow(tensors):  # type: ignore[no-untyped-def]
        values, qtype = tensors["blk.0.attn_output.weight"]
        tensors["blk.0.attn_output.weight"] = (values[:, :160], qtype)

    path = write_tiny_llama(tmp_path / "shape.gguf", edit=narrow)
    with pytest.raises(FormatError,
                       match=r"blk\.0\.attn_output\.weight.*shape: expected \(192, 192\), got \(160, 192\)"):
        load_model(path, device)


def test_a_missing_tensor_is_refused_naming_it(device, tmp_path):
    path = write_tiny_llama(tmp_path / "missing.gguf", edit=lambda t: t.pop("blk.2.ffn_norm.weight"))
    with pytest.raises(FormatError, match=r"blk\.2\.ffn_norm\.weight.*missing"):
        load_model(path, device)


def test_a_tensor_a_llama_model_does_not_have_is_refused_naming_it(device, tmp_path):
    bias = {"blk.0.attn_q.bias": (np.ones(192), F32)}  # a qwen2 tensor
    path = write_tiny_llama(tmp_path / "extra.gguf", edit=lambda t: t.update(bias))
    with pytest.raises(FormatError, match=r"blk\.0\.attn_q\.bias"):
        load_model(path, device)


def test_a_block_count_beyond_the_tensors_is_refused(device, tmp_path):
    path = write_tiny_llama(tmp_path / "blocks.gguf", metadata={"block_count": 4})
    with pytest.raises(FormatError, match=r"blk\.3\.attn_norm\.weight.*missing"):
        load_model(path, device)


def test_rope_scaling_other_than_linear_is_refused(device, tmp_path):
    path = write_tiny_llama(tmp_path / "scaled.gguf", metadata={"rope.scaling.type": "yarn"})
    with pytest.raises(FormatError, match="llama.rope.scaling.type"):
        load_model(path, device)


def test_kvckpt_generate_with_an_unsupported_model_prints_one_line(tmp_path):
    def requantize(tensors):  # type: ignore[no-untyped-def]
        tensors["blk.0.attn_q.weight"] = (tensors["blk.0.attn_q.weight"][0], Q5_1)

    path = write_tiny_llama(tmp_path / "q5_1.gguf", edit=requantize)
    result = subprocess.run([sys.executable, "-m", "kvckpt_web.cli.main", "generate", "--model", str(path), "--prompt",
                             "hi"], capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if not line.startswith("loading model")]
    assert len(errors) == 1 and errors[0].startswith("kvckpt: error: "), result.stderr
    assert "blk.0.attn_q.weight" in errors[0] and "Q5_1" in errors[0]
