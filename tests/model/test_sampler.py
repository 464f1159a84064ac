"""Sampling settings, the counter-based random numbers, the next-token picks and picks from a shortlist."""

from __future__ import annotations

import json
import math
import random
import struct
from typing import Any

import pytest

from kvckpt_web.errors import FieldError
from kvckpt_web.model.sampler import (MAX_SEED, Sampler, SamplingSettings, candidate_count, rank, splitmix64,
                                     uniform)

from sampler_v1 import pick_v1

# Probabilities 0.5, 0.3, 0.2 for tokens 0, 1, 2 at temperature 1.
THREE = [(0, math.log(0.5)), (1, math.log(0.3)), (2, math.log(0.2))]


def f32(value: float) -> float:
    return struct.unpack("<f", struct.pack("<f", value))[0]


def sampled(settings: SamplingSettings, candidates: list[tuple[int, float]], n: int) -> list[int]:
    sampler = Sampler(settings)
    return [sampler.pick(candidates) for _ in range(n)]


# ---------------------------------------------------------------- random numbers

def test_splitmix64_seed_0_first_output_is_the_reference() -> None:
    assert splitmix64(0, 0) == 0xE220A8397B1DCDAF


def test_splitmix64_seed_1234567_matches_the_reference_sequence() -> None:
    assert [splitmix64(1234567, n) for n in range(5)] == [
        6457827717110365317, 3203168211198807973, 9817491932198370423, 4593380528125082431,
        16408922859458223821]


def test_uniform_golden_values() -> None:
    assert [uniform(42, n) for n in range(3)] == [0.7415648787718233, 0.1599103928769201, 0.27860113025513866]


def test_uniform_is_53_bits_in_0_1() -> None:
    for n in range(1000):
        u = uniform(7, n)
        assert 0 <= u < 1 and (u * 2**53).is_integer()


def test_uniform_10000_draws_pass_a_chi_square_bound() -> None:
    counts = [0] * 10
    for n in range(10_000):
        counts[int(uniform(2024, n) * 10)] += 1
    chi2 = sum((c - 1000) ** 2 / 1000 for c in counts)
    assert chi2 < 27.88  # 9 degrees of freedom, p = 0.001


# ---------------------------------------------------------------- settings

def test_default_settings_are_greedy() -> None:
    assert SamplingSettings().greedy and not SamplingSettings(temperature=0.7).greedy


@pytest.mark.parametrize(("field", "value"), [
    ("temperature", -0.1), ("temperature", math.inf), ("temperature", math.nan), ("temperature", "1"),
    ("temperature", True),
    ("top_k", -1), ("top_k", 2.0), ("top_k", True),
    ("top_p", 0), ("top_p", 1.01), ("top_p", math.nan), ("top_p", None),
    ("repetition_penalty", 0), ("repetition_penalty", -1.2), ("repetition_penalty", math.inf),
    ("seed", -1), ("seed", MAX_SEED + 1), ("seed", 1.0), ("seed", False),
])
def test_settings_refuse_bad_values_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(FieldError) as info:
        SamplingSettings(**{field: value})
    assert info.value.field == field


def test_settings_accept_their_bounds() -> None:
    SamplingSettings(temperature=0, top_k=0, top_p=1, repetition_penalty=1e-6, seed=MAX_SEED)


# ---------------------------------------------------------------- picks

def test_greedy_takes_the_highest_logit_and_draws_nothing() -> None:
    sampler = Sampler()
    assert sampler.pick([(4, 0.1), (9, 2.5), (2, -3.0)]) == 9
    assert sampler.counter == 0


def test_greedy_ties_go_to_the_lowest_token_id() -> None:
    assert Sampler().pick([(7, 1.0), (3, 1.0), (5, 0.5), (4, 1.0)]) == 3


def test_sampling_ties_are_ordered_by_token_id() -> None:
    tied = [(9, 0.0), (1, 0.0)]
    # u(42, 1) = 0.16 falls in the first half: the lowest id, whatever order the candidates came in.
    sampler = Sampler(SamplingSettings(temperature=1.0, seed=42), counter=1)
    assert sampler.pick(tied) == 1


def test_sampling_is_the_inverse_cdf_of_the_draws() -> None:
    # u = 0.742, 0.160, 0.279 against cumulative 0.5, 0.8, 1.0
    assert sampled(SamplingSettings(temperature=1.0, seed=42), THREE, 3) == [1, 0, 0]


def test_each_sampled_token_takes_one_draw() -> None:
    sampler = Sampler(SamplingSettings(temperature=0.8, seed=5))
    for _ in range(7):
        sampler.pick(THREE)
    assert sampler.counter == 7


