"""Choosing the next token from logits: greedy or sampled, reproducibly, with a resumable random state.

The random numbers come from SplitMix64 evaluated at (seed, counter): the n-th draw is a pure function of
the seed and n, computed with integer arithmetic only, so desktop Python and Pyodide draw the same numbers
and the whole state of a :class:`Sampler` is a small JSON value that a checkpoint can carry.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..checks import check_collection, check_instance
from ..errors import FieldError, is_int

__all__ = ["MAX_SEED", "Sampler", "SamplingSettings", "candidate_count", "splitmix64", "uniform"]

MAX_SEED = 2**64 - 1
"""Largest seed: seeds are 64-bit unsigned integers."""

_MASK = 2**64 - 1
_GAMMA = 0x9E3779B97F4A7C15


def splitmix64(seed: int, counter: int) -> int:
    """The ``counter``-th (from 0) 64-bit output of SplitMix64 started from state ``seed``."""
    z = (seed + (counter + 1) * _GAMMA) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def uniform(seed: int, counter: int) -> float:
    """A double in [0, 1) from the top 53 bits of ``splitmix64(seed, counter)`` (exact: k / 2**53)."""
    return (splitmix64(seed, counter) >> 11) / 2**53


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _rank(candidate: tuple[int, float]) -> tuple[float, int]:
    """Sort key: highest logit first, lowest token id first among equal logits."""
    return -candidate[1], candidate[0]


@dataclass(frozen=True)
class SamplingSettings:
    """How the next token is chosen.

    ``temperature`` 0 is greedy (the highest logit, lowest token id on ties, no random draw); above 0 the
    logits are divided by it and a token is drawn. ``top_k`` (0: off) keeps the k most likely tokens;
    ``top_p`` (1: off) keeps the fewest most likely tokens whose probabilities sum to at least ``top_p``;
    ``repetition_penalty`` (1: off) divides a positive logit of an already seen token by the penalty and
    multiplies a negative one by it (CTRL / HF transformers), also when greedy. ``seed`` starts the draws.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not _is_real(self.temperature) or self.temperature < 0:
            raise FieldError("temperature", "a finite number >= 0 (0: greedy)", self.temperature)
        if not is_int(self.top_k, 0):
            raise FieldError("top_k", "an integer >= 0 (0: off)", self.top_k)
        if not _is_real(self.top_p) or not 0 < self.top_p <= 1:
            raise FieldError("top_p", "a number in (0, 1] (1: off)", self.top_p)
        if not _is_real(self.repetition_penalty) or self.repetition_penalty <= 0:
            raise FieldError("repetition_penalty", "a finite number > 0 (1: off)", self.repetition_penalty)
        if not is_int(self.seed, 0, MAX_SEED):
            raise FieldError("seed", f"an integer in [0, {MAX_SEED}]", self.seed)

    @property
    def greedy(self) -> bool:
        """Whether the highest logit is always taken (temperature 0)."""
        return self.temperature == 0


