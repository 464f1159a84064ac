"""Constrained decoding: the next token picked among those that keep a reply a JSON value of its shape
(:mod:`.json_grammar`), so that a reply that ends at its end-of-sequence token parses and validates.

A :class:`Vocabulary` is what the constraint knows of a tokenizer: the bytes each token id stands for, and, built
once on first need, the ids bucketed by their first two bytes, so that the tokens a state allows are found without
running every one of the vocabulary's strings through the grammar. A :class:`JsonConstraint` is one reply's: its
state is a pure function of the reply's tokens (a resumed reply replays them), and :meth:`JsonConstraint.pick`
chooses as the sampler would among the allowed tokens only:

- greedy (no penalty): the argmax if allowed, else the best allowed token of the GPU's top-k read in
  growing windows (8, 64, 512, ... tokens);
- otherwise the candidates the sampler needs (:func:`~kvckpt_web.model.sampler.candidate_count`) are counted among
  allowed tokens only: windows grow until they hold that many allowed ones (all the vocabulary's logits for
  ``top_k`` 0), and :meth:`Sampler.pick` draws among them as it draws among all (one draw per token: the sampler's
  state stays resumable). Tokens of a small window are checked one by one; past :data:`_CHECKED` the state's
  allowed set is found once, through the vocabulary's buckets.

End-of-sequence ids are allowed only where the value is complete, and once it is complete they are the only ones:
the reply ends there. Special tokens are never allowed otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import FieldError
from ..model.sampler import Sampler, candidate_count
from .json_grammar import Node, State, can_end, feed, in_plain_string, initial, step
from .json_schema import response_shape

if TYPE_CHECKING:
    from ..model.protocol import Logits

__all__ = ["FIRST_WINDOW", "JsonConstraint", "Vocabulary"]

FIRST_WINDOW = 8
"""The first window of the GPU's top-k a constrained pick reads (each next one 8 times larger)."""

_CHECKED = 64
"""The largest window whose tokens are checked one by one: beyond it the state's allowed set is found once."""
_PLAIN = frozenset(b for b in range(256) if b >= 0x20 and b not in b'"\\')  # string bytes that change no state


class Vocabulary:
    """A tokenizer's tokens as the constraint sees them: ``pieces()`` returns the bytes of each token id (empty for
    a special token, which text never holds); read and indexed on first use."""

    def __init__(self, pieces: Callable[[], Sequence[bytes]]) -> None:
        self._source = pieces
        self._pieces: list[bytes] | None = None
        self._buckets: dict[int, dict[int, list[int]]] = {}   # first byte -> second byte -> ids of longer tokens
        self._singles: dict[int, list[int]] = {}              # byte -> ids of one-byte tokens
        self._plain: frozenset[int] = frozenset()             # ids of tokens of plain string bytes only
        self._unplain: list[int] = []                         # ids of the other tokens

    def pieces(self) -> list[bytes]:
        """The bytes of each token id (read once)."""
        if self._pieces is None:
            self._pieces = list(self._source())
            self._index(self._pieces)
        return self._pieces

    def _index(self, pieces: list[bytes]) -> None:
        plain = []
        for token, piece in enumerate(pieces):
            if not piece:
                continue
            if len(piece) == 1:
                self._singles.setdefault(piece[0], []).append(token)
            else:
                self._buckets.setdefault(piece[0], {}).setdefault(piece[1], []).append(token)
            (plain if all(b in _PLAIN for b in piece) else self._unplain).append(token)
        self._plain = frozenset(plain)

    def allows(self, state: State, token: int) -> bool:
        """Whether token ``token`` (not an end-of-sequence id) may come in ``state``."""
        piece = self.pieces()[token]
        return bool(piece) and feed(state, piece) is not None

    def allowed(self, state: State) -> set[int]:
        """Every token id (end-of-sequence ids left out) that may come in ``state``."""
        pieces = self.pieces()
        if in_plain_string(state):
            return set(self._plain).union(t for t in self._unplain if feed(state, pieces[t]) is not None)
        out: set[int] = set()
        for first in self._buckets.keys() | self._singles.keys():
            seconds = self._buckets.get(first, {})
            after = step(state, first)
            if after is None:
                continue
            out.update(self._singles.get(first, ()))
            for second, tokens in seconds.items():
                then = step(after, second)
                if then is not None:
                    out.update(t for t in tokens if feed(then, pieces[t][2:]) is not None)
        return out


class JsonConstraint:
    """One reply held to ``response_format`` (see :func:`.json_schema.response_shape`; FieldError naming the field
    if it is none): its state after the reply's tokens, and the pick of the next one."""

    def __init__(self, response_format: Any, vocabulary: Vocabulary, eos_ids: Sequence[int]) -> None:
        shape = response_shape(response_format)
        if shape is None:
            raise FieldError("response_format", "a JSON response format", response_format)
        if not eos_ids:
            raise FieldError("eos_ids", "at least one end-of-sequence id, to end a JSON reply", "none")
        self.shape: Node = shape
        self.vocabulary = vocabulary
        self.eos_ids = tuple(eos_ids)
        self._state: State = initial(shape)
        self._seen = 0  # reply tokens the state is after

    def state(self, generated: Sequence[int]) -> State | None:
        """The state after the reply's tokens ``generated`` (those seen before are not run again); None once it
        ended (an end-of-sequence id) or took a token the format does not allow."""
        pieces = self.vocabulary.pieces()
        for token in generated[self._seen:]:
            self._state = None if token in self.eos_ids or self._state is None else feed(self._state, pieces[token])
            self._seen += 1
        return self._state

    def _allowed(self, state: State) -> set[int]:
        return self.vocabulary.allowed(state) | (set(self.eos_ids) if can_end(state) else set())

    def _allows(self, state: State, token: int) -> bool:
        return can_end(state) if token in self.eos_ids else self.vocabulary.allows(state, token)

    async def pick(self, logits: "Logits", sampler: Sampler, tokens: Sequence[int], generated: Sequence[int],
                   vocab_size: int) -> int:
        """The next token of the reply ``generated`` (``tokens``: every token so far, for the repetition penalty;
        ``generated`` for the presence and frequency penalties), from ``logits``, among the allowed ones, as
        ``sampler`` picks."""
        state = self.state(generated)
        if state is None:
            raise FieldError("generated", "a reply the response_format allows, not ended",
                             "an end-of-sequence id or a token the format does not allow")
        if not state:
            return self.eos_ids[0]  # the value is complete: the reply ends
        settings = sampler.settings
        need = candidate_count(settings, tokens, generated, vocab_size)
        if need == 0:  # the best allowed token
            best = await logits.argmax()
            if self._allows(state, best):
                return best
        allowed = self._allowed(state) if need >= vocab_size else None
        window = min(vocab_size, max(need, FIRST_WINDOW))
        while True:
            candidates = [c for c in await logits.top_k(window) if (c[0] in allowed if allowed is not None
                                                                      else self._allows(state, c[0]))]
            if len(candidates) >= max(need, 1) or window >= vocab_size:
                break
            window = min(vocab_size, window * 8)
            if allowed is None and window > _CHECKED:
                allowed = self._allowed(state)
        if not candidates:
            raise FieldError("response_format", "a format this vocabulary can write", "no token allowed")
        return candidates[0][0] if need == 0 else sampler.pick(candidates, tokens, generated)
