"""Sampled picks on the GPU (kvckpt_web/model/shortlist.py, shaders/model/shortlist.wgsl): the tokens of the
sampler's version 1 pick over the whole vocabulary (tests/model/sampler_v1.py), from a window of the scores."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from kvckpt_web.gpu.device import Usage
from kvckpt_web.model.sampler import Sampler, SamplingSettings
from kvckpt_web.model.shortlist import Shortlist

from sampler_v1 import pick_v1

VOCAB = 5000  # not a multiple of the chunk
SETTINGS = [
    SamplingSettings(temperature=1.0, top_p=0.9, seed=1),
    SamplingSettings(temperature=0.8, seed=2),
    SamplingSettings(temperature=0.7, top_k=40, seed=3),
    SamplingSettings(temperature=1.0, top_k=200, top_p=0.95, seed=4),
    SamplingSettings(repetition_penalty=1.3),
    SamplingSettings(temperature=0.9, top_p=0.9, repetition_penalty=1.2, seed=5),
    SamplingSettings(temperature=1.0, top_p=0.9, repetition_penalty=0.7, seed=6),
    SamplingSettings(temperature=1e-30, top_p=0.9, seed=7),
    SamplingSettings(temperature=1e6, top_p=0.5, seed=8),
]


class Logits:
    """A logits buffer on the device, and the shortlist that picks from it."""

    def __init__(self, device, vocab: int) -> None:
        self.device = device
        self.buffer = device.create_buffer(4 * vocab, Usage.STORAGE | Usage.COPY_SRC | Usage.COPY_DST, "test.logits")
        self.shortlist = Shortlist(device, vocab)

    def close(self) -> None:
        self.shortlist.close()
        self.device.destroy(self.buffer)

    def pick(self, values: np.ndarray, sampler: Sampler, previous: list[int], generated: list[int] = ()) -> int:
        self.device.write(self.buffer, 0, values.astype(np.float32).tobytes())
        return asyncio.run(self.shortlist.pick(self.buffer, sampler, previous, generated))


@pytest.fixture
def logits(device):
    made = Logits(device, VOCAB)
    yield made
    made.close()


def language_like(rng: np.random.Generator, vocab: int) -> np.ndarray:
    """Logits shaped as a model's: a broad body and a few tokens far above it."""
    values = rng.normal(0, 3, vocab)
    values[rng.choice(vocab, 8, replace=False)] += rng.uniform(5, 20, 8)
    return values.astype(np.float32)


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: f"t{s.temperature}-k{s.top_k}-p{s.top_p}-r"
                                                             f"{s.repetition_penalty}")
def test_the_gpu_pick_gives_the_version_1_tokens(logits, settings):
    rng = np.random.default_rng(11)
    sampler, counter = Sampler(settings), 0
    for step in range(60):
        values = language_like(rng, VOCAB)
        previous = [int(t) for t in rng.integers(0, VOCAB, 30)]
        want, counter = pick_v1(settings, counter, list(enumerate(values.astype(np.float64).tolist())), previous)
        assert logits.pick(values, sampler, previous) == want, step
        assert sampler.counter == counter


@pytest.mark.parametrize("settings", [
    SamplingSettings(presence_penalty=1.5, frequency_penalty=0.3),
    SamplingSettings(temperature=1.0, top_p=0.9, presence_penalty=-2.0, seed=1),
    SamplingSettings(temperature=0.8, top_k=20, frequency_penalty=-0.7, repetition_penalty=1.2, seed=2),
    SamplingSettings(temperature=1.0, presence_penalty=0.4, frequency_penalty=2.0, repetition_penalty=0.9, seed=3),
], ids=lambda s: f"t{s.temperature}-k{s.top_k}-pres{s.presence_penalty}-freq{s.frequency_penalty}")
def test_the_gpu_pick_under_presence_and_frequency_penalties_is_the_pick_from_all_logits(logits, settings):
    rng = np.random.default_rng(12)
    on_gpu, on_host = Sampler(settings), Sampler(settings)
    for step in range(40):
        values = language_like(rng, VOCAB)
        generated = [int(t) for t in rng.integers(0, VOCAB, 12)] + [int(np.argmax(values))] * 3
        previous = [int(t) for t in rng.integers(0, VOCAB, 20)] + generated
        want = on_host.pick(list(enumerate(values.astype(np.float64).tolist())), previous, generated)
        assert logits.pick(values, on_gpu, previous, generated) == want, step


def test_a_negative_presence_penalty_lifts_a_generated_token_from_far_below(logits):
    values = np.zeros(VOCAB, np.float32)
    values[10], values[4321] = 1.5, 0.0  # 4321 is 1.5 below the top: -2 lifts it above
    assert logits.pick(values, Sampler(SamplingSettings(presence_penalty=-2.0)), [4321], [4321]) == 4321


def test_equal_top_scores_go_to_the_lowest_id(logits):
    values = np.zeros(VOCAB, np.float32)
    values[[4000, 17, 2500]] = 9.0
    assert logits.pick(values, Sampler(SamplingSettings(repetition_penalty=1.5)), [5]) == 17


def test_a_flat_distribution_reads_the_whole_vocabulary(logits):
    """Every score within the widest window of the top: the draw needs all of them."""
    values = np.full(VOCAB, 1.5, np.float32)
    values[123] = 2.0
    settings = SamplingSettings(temperature=1.0, seed=9)
    sampler, counter = Sampler(settings), 0
    for _ in range(20):
        want, counter = pick_v1(settings, counter, list(enumerate(values.astype(np.float64).tolist())))
        assert logits.pick(values, sampler, []) == want


@pytest.mark.parametrize("top", [0, 5, 20])
def test_log_probabilities_are_the_raw_logits_log_softmax(logits, top):
    """The device's f32 sum of the weights: within 1e-5 of the float64 log-softmax, penalties and temperature aside."""
    rng = np.random.default_rng(13)
    values = language_like(rng, VOCAB)
    logits.device.write(logits.buffer, 0, values.tobytes())
    got = asyncio.run(logits.shortlist.logprobs(logits.buffer, 77, top))
    exact = values.astype(np.float64) - values.max()
    exact -= np.log(np.exp(exact).sum())
    assert got.token == 77 and abs(got.logprob - exact[77]) < 1e-5
    order = np.lexsort((np.arange(VOCAB), -values))[:top]
    assert [i for i, _ in got.top] == order.tolist()
    assert np.allclose([lp for _, lp in got.top], exact[order], rtol=0, atol=1e-5)
