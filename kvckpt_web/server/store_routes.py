"""A checkpoint store served over HTTP (``kvckpt serve --store DIR|URL --token T``): chunks, manifests and prefix
index records by key, create-only, for browsers on other profiles or devices and for ``kvckpt sync``.

Every request under ``/store/`` needs ``Authorization: Bearer <token>`` (else 401, and nothing is read or written);
CORS preflights (``OPTIONS``) alone are answered without it, since a browser sends them without credentials.
Only the store's keys are reachable (a path that is no store key is 404; a key can name nothing outside the
store: its segments are ``[A-Za-z0-9._-]``, never ``.`` or ``..``), and nothing is ever overwritten or deleted: a
client pushes and pulls, gc runs where the store's storage is.

* ``GET /store/keys?prefix=P&after=K`` -- ``{"keys": [...], "truncated": bool}``: the keys starting with ``P``,
  sorted, after ``K``, at most :data:`LIST_PAGE` per answer;
* ``GET`` / ``HEAD /store/v/<key>`` -- the value (404 if none; 500 if what the store holds there is damaged: longer
  than its key's kind allows, or no file);
* ``PUT /store/v/<key>`` -- stores the body if the key holds nothing: 201, or 412 if it holds a value. Only keys
  of the checkpoint format are taken (a chunk's, a manifest's, a prefix index record's): any other is 400. A body
  longer than its key's kind allows (a manifest the format's limit, a prefix index record 1 MiB, a chunk
  :data:`MAX_VALUE_BYTES`) is refused (413) before it is read. A chunk key's body must be the bytes its SHA-256
  names, a manifest key's must decode and every chunk it names must be stored already, a record key's must
  decode and its manifest be stored: else 400 or 409 and nothing is written. Manifests and records are written
  under the store's writer lock. The body is spooled to a temporary file as it arrives, never held in memory
  whole, and must arrive within ``body_timeout`` seconds of the request head (else 408, closing the connection);
* ``/store/claims/<name>`` -- claims of checkpoint names, held as leases (:mod:`.claim_routes`).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import mmap
import tempfile
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from ..durable.catalog import decode_at
from ..durable.container import MAX_MANIFEST_BYTES
from ..durable.keys import chunk_key, is_chunk_key, parse_manifest_key
from ..durable.prefix_records import MAX_RECORD_BYTES, decode_record, manifest_of
from ..checks import check_seconds
from ..errors import FieldError, FormatError, KVCkptError
from ..stores.base import Store, validate_key, validate_prefix
from .claim_routes import ClaimRoutes

__all__ = ["BODY_TIMEOUT", "LIST_PAGE", "MAX_VALUE_BYTES", "StoreRoutes", "check_token"]

LIST_PAGE = 10_000
"""Keys per answer of ``/store/keys``."""

MAX_VALUE_BYTES = 256 << 20
"""The longest chunk (or other value) a served store takes (a save's chunks are about 1 MiB unless it asks for
larger)."""

BODY_TIMEOUT = 120.0
"""Seconds a PUT body may take to arrive, once its head has (a chunk of :data:`MAX_VALUE_BYTES` at about 2 MiB/s)."""

MIN_TOKEN_CHARS = 16

CORS = {"access-control-allow-origin": "*"}
PREFLIGHT = {**CORS, "access-control-allow-methods": "GET, HEAD, PUT, POST, DELETE",
             "access-control-allow-headers": "authorization, content-type, if-none-match",
             "access-control-max-age": "600"}


def check_token(token: object, field: str = "token") -> str:
    """``token`` if it can be a bearer token: at least :data:`MIN_TOKEN_CHARS` printable ASCII characters, no space;
    FieldError naming ``field`` if not."""
    if not isinstance(token, str) or len(token) < MIN_TOKEN_CHARS or not all(33 <= ord(c) <= 126 for c in token):
        raise FieldError(field, f"a bearer token of at least {MIN_TOKEN_CHARS} printable ASCII characters, no space",
                         "a shorter or other one" if isinstance(token, str) else type(token).__name__)
    return token


def _is_manifest_key(key: str) -> bool:
    try:
        parse_manifest_key(key)
    except FormatError:
        return False
    return True


def _limit(key: str) -> int:
    """The longest value a key of this kind may hold."""
    if _is_manifest_key(key):
        return MAX_MANIFEST_BYTES + 48
    if manifest_of(key) is not None:
        return MAX_RECORD_BYTES
    return MAX_VALUE_BYTES


def _text(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return PlainTextResponse(message, status, headers={**CORS, **(headers or {})})


class StoreRoutes:
    """The routes serving ``store`` to holders of ``token``; a PUT body must arrive within ``body_timeout``
    seconds of its head; ``clock`` (default ``time.time``) measures the leases of claims."""

    def __init__(self, store: Store, token: str, *, body_timeout: float = BODY_TIMEOUT,
                 clock: Callable[[], float] | None = None) -> None:
        self.store = store
        self._token = check_token(token).encode()
        self.body_timeout = check_seconds("body_timeout", body_timeout)
        self.claims = ClaimRoutes(store, self._refused, clock=clock)

    def routes(self) -> list[Route]:
        return [Route("/store/keys", self._keys, methods=["GET", "OPTIONS"]),
                Route("/store/v/{key:path}", self._value, methods=["GET", "HEAD", "PUT", "OPTIONS"]),
                *self.claims.routes()]

    def _refused(self, request: Request) -> Response | None:
        """The answer to a request this server does not take: a preflight's, or 401 without the token."""
        if request.method == "OPTIONS":
            return Response(status_code=204, headers=PREFLIGHT)
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self._token):
            return _text(401, "Unauthorized: expected Authorization: Bearer <the store's token>",
                         {"www-authenticate": 'Bearer realm="kvckpt store"'})
        return None

    async def _keys(self, request: Request) -> Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        prefix, after = request.query_params.get("prefix", ""), request.query_params.get("after", "")
        try:
            validate_prefix(prefix)
            keys = [k for k in await self.store.list_prefix(prefix) if k > after]
        except KVCkptError as exc:
            return _text(400 if isinstance(exc, FieldError) else 500, str(exc))
        return JSONResponse({"keys": keys[:LIST_PAGE], "truncated": len(keys) > LIST_PAGE}, headers=CORS)

    async def _value(self, request: Request) -> Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        key = request.path_params["key"]
        try:
            validate_key(key)
        except FieldError:
            return _text(404, "Not Found")
        try:
            if request.method == "PUT":
                return await self._put(request, key)
            data = await self.store.get(key, max_bytes=_limit(key))
        except KVCkptError as exc:  # the store failing, or what it holds damaged: never the client's fault
            return _text(500, str(exc))
        if data is None:
            return _text(404, "Not Found")
        headers = {**CORS, "content-length": str(len(data)), "content-type": "application/octet-stream"}
        return Response(b"" if request.method == "HEAD" else data, headers=headers)

    def accepts(self, key: str) -> bool:
        """Whether a PUT may store a value under ``key`` (a valid key): only keys of the checkpoint format, a
        chunk's, a manifest's or a prefix index record's (FORMAT.md), so nothing else lands in the store."""
        return is_chunk_key(key) or _is_manifest_key(key) or manifest_of(key) is not None

    async def _put(self, request: Request, key: str) -> Response:
        if not self.accepts(key):
            return _text(400, f"Bad Request: {key} is no key of the checkpoint format (expected chunks/<sha256>, "
                              "manifests/<name>/<20 digits> or prefixes/<32 hex>/<name>/<20 digits>)")
        limit = _limit(key)
        declared = request.headers.get("content-length")
        if declared is None or not declared.isdigit():
            return _text(411, "Length Required")
        if int(declared) > limit:
            return _text(413, f"Content Too Large: {key} holds at most {limit} bytes, got {declared}")
        body = await self._receive(request, int(declared))
        if isinstance(body, Response):
            return body
        if is_chunk_key(key) and chunk_key(hashlib.sha256(body).hexdigest()) != key:
            return _text(400, f"Bad Request: {key}: the body is not the bytes its SHA-256 names")
        check = (self._check_manifest if _is_manifest_key(key) else
                 self._check_record if manifest_of(key) is not None else None)
        if check is None:
            return self._stored(key, await self.store.set_if_absent(key, body))
        async with self.store.lock():  # a manifest's chunks and a record's manifest stay while it is committed
            problem = await check(key, bytes(body))
            if problem is not None:
                return problem
            return self._stored(key, await self.store.set_if_absent(key, body))

    async def _receive(self, request: Request, length: int) -> memoryview | bytes | Response:
        """The body of ``request``, ``length`` bytes, spooled to a temporary file as it arrives (so a large
        value is never held in memory whole) and mapped read-only; the answer instead if it is longer or shorter
        than that, or does not arrive whole within :attr:`body_timeout` seconds (408, closing the connection)."""
        with tempfile.TemporaryFile(prefix="kvckpt-put-") as spool:
            received = 0
            try:
                async with asyncio.timeout(self.body_timeout):
                    async for piece in request.stream():
                        received += len(piece)
                        if received > length:
                            return _text(400, "Bad Request: a body longer than its Content-Length")
                        spool.write(piece)
            except TimeoutError:
                return _text(408, f"Request Timeout: expected the whole body within {self.body_timeout:g} s of "
                                  "the request head", {"connection": "close"})
            if received != length:
                return _text(400, "Bad Request: a body shorter than its Content-Length")
            if not length:
                return b""
            spool.flush()
            return memoryview(mmap.mmap(spool.fileno(), length, access=mmap.ACCESS_READ))  # valid once it is closed

    @staticmethod
    def _stored(key: str, stored: bool) -> Response:
        if stored:
            return _text(201, "Created")
        return _text(412, f"Precondition Failed: {key} holds a value already (this store is create-only)")

    async def _check_manifest(self, key: str, body: bytes) -> Response | None:
        try:
            manifest = decode_at(key, body)
        except KVCkptError as exc:
            return _text(400, f"Bad Request: {exc}")
        missing = [k for k in sorted(set(manifest.chunk_keys())) if not await self.store.exists(k)]
        if missing:
            return _text(409, f"Conflict: {key} names {len(missing)} chunks this store does not hold "
                              f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}): send them first")
        return None

    async def _check_record(self, key: str, body: bytes) -> Response | None:
        manifest = manifest_of(key)
        try:
            decode_record(key, body)
        except KVCkptError as exc:
            return _text(400, f"Bad Request: {exc}")
        if not await self.store.exists(manifest):
            return _text(409, f"Conflict: {key} is the record of {manifest}, which this store does not hold")
        return None

