"""Guards applied to JSON text before it is parsed."""

from __future__ import annotations

#: Deepest array/object nesting a reader accepts. Python's recursive parser would otherwise exhaust the
#: stack on hostile input, and in Pyodide that kills the whole interpreter instead of raising.
MAX_NESTING = 128


def nesting_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in JSON ``text`` (brackets inside strings do not count)."""
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
