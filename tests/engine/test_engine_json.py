"""Replies held to a JSON response_format on the engine: they parse and validate, the format is in the
conversation's app_state, and a reply cut mid-JSON resumes, in a new engine, to the tokens of an uninterrupted
run (the constraint's state replayed from the tokens)."""

from __future__ import annotations

import json

import pytest

from kvckpt_web import FileStore, MemoryStore
from kvckpt_web.durable.catalog import load_manifest
from kvckpt_web.errors import FieldError

from lm_double import ALPHABET, DoubleText
from support.kvmodel import run

PIECES = ['{', '}', '"', ':', ',', ' ', 'a', 'b', 'n', 'ok', 'true', 'false', '1', '2', '0', '.', '[', ']', '\n',
          'x', 'y', '"a"', '": ', ', "', 'null', '-', 'e', 'name', 'sea', 'wind', '\\', 'u', '{"']
assert len(PIECES) == len(ALPHABET)  # one piece per id of the double's vocabulary

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 10]},
                                           "tags": {"type": "array", "items": {"enum": ["sea", "wind"]}}},
          "required": ["ok", "n"], "additionalProperties": False}
SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}}
MESSAGES = [{"role": "user", "content": "answer in json."}]
GREEDY = {"temperature": 0.0, "max_tokens": 60}
SEEDED = {"temperature": 0.9, "top_p": 0.9, "seed": 11, "max_tokens": 60}


class JsonText(DoubleText):
    """The double's codec whose ids (past BOS and EOS) stand for pieces of JSON: replies can be JSON."""

    def decode(self, tokens):
        return "".join(PIECES[t - 2] for t in tokens if t >= 2)

    def token_pieces(self):
        return [b"", b""] + [p.encode() for p in PIECES]


def validates(value) -> bool:
    return (set(value) <= {"ok", "n", "tags"} and {"ok", "n"} <= set(value) and isinstance(value["ok"], bool)
            and value["n"] in (1, 2, 10) and all(t in ("sea", "wind") for t in value.get("tags", [])))


@pytest.mark.parametrize("settings", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_a_json_schema_reply_parses_and_validates(make_engine, settings):
    engine = make_engine(text=JsonText())
    reply = run(engine.chat(MESSAGES, response_format=SCHEMA_FORMAT, **settings))
    assert reply.finish_reason == "stop"
    assert validates(json.loads(reply.text))


def test_a_json_object_reply_is_an_object_or_cut_by_the_token_limit(make_engine):
    engine = make_engine(text=JsonText())
    reply = run(engine.chat(MESSAGES, response_format={"type": "json_object"}, **GREEDY))
    if reply.finish_reason == "stop":
        assert isinstance(json.loads(reply.text), dict)
    else:
        assert reply.finish_reason == "length" and reply.text.startswith("{")


def test_the_response_format_is_in_the_app_state(make_engine):
    store = MemoryStore()
    engine = make_engine(store=store, text=JsonText())
    reply = run(engine.chat(MESSAGES, response_format=SCHEMA_FORMAT, **GREEDY))
    manifest, _ = run(load_manifest(store, reply.conversation))
    assert manifest.app_state["response_format"] == SCHEMA_FORMAT and manifest.app_state["version"] == 2


@pytest.mark.parametrize("settings", [GREEDY, SEEDED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("cut", [1, 4, 9])
def test_a_reply_cut_mid_json_resumes_in_a_new_engine_to_the_same_tokens(make_engine, tmp_path, settings, cut):
    whole = run(make_engine(text=JsonText()).chat(MESSAGES, response_format=SCHEMA_FORMAT, **settings))
    assert len(whole.token_ids) > cut

    async def cut_and_resume():
        engine = make_engine(store=FileStore(tmp_path / "s"), text=JsonText())
        got = 0
        async for chunk in await engine.chat(MESSAGES, stream=True, response_format=SCHEMA_FORMAT, **settings):
            got += len(chunk.token_ids)
            if got == cut:
                engine.interrupt()
        await engine.close()
        again = make_engine(store=FileStore(tmp_path / "s"), text=JsonText())
        (info,) = await again.unfinished()
        return await again.resume(info.name)

    resumed = run(cut_and_resume())
    assert resumed.token_ids == whole.token_ids and validates(json.loads(resumed.text))


def test_a_schema_keyword_not_held_to_is_refused_naming_it_and_nothing_is_stored(make_engine):
    store = MemoryStore()
    engine = make_engine(store=store, text=JsonText())
    bad = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "string", "format": "email"}}}
    with pytest.raises(FieldError) as caught:
        run(engine.chat(MESSAGES, response_format=bad, **GREEDY))
    assert caught.value.field == "response_format.json_schema.schema.format"
    assert not store._data


# ----- SmolLM2 ------------------------------------------------------------------------------------------------

PERSON = {"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": {
    "type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                     "pet": {"enum": ["cat", "dog", "none"]}},
    "required": ["name", "age", "pet"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "Describe a person called Ann, aged 31, who has a cat, as JSON."}]


@pytest.fixture(scope="module")
def smollm_loaded(smollm_path, device):
    from kvckpt_web.model.loader import load_model
    loaded = load_model(smollm_path, device)
    yield loaded
    loaded.model.close()


def smollm_engine(loaded, device, store=None):
    from kvckpt_web.engine import Engine, EngineConfig
    return Engine(loaded, device, store=store, config=EngineConfig(context=512, sequences=2, prefill_chunk=64))


def test_smollm2_json_object_reply_parses(smollm_loaded, device):
    engine = smollm_engine(smollm_loaded, device)
    ask = [{"role": "user", "content": 'Is the sea salty? Reply in JSON with one key, "salty", true or false.'}]
    try:
        reply = run(engine.chat(ask, response_format={"type": "json_object"}, temperature=0, max_tokens=64))
    finally:
        run(engine.close())
    assert reply.finish_reason == "stop" and isinstance(json.loads(reply.text), dict)


@pytest.mark.parametrize("settings", [{"temperature": 0}, {"temperature": 0.8, "top_k": 40, "seed": 5}],
                         ids=["greedy", "seeded"])
def test_smollm2_json_schema_reply_validates(smollm_loaded, device, settings):
    engine = smollm_engine(smollm_loaded, device)
    try:
        reply = run(engine.chat(ASK, response_format=PERSON, max_tokens=96, **settings))
    finally:
        run(engine.close())
    assert reply.finish_reason == "stop"
    value = json.loads(reply.text)
    assert set(value) == {"name", "age", "pet"} and isinstance(value["name"], str)
    assert type(value["age"]) is int and value["pet"] in ("cat", "dog", "none")


def test_smollm2_reply_cut_mid_json_resumes_to_the_same_tokens(smollm_loaded, device, tmp_path):
    settings = {"response_format": PERSON, "temperature": 0.8, "top_k": 40, "seed": 5, "max_tokens": 96}
    fresh = smollm_engine(smollm_loaded, device)
    whole = run(fresh.chat(ASK, **settings))
    run(fresh.close())

    async def cut_and_resume():
        engine = smollm_engine(smollm_loaded, device, FileStore(tmp_path / "s"))
        got = 0
        async for chunk in await engine.chat(ASK, stream=True, **settings):
            got += len(chunk.token_ids)
            if got == 6:
                engine.interrupt()
        await engine.close()
        again = smollm_engine(smollm_loaded, device, FileStore(tmp_path / "s"))
        (info,) = await again.unfinished()
        try:
            return await again.resume(info.name)
        finally:
            await again.close()

    resumed = run(cut_and_resume())
    assert resumed.token_ids == whole.token_ids and json.loads(resumed.text) == json.loads(whole.text)
