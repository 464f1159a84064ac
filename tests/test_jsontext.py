"""The guards run on JSON text before (nesting) and while (duplicate keys) it is parsed."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvckpt_web.jsontext import DuplicateKeyError, nesting_depth, unique_keys


def scanned_depth(text: str) -> int:
    """The specification: a character scan that skips string contents, escapes included."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def test_brackets_inside_strings_do_not_count() -> None:
    assert nesting_depth('{"a": "[[[{{{", "b": [1, "\\"]]]"]}') == 2


def test_everything_after_an_unterminated_string_is_inside_it() -> None:
    assert nesting_depth('[[ "abc [[[[ ') == 2


@given(st.text(alphabet='[]{}"\\ab,:\n', max_size=40))
def test_depth_equals_the_character_scan_on_any_text(text: str) -> None:
    assert nesting_depth(text) == scanned_depth(text)


def test_unique_keys_builds_the_object_of_distinct_keys() -> None:
    assert json.loads('{"a": 1, "b": {"c": 2}}', object_pairs_hook=unique_keys) == {"a": 1, "b": {"c": 2}}


def test_unique_keys_names_a_key_given_twice() -> None:
    with pytest.raises(DuplicateKeyError) as info:
        json.loads('{"a": 1, "b": 2, "a": 3}', object_pairs_hook=unique_keys)
    assert info.value.key == "a"
