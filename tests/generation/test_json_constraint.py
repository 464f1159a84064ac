"""Constrained picks: the best allowed token (greedy), a draw among allowed tokens only (sampled), the end of the
reply exactly where the value is complete, and a state that is a function of the reply's tokens."""

from __future__ import annotations

import json

from kvckpt_web.generation.json_constraint import JsonConstraint, Vocabulary
from kvckpt_web.generation.json_grammar import initial
from kvckpt_web.generation.json_schema import response_shape
from kvckpt_web.model.sampler import Sampler, SamplingSettings
from support.kvmodel import run

EOS = 0
PIECES = [b"", b'{"', b"a", b'":', b" 1", b"}", b"hello", b'"', b",", b"2", b" ", b"\n", b"{", b"}}", b'"a"']
OBJECT = {"type": "json_object"}


class Logits:
    """Logits of a given order: ``ranked`` ids best first."""

    def __init__(self, ranked):
        self.values = {t: float(len(ranked) - i) for i, t in enumerate(ranked)}
        self.reads = []

    async def argmax(self):
        return max(self.values, key=lambda t: (self.values[t], -t))

    async def top_k(self, k):
        self.reads.append(k)
        return sorted(self.values.items(), key=lambda c: (-c[1], c[0]))[:k]


def ranked(*best):
    return list(best) + [t for t in range(len(PIECES)) if t not in best]


def constraint(response_format=OBJECT):
    return JsonConstraint(response_format, Vocabulary(lambda: PIECES), (EOS,))


def pick(c, logits, generated, settings=SamplingSettings()):
    return run(c.pick(logits, Sampler(settings), generated, generated, len(PIECES)))


def test_greedy_takes_the_argmax_when_allowed():
    assert pick(constraint(), Logits(ranked(1)), []) == 1


def test_greedy_takes_the_best_allowed_token_further_down():
    logits = Logits(ranked(6, 2, 5, 12))
    assert pick(constraint(), logits, []) == 12


def test_eos_is_allowed_only_once_the_value_is_complete_and_then_alone():
    c = constraint()
    assert pick(c, Logits(ranked(EOS, 5)), [12]) == 5
    assert pick(c, Logits(ranked(6, 8)), [12, 5]) == EOS


def test_a_sampled_pick_draws_among_allowed_tokens_only():
    allowed = Vocabulary(lambda: PIECES).allowed(constraint().state([1, 2, 3]))  # after '{"a":'
    picks = {pick(constraint(), Logits(ranked(6, 5, 8)), [1, 2, 3], SamplingSettings(temperature=1.0, seed=seed))
             for seed in range(20)}
    assert picks <= allowed and len(picks) > 1


def test_a_sampled_pick_takes_one_draw_as_an_unconstrained_one():
    sampler = Sampler(SamplingSettings(temperature=1.0, top_k=3, seed=5))
    run(constraint().pick(Logits(ranked(6, 2)), sampler, [], [], len(PIECES)))
    assert sampler.counter == 1


def test_a_greedy_pick_under_a_presence_penalty_takes_the_best_allowed_token_after_it():
    generated = [12, 10]  # '{ ': the whitespace token was generated, and is allowed again
    assert pick(constraint(), Logits(ranked(10, 11, 7)), generated) == 10
    assert pick(constraint(), Logits(ranked(10, 11, 7)), generated, SamplingSettings(presence_penalty=2.0)) == 11


def test_the_allowed_set_is_the_tokens_the_grammar_takes():
    vocabulary = Vocabulary(lambda: PIECES)
    state = initial(response_shape(OBJECT))
    assert vocabulary.allowed(state) == {1, 10, 11, 12}
    in_string = constraint().state([1])
    assert vocabulary.allowed(in_string) == {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 13}


def test_the_state_is_a_function_of_the_reply_tokens():
    fresh, stepped = constraint(), constraint()
    for n in range(1, 5):
        stepped.state([1, 2, 3, 4][:n])
    assert fresh.state([1, 2, 3, 4]) == stepped.state([1, 2, 3, 4])


def test_a_schema_reply_validates():
    schema = {"type": "json_schema", "json_schema": {"name": "n", "schema": {
        "type": "object", "properties": {"a": {"enum": [1, 2]}}, "required": ["a"], "additionalProperties": False}}}
    c, generated = constraint(schema), []
    while not generated or generated[-1] != EOS:
        generated.append(pick(c, Logits(ranked(6, 11, 10, 8, 4, 1, 2, 3, 9, 5)), generated))
    text = b"".join(PIECES[t] for t in generated).decode()
    assert json.loads(text) in ({"a": 1}, {"a": 2})
