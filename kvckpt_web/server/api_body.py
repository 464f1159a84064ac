"""Reading a request body of the HTTP API: JSON, bounded in size and in time.

A body must say ``Content-Type: application/json`` (a page of another site can then only send it after a CORS
preflight, which this server never grants, so it cannot make the server generate or write). It is read
``max_body`` bytes at most: a ``Content-Length`` over the limit is answered 413 before a byte of the body is
read, and a chunked body as soon as it passes the limit (uvicorn holds at most 64 KiB of unread body, so no
more than that is buffered beyond the limit). The whole body must arrive within ``timeout`` seconds of the
request head (the server's idle timeout covers only the head), or the request is answered 408; both close the
connection. The JSON is parsed strictly: UTF-8, no duplicate keys, no NaN or Infinity, nesting bounded.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.requests import Request

from ..jsontext import MAX_NESTING, DuplicateKeyError, nesting_depth, unique_keys
from .api_errors import ApiError

__all__ = ["DEFAULT_BODY_TIMEOUT", "DEFAULT_MAX_BODY", "read_json"]

DEFAULT_MAX_BODY = 4 << 20
"""Bytes a request body may hold: far more than any context's worth of messages."""
DEFAULT_BODY_TIMEOUT = 30.0
"""Seconds a request body may take to arrive, once its head has."""

_CLOSE = {"connection": "close"}


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _parse(data: bytes) -> Any:
    try:
        text = data.decode("utf-8")
        if nesting_depth(text) > MAX_NESTING:
            raise ValueError(f"arrays and objects nested more than {MAX_NESTING} deep")
        return json.loads(text, object_pairs_hook=unique_keys, parse_constant=_refuse_constant)
    except DuplicateKeyError as exc:
        raise ApiError(400, f"body: expected each key once in an object, got {exc.key!r} twice",
                       param=exc.key) from None
    except ValueError as exc:  # UnicodeDecodeError, json.JSONDecodeError
        raise ApiError(400, f"body: expected JSON text (UTF-8), got {' '.join(str(exc).split())}") from None


async def _read(request: Request, max_body: int) -> bytes:
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_body:
            raise ApiError(413, f"body: expected at most {max_body} bytes, got more", code="request_too_large",
                           headers=_CLOSE)
    return bytes(body)


async def read_json(request: Request, max_body: int, timeout: float, *, empty: Any = None) -> Any:
    """The JSON value of ``request``'s body (``empty`` for an empty body, if given: else an empty body is
    refused as invalid JSON); ApiError 415, 413, 408 or 400 as the module docstring says."""
    kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if kind != "application/json":
        raise ApiError(415, f"Content-Type: expected application/json, got {kind or 'none'!r}",
                       code="unsupported_media_type")
    length = request.headers.get("content-length", "").lstrip("0")  # h11 has checked it is digits
    if len(length) > len(str(max_body)) or (length and int(length) > max_body):
        raise ApiError(413, f"body: expected at most {max_body} bytes, got a Content-Length of {length[:20]}",
                       code="request_too_large", headers=_CLOSE)
    try:
        async with asyncio.timeout(timeout):
            data = await _read(request, max_body)
    except TimeoutError:
        raise ApiError(408, f"body: expected the whole body within {timeout:g} s of the request head, got "
                       "less", code="request_timeout", headers=_CLOSE) from None
    if not data and empty is not None:
        return empty
    return _parse(data)
