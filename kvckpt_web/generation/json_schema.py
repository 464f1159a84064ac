"""OpenAI's ``response_format`` read into the shape a reply is held to (:mod:`.json_grammar`).

``{"type": "text"}`` (or none) is free text; ``{"type": "json_object"}`` any JSON object; ``{"type": "json_schema",
"json_schema": {"name", "schema", "strict", "description"}}`` a value valid against ``schema``, of this subset of
JSON Schema: ``type`` (``object``, ``array``, ``string``, ``number``, ``integer``, ``boolean``, ``null``, or a list
of them), ``properties``, ``required`` (names among ``properties``), ``additionalProperties`` (true or false;
absent: true), ``items``, ``enum``, ``const``, and the annotations ``title``, ``description`` and ``$schema``. Any
other keyword cannot be held to, and is refused (FieldError naming it, its path from ``response_format``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..errors import FieldError
from .json_grammar import (ANY, ANY_OBJECT, ArrayNode, LiteralNode, Node, NumberNode, ObjectNode, StringNode,
                           UnionNode)

__all__ = ["KEYWORDS", "TYPES", "response_shape"]

TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
"""The values of ``type`` held to."""
KEYWORDS = ("type", "properties", "required", "additionalProperties", "items", "enum", "const", "title",
            "description", "$schema")
"""The JSON Schema keywords held to (or, the last three, that change nothing)."""

_OWN = {"object": ("properties", "required", "additionalProperties"), "array": ("items",)}
_FORMATS = ("text", "json_object", "json_schema")


def response_shape(response_format: Any) -> Node | None:
    """The shape ``response_format`` holds a reply to; None for free text (``{"type": "text"}`` or None).
    FieldError naming the field (``response_format.json_schema.schema.properties.age.minimum``) for what is not
    a response format, or a schema keyword not held to."""
    if response_format is None:
        return None
    if not isinstance(response_format, Mapping):
        raise FieldError("response_format", "an object with a 'type'", type(response_format).__name__)
    kind = response_format.get("type")
    if kind not in _FORMATS:
        raise FieldError("response_format.type", f"one of {list(_FORMATS)}", kind)
    allowed = ("type", "json_schema") if kind == "json_schema" else ("type",)
    for key in response_format:
        if key not in allowed:
            raise FieldError(f"response_format.{key}", f"only {list(allowed)} with type {kind!r}", "an unknown key")
    if kind == "text":
        return None
    if kind == "json_object":
        return ANY_OBJECT
    spec = response_format.get("json_schema")
    where = "response_format.json_schema"
    if not isinstance(spec, Mapping):
        raise FieldError(where, "an object with 'name' and 'schema'", type(spec).__name__)
    for key in spec:
        if key not in ("name", "schema", "strict", "description"):
            raise FieldError(f"{where}.{key}", "only 'name', 'schema', 'strict' and 'description'", "an unknown key")
    if not isinstance(spec.get("name"), str) or not spec["name"]:
        raise FieldError(f"{where}.name", "a non-empty string", spec.get("name"))
    if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
        raise FieldError(f"{where}.strict", "true, false or null", spec["strict"])
    if "schema" not in spec:
        raise FieldError(f"{where}.schema", "a JSON Schema object", "none")
    return _node(spec["schema"], f"{where}.schema")


def _node(schema: Any, where: str) -> Node:
    if not isinstance(schema, Mapping):
        raise FieldError(where, "a JSON Schema object", type(schema).__name__)
    for key in schema:
        if key not in KEYWORDS:
            raise FieldError(f"{where}.{key}", f"a supported keyword ({', '.join(KEYWORDS)})",
                             "a keyword that is not held to")
    types = _types(schema, where)
    for key in schema:
        owner = next((t for t, own in _OWN.items() if key in own), None)
        if owner is not None and owner not in types:
            raise FieldError(f"{where}.{key}", f"only with type {owner!r}", f"type {schema.get('type')!r}")
    if "enum" in schema or "const" in schema:
        return _literals(schema, types, where)
    if not types:
        raise FieldError(f"{where}.type", f"one of {list(TYPES)} (or a list of them), or an enum or const", "none")
    nodes = [_typed(t, schema, where) for t in types if not (t == "integer" and "number" in types)]
    return nodes[0] if len(nodes) == 1 else UnionNode(tuple(nodes))


def _types(schema: Mapping[str, Any], where: str) -> tuple[str, ...]:
    value = schema.get("type")
    if value is None:
        return ()
    listed = value if isinstance(value, list) else [value]
    if not listed or any(t not in TYPES for t in listed) or len(set(listed)) != len(listed):
        raise FieldError(f"{where}.type", f"one of {list(TYPES)} or a list of distinct ones", value)
    return tuple(listed)


def _typed(kind: str, schema: Mapping[str, Any], where: str) -> Node:
    if kind == "object":
        return _object(schema, where)
    if kind == "array":
        return ArrayNode(_node(schema["items"], f"{where}.items") if "items" in schema else ANY)
    if kind == "string":
        return StringNode()
    if kind in ("number", "integer"):
        return NumberNode(integer=kind == "integer")
    return LiteralNode((b"true", b"false") if kind == "boolean" else (b"null",))


def _object(schema: Mapping[str, Any], where: str) -> ObjectNode:
    properties = schema.get("properties", {})
    if not isinstance(properties, Mapping):
        raise FieldError(f"{where}.properties", "an object of schemas by name", type(properties).__name__)
    nodes = {name: _node(sub, f"{where}.properties.{name}") for name, sub in properties.items()}
    required = schema.get("required", [])
    if not isinstance(required, list) or any(not isinstance(n, str) for n in required):
        raise FieldError(f"{where}.required", "a list of property names", required)
    for i, name in enumerate(required):
        if name not in nodes:
            raise FieldError(f"{where}.required[{i}]", "a name among 'properties'", name)
    additional = schema.get("additionalProperties", True)
    if not isinstance(additional, bool):
        raise FieldError(f"{where}.additionalProperties", "true or false (a schema is not held to)",
                         type(additional).__name__)
    return ObjectNode(nodes, frozenset(required), ANY if additional else None)


def _literals(schema: Mapping[str, Any], types: tuple[str, ...], where: str) -> LiteralNode:
    if "enum" in schema and "const" in schema:
        raise FieldError(f"{where}.const", "not together with enum", schema["const"])
    key = "enum" if "enum" in schema else "const"
    values = schema["enum"] if key == "enum" else [schema["const"]]
    if key == "enum" and (not isinstance(values, list) or not values):
        raise FieldError(f"{where}.enum", "a non-empty list of values", values)
    options = []
    for i, value in enumerate(values):
        field = f"{where}.enum[{i}]" if key == "enum" else f"{where}.const"
        if types and _type_of(value) not in types and not (_type_of(value) == "integer" and "number" in types):
            raise FieldError(field, f"a value of type {schema['type']!r}", value)
        options.append(json.dumps(value, ensure_ascii=False, separators=(", ", ": ")).encode())
    return LiteralNode(tuple(dict.fromkeys(options)))


def _type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    return {float: "number", str: "string", list: "array", dict: "object"}.get(type(value), "unknown")
