"""Errors of the API: OpenAI's error object with the status, type, param and code OpenAI (or HTTP) gives them, one
line, never a traceback; bad or oversize requests change nothing stored."""

from __future__ import annotations

import asyncio

import openai
import pytest
from api_helpers import SEEDED, USER, api_serving, client, error_of, raw, until_closed
from serve_helpers import connect

from kvckpt_web import FileStore
from kvckpt_web.durable.catalog import load_manifest
from kvckpt_web.engine import ChatChunk
from kvckpt_web.errors import StoreError


def snapshot(directory) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture
def store_dir(tmp_path):
    return tmp_path / "store"


@pytest.fixture
def worker(make_worker, store_dir):
    return make_worker(store=FileStore(store_dir))


@pytest.fixture
def url(worker):
    with api_serving(worker, max_body=4096) as url:
        yield url


def failed(call) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as caught:
        call()
    return caught.value


def create(url, **body):
    return client(url).chat.completions.create(**{"model": "tiny", "messages": [USER], **SEEDED, **body})


@pytest.mark.parametrize("body, param", [
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"messages": []}, "messages"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"temperature": 3}, "temperature"),
    ({"extra_body": {"functions": []}}, "functions"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"n": True}, "n"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {
        "type": "object", "properties": {"age": {"type": "integer", "minimum": 0}}}}}},
     "response_format.json_schema.schema.properties.age.minimum"),
], ids=["role", "no messages", "max_tokens", "temperature", "unknown key", "stream_options without stream", "n true",
        "schema keyword"])
def test_a_bad_field_is_a_400_naming_it_and_nothing_is_stored(url, store_dir, body, param):
    error = failed(lambda: create(url, **body))
    assert error.status_code == 400 and error.body["param"] == param
    assert error.body["type"] == "invalid_request_error" and error.body["message"].startswith(param + ": expected")
    assert snapshot(store_dir) == {}


def test_a_conversation_name_that_is_no_name_is_a_400_naming_it(url):
    status, _, body = raw(url, "GET", "/v1/kvckpt/conversations/sp%20ace")
    assert status == 400 and error_of(body)["param"] == "name" and error_of(body)["type"] == "invalid_request_error"


def test_a_damaged_stored_checkpoint_is_a_500_damaged_data_naming_it_not_the_clients_400(url, worker, store_dir):
    name = create(url).kvckpt["conversation"]
    newest = sorted((store_dir / "manifests" / name).iterdir())[-1]
    newest.unlink()
    newest.write_bytes(b"KVCK")  # cut short: off the manifest format
    key = newest.relative_to(store_dir).as_posix()

    async def conversation(name):  # a request that reads the conversation's newest manifest
        await load_manifest(FileStore(store_dir), name)

    worker.engine.conversation = conversation
    status, _, body = raw(url, "GET", f"/v1/kvckpt/conversations/{name}")
    error = error_of(body)
    assert status == 500 and error["type"] == "server_error" and error["code"] == "damaged_data"
    assert error["message"].startswith(f"{key}: manifest length: expected at least")


def test_a_prompt_the_context_cannot_hold_is_a_400_context_length_exceeded(make_worker):
    with api_serving(make_worker(context=32)) as url:
        error = failed(lambda: create(url, messages=[{"role": "user", "content": "x" * 40}]))
    assert error.status_code == 400 and error.body["code"] == "context_length_exceeded"
    assert error.body["param"] == "messages" and "32" in error.body["message"]


def test_another_model_is_a_404_model_not_found(url):
    error = failed(lambda: create(url, model="gpt-4o"))
    assert error.status_code == 404 and error.body["code"] == "model_not_found" and "gpt-4o" in error.body["message"]
    assert failed(lambda: client(url).models.retrieve("gpt-4o")).status_code == 404


def test_a_conversation_another_writer_holds_is_a_409(url, store_dir):
    claim = FileStore(store_dir).claim("talk")
    loop = asyncio.new_event_loop()
    loop.run_until_complete(claim.__aenter__())
    try:
        error = failed(lambda: create(url, extra_body={"conversation": "talk"}))
    finally:
        loop.run_until_complete(claim.__aexit__(None, None, None))
        loop.close()
    assert error.status_code == 409 and error.body["code"] == "conflict" and "talk" in error.body["message"]
    assert "retry-after" not in error.response.headers  # a directory's claim is a lock: held until released