def test_sampled_frequencies_pass_a_chi_square_bound() -> None:
    picks = sampled(SamplingSettings(temperature=1.0, seed=99), THREE, 10_000)
    chi2 = sum((picks.count(t) - 10_000 * p) ** 2 / (10_000 * p) for t, p in ((0, 0.5), (1, 0.3), (2, 0.2)))
    assert chi2 < 13.82  # 2 degrees of freedom, p = 0.001


def test_temperature_flattens_the_distribution() -> None:
    # logits ln 4, 0: probabilities 0.8 / 0.2 at temperature 1, 2/3 / 1/3 at temperature 2.
    candidates = [(0, math.log(4)), (1, 0.0)]
    counter = next(n for n in range(100) if 2 / 3 < uniform(3, n) < 0.8)
    cold = Sampler(SamplingSettings(temperature=1.0, seed=3), counter)
    hot = Sampler(SamplingSettings(temperature=2.0, seed=3), counter)
    assert (cold.pick(candidates), hot.pick(candidates)) == (0, 1)


def test_top_k_1_always_takes_the_top_but_still_draws() -> None:
    sampler = Sampler(SamplingSettings(temperature=1.5, top_k=1, seed=1))
    assert {sampler.pick(THREE) for _ in range(50)} == {0}
    assert sampler.counter == 50


def test_top_k_keeps_the_k_highest() -> None:
    assert set(sampled(SamplingSettings(temperature=1.0, top_k=2, seed=8), THREE, 300)) == {0, 1}


def test_top_p_keeps_the_fewest_tokens_reaching_p() -> None:
    # 0.5 alone reaches 0.5; 0.5 + 0.3 is needed for 0.6.
    assert set(sampled(SamplingSettings(temperature=1.0, top_p=0.5, seed=8), THREE, 300)) == {0}
    assert set(sampled(SamplingSettings(temperature=1.0, top_p=0.6, seed=8), THREE, 300)) == {0, 1}


def test_top_p_renormalizes_what_it_keeps() -> None:
    # Kept 0.5 and 0.3 become 0.625 / 0.375: u = 0.742 picks token 1, u = 0.160 and 0.279 token 0.
    assert sampled(SamplingSettings(temperature=1.0, top_p=0.6, seed=42), THREE, 3) == [1, 0, 0]


def test_repetition_penalty_divides_a_positive_logit_of_a_seen_token() -> None:
    sampler = Sampler(SamplingSettings(repetition_penalty=2.0))
    assert sampler.pick([(0, 2.0), (1, 1.5)], previous=[0]) == 1  # 2.0 / 2 = 1.0 < 1.5
    assert sampler.pick([(0, 2.0), (1, 0.9)], previous=[0]) == 0  # 1.0 > 0.9


def test_repetition_penalty_multiplies_a_negative_logit_of_a_seen_token() -> None:
    sampler = Sampler(SamplingSettings(repetition_penalty=2.0))
    assert sampler.pick([(0, -1.0), (1, -1.5)], previous=[0, 0]) == 1  # -1.0 * 2 = -2.0 < -1.5


def test_presence_and_frequency_penalties_subtract_from_the_logits_of_the_replys_tokens() -> None:
    sampler = Sampler(SamplingSettings(presence_penalty=0.5, frequency_penalty=0.25))
    candidates = [(0, 2.0), (1, 1.2), (2, 1.0)]
    assert sampler.pick(candidates, previous=[0, 1], generated=[0]) == 0  # 2.0 - 0.75 = 1.25 > 1.2
    assert sampler.pick(candidates, previous=[0, 0, 1], generated=[0, 0]) == 1  # 2.0 - 1.0 = 1.0 < 1.2
    assert sampler.pick(candidates, previous=[0, 0], generated=[]) == 0  # the prompt's tokens are not counted


def test_a_negative_presence_penalty_lifts_a_generated_token() -> None:
    sampler = Sampler(SamplingSettings(presence_penalty=-2.0))
    assert sampler.pick([(0, 2.0), (1, 0.5)], previous=[1], generated=[1]) == 1


@pytest.mark.parametrize("name", ["presence_penalty", "frequency_penalty"])
@pytest.mark.parametrize("value", [2.5, -2.01, math.nan, True])
def test_presence_and_frequency_penalties_are_refused_outside_minus_2_to_2(name: str, value: Any) -> None:
    with pytest.raises(FieldError) as info:
        SamplingSettings(**{name: value})
    assert info.value.field == name


def test_repetition_penalty_off_ignores_previous_tokens() -> None:
    assert Sampler().pick([(0, 2.0), (1, 1.5)], previous=[0]) == 0


