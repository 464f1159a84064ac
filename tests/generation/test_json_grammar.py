"""The JSON grammar over bytes: what may come next so that the text stays the start of a value of its shape, and
when the value is complete."""

from __future__ import annotations

import pytest

from kvckpt_web.generation.json_grammar import (ANY, ANY_OBJECT, MAX_WHITESPACE, ArrayNode, LiteralNode, NumberNode,
                                                ObjectNode, StringNode, can_end, feed, in_plain_string, initial)

PERSON = ObjectNode({"name": StringNode(), "age": NumberNode(integer=True),
                     "tags": ArrayNode(LiteralNode((b'"a"', b'"b"')))}, frozenset({"name", "age"}), None)


def whole(node, text: str) -> bool:
    state = feed(initial(node), text.encode())
    return state is not None and can_end(state)


def prefix(node, text: str) -> bool:
    return feed(initial(node), text.encode()) is not None


@pytest.mark.parametrize("text", ['{}', '{"a": 1}', '{"a": [1, 2.5e-3, "x\\u00e9\\n", true, false, null, {"b": {}}]}',
                                  ' {\n  "k": -0.5E+2\n}', '{"a":"\\"q\\\\"}', '{"é": "日本"}', '{"a": []}'])
def test_json_object_takes_any_object(text):
    assert whole(ANY_OBJECT, text)


@pytest.mark.parametrize("text", ['[1]', '"s"', '{"a"}', '{"a":}', '{"a": 01}', '{"a": 1,}', '{"a": tru}',
                                  '{"a": "x\n"}', '{"a": [1,]}', "{'a': 1}", '{"a": 1.}', '{"a": -}'])
def test_json_object_refuses_what_is_no_object(text):
    assert not whole(ANY_OBJECT, text)


def test_nothing_may_follow_a_complete_value():
    assert feed(initial(ANY_OBJECT), b"{}") == ()
    assert not prefix(ANY_OBJECT, "{} ") and not prefix(ANY_OBJECT, "{}{")


def test_whitespace_between_tokens_is_bounded():
    assert prefix(ANY_OBJECT, "{" + " " * MAX_WHITESPACE)
    assert not prefix(ANY_OBJECT, "{" + " " * (MAX_WHITESPACE + 1))


def test_an_object_of_fixed_keys_takes_only_its_keys_each_once_and_closes_once_the_required_are_in():
    assert whole(PERSON, '{"name": "x", "age": 3}') and whole(PERSON, '{"age": 3, "tags": ["a", "b"], "name": "x"}')
    assert not prefix(PERSON, '{"nam ') and not prefix(PERSON, '{"extra"')
    assert not prefix(PERSON, '{"name": "x"}')
    assert not prefix(PERSON, '{"name": "x", "name"')
    assert not prefix(PERSON, '{"name": "x", "age": 3, "tags": ["c"')


def test_no_comma_is_allowed_once_every_key_is_in():
    one = ObjectNode({"a": NumberNode()}, frozenset(), None)
    assert whole(one, '{"a": 1}') and not prefix(one, '{"a": 1,')


def test_an_integer_has_no_fraction_or_exponent():
    assert whole(NumberNode(integer=True), "-12") and not prefix(NumberNode(integer=True), "1.")
    assert not prefix(NumberNode(integer=True), "1e")


def test_other_keys_take_any_value_and_named_ones_their_propertys_however_written():
    node = ObjectNode({"n": NumberNode(integer=True)}, frozenset({"n"}), ANY)
    assert whole(node, '{"x": [1, {}], "n": 2}') and whole(node, '{"\\u006e": 2}')
    assert not prefix(node, '{"n": 2.5') and not prefix(node, '{"n": 1, "n"')


def test_a_literal_that_another_extends_ends_where_its_parent_goes_on():
    node = ArrayNode(LiteralNode((b"1", b"12")))
    assert whole(node, "[1, 12, 1]") and not prefix(node, "[13")


def test_inside_a_string_plain_bytes_keep_the_state():
    state = feed(initial(StringNode()), b'"ab')
    assert in_plain_string(state) and feed(state, "cd é".encode()) == state
    assert not in_plain_string(feed(state, b"\\"))
