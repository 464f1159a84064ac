"""The sampler's version 1 pick (kvckpt_web before the shortlist on the GPU), kept as the oracle the version 2 picks
are held to: over the whole vocabulary, penalties in float64, the weights' sums by ``sum`` (left to right on the
desktop's Python 3.11)."""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable

from kvckpt_web.model.sampler import SamplingSettings, uniform


def _rank(candidate: tuple[int, float]) -> tuple[float, int]:
    return -candidate[1], candidate[0]


def pick_v1(settings: SamplingSettings, counter: int, candidates: Iterable[tuple[int, float]],
            previous: Iterable[int] = ()) -> tuple[int, int]:
    """The token version 1 picked from ``candidates`` after ``previous`` with ``counter`` draws made; the counter
    after it."""
    s = settings
    seen = set(previous) if s.repetition_penalty != 1 else set()
    penalized = [(t, (l / s.repetition_penalty if l > 0 else l * s.repetition_penalty) if t in seen else l)
                 for t, l in candidates]
    if s.greedy:
        return min(penalized, key=_rank)[0], counter
    ranked = heapq.nsmallest(s.top_k, penalized, key=_rank) if s.top_k else sorted(penalized, key=_rank)
    top = ranked[0][1]
    weights = [math.exp((logit - top) / s.temperature) for _, logit in ranked]
    if s.top_p < 1:
        total, limit, kept = sum(weights), 0.0, 0
        while kept < len(weights) and limit < s.top_p * total:
            limit += weights[kept]
            kept += 1
        del ranked[kept:], weights[kept:]
    target = uniform(s.seed, counter) * sum(weights)
    cumulative = 0.0
    for (token_id, _), weight in zip(ranked, weights):
        cumulative += weight
        if target < cumulative:
            return token_id, counter + 1
    return ranked[-1][0], counter + 1
