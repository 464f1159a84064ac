"""``kvckpt serve --api``: an OpenAI-compatible HTTP API over the chat engine, under ``/v1``.

* ``POST /v1/chat/completions``: OpenAI's chat-completions body (``ChatRequest.from_openai``: messages, sampling
  settings, plus ``top_k``, ``repetition_penalty``, ``cache_prompt``, ``conversation``), ``model`` (the served
  model's name, or left out) and ``stream``. The answer is ``chat.completion`` JSON, or with ``stream: true``
  server-sent events: one ``data: {chat.completion.chunk}`` per chunk, then ``data: [DONE]``. As OpenAI's,
  chunks carry no usage unless ``stream_options: {"include_usage": true}``: then every chunk has
  ``"usage": null`` and a last chunk with ``"choices": []`` has the usage. Beyond OpenAI's fields, ``usage``
  has ``prompt_tokens_details.cached_tokens`` (prompt tokens whose K/V came from the cache or the store) and
  ``timings``, and each answer a ``kvckpt`` object: the conversation the reply is saved under and its token ids.
  A model without a chat template (a base model) refuses it: 400, ``param`` ``messages``.
* ``POST /v1/completions``: OpenAI's (legacy) completions body (``CompletionRequest.from_openai``: ``prompt`` a
  string, ``max_tokens`` default 16, the sampling settings and the same extras), answered as ``text_completion``
  JSON or its chunks, streamed and with usage as above. A completion is a turn of a conversation as a chat's
  reply is (``completion-...`` unless ``conversation`` names one): saved, listed, resumed the same way.
* ``GET /v1/models``, ``GET /v1/models/{id}``: the one served model.
* ``GET /v1/kvckpt/conversations``: the conversations (of the store, or of the cache without one), newest
  first, each with its messages and whether its last reply ``finished``;
  ``GET`` / ``DELETE /v1/kvckpt/conversations/{name}``: one of them, or delete it;
  ``POST /v1/kvckpt/conversations/{name}/resume``: continue a reply cut by a crash, a disconnect or a stop,
  answered as a completion (``{"stream": true}`` streams it); the first chunk holds the text written before.
* ``GET /v1/kvckpt/retention``: the server's policy for conversations nobody named (``engine/unnamed.py``) and what
  it decides for each conversation of the store, the oldest first; it is enforced when the server starts and
  then at the end of a reply once its ``check_every_s`` seconds passed since it last was.

A client that disconnects stops its reply after the current token: the reply is saved, and listed as
unfinished. Errors are OpenAI's error objects (``api_errors.py``); a stream that fails once started ends with
an error event (``data: {"error": ...}``) and no ``[DONE]``. Bodies are JSON, bounded in size and time
(``api_body.py``). Requests run concurrently up to the cache's sequences, then queue, on the engine's own
thread (``worker.py``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import Receive, Scope, Send

from ..durable.keys import validate_name
from ..engine import ChatChunk, ChatCompletion, ChatRequest, CompletionRequest, Engine
from ..engine.unnamed import Retained, UnnamedRetention, enforce, judge
from ..errors import FieldError, KVCkptError, is_int
from .api_body import DEFAULT_BODY_TIMEOUT, DEFAULT_MAX_BODY, read_json
from .api_errors import ApiError, error_body, error_response
from .app import create_app
from .run import Server, listen
from .worker import Busy, EngineWorker, Job

__all__ = ["Api", "make_api_server"]

_STREAM_KEYS = ("model", "stream", "stream_options")
"""The keys of a body that say how to answer (the rest say what)."""


def _event(data: Any) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return f"data: {text}\n\n".encode()


def _wire_chunks(chunk: ChatChunk, include_usage: bool) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects of ``chunk``: itself, without usage unless asked; the final one
    then followed by the usage chunk."""
    wire = chunk.to_openai()
    usage = wire.pop("usage", None)
    if not include_usage:
        return [wire]
    wire["usage"] = None
    return [wire] if usage is None else [wire, {**wire, "choices": [], "usage": usage}]


