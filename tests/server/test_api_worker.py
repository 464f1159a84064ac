"""The engine on its own thread: the server answers while a reply is generated, requests run concurrently up to
the cache's sequences and then wait in a bounded queue in arrival order (503 with Retry-After beyond it), and a
client that goes away stops its own reply, which stays resumable; replies batched on the tiny llama give the
tokens each gives alone.

The gated model (``api_helpers.GatedModel``) holds a forward until the test opens its gate: blocking the
engine's thread as GPU work does, or awaiting, so the engine's loop could take other work meanwhile.
"""

from __future__ import annotations

import json
import signal
import threading
import time

from api_helpers import SEEDED, USER, GatedModel, api_serving, client, error_of, raw
from serve_helpers import PATIENCE, request

from kvckpt_web import FileStore
from kvckpt_web.server.api import Api, make_api_server
from kvckpt_web.server.app import create_app
from kvckpt_web.server.run import listen
from kvckpt_web.server.static import Site


def until(condition) -> None:
    """Wait (PATIENCE seconds at most) for ``condition()``, which the server makes true soon."""
    deadline = time.monotonic() + PATIENCE
    while not condition():
        assert time.monotonic() < deadline, "the server did not get there"
        time.sleep(0.01)


def in_thread(call) -> tuple[threading.Thread, list]:
    """``call()`` run in a thread; its result lands in the list."""
    out: list = []
    thread = threading.Thread(target=lambda: out.append(call()), daemon=True)
    thread.start()
    return thread, out


def reply(url, conversation=None, **settings):
    extra = {"conversation": conversation} if conversation else {}
    return client(url).chat.completions.create(model="tiny", messages=[USER], extra_body=extra,
                                               **{**SEEDED, **settings})


def test_models_and_static_files_are_answered_while_the_engine_thread_is_busy(make_worker, tiny_llama, pyodide):
    gated = GatedModel(tiny_llama.model, after=3)
    api = Api(make_worker(model=gated))
    server = listen(lambda address: create_app(Site.of(pyodide, []), address, api.routes()), port=0)
    url = server.start()
    try:
        streaming, out = in_thread(lambda: list(reply(url, stream=True)))
        assert gated.reached.wait(PATIENCE)  # the engine's thread is blocked in a forward, mid-reply
        assert client(url).models.list().data[0].id == "tiny"
        assert request(url, "/kvckpt.mjs")[0] == 200
        assert streaming.is_alive()
        gated.open()
        streaming.join(PATIENCE)
        assert out[0][-1].choices[0].finish_reason is not None
    finally:
        server.shutdown()
        server.server_close()


def recorded(worker) -> list:
    """The conversations of the requests ``worker``'s engine has begun to answer, in order."""
    started, create = [], worker.engine.create

    async def recording(request, stream=False):
        started.append(request.conversation)
        return await create(request, stream=stream)

    worker.engine.create = recording
    return started


def test_requests_run_concurrently_up_to_the_caches_sequences_then_wait_in_arrival_order(make_worker, tiny_llama):
    gated = GatedModel(tiny_llama.model, after=1, blocking=False)
    worker = make_worker(model=gated, sequences=2)
    started = recorded(worker)
    with api_serving(worker) as url:
        threads = [in_thread(lambda: reply(url, "a"))[0]]
        assert gated.reached.wait(PATIENCE)  # a's reply waits at the gate, the engine's loop is free
        threads.append(in_thread(lambda: reply(url, "b"))[0])
        until(lambda: started == ["a", "b"])
        for i, name in enumerate("cd", start=1):
            threads.append(in_thread(lambda name=name: reply(url, name))[0])
            until(lambda i=i: worker.queued == i)
        assert started == ["a", "b"]
        gated.open()
        for thread in threads:
            thread.join(PATIENCE)
    assert started == ["a", "b", "c", "d"]


def test_a_request_beyond_the_queue_is_refused_503_with_retry_after(make_worker, tiny_llama):
    gated = GatedModel(tiny_llama.model, after=1, blocking=False)
    worker = make_worker(model=gated, sequences=1, queue=1)
    with api_serving(worker) as url:
        running = in_thread(lambda: reply(url, "a"))[0]
        assert gated.reached.wait(PATIENCE)
        queued = in_thread(lambda: reply(url, "b"))[0]
        until(lambda: worker.queued == 1)
        status, headers, body = raw(url, "POST", "/v1/chat/completions", json.dumps({"messages": [USER]}).encode())
        gated.open()
        running.join(PATIENCE)
        queued.join(PATIENCE)
    assert status == 503 and error_of(body)["code"] == "queue_full" and int(headers["retry-after"]) >= 1


