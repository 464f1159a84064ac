"""Errors of the HTTP API in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

Each exception maps to one status, as OpenAI's API (or HTTP itself) answers it:

* :class:`~kvckpt_web.errors.FieldError` (bad messages or settings): 400 ``invalid_request_error``, ``param``
  naming the field (``messages[1].role``, ``max_tokens``); a :class:`~kvckpt_web.errors.ContextFullError`
  has the code ``context_length_exceeded``;
* :class:`~kvckpt_web.errors.ConflictError` (the conversation is busy, or another writer holds its name): 409,
  with ``Retry-After`` (seconds) when the name is held by a lease that another replica may take over then;
* :class:`~kvckpt_web.errors.NotFoundError` (no such conversation): 404;
* :class:`~kvckpt_web.errors.CapacityError` (the cache has no room now) and a server stopping: 503;
* a request beyond the queue (:class:`~.worker.Busy`): 503 with the code ``queue_full`` and ``Retry-After``;
* :class:`~kvckpt_web.errors.DataError` (a stored checkpoint damaged or off its format: a
  :class:`~kvckpt_web.errors.FormatError`, :class:`~kvckpt_web.errors.MetadataError` or
  :class:`~kvckpt_web.errors.CorruptionError`): 500 ``server_error`` with the code ``damaged_data``, its message
  naming the key and field; the client's request was not at fault;
* any other :class:`~kvckpt_web.errors.KVCkptError` (a store that cannot be written, ...): 500 with its message;
* anything else: 500 naming only the exception's type; its traceback goes to the server's stderr, never to
  the client.

The message is one line. :class:`ApiError` carries any other answer (a body too large, an unknown URL).
"""

from __future__ import annotations

import math
import sys
import time
import traceback
from typing import Any

from starlette.responses import JSONResponse

from ..errors import (CapacityError, ConflictError, ContextFullError, DataError, FieldError, KVCkptError,
                      NotFoundError)
from .worker import Busy, ShuttingDown

__all__ = ["ApiError", "api_error", "error_body", "error_response"]

INVALID = "invalid_request_error"


class ApiError(KVCkptError):
    """An HTTP API answer that is an error: ``status``, OpenAI's ``type``, ``param`` and ``code``, and headers
    (``Allow``, ``Connection: close``)."""

    def __init__(self, status: int, message: str, *, type: str = INVALID, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.type, self.param, self.code = status, type, param, code
        self.headers = headers or {}


def api_error(exc: BaseException) -> ApiError:
    """What the API answers for ``exc`` (see the module docstring); an unexpected one's traceback is printed
    to stderr."""
    if isinstance(exc, ApiError):
        return exc
    message = " ".join(str(exc).splitlines())
    if isinstance(exc, FieldError):
        code = "context_length_exceeded" if isinstance(exc, ContextFullError) else None
        return ApiError(400, message, param=exc.field, code=code)
    if isinstance(exc, ConflictError):
        retry = {} if exc.retry_at is None else {"retry-after": str(max(1, math.ceil(exc.retry_at - time.time())))}
        return ApiError(409, message, code="conflict", headers=retry)
    if isinstance(exc, NotFoundError):
        return ApiError(404, message, code="not_found")
    if isinstance(exc, Busy):
        return ApiError(503, message, type="server_error", code="queue_full",
                        headers={"retry-after": str(exc.retry_after)})
    if isinstance(exc, (CapacityError, ShuttingDown)):
        return ApiError(503, message, type="server_error", code="unavailable")
    if isinstance(exc, DataError):
        return ApiError(500, message, type="server_error", code="damaged_data")
    if isinstance(exc, KVCkptError):
        return ApiError(500, message, type="server_error")
    print(f"kvckpt serve: internal error answering a request: {exc!r}", file=sys.stderr, flush=True)
    traceback.print_exception(exc, file=sys.stderr)
    return ApiError(500, f"internal server error ({type(exc).__name__}); the server's log has the details",
                    type="server_error")


def error_body(exc: BaseException) -> dict[str, Any]:
    """OpenAI's error object for ``exc``: the body of an error answer, or an event of a broken stream."""
    err = api_error(exc)
    return {"error": {"message": str(err), "type": err.type, "param": err.param, "code": err.code}}


def error_response(exc: BaseException) -> JSONResponse:
    """The answer to a request that failed with ``exc``."""
    err = api_error(exc)
    return JSONResponse(error_body(err), err.status, headers=err.headers)