class Answer:
    """The answer to a request for a reply (a completion or a resume) whose work is queued on the engine:
    JSON or server-sent events. A client that goes away cancels the work. ``after()`` is called once the work
    is done, and the answer's end is sent once the job it returns (if any) ran (or it is called once the work is
    cancelled)."""

    def __init__(self, job: Job, stream: bool, include_usage: bool, after: Callable[[], Job | None]) -> None:
        self.job, self.stream, self.include_usage, self.after = job, stream, include_usage, after
        self._done = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watcher = asyncio.ensure_future(self._watch(receive))
        try:
            await self._answer(scope, send)
        finally:
            watcher.cancel()
            if not self._done:
                self.job.cancel()
                self._finished()

    def _finished(self) -> Job | None:
        self._done = True
        try:
            return self.after()
        except Busy:
            return None  # the queue is full: a later reply's end runs it

    async def _finish(self) -> None:
        """:meth:`_finished`, returning once the job ``after()`` gave ran: requests run concurrently, so the client's
        next request sees what it did (the retention policy's deletions)."""
        job = self._finished()
        if job is not None:
            try:
                await job.result()
            except (KVCkptError, OSError):
                pass  # the reply stands; the next reply's end tries again

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        if not self._done:
            self.job.cancel()

    async def _answer(self, scope: Scope, send: Send) -> None:
        try:
            await self.job.result()
            if not self.stream:
                chunks = [chunk async for chunk in self.job.items()]
        except Exception as exc:
            await self._finish()
            return await error_response(exc)(scope, _no_receive, send)
        if not self.stream:
            await self._finish()
            return await JSONResponse(ChatCompletion.from_chunks(chunks).to_openai())(scope, _no_receive, send)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8")]})
        try:
            async for chunk in self.job.items():
                for wire in _wire_chunks(chunk, self.include_usage):
                    await send({"type": "http.response.body", "body": _event(wire), "more_body": True})
            end = _event("[DONE]")
        except Exception as exc:
            end = _event(error_body(exc))
        await self._finish()
        await send({"type": "http.response.body", "body": end, "more_body": False})


async def _no_receive() -> dict[str, Any]:
    return {"type": "http.disconnect"}


