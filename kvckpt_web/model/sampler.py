"""Choosing the next token from logits: greedy or sampled, reproducibly, with a resumable random state.

The random numbers come from SplitMix64 evaluated at (seed, counter): the n-th draw is a pure function of
the seed and n, computed with integer arithmetic only, so desktop Python and Pyodide draw the same numbers
and the whole state of a :class:`Sampler` is a small JSON value that a checkpoint can carry.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..checks import check_collection, check_instance
from ..errors import FieldError, is_int

__all__ = ["MAX_SEED", "SAMPLER_VERSION", "Sampler", "SamplingSettings", "candidate_count", "rank", "splitmix64",
           "uniform"]

MAX_SEED = 2**64 - 1
"""Largest seed: seeds are 64-bit unsigned integers."""

SAMPLER_VERSION = 2
"""The version of the rules :meth:`Sampler.draw` follows, recorded in its state (``APP_STATE.md`` §4)."""

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


def _f32(value: float) -> float:
    """``value`` rounded to the nearest f32 (ties to even)."""
    return struct.unpack("<f", struct.pack("<f", value))[0]


def _sum(values: list[float]) -> float:
    """The float64 sum of ``values`` added left to right (Python 3.12's ``sum`` compensates: the browser's
    Pyodide would sum otherwise than the desktop)."""
    total = 0.0
    for value in values:
        total += value
    return total


def rank(candidate: tuple[int, float]) -> tuple[float, int]:
    """Sort key of (token id, score) pairs: highest score first, lowest token id first among equal logits."""
    return -candidate[1], candidate[0]


@dataclass(frozen=True)
class SamplingSettings:
    """How the next token is chosen.

    ``temperature`` 0 is greedy (the highest logit, lowest token id on ties, no random draw); above 0 the
    logits are divided by it and a token is drawn. ``top_k`` (0: off) keeps the k most likely tokens;
    ``top_p`` (1: off) keeps the fewest most likely tokens whose probabilities sum to at least ``top_p``;
    ``repetition_penalty`` (1: off) divides a positive logit of an already seen token by the penalty (times the
    f32 of its inverse) and multiplies a negative one by it (CTRL / HF transformers), also when greedy.
    ``presence_penalty`` and ``frequency_penalty`` (0: off, each in [-2, 2]) then subtract ``presence_penalty +
    frequency_penalty * count`` from the logit of a token generated ``count`` > 0 times in this reply (OpenAI's),
    also when greedy. ``seed`` starts the draws.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

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
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _is_real(value) or not -2 <= value <= 2:
                raise FieldError(name, "a number in [-2, 2] (0: off)", value)

    @property
    def greedy(self) -> bool:
        """Whether the highest logit is always taken (temperature 0)."""
        return self.temperature == 0


class Sampler:
    """Picks next tokens under ``settings``; ``counter`` counts the random draws made so far.

    Each sampled token takes exactly one draw; a greedy pick takes none. ``to_json`` / ``from_json`` carry
    the settings and the counter, so a restored sampler continues the same sequence of draws.

    How a token is chosen is version :data:`SAMPLER_VERSION` of the rules (``APP_STATE.md`` §4): the penalized
    scores are f32 (:meth:`penalized`), ranked highest first (lowest id first among equal ones); the weights
    ``exp((score - top) / temperature)`` are float64, summed left to right; without ``top_k`` the mass ``top_p`` is
    a part of is ``total``, the device's f32 sum of the weights of the whole vocabulary (:meth:`draw`).
    """

    def __init__(self, settings: SamplingSettings | None = None, counter: int = 0) -> None:
        if not is_int(counter, 0):
            raise FieldError("counter", "an integer >= 0", counter)
        self.settings = SamplingSettings() if settings is None else check_instance(
            "settings", settings, SamplingSettings, "a SamplingSettings or None")
        self.counter = counter

    @property
    def penalizes(self) -> bool:
        """Whether any penalty changes a score."""
        s = self.settings
        return s.repetition_penalty != 1 or s.presence_penalty != 0 or s.frequency_penalty != 0

    def offsets(self, generated: Sequence[int]) -> dict[int, float]:
        """The f32 amount the presence and frequency penalties subtract from the score of each token of
        ``generated`` (this reply's tokens) whose score they change."""
        s = self.settings
        if not (s.presence_penalty or s.frequency_penalty):
            return {}
        counts: dict[int, int] = {}
        for token_id in generated:
            counts[token_id] = counts.get(token_id, 0) + 1
        offsets = {t: _f32(s.presence_penalty + s.frequency_penalty * n) for t, n in counts.items()}
        return {t: offset for t, offset in offsets.items() if offset}

    def penalty_factors(self) -> tuple[float, float]:
        """The f32 factors of the repetition penalty: of a score above 0 (1 / penalty) and at or below 0."""
        penalty = self.settings.repetition_penalty
        return _f32(1 / penalty), _f32(penalty)

    def penalized(self, score: float, seen: bool, offset: float = 0.0) -> float:
        """``score`` (an f32 logit) after the penalties, as f32 arithmetic gives it (what the device computes):
        times :meth:`penalty_factors` if its token was ``seen``, then less its ``offset`` (:meth:`offsets`)."""
        if seen and self.settings.repetition_penalty != 1:
            above, below = self.penalty_factors()
            score = _f32(score * (above if score > 0 else below))  # an f32 product is exact in float64
        if offset:
            score = _f32(score - offset)  # rounded twice only where the f32 result is the larger operand
        return score

    def pick(self, candidates: Iterable[tuple[int, float]], previous: Iterable[int] = (),
             generated: Sequence[int] = ()) -> int:
        """The next token id chosen among ``candidates``, (token id, logit) pairs: the whole vocabulary, or for a
        greedy pick or ``top_k`` at least the highest scores after the penalties. ``previous`` are the token ids
        seen so far (the prompt and what was generated), for the repetition penalty, ``generated`` this reply's,
        for the presence and frequency penalties. The weights' ``total`` is their float64 sum here (the device's f32
        one in :meth:`draw` from a shortlist)."""
        ranked = sorted(self._penalized(candidates, previous, generated), key=rank)
        top, temperature = ranked[0][1], self.settings.temperature
        # draw() reads the total only without top_k
        total = _sum([math.exp((score - top) / temperature) for _, score in ranked]) \
            if temperature and not self.settings.top_k else 0.0
        token = self.draw(ranked, total, complete=True)
        assert token is not None
        return token

    def mass_needed(self, total: float) -> float:
        """How much of ``total`` (the weights of the whole vocabulary) a shortlist must hold for :meth:`draw` to pick
        from it without ``top_k``: the ``top_p`` part, or without ``top_p`` the next draw's part."""
        s = self.settings
        return s.top_p * total if s.top_p < 1 else uniform(s.seed, self.counter) * total

    def draw(self, ranked: Sequence[tuple[int, float]], total: float, complete: bool) -> int | None:
        """The next token id from ``ranked``: (token id, score) pairs after the penalties, highest first (lowest id
        first among equal scores), the first of the whole vocabulary's ranking; all of it if ``complete``, and at
        least the top ``top_k`` with ``top_k``. ``total`` is the sum of the whole vocabulary's weights (used without
        ``top_k``). None, without drawing, when the tokens past ``ranked`` could be chosen: the caller asks again
        with more.

        Greedy takes the first. Otherwise the weights are those of the top ``top_k`` (or all); ``top_p`` keeps
        the fewest first ones whose running sum reaches ``top_p`` times their mass (``total`` without ``top_k``),
        and a draw in [0, 1) times the kept weights' sum (``total`` if all are kept without ``top_k``) falls in
        the first whose running sum passes it; rounding past the last falls on the last kept.
        """
        s = self.settings
        if s.greedy:
            return ranked[0][0]
        pool = list(ranked[:s.top_k] if s.top_k else ranked)
        complete = complete or bool(s.top_k)
        top = pool[0][1]
        weights = [math.exp((score - top) / s.temperature) for _, score in pool]
        mass = _sum(weights) if s.top_k else total
        if s.top_p < 1:
            limit, kept = 0.0, 0
            while kept < len(weights) and limit < s.top_p * mass:
                limit += weights[kept]
                kept += 1
            if limit >= s.top_p * mass:
                del pool[kept:], weights[kept:]
                mass, complete = _sum(weights), True
            elif not complete:
                return None
        target = uniform(s.seed, self.counter) * mass
        cumulative = 0.0
        for (token_id, _), weight in zip(pool, weights):
            cumulative += weight
            if target < cumulative:
                self.counter += 1
                return token_id
        if not complete:
            return None
        self.counter += 1
        return pool[-1][0]  # rounding left target at the very top of the last interval

    def _penalized(self, candidates: Iterable[tuple[int, float]], previous: Iterable[int],
                   generated: Sequence[int]) -> list[tuple[int, float]]:
        """The candidates as a list, validated, with seen tokens' logits penalized."""
        check_collection("previous", previous, "the token ids seen so far")
        offsets = self.offsets(check_collection("generated", generated, "this reply's token ids"))
        seen = set(previous) if self.settings.repetition_penalty != 1 else set()
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
            out.append((token_id, self.penalized(logit, token_id in seen, offsets.get(token_id, 0.0))))
        if not out:
            raise FieldError("candidates", "at least one (token id, logit) pair", "none")
        return out

    def to_json(self) -> dict[str, Any]:
        """The sampler's whole state as a JSON-serializable value."""
        return {"version": SAMPLER_VERSION, "settings": asdict(self.settings), "counter": self.counter}

    @classmethod
    def from_json(cls, state: Any) -> Sampler:
        """A sampler in the state ``to_json`` returned, or a version 1 state (no ``version``: it goes on under
        these rules); refuses anything else with a FieldError."""
        keys = {"settings", "counter"}
        if not isinstance(state, dict) or set(state) - {"version"} != keys:
            raise FieldError("sampler state", "an object with keys 'settings', 'counter' and 'version'",
                             sorted(state) if isinstance(state, dict) else type(state).__name__)
        if state.get("version", 1) not in (1, SAMPLER_VERSION):
            raise FieldError("sampler state.version", f"1 or {SAMPLER_VERSION}", state.get("version"))
        settings = state["settings"]
        fields = {"temperature", "top_k", "top_p", "repetition_penalty", "seed"}
        optional = {"presence_penalty", "frequency_penalty"}  # absent: 0, the same tokens
        if not isinstance(settings, dict) or not fields <= set(settings) <= fields | optional:
            raise FieldError("sampler state.settings", f"an object with keys {sorted(fields)}",
                             sorted(settings) if isinstance(settings, dict) else type(settings).__name__)
        return cls(SamplingSettings(**settings), state["counter"])


def candidate_count(settings: SamplingSettings, previous: Sequence[int], generated: Sequence[int],
                    vocab_size: int) -> int:
    """How many of the largest logits :meth:`Sampler.pick` needs to choose as it would from all of them after
    ``previous`` (``generated`` the reply's part); 0 when the argmax is the choice (greedy, no penalty).

    A repetition penalty above 1 only lowers seen tokens, and presence and frequency penalties of 0 or more only
    lower generated ones, so the ``n`` best after them are among the ``n`` best before plus the distinct tokens
    they lower; a penalty that can lift a token (a repetition penalty below 1, a negative presence or frequency
    penalty) needs all logits, as sampling without ``top_k`` does.
    """
    penalty, presence, frequency = settings.repetition_penalty, settings.presence_penalty, settings.frequency_penalty
    if settings.greedy and penalty == 1 and presence == 0 and frequency == 0:
        return 0
    if penalty < 1 or presence < 0 or frequency < 0 or (settings.top_k == 0 and not settings.greedy):
        return vocab_size
    lowered = set(previous) if penalty > 1 else set()
    if presence or frequency:
        lowered.update(generated)
    return min(vocab_size, (1 if settings.greedy else settings.top_k) + len(lowered))
