"""``forward_batch``: several sequences in one forward pass of the cache (decode tokens and prefill chunks), each
run's logits and K/V bit for bit those of the same run alone, whatever else the batch holds (kvckpt_web.model.llama).

Each test builds two caches with the same sequences (each prompt prefilled alone), then runs one step: in one
cache every run alone (``forward``), in the other all of them in one ``forward_batch``; the logits of each run
(every value, its argmax and top k picked on the GPU) and every K/V of each sequence, read back through the
cache's export, must be the same bits. The sequences' lengths differ so that their attention splits differ (16
keys a split at these lengths; the first under 16 keys: one split).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from greedy_check import all_logits  # noqa: E402
from tiny_archs import write_tiny_arch  # noqa: E402

from kvckpt_web.errors import CapacityError, SequenceError  # noqa: E402
from kvckpt_web.model.caches import new_cache  # noqa: E402
from kvckpt_web.model.loader import load_model  # noqa: E402
from kvckpt_web.model.sampler import Sampler, SamplingSettings  # noqa: E402

LENGTHS = [9, 40, 100, 23, 66, 130, 17, 51]
"""Prompt lengths of up to 8 decoding sequences."""
CHUNK_SEQ, CHUNK_HELD, CHUNK = 8, 30, 20
"""The sequence that prefills in the batch: it holds CHUNK_HELD tokens and runs a chunk of CHUNK more."""


@pytest.fixture(scope="module")
def tiny(device, tiny_llama_path):  # type: ignore[no-untyped-def]
    loaded = load_model(tiny_llama_path, device)
    yield loaded.model
    loaded.model.close()


@pytest.fixture(scope="module")
def gemma(device, tmp_path_factory):  # type: ignore[no-untyped-def]
    """The tiny Gemma 3: sliding-window layers (a window of 5) beside global ones."""
    path, _, _ = write_tiny_arch(tmp_path_factory.mktemp("gemma") / "gemma3.gguf", "gemma3")
    loaded = load_model(path, device)
    yield loaded.model
    loaded.model.close()


def tokens(vocab: int, n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, vocab, n)]


async def snapshot(logits, vocab: int) -> tuple[bytes, int, list[tuple[int, float]]]:  # type: ignore[no-untyped-def]
    """A run's logits: every value's bits, the argmax and the top 5 (both picked on the GPU)."""
    values = (await all_logits(logits, vocab)).astype(np.float32).tobytes()
    return values, await logits.argmax(), await logits.top_k(5)


SAMPLED = [SamplingSettings(temperature=1.0, top_p=0.9, seed=3),
           SamplingSettings(temperature=0.8, top_k=5, seed=4, presence_penalty=0.5),
           SamplingSettings(temperature=1.0, seed=5, repetition_penalty=1.3, frequency_penalty=0.4)]
"""Sampled picks of each kind of the shortlist (top_p, top_k, the whole distribution; with penalties)."""


async def sampled(logits, vocab: int) -> list:  # type: ignore[no-untyped-def]
    """A run's sampled picks (:data:`SAMPLED`, after the tokens 3..12, 8..12 generated) and the log
    probabilities of each pick with its 3 most likely alternatives, all on the GPU."""
    picks = [await logits.pick(Sampler(settings), list(range(3, 13)), list(range(8, 13))) for settings in SAMPLED]
    return [(token, await logits.logprobs(token, 3)) for token in picks]


def batched_and_alone(model, device, decoding: int, chunk: bool, page_size: int = 16,  # type: ignore[no-untyped-def]
                      read=snapshot):
    """(what ``read`` reads of each run's logits, every sequence's K/V) after one step of ``decoding`` sequences
    (and the prefill chunk of one more, among them, if ``chunk``): (in one forward_batch, each alone)."""
    prompts = {s: tokens(model.vocab_size, LENGTHS[s], s) for s in range(decoding)}
    runs = [(s, tokens(model.vocab_size, 1, 100 + s)) for s in range(decoding)]
    if chunk:
        prompts[CHUNK_SEQ] = tokens(model.vocab_size, CHUNK_HELD, 99)
        runs.insert(decoding // 2, (CHUNK_SEQ, tokens(model.vocab_size, CHUNK, 98)))

    async def step(batched: bool) -> tuple[list, dict[int, tuple[bytes, bytes]]]:
        cache = new_cache(model, device, max_tokens=max(LENGTHS) + CHUNK + 1, prefill_chunk=64,
                          page_size=page_size, num_seqs=len(prompts))
        try:
            for s, prompt in prompts.items():
                cache.add_sequence(s)
                await model.forward(cache, s, prompt)
            if batched:
                got = [await read(logits, model.vocab_size) for logits in await model.forward_batch(cache, runs)]
            else:
                got = [await read(await model.forward(cache, s, t), model.vocab_size) for s, t in runs]
            kv = {}
            for s in prompts:
                k, v = await cache.debug_get_kv(s, 0, cache.get_sequence_length(s))
                kv[s] = (bytes(k.data), bytes(v.data))
            return got, kv
        finally:
            cache.close()

    return asyncio.run(step(True)), asyncio.run(step(False))


def assert_same_bits(batched, alone) -> None:  # type: ignore[no-untyped-def]
    (got, got_kv), (want, want_kv) = batched, alone
    assert len(got) == len(want)
    for row, (g, w) in enumerate(zip(got, want)):
        assert g[0] == w[0], f"logits of run {row}"
        assert g[1:] == w[1:], f"argmax and top 5 of run {row}"
    assert got_kv.keys() == want_kv.keys()
    for s in want_kv:
        assert got_kv[s] == want_kv[s], f"K/V of sequence {s}"


@pytest.mark.parametrize("decoding", [1, 2, 4, 8])
def test_decode_steps_in_one_batch_give_each_sequence_the_bits_of_its_step_alone(device, tiny, decoding):
    assert_same_bits(*batched_and_alone(tiny, device, decoding, chunk=False))


@pytest.mark.parametrize("decoding", [1, 4])
def test_a_prefill_chunk_beside_decode_steps_gives_every_run_the_bits_it_has_alone(device, tiny, decoding):
    assert_same_bits(*batched_and_alone(tiny, device, decoding, chunk=True))


@pytest.mark.parametrize("chunk", [False, True])
def test_sampled_picks_and_log_probabilities_of_each_run_of_a_batch_are_those_of_its_step_alone(device, tiny, chunk):
    batched, alone = batched_and_alone(tiny, device, 4, chunk=chunk, read=sampled)
    assert len({pick for run in alone[0] for pick, _ in run}) > 1  # the runs' logits differ: each row is read
    assert_same_bits(batched, alone)


def test_sliding_window_layers_give_every_run_of_a_batch_the_bits_it_has_alone(device, gemma):
    assert_same_bits(*batched_and_alone(gemma, device, 8, chunk=True, page_size=8))


@pytest.mark.real_model
def test_smollm2_decode_steps_beside_a_prefill_chunk_give_the_bits_of_each_alone(device, smollm_path):
    loaded = load_model(smollm_path, device)
    try:
        assert_same_bits(*batched_and_alone(loaded.model, device, 4, chunk=True))
    finally:
        loaded.model.close()


def test_a_batch_of_one_run_is_a_forward_of_it(device, tiny):
    prompt = tokens(tiny.vocab_size, 37, 5)

    async def run(batched: bool) -> tuple[bytes, int, list[tuple[int, float]]]:
        cache = new_cache(tiny, device, max_tokens=64, prefill_chunk=64, num_seqs=1)
        try:
            cache.add_sequence(0)
            logits = (await tiny.forward_batch(cache, [(0, prompt)]))[0] if batched \
                else await tiny.forward(cache, 0, prompt)
            return await snapshot(logits, tiny.vocab_size)
        finally:
            cache.close()

    assert asyncio.run(run(True)) == asyncio.run(run(False))


@pytest.mark.parametrize("runs,error,names", [
    ([], SequenceError, "runs"),
    ([(0, [5]), 1], SequenceError, "runs[1]"),
    ([(0, [5]), (1, [])], SequenceError, "runs[1].tokens"),
    ([(0, [5]), (1, [5, 10**6])], SequenceError, "runs[1].tokens[1]"),
    ([(0, [5] * 10), (1, [5] * 7)], CapacityError, "16 tokens"),
])
def test_a_batch_that_cannot_run_is_refused_and_leaves_the_cache_as_it_was(device, tiny, runs, error, names):
    cache = new_cache(tiny, device, max_tokens=32, prefill_chunk=16, num_seqs=2)
    try:
        for s in (0, 1):
            cache.add_sequence(s)
        with pytest.raises(error, match=names.replace("[", r"\[").replace("]", r"\]")):
            asyncio.run(tiny.forward_batch(cache, runs))
        assert [cache.get_sequence_length(s) for s in (0, 1)] == [0, 0]
    finally:
        cache.close()


def test_the_test_double_gives_each_run_of_a_batch_the_logits_of_its_forward_alone(device):
    from lm_double import DoubleLM

    model = DoubleLM()
    runs = [(0, [5]), (1, [6, 7, 8]), (2, [9])]

    async def step(batched: bool) -> list[list[tuple[int, float]]]:
        cache = new_cache(model, device, max_tokens=16, prefill_chunk=8, num_seqs=3)
        try:
            for s in range(3):
                cache.add_sequence(s)
                await model.forward(cache, s, [2 + s] * (s + 2))
            out = await model.forward_batch(cache, runs) if batched \
                else [await model.forward(cache, s, t) for s, t in runs]
            return [await logits.top_k(model.vocab_size) for logits in out]
        finally:
            cache.close()

    assert asyncio.run(step(True)) == asyncio.run(step(False))