def _answering(endpoint: Callable[[Request], Any]) -> Callable[[Request], Any]:
    """``endpoint`` with every error it raises answered as an OpenAI error."""
    async def answer(request: Request) -> Any:
        try:
            return await endpoint(request)
        except ClientDisconnect:  # gone while its body was read: nobody to answer
            return Response(status_code=400)
        except Exception as exc:
            return error_response(exc)

    return answer


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404 and 405 (no route, or not its method), as OpenAI answers them."""
    status = getattr(exc, "status_code", 500)
    where = f"{request.method} {request.url.path}"
    if status == 405:
        allowed = (getattr(exc, "headers", None) or {}).get("Allow", "")
        return error_response(ApiError(405, f"Method not allowed ({where}); allowed: {allowed}",
                                       code="method_not_allowed", headers={"allow": allowed}))
    return error_response(ApiError(status, f"Invalid URL ({where})"))


class Api:
    """The routes of the API over the engine ``worker`` runs; bodies of at most ``max_body`` bytes, each
    arriving within ``body_timeout`` seconds; the conversations nobody named kept as ``retention`` says (None: all
    kept), at the time ``clock`` (seconds since the epoch) reads."""

    def __init__(self, worker: EngineWorker, *, max_body: int = DEFAULT_MAX_BODY,
                 body_timeout: float = DEFAULT_BODY_TIMEOUT, retention: UnnamedRetention | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        if not is_int(max_body, 1):
            raise FieldError("max_body", "an integer >= 1 (bytes)", max_body)
        if isinstance(body_timeout, bool) or not isinstance(body_timeout, (int, float)) or not body_timeout > 0:
            raise FieldError("body_timeout", "a number of seconds > 0", body_timeout)
        self.worker = worker
        self.model_name = worker.engine.model_name
        self.context = worker.engine.context
        if retention is not None and not isinstance(retention, UnnamedRetention):
            raise FieldError("retention", "an UnnamedRetention or None", type(retention).__name__)
        if not callable(clock):
            raise FieldError("clock", "a function of no arguments giving seconds since the epoch", clock)
        self.max_body, self.body_timeout = max_body, body_timeout
        self.retention, self.clock = retention, clock
        self.created = int(time.time())
        self._retained_at: float | None = None  # when retain last queued the policy's deletions

    def retain(self) -> Job | None:
        """Queue the deletion of what the retention policy does not keep now, behind the requests queued before
        (called on the server's loop), unless it was queued less than its ``check_every_s`` seconds ago; its job,
        None without a policy or within that interval."""
        policy, now = self.retention, self.clock()
        if policy is None:
            return None
        if self._retained_at is not None and now - self._retained_at < policy.check_every_s:
            return None

        async def enforced(engine: Engine) -> list[Retained]:
            return await enforce(engine, policy, now, await self.worker.waiting_conversations())

        job = self.worker.submit(enforced)
        self._retained_at = now
        return job

    def retain_now(self) -> None:
        """:meth:`retain`, returning once it is done (called where no event loop runs, before the server serves)."""
        async def retained() -> None:
            job = self.retain()
            if job is not None:
                await job.result()

        asyncio.run(retained())

    def routes(self) -> list[BaseRoute]:
        """One mount, ``/v1``, whose unknown paths and methods are answered in OpenAI's shape."""
        routes = [Route("/chat/completions", _answering(self._completions), methods=["POST"]),
                  Route("/completions", _answering(self._text_completions), methods=["POST"]),
                  Route("/models", _answering(self._models), methods=["GET"]),
                  Route("/models/{model:path}", _answering(self._model), methods=["GET"]),
                  Route("/kvckpt/conversations", _answering(self._conversations), methods=["GET"]),
                  Route("/kvckpt/conversations/{name}", _answering(self._conversation), methods=["GET", "DELETE"]),
                  Route("/kvckpt/conversations/{name}/resume", _answering(self._resume), methods=["POST"]),
                  Route("/kvckpt/retention", _answering(self._retention), methods=["GET"])]
        return [Mount("/v1", app=Starlette(routes=routes, exception_handlers={HTTPException: _http_error}))]

    # ----- models -------------------------------------------------------------------------------

    def _model_object(self) -> dict[str, Any]:
        return {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "kvckpt",
                "kvckpt": {"context": self.context}}

    async def _models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self._model_object()]})

    async def _model(self, request: Request) -> Response:
        self._check_model(request.path_params["model"])
        return JSONResponse(self._model_object())

    def _check_model(self, model: Any) -> None:
        if model is None:
            return
        if not isinstance(model, str):
            raise FieldError("model", f"the served model's name ({self.model_name!r})", type(model).__name__)
        if model != self.model_name:
            raise ApiError(404, f"The model `{model}` does not exist or you do not have access to it (this server "
                           f"serves `{self.model_name}`).", code="model_not_found")

    # ----- replies ------------------------------------------------------------------------------

    def _how(self, body: Mapping[str, Any]) -> tuple[bool, bool]:
        """Whether to stream, and to add a usage chunk, from a body's ``model``, ``stream`` and
        ``stream_options``."""
        self._check_model(body.get("model"))
        stream = body.get("stream")
        if stream is not None and not isinstance(stream, bool):
            raise FieldError("stream", "true or false", type(stream).__name__)
        options = body.get("stream_options")
        if options is None:
            return bool(stream), False
        if not stream:
            raise FieldError("stream_options", "null unless stream is true", "an object")
        if not isinstance(options, Mapping):
            raise FieldError("stream_options", "an object", type(options).__name__)
        for key in options:
            if key != "include_usage":
                raise FieldError(f"stream_options.{key}", "a supported stream option (include_usage)",
                                 "an unknown key")
        usage = options.get("include_usage")
        if usage is not None and not isinstance(usage, bool):
            raise FieldError("stream_options.include_usage", "true or false", type(usage).__name__)
        return True, bool(usage)

    def submit_reply(self, request: ChatRequest | CompletionRequest) -> Job:
        """Queue the streamed reply to ``request`` (called on the server's loop); while it waits, the retention
        policy keeps the conversation it would continue."""
        return self.worker.submit(lambda engine: engine.create(request, stream=True),
                                  continues=lambda engine: engine.continued_by(request))

    async def _completions(self, request: Request) -> Answer:
        body = await read_json(request, self.max_body, self.body_timeout)
        stream, usage = self._how(body) if isinstance(body, Mapping) else (False, False)
        return Answer(self.submit_reply(ChatRequest.from_openai(body)), stream, usage, self.retain)

    async def _text_completions(self, request: Request) -> Answer:
        body = await read_json(request, self.max_body, self.body_timeout)
        stream, usage = self._how(body) if isinstance(body, Mapping) else (False, False)
        return Answer(self.submit_reply(CompletionRequest.from_openai(body)), stream, usage, self.retain)

    async def _resume(self, request: Request) -> Answer:
        name = validate_name(request.path_params["name"])
        body = await read_json(request, self.max_body, self.body_timeout, empty={})
        if not isinstance(body, Mapping):
            raise FieldError("body", "a JSON object", type(body).__name__)
        for key in body:
            if key not in _STREAM_KEYS:
                raise FieldError(key, f"one of {list(_STREAM_KEYS)} (the saved request says the rest)",
                                 "an unknown key")
        stream, usage = self._how(body)

        async def continues(engine: Engine) -> str:
            return name

        return Answer(self.worker.submit(lambda engine: engine.resume(name, stream=True), continues=continues),
                      stream, usage, self.retain)

    # ----- conversations ------------------------------------------------------------------------

    async def _conversations(self, request: Request) -> Response:
        infos = await self.worker.submit(lambda engine: engine.conversations()).result()
        return JSONResponse({"object": "list", "data": [{"object": "kvckpt.conversation", **info.to_json()}
                                                        for info in infos]})

    async def _retention(self, request: Request) -> Response:
        policy = self.retention

        async def judged_now(engine: Engine) -> list[Retained]:
            return await judge(engine, policy, self.clock(), await self.worker.waiting_conversations())

        judged = [] if policy is None else await self.worker.submit(judged_now).result()
        return JSONResponse({"object": "kvckpt.retention", "policy": None if policy is None else policy.to_json(),
                             "data": [{"object": "kvckpt.retained", **r.to_json()} for r in judged]})

    async def _conversation(self, request: Request) -> Response:
        name = validate_name(request.path_params["name"])
        if request.method == "DELETE":
            await self.worker.submit(lambda engine: engine.delete(name)).result()
            return JSONResponse({"id": name, "object": "kvckpt.conversation.deleted", "deleted": True})
        info = await self.worker.submit(lambda engine: engine.conversation(name)).result()
        return JSONResponse({"object": "kvckpt.conversation", **info.to_json()})


def make_api_server(worker: EngineWorker, *, max_body: int = DEFAULT_MAX_BODY,
                    body_timeout: float = DEFAULT_BODY_TIMEOUT, retention: UnnamedRetention | None = None,
                    clock: Callable[[], float] = time.time, **listening: Any) -> Server:
    """A listening, not yet serving, server of the API alone over ``worker``'s engine, which a signal that stops
    the server stops at once (:meth:`EngineWorker.stop`); ``retention`` (enforced at once, then at the end of a
    reply at least its ``check_every_s`` seconds after it last was) and ``clock`` as :class:`Api`'s; ``listening``
    are :func:`~.run.listen`'s ``host``, ``port``, ``allow_remote``, ``idle_timeout`` and ``max_connections``."""
    api = Api(worker, max_body=max_body, body_timeout=body_timeout, retention=retention, clock=clock)
    api.retain_now()
    return listen(lambda address: create_app(None, address, api.routes()), on_exit=worker.stop, **listening)