class Sampler:
    """Picks next tokens under ``settings``; ``counter`` counts the random draws made so far.

    Each sampled token takes exactly one draw; a greedy pick takes none. ``to_json`` / ``from_json`` carry
    the settings and the counter, so a restored sampler continues the same sequence of draws.
    """

    def __init__(self, settings: SamplingSettings | None = None, counter: int = 0) -> None:
        if not is_int(counter, 0):
            raise FieldError("counter", "an integer >= 0", counter)
        self.settings = SamplingSettings() if settings is None else check_instance(
            "settings", settings, SamplingSettings, "a SamplingSettings or None")
        self.counter = counter

    def pick(self, candidates: Iterable[tuple[int, float]], previous: Iterable[int] = ()) -> int:
        """The next token id chosen among ``candidates``, (token id, logit) pairs.

        ``candidates`` may be the whole vocabulary or only its highest logits (e.g. a GPU top-k); with a
        repetition penalty, a shortlist must hold the top ``top_k`` plus every token of ``previous`` that
        could rank among them, since only listed tokens can be chosen. ``previous`` are the token ids seen
        so far (the prompt and what was generated), for the repetition penalty.
        """
        s = self.settings
        penalized = self._penalized(candidates, previous)
        if s.greedy:
            return min(penalized, key=_rank)[0]
        ranked = heapq.nsmallest(s.top_k, penalized, key=_rank) if s.top_k else sorted(penalized, key=_rank)
        top = ranked[0][1]
        weights = [math.exp((logit - top) / s.temperature) for _, logit in ranked]
        if s.top_p < 1:
            total, limit, kept = sum(weights), 0.0, 0
            while kept < len(weights) and limit < s.top_p * total:
                limit += weights[kept]
                kept += 1
            del ranked[kept:], weights[kept:]
        target = uniform(s.seed, self.counter) * sum(weights)
        self.counter += 1
        cumulative = 0.0
        for (token_id, _), weight in zip(ranked, weights):
            cumulative += weight
            if target < cumulative:
                return token_id
        return ranked[-1][0]  # rounding left target at the very top of the last interval

    def _penalized(self, candidates: Iterable[tuple[int, float]], previous: Iterable[int]) -> list[tuple[int, float]]:
        """The candidates as a list, validated, with seen tokens' logits penalized."""
        penalty = self.settings.repetition_penalty
        check_collection("previous", previous, "the token ids seen so far")
        seen = set(previous) if penalty != 1 else set()
        out = []
        for i, candidate in enumerate(check_collection("candidates", candidates, "(token id, logit) pairs")):
            try:
                token_id, logit = candidate
            except (TypeError, ValueError):
                raise FieldError(f"candidates[{i}]", "a (token id, logit) pair", repr(candidate)) from None
            if not is_int(token_id, 0):
                raise FieldError(f"candidates[{i}] token id", "an integer >= 0", token_id)
            if not _is_real(logit):
                raise FieldError(f"candidates[{i}] logit", "a finite number", logit)
            if token_id in seen:
                logit = logit / penalty if logit > 0 else logit * penalty
            out.append((token_id, logit))
        if not out:
            raise FieldError("candidates", "at least one (token id, logit) pair", "none")
        return out

    def to_json(self) -> dict[str, Any]:
        """The sampler's whole state as a JSON-serializable value."""
        return {"settings": asdict(self.settings), "counter": self.counter}

    @classmethod
    def from_json(cls, state: Any) -> Sampler:
        """A sampler in the state ``to_json`` returned; refuses anything else with a FieldError."""
        if not isinstance(state, dict) or set(state) != {"settings", "counter"}:
            raise FieldError("sampler state", "an object with keys 'settings' and 'counter'",
                             sorted(state) if isinstance(state, dict) else type(state).__name__)
        settings = state["settings"]
        fields = {"temperature", "top_k", "top_p", "repetition_penalty", "seed"}
        if not isinstance(settings, dict) or set(settings) != fields:
            raise FieldError("sampler state.settings", f"an object with keys {sorted(fields)}",
                             sorted(settings) if isinstance(settings, dict) else type(settings).__name__)
        return cls(SamplingSettings(**settings), state["counter"])


def candidate_count(settings: SamplingSettings, previous: Sequence[int], vocab_size: int) -> int:
    """How many of the largest logits :meth:`Sampler.pick` needs to choose as it would from all of them;
    0 when the argmax is the choice (greedy, no repetition penalty).

    A penalty above 1 only lowers seen tokens, so the ``n`` best after it are among the ``n`` best before
    it plus the distinct seen tokens; a penalty below 1 can lift any seen token: all logits then.
    """
    penalty = settings.repetition_penalty
    if settings.greedy and penalty == 1:
        return 0
    if penalty < 1 or (settings.top_k == 0 and not settings.greedy):
        return vocab_size
    keep = 1 if settings.greedy else settings.top_k
    return min(vocab_size, keep + (len(set(previous)) if penalty > 1 else 0))