def test_a_client_that_goes_away_mid_stream_stops_its_reply_which_resumes_to_the_uninterrupted_tokens(
        make_worker, tiny_llama, tmp_path):
    with api_serving(make_worker()) as url:
        want = reply(url, max_tokens=40)
    assert len(want.kvckpt["token_ids"]) > 6
    gated = GatedModel(tiny_llama.model, after=5, blocking=False)  # the prefill, then 4 more tokens
    worker = make_worker(store=FileStore(tmp_path / "store"), model=gated)
    jobs, submit = [], worker.submit
    worker.submit = lambda work, **how: jobs.append(submit(work, **how)) or jobs[-1]
    with api_serving(worker) as url:
        stream = reply(url, max_tokens=40, stream=True)
        chunks = iter(stream)
        got = [next(chunks) for _ in range(3)]
        stream.close()
        until(lambda: jobs[0]._cancelled)  # the server saw the client go: its reply stops after this token
        gated.open()
        [cut] = client(url).get("/kvckpt/conversations", cast_to=object)["data"]  # answered once the reply ended
        assert cut["name"] == got[0].kvckpt["conversation"] and not cut["finished"]
        status, _, body = raw(url, "POST", f"/v1/kvckpt/conversations/{cut['name']}/resume")
    resumed = json.loads(body)
    assert status == 200 and resumed["kvckpt"]["token_ids"] == want.kvckpt["token_ids"]
    assert resumed["choices"][0]["message"]["content"] == want.choices[0].message.content


def test_a_stopping_server_stops_the_reply_being_generated_and_refuses_the_queued_ones_503(make_worker, tiny_llama):
    gated = GatedModel(tiny_llama.model, after=1, blocking=False)
    worker = make_worker(model=gated, sequences=1)
    with api_serving(worker) as url:
        running, first = in_thread(lambda: reply(url, max_tokens=40))
        assert gated.reached.wait(PATIENCE)
        queued, second = in_thread(lambda: raw(url, "POST", "/v1/chat/completions",
                                                json.dumps({"messages": [USER]}).encode()))
        until(lambda: worker.queued == 1)
        worker.stop()  # what Ctrl-C or SIGTERM does
        gated.open()
        running.join(PATIENCE)
        queued.join(PATIENCE)
    assert first[0].choices[0].finish_reason == "abort" and len(first[0].kvckpt["token_ids"]) < 40
    status, _, body = second[0]
    assert status == 503 and error_of(body)["code"] == "unavailable"


def test_a_signal_that_stops_the_server_stops_the_reply_being_generated_at_once(make_worker, tiny_llama):
    gated = GatedModel(tiny_llama.model, after=1, blocking=False)
    server = make_api_server(make_worker(model=gated), port=0)
    url = server.start()
    try:
        running, out = in_thread(lambda: reply(url, max_tokens=40))
        assert gated.reached.wait(PATIENCE)
        server._uvicorn.handle_exit(signal.SIGINT, None)  # Ctrl-C, as uvicorn's handler receives it
        gated.open()
        running.join(PATIENCE)
    finally:
        server.shutdown()
        server.server_close()
    assert out[0].choices[0].finish_reason == "abort"


def test_concurrent_requests_on_the_tiny_llama_give_the_tokens_each_gives_alone(make_worker, tiny_llama):
    asks = [{"role": "user", "content": f"tell me story number {i} about the sea."} for i in range(4)]
    settings = [{"temperature": 0.0, "max_tokens": 24} if i % 2 == 0 else {**SEEDED, "seed": 20 + i}
                for i in range(4)]

    def ids(url, i):
        return client(url).chat.completions.create(model="tiny", messages=[asks[i]], extra_body={"cache_prompt": False},
                                                   **settings[i]).kvckpt["token_ids"]

    with api_serving(make_worker()) as url:
        alone = [ids(url, i) for i in range(4)]
    gated = GatedModel(tiny_llama.model, after=1, blocking=False)
    worker = make_worker(model=gated)
    started = recorded(worker)
    with api_serving(worker) as url:
        threads = [in_thread(lambda i=i: ids(url, i)) for i in range(4)]
        until(lambda: len(started) == 4)  # all four placed or waiting for the cache while the first is held
        gated.open()
        for thread, _ in threads:
            thread.join(PATIENCE)
    assert [out[0] for _, out in threads] == alone
    assert gated.forwards < sum(map(len, alone))  # one at a time, every token would be a forward of its own
