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


def non_string_key(value: Any) -> tuple[str, Any] | None:
    """The first object key in ``value`` (dicts and lists, nested) that is not a str, and the path of the object
    holding it (``.a[2]``); None if every key is a str. JSON has only string keys: ``json.dumps`` would turn
    such a key into one, and it would come back as another key."""
    todo: list[tuple[str, Any]] = [("", value)]
    seen: set[int] = set()  # each container once: shared ones, and cycles (which json.dumps refuses anyway)
    while todo:
        path, item = todo.pop()
        if id(item) in seen:
            continue
        if isinstance(item, dict):
            seen.add(id(item))
            for key, child in item.items():
                if not isinstance(key, str):
                    return path, key
                if isinstance(child, (dict, list, tuple)):
                    todo.append((f"{path}.{key}" if key.isidentifier() else f"{path}[{key!r}]", child))
        elif isinstance(item, (list, tuple)):
            seen.add(id(item))
            todo.extend((f"{path}[{i}]", child) for i, child in enumerate(item)
                        if isinstance(child, (dict, list, tuple)))
    return None


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