def test_a_shortlist_holding_the_top_k_picks_as_the_full_vocabulary() -> None:
    rng = random.Random(0)
    full = [(i, rng.gauss(0, 3)) for i in range(2000)]
    shortlist = sorted(full, key=lambda c: -c[1])[:5]
    settings = SamplingSettings(temperature=0.9, top_k=5, top_p=0.9, seed=11)
    assert sampled(settings, full, 200) == sampled(settings, shortlist, 200)


@pytest.mark.parametrize(("candidates", "field"), [
    ([], "candidates"),
    ([(1, 0.5), (2,)], "candidates[1]"),
    ([(1, 0.5), 3], "candidates[1]"),
    ([(-1, 0.5)], "candidates[0] token id"),
    ([(1.0, 0.5)], "candidates[0] token id"),
    ([(1, math.nan)], "candidates[0] logit"),
    ([(1, -math.inf)], "candidates[0] logit"),
])
def test_pick_refuses_bad_candidates(candidates: list[Any], field: str) -> None:
    with pytest.raises(FieldError) as info:
        Sampler().pick(candidates)
    assert info.value.field == field


# ---------------------------------------------------------------- state

def test_state_round_trip_continues_the_same_sequence() -> None:
    settings = SamplingSettings(temperature=0.7, top_k=3, top_p=0.95, repetition_penalty=1.1, seed=2**63 + 5)
    original = Sampler(settings)
    for _ in range(10):
        original.pick(THREE, previous=[1])
    restored = Sampler.from_json(json.loads(json.dumps(original.to_json())))
    assert restored.settings == settings and restored.counter == 10
    assert [restored.pick(THREE, [1]) for _ in range(50)] == [original.pick(THREE, [1]) for _ in range(50)]


def test_state_is_small_json() -> None:
    state = Sampler(SamplingSettings(temperature=1.0, seed=3), counter=12).to_json()
    assert state == {"version": 2, "settings": {"temperature": 1.0, "top_k": 0, "top_p": 1.0,
                                                "repetition_penalty": 1.0, "seed": 3, "presence_penalty": 0.0,
                                                "frequency_penalty": 0.0}, "counter": 12}


def test_a_state_without_presence_and_frequency_penalties_has_them_off() -> None:
    state = Sampler(SamplingSettings(temperature=1.0, seed=3)).to_json()
    del state["settings"]["presence_penalty"], state["settings"]["frequency_penalty"]
    assert Sampler.from_json(state).settings == SamplingSettings(temperature=1.0, seed=3)


def test_a_version_1_state_goes_on_under_version_2() -> None:
    state = Sampler(SamplingSettings(temperature=1.0, seed=3), counter=12).to_json()
    del state["version"]
    assert Sampler.from_json(state).to_json()["version"] == 2


@pytest.mark.parametrize(("state", "field"), [
    ([], "sampler state"),
    ({"counter": 0}, "sampler state"),
    ({"version": 3, "settings": {"temperature": 1, "top_k": 0, "top_p": 1, "repetition_penalty": 1, "seed": 0},
      "counter": 0}, "sampler state.version"),
    ({"settings": {"seed": 1}, "counter": 0}, "sampler state.settings"),
    ({"settings": {"temperature": -1, "top_k": 0, "top_p": 1, "repetition_penalty": 1, "seed": 0}, "counter": 0},
     "temperature"),
    ({"settings": {"temperature": 1, "top_k": 0, "top_p": 1, "repetition_penalty": 1, "seed": 0}, "counter": -2},
     "counter"),
])
def test_from_json_refuses_other_values(state: Any, field: str) -> None:
    with pytest.raises(FieldError) as info:
        Sampler.from_json(state)
    assert info.value.field == field


# ---------------------------------------------------------------- how many candidates a pick needs

@pytest.mark.parametrize(("settings", "previous", "generated", "want"), [
    (SamplingSettings(), [5, 5, 6], [6], 0),
    (SamplingSettings(repetition_penalty=1.5), [5, 5, 6], [6], 3),
    (SamplingSettings(temperature=1.0, top_k=4), [5, 6], [6], 4),
    (SamplingSettings(temperature=1.0, top_k=4, repetition_penalty=1.2), [5, 6, 6, 7], [7], 7),
    (SamplingSettings(temperature=1.0, top_k=4, presence_penalty=0.5), [5, 6, 6, 7], [6, 7], 6),
    (SamplingSettings(frequency_penalty=1.0, repetition_penalty=1.2), [5, 6, 7], [7, 8], 5),
    (SamplingSettings(temperature=1.0, top_p=0.5), [5], [], 35),
    (SamplingSettings(temperature=1.0, top_k=4, repetition_penalty=0.8), [5], [], 35),
    (SamplingSettings(temperature=1.0, top_k=4, presence_penalty=-0.5), [5], [5], 35),
    (SamplingSettings(frequency_penalty=-0.1), [5], [5], 35),
])
def test_candidate_count_covers_every_token_the_sampler_could_pick(settings: SamplingSettings, previous: list[int],
                                                                   generated: list[int], want: int) -> None:
    assert candidate_count(settings, previous, generated, 35) == want