def test_a_body_that_is_not_json_is_a_400(url):
    status, _, body = raw(url, "POST", "/v1/chat/completions", b'{"messages": [')
    assert status == 400 and error_of(body)["message"].startswith("body: expected JSON text")


def test_a_key_given_twice_is_a_400_naming_it(url):
    status, _, body = raw(url, "POST", "/v1/chat/completions", b'{"messages": [], "messages": []}')
    assert status == 400 and error_of(body)["param"] == "messages"


def test_a_body_that_is_not_declared_json_is_a_415(url):
    status, _, body = raw(url, "POST", "/v1/chat/completions", b'{"messages": []}', {"Content-Type": "text/plain"})
    assert status == 415 and "application/json" in error_of(body)["message"]


def test_a_body_over_the_limit_is_a_413_before_it_is_read_and_nothing_is_stored(url, store_dir):
    text = "x" * 5000
    error = failed(lambda: create(url, messages=[{"role": "user", "content": text}]))
    assert error.status_code == 413 and error.body["code"] == "request_too_large" and "4096" in error.body["message"]
    assert error.response.headers["connection"] == "close"
    assert snapshot(store_dir) == {}


def test_a_chunked_body_is_refused_413_once_it_passes_the_limit(url, store_dir):
    with connect(url) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n" + b"1000\r\n" + b" " * 4096 + b"\r\n" + b"1\r\n \r\n")
        assert until_closed(sock).startswith(b"HTTP/1.1 413 ")
    assert snapshot(store_dir) == {}


def test_a_body_slower_than_its_deadline_is_a_408_and_the_connection_closed(worker):
    with api_serving(worker, body_timeout=0.5) as url, connect(url) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{")
        answer = until_closed(sock)
        assert answer.startswith(b"HTTP/1.1 408 ") and b"request_timeout" in answer


def test_a_wrong_method_is_a_405_saying_which_are_allowed(url):
    status, headers, body = raw(url, "GET", "/v1/chat/completions")
    assert status == 405 and headers["allow"] == "POST" and error_of(body)["code"] == "method_not_allowed"


def test_an_unknown_path_under_v1_is_a_404_in_openais_shape(url):
    status, _, body = raw(url, "POST", "/v1/edits", b"{}")
    assert status == 404 and error_of(body)["message"] == "Invalid URL (POST /v1/edits)"


def test_an_unexpected_error_is_a_500_of_one_line_without_its_details(url, worker, capfd):
    def broken(request, stream=False):
        raise RuntimeError("secret detail\nof the server")

    worker.engine.create = broken
    error = failed(lambda: create(url))
    assert error.status_code == 500 and error.body["type"] == "server_error"
    assert "RuntimeError" in error.body["message"] and "secret" not in error.body["message"]
    assert "secret detail" in capfd.readouterr().err  # the server's log has it


def test_a_stream_that_fails_once_started_ends_with_an_error_event_and_no_done(url, worker):
    async def failing(request, stream=False):
        async def chunks():
            yield ChatChunk("chatcmpl-1", 0, "tiny", "talk", "Hel", (1,), first=True)
            raise StoreError("store: the disk is full")
        return chunks()

    worker.engine.create = failing
    status, _, events = raw(url, "POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}],'
                            b' "stream": true}')
    *chunks, error, end = events.decode().split("\n\n")
    assert status == 200 and len(chunks) == 1 and end == "" and "[DONE]" not in events.decode()
    assert error.startswith('data: {"error":') and "the disk is full" in error
    with pytest.raises(openai.APIError, match="the disk is full"):
        list(create(url, stream=True))


def test_resuming_a_missing_conversation_is_a_404_and_a_finished_one_a_400(url):
    status, _, body = raw(url, "POST", "/v1/kvckpt/conversations/nothing/resume")
    assert status == 404 and error_of(body)["code"] == "not_found"
    name = create(url).kvckpt["conversation"]
    status, _, body = raw(url, "POST", f"/v1/kvckpt/conversations/{name}/resume")
    assert status == 400 and error_of(body)["param"] == "conversation"
