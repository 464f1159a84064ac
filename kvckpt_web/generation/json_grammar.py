"""A JSON grammar as a state machine over bytes: which bytes may come next so that the text stays the beginning of
a JSON value of a given shape, and whether the value is complete.

A shape is a tree of nodes (:class:`ObjectNode`, :class:`ArrayNode`, :class:`StringNode`, :class:`NumberNode`,
:class:`LiteralNode`, :class:`UnionNode`; :data:`ANY` is any JSON value), built from a JSON Schema by
:mod:`.json_schema`. A state is an immutable tuple of frames (the innermost last), so a state is kept, compared
and branched from at no cost: :func:`step` returns the state after one more byte, or None where the byte cannot
come. Every state it returns can still be completed (there is no dead end: an object whose keys are fixed offers
only the keys left, and a closing brace only once the required keys are in). Before the value and between its
tokens at most :data:`MAX_WHITESPACE` bytes of whitespace are allowed, and nothing after it: a reply is the value
alone. Bytes of 0x80 and above are taken as they come inside strings (the text's decoder makes U+FFFD of
invalid UTF-8, which is still a JSON string). Pure Python: it runs in Pyodide.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Union

__all__ = ["ANY", "ANY_OBJECT", "MAX_WHITESPACE", "AnyNode", "ArrayNode", "LiteralNode", "Node", "NumberNode", "ObjectNode",
           "State", "StringNode", "UnionNode", "can_end", "feed", "in_plain_string", "initial", "step"]

MAX_WHITESPACE = 20
"""The most whitespace bytes allowed between two tokens of the JSON text (as llama.cpp's JSON grammar bounds it):
a model cannot pad a reply with whitespace without end."""

_WS = frozenset(b" \t\n\r")
_DIGITS = frozenset(b"0123456789")
_HEX = frozenset(b"0123456789abcdefABCDEF")
_ESCAPES = frozenset(b'"\\/bfnrt')


@dataclass(frozen=True, eq=False)
class AnyNode:
    """Any JSON value."""


@dataclass(frozen=True, eq=False)
class StringNode:
    """Any JSON string."""


@dataclass(frozen=True, eq=False)
class NumberNode:
    """A JSON number; ``integer``: without fraction or exponent."""

    integer: bool = False


@dataclass(frozen=True, eq=False)
class LiteralNode:
    """One of a few JSON texts, byte for byte (``true``, ``null``, an enum's values as ``json.dumps`` writes them)."""

    options: tuple[bytes, ...]


@dataclass(frozen=True, eq=False)
class ArrayNode:
    """A JSON array whose items are ``items``."""

    items: "Node" = AnyNode()


@dataclass(frozen=True, eq=False)
class ObjectNode:
    """A JSON object: ``properties`` (name -> node), the ``required`` names, and the node of any other key's value
    (``additional``; None: no other key)."""

    properties: dict[str, "Node"] = field(default_factory=dict)
    required: frozenset[str] = frozenset()
    additional: "Node | None" = None

    def __post_init__(self) -> None:
        keys = {name: json.dumps(name, ensure_ascii=False).encode()[1:] for name in self.properties}
        object.__setattr__(self, "_keys", keys)  # the bytes of a key after its opening quote, closing quote included

    def key_bytes(self) -> dict[str, bytes]:
        """Each property's name as its key is written, after the opening quote (closing quote included)."""
        return self._keys  # type: ignore[attr-defined]


@dataclass(frozen=True, eq=False)
class UnionNode:
    """A value of any of ``nodes``, told apart by their first byte (JSON types start differently)."""

    nodes: tuple["Node", ...]


Node = Union[AnyNode, StringNode, NumberNode, LiteralNode, ArrayNode, ObjectNode, UnionNode]
"""A shape."""

ANY: Node = AnyNode()
"""Any JSON value."""
ANY_OBJECT = ObjectNode(additional=ANY)
"""Any JSON object (what ``response_format`` ``json_object`` asks for)."""

State = tuple
"""Frames, the innermost last; ``()``: the value is complete."""

_STRING = ("s", 0)  # a string's frame outside any escape: every other byte of text keeps it as it is
_ANY_NODES = (ObjectNode(additional=ANY), ArrayNode(ANY), StringNode(), NumberNode(),
              LiteralNode((b"true", b"false", b"null")))


def initial(node: Node) -> State:
    """The state before the first byte of a value of ``node``."""
    return (("v", node, 0),)


def feed(state: State | None, data: bytes) -> State | None:
    """The state after ``data``, or None where a byte of it cannot come."""
    for b in data:
        if state is None:
            return None
        state = step(state, b)
    return state


def in_plain_string(state: State) -> bool:
    """Whether the state is inside a string outside an escape, where every byte but ``"``, ``\\`` and the control
    bytes leaves it as it is."""
    return bool(state) and state[-1] == _STRING


def can_end(state: State) -> bool:
    """Whether the text so far is a whole value (a number may yet go on)."""
    if not state:
        return True
    return len(state) == 1 and _accepting(state[0])


def _accepting(frame: tuple) -> bool:
    if frame[0] == "n":
        return frame[2] in ("zero", "int", "frac", "exp")
    if frame[0] == "l":
        return any(len(o) == frame[2] for o in frame[1])
    return False


def step(state: State, b: int) -> State | None:
    """The state after byte ``b``, or None where it cannot come."""
    if not state:
        return None  # nothing after the value
    top, rest = state[-1], state[:-1]
    kind = top[0]
    if kind == "s":
        return _string(top, rest, b)
    if kind == "v":
        if b in _WS:
            return rest + (("v", top[1], top[2] + 1),) if top[2] < MAX_WHITESPACE else None
        return _start(top[1], rest, b)
    if kind == "o":
        return _object(top, rest, b)
    if kind == "a":
        return _array(top, rest, b)
    if kind == "k":
        return _key(top, rest, b)
    if kind == "n":
        return _number(top, rest, b)
    return _literal(top, rest, b)


def _start(node: Node, rest: State, b: int) -> State | None:
    """The first byte ``b`` of a value of ``node``, whose parents are ``rest``."""
    if isinstance(node, (AnyNode, UnionNode)):
        for option in _ANY_NODES if isinstance(node, AnyNode) else node.nodes:
            state = _start(option, rest, b)
            if state is not None:
                return state
        return None
    if isinstance(node, StringNode):
        return rest + (_STRING,) if b == 0x22 else None
    if isinstance(node, ObjectNode):
        return rest + (("o", node, "open", frozenset(), 0, None),) if b == 0x7B else None
    if isinstance(node, ArrayNode):
        return rest + (("a", node, "open", 0),) if b == 0x5B else None
    if isinstance(node, NumberNode):
        phase = "minus" if b == 0x2D else "zero" if b == 0x30 else "int" if b in _DIGITS else None
        return None if phase is None else rest + (("n", node.integer, phase),)
    options = tuple(o for o in node.options if o[0] == b)
    if not options:
        return None
    return rest + (("l", options, 1),) if any(len(o) > 1 for o in options) else rest


def _string(top: tuple, rest: State, b: int) -> State | None:
    escape = top[1]
    if escape == 0:
        if b == 0x22:
            return rest
        if b == 0x5C:
            return rest + (("s", 1),)
        return None if b < 0x20 else rest + (_STRING,)
    if escape == 1:
        if b in _ESCAPES:
            return rest + (_STRING,)
        return rest + (("s", 2),) if b == 0x75 else None  # \u and four hex digits
    if b not in _HEX:
        return None
    return rest + ((_STRING if escape == 5 else ("s", escape + 1)),)


def _more_keys(node: ObjectNode, used: frozenset[str]) -> bool:
    return node.additional is not None or any(name not in used for name in node.properties)


def _object(top: tuple, rest: State, b: int) -> State | None:
    _, node, phase, used, ws, pending = top
    if b in _WS:
        return rest + (("o", node, phase, used, ws + 1, pending),) if ws < MAX_WHITESPACE else None
    if phase in ("open", "next") and b == 0x22:
        if node.additional is not None and not node.properties:  # any key: a string, then its value's node
            return rest + (("o", node, "colon", used, 0, node.additional), _STRING)
        return rest + (("o", node, "key", used, 0, None), ("k", b"", 0))
    if phase == "colon" and b == 0x3A:
        return rest + (("o", node, "after", used, 0, None), ("v", pending, 0))
    if phase == "after" and b == 0x2C and _more_keys(node, used):
        return rest + (("o", node, "next", used, 0, None),)
    if phase in ("open", "after") and b == 0x7D and node.required <= used:
        return rest
    return None


def _key(top: tuple, rest: State, b: int) -> State | None:
    """A key of an object with named properties: one of those left (written as ``json.dumps`` writes it) or, where
    other keys are allowed, any string, whose value is then its property's if it names one."""
    parent = rest[-1]
    node, used = parent[1], parent[3]
    written = top[1] + bytes((b,))
    if node.additional is None:
        names = [n for n, k in node.key_bytes().items() if n not in used and k.startswith(written)]
        if not names:
            return None
        done = [n for n in names if len(node.key_bytes()[n]) == len(written)]
        if done:
            return rest[:-1] + (("o", node, "colon", used | {done[0]}, 0, node.properties[done[0]]),)
        return rest + (("k", written, 0),)
    inner = _string(("s", top[2]), (), b)  # the key's text as a string's, kept to name its property
    if inner is None:
        return None
    if inner:
        return rest + (("k", written, inner[-1][1]),)
    try:
        name = json.loads(b'"' + written)
    except ValueError:  # bytes that are not UTF-8: no property's name
        name = None
    if name in used:
        return None
    value = node.properties.get(name, node.additional)
    return rest[:-1] + (("o", node, "colon", used | {name}, 0, value),)


def _array(top: tuple, rest: State, b: int) -> State | None:
    _, node, phase, ws = top
    if b in _WS:
        return rest + (("a", node, phase, ws + 1),) if ws < MAX_WHITESPACE else None
    if b == 0x5D and phase in ("open", "after"):
        return rest
    if phase == "after":
        return rest + (("a", node, "next", 0),) if b == 0x2C else None
    return _start(node.items, rest + (("a", node, "after", 0),), b)


_NUMBER_NEXT = {  # phase -> (digits go to, "." goes to, "e"/"E" go to)
    "minus": ("int", None, None), "int": ("int", "dot", "e"), "dot": ("frac", None, None),
    "frac": ("frac", None, "e"), "e": ("exp", None, None), "sign": ("exp", None, None), "exp": ("exp", None, None),
}


def _number(top: tuple, rest: State, b: int) -> State | None:
    _, integer, phase = top
    if phase == "minus" and b == 0x30:
        nxt = "zero"
    elif phase == "zero":
        nxt = "dot" if b == 0x2E else "e" if b in b"eE" else None
    elif phase == "e" and b in b"+-":
        nxt = "sign"
    else:
        digit, dot, exp = _NUMBER_NEXT[phase]
        nxt = digit if b in _DIGITS else dot if b == 0x2E else exp if b in b"eE" else None
    if nxt is not None and not (integer and nxt in ("dot", "e")):
        return rest + (("n", integer, nxt),)
    return step(rest, b) if _accepting(top) else None  # the number ended: the byte is its parent's


def _literal(top: tuple, rest: State, b: int) -> State | None:
    _, options, at = top
    longer = tuple(o for o in options if len(o) > at and o[at] == b)
    if longer:
        return rest + (("l", longer, at + 1),) if any(len(o) > at + 1 for o in longer) else rest
    return step(rest, b) if _accepting(top) else None  # an option ended (another went on): the byte is the parent's
