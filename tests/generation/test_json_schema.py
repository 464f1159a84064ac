"""OpenAI's response_format read into a shape: json_object, a schema of the subset held to, and the refusal of
anything else naming the field."""

from __future__ import annotations

import pytest

from kvckpt_web.errors import FieldError
from kvckpt_web.generation.json_grammar import ANY_OBJECT, can_end, feed, initial
from kvckpt_web.generation.json_schema import response_shape


def schema_format(schema):
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}


def valid(shape, text: str) -> bool:
    state = feed(initial(shape), text.encode())
    return state is not None and can_end(state)


def test_text_is_free_and_json_object_any_object():
    assert response_shape(None) is None and response_shape({"type": "text"}) is None
    assert response_shape({"type": "json_object"}) is ANY_OBJECT


def test_a_schema_of_the_subset_is_held_to():
    shape = response_shape(schema_format({
        "type": "object", "title": "Person", "description": "someone",
        "properties": {"name": {"type": "string"}, "age": {"type": ["integer", "null"]},
                       "kind": {"enum": ["cat", "dog"]}, "ok": {"const": True},
                       "scores": {"type": "array", "items": {"type": "number"}}},
        "required": ["name", "kind"], "additionalProperties": False}))
    assert valid(shape, '{"name": "Rex", "kind": "dog", "age": null, "scores": [1.5, 2], "ok": true}')
    assert not valid(shape, '{"name": "Rex", "kind": "cow"}')
    assert not valid(shape, '{"name": "Rex", "kind": "dog", "age": 1.5}')
    assert not valid(shape, '{"name": "Rex", "kind": "dog", "other": 1}')


@pytest.mark.parametrize("schema, field", [
    ({"type": "string", "pattern": "^a"}, "response_format.json_schema.schema.pattern"),
    ({"type": "object", "properties": {"age": {"type": "integer", "minimum": 0}}},
     "response_format.json_schema.schema.properties.age.minimum"),
    ({"type": "object", "properties": {}, "required": ["x"]}, "response_format.json_schema.schema.required[0]"),
    ({"type": "object", "additionalProperties": {"type": "string"}},
     "response_format.json_schema.schema.additionalProperties"),
    ({"type": "string", "items": {}}, "response_format.json_schema.schema.items"),
    ({"type": "date"}, "response_format.json_schema.schema.type"),
    ({"properties": {}}, "response_format.json_schema.schema.properties"),
    ({"type": "string", "enum": ["a", 1]}, "response_format.json_schema.schema.enum[1]"),
    ({"enum": []}, "response_format.json_schema.schema.enum"),
    ({"anyOf": [{"type": "string"}]}, "response_format.json_schema.schema.anyOf"),
], ids=["pattern", "minimum", "required unknown", "additional schema", "items of a string", "unknown type",
        "no type", "enum of another type", "empty enum", "anyOf"])
def test_a_keyword_not_held_to_is_refused_naming_it(schema, field):
    with pytest.raises(FieldError) as caught:
        response_shape(schema_format(schema))
    assert caught.value.field == field


@pytest.mark.parametrize("value, field", [
    ({"type": "xml"}, "response_format.type"), ("json", "response_format"),
    ({"type": "json_schema"}, "response_format.json_schema"),
    ({"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}, "response_format.json_schema.name"),
    ({"type": "json_schema", "json_schema": {"name": "a"}}, "response_format.json_schema.schema"),
    ({"type": "json_object", "schema": {}}, "response_format.schema"),
])
def test_a_response_format_that_is_none_is_refused_naming_the_field(value, field):
    with pytest.raises(FieldError) as caught:
        response_shape(value)
    assert caught.value.field == field
