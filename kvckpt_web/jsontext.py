"""Guards applied to JSON text before and while it is parsed."""

from __future__ import annotations

import re
from typing import Any

#: Deepest array/object nesting a reader accepts. Python's recursive parser would otherwise exhaust the
#: stack on hostile input, and in Pyodide that kills the whole interpreter instead of raising.
MAX_NESTING = 128


_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")


def nesting_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in JSON ``text`` (brackets inside strings do not count)."""
    bare = _STRING.sub("", text)
    if '"' in bare:  # an unterminated string: everything after its quote is inside it
        bare = bare[:bare.index('"')]
    depth = deepest = 0
    for bracket in _BRACKET.findall(bare):
        if bracket in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


class DuplicateKeyError(ValueError):
    """A JSON object names ``key`` twice (raised inside ``json.loads``; readers report it as their own error)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"duplicate key {key!r}")
        self.key = key


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An ``object_pairs_hook`` for ``json.loads`` that refuses duplicate keys (:class:`DuplicateKeyError`)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKeyError(key)
            seen.add(key)
    return obj