@pytest.mark.parametrize("settings", [
    SamplingSettings(temperature=0.7, top_k=3, repetition_penalty=1.8, seed=2),
    SamplingSettings(temperature=0.7, top_k=3, presence_penalty=1.5, frequency_penalty=0.5, seed=3),
    SamplingSettings(presence_penalty=2.0),
], ids=["repetition", "presence-frequency", "greedy-presence"])
def test_candidate_count_picks_as_from_the_whole_vocabulary_under_a_penalty(settings: SamplingSettings) -> None:
    """Sampling from the shortlist gives what sampling from every logit gives, token for token."""
    rng = random.Random(1)
    short, full = Sampler(settings), Sampler(settings)
    for _ in range(200):
        logits = [rng.gauss(0, 1) for _ in range(35)]
        previous = [rng.randrange(35) for _ in range(6)]
        ranked = sorted(enumerate(logits), key=lambda c: (-c[1], c[0]))
        k = candidate_count(settings, previous, previous[3:], 35)
        assert short.pick(ranked[:k], previous, previous[3:]) == full.pick(ranked, previous, previous[3:])


# ---------------------------------------------------------------- picks from a shortlist

def test_a_penalized_score_is_the_f32_product_with_the_f32_factor() -> None:
    sampler = Sampler(SamplingSettings(repetition_penalty=1.1))
    above, below = sampler.penalty_factors()
    assert (above, below) == (f32(1 / 1.1), f32(1.1))
    assert sampler.penalized(3.0, seen=True) == f32(3.0 * above)
    assert sampler.penalized(-3.0, seen=True) == f32(-3.0 * below)
    assert sampler.penalized(3.0, seen=False) == 3.0


def test_a_draw_from_a_prefix_of_the_ranking_picks_as_from_the_whole_vocabulary_or_asks_for_more() -> None:
    rng = random.Random(3)
    ranked = sorted(((i, rng.gauss(0, 3)) for i in range(3000)), key=rank)
    total = sum(math.exp(score - ranked[0][1]) for _, score in ranked)
    for settings in (SamplingSettings(temperature=1.0, top_p=0.9, seed=5), SamplingSettings(temperature=1.0, seed=6)):
        whole, short = Sampler(settings), Sampler(settings)
        asked = 0
        for _ in range(300):
            want = whole.draw(ranked, total, complete=True)
            for size in (5, 50, 500, 3000):
                got = short.draw(ranked[:size], total, complete=size == 3000)
                if got is not None:
                    break
                asked += 1
            assert got == want and short.counter == whole.counter
        assert asked > 0


def test_a_draw_past_every_weight_falls_on_the_last_token_of_the_whole_vocabulary() -> None:
    """A total above the weights' own sum (the device's f32 rounding) can leave the draw past the last of them."""
    ranked = [(7, 0.0), (3, -1.0), (9, -2.0)]
    sampler = Sampler(SamplingSettings(temperature=1.0, seed=0))
    assert sampler.draw(ranked[:2], 1e9, complete=False) is None and sampler.counter == 0
    assert sampler.draw(ranked, 1e9, complete=True) == 9 and sampler.counter == 1


@pytest.mark.parametrize("settings", [
    SamplingSettings(temperature=0.8, seed=1), SamplingSettings(temperature=1.0, top_p=0.9, seed=2),
    SamplingSettings(temperature=0.7, top_k=40, seed=3), SamplingSettings(temperature=1.3, top_k=5, top_p=0.8, seed=4),
    SamplingSettings(repetition_penalty=1.3), SamplingSettings(temperature=1.0, top_p=0.95, repetition_penalty=0.8,
                                                               seed=5),
    SamplingSettings(temperature=1e-6, seed=6), SamplingSettings(temperature=50.0, top_p=0.5, seed=7),
], ids=lambda s: f"t{s.temperature}-k{s.top_k}-p{s.top_p}-r{s.repetition_penalty}")
def test_the_version_2_pick_gives_the_version_1_tokens(settings: SamplingSettings) -> None:
    rng = random.Random(8)
    sampler, counter = Sampler(settings), 0
    for step in range(200):
        logits = [(i, f32(rng.gauss(0, 4))) for i in range(500)]
        previous = [rng.randrange(500) for _ in range(20)]
        want, counter = pick_v1(settings, counter, logits, previous)
        assert sampler.pick(logits, previous) == want, step
