"""Claims of checkpoint names in a served store (``kvckpt serve --store DIR|URL --token T``), held as leases, so a
name has one writer across every client of the server and every writer of its storage.

The server holds the claim of the store it serves (a FileStore's ``flock``, an ObjectStore's lease) for the client
that claimed the name, for as long as that client's lease runs: :data:`~kvckpt_web.stores.leases.DEFAULT_LEASE_SECONDS`
from the request, unless renewed. A lease that ran out (by more than
:data:`~kvckpt_web.stores.leases.CLOCK_SKEW_SECONDS`) is released, at the next claim request and by a timer, so a
client that died holds the name no longer than that. Each request needs the store's bearer token, as every
``/store/`` request does; ``<holder>`` is an id the client draws for each claim (32 lowercase hex digits).

* ``POST /store/claims/<name>`` with ``{"holder": "<holder>"}`` -- take the claim: 201 ``{"seconds": S}`` (the lease),
  or 409 while another client or writer of the storage holds the name;
* ``PUT /store/claims/<name>`` with ``{"holder": "<holder>"}`` -- renew it: 200 ``{"seconds": S}``, or 409 if it is
  not that holder's any more (its lease ran out and the name was released or taken over);
* ``DELETE /store/claims/<name>?holder=<holder>`` -- release it: 204 (also if that holder no longer has it).

A name that is no key segment is 404, a body that is no such JSON object (or longer than 1 KiB) 400.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from ..checks import check_callable
from ..errors import ConflictError, KVCkptError
from ..jsontext import unique_keys
from ..stores.base import Store, is_segment
from ..stores.leases import CLOCK_SKEW_SECONDS, DEFAULT_LEASE_SECONDS, check_lease_seconds, is_holder

__all__ = ["ClaimRoutes"]

MAX_BODY_BYTES = 1024

CORS = {"access-control-allow-origin": "*"}


@dataclass
class _Held:
    holder: str
    expires_at: float
    claim: AbstractAsyncContextManager[None]
    """The claim of the served store the server holds for the client."""


class ClaimRoutes:
    """The claim routes of a served ``store``; ``refused(request)`` is the answer to a request without the token (None
    if it has it). Leases run ``lease_seconds``, measured by ``clock`` (default ``time.time``)."""

    def __init__(self, store: Store, refused: Callable[[Request], Response | None], *,
                 lease_seconds: float = DEFAULT_LEASE_SECONDS, clock: Callable[[], float] | None = None) -> None:
        self.store = store
        self._refused = refused
        self.lease_seconds = check_lease_seconds("lease_seconds", lease_seconds)
        self._clock = check_callable("clock", clock) or time.time
        self._held: dict[str, _Held] = {}
        self._sweeps: set[asyncio.Task[None]] = set()

    def routes(self) -> list[Route]:
        return [Route("/store/claims/{name}", self._answer, methods=["POST", "PUT", "DELETE", "OPTIONS"])]

    async def _answer(self, request: Request) -> Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        name = request.path_params["name"]
        if not is_segment(name):
            return _text(404, "Not Found")
        await self._sweep()
        if request.method == "DELETE":
            await self._release(name, request.query_params.get("holder", ""))
            return Response(status_code=204, headers=CORS)
        holder = await _holder(request)
        if holder is None:
            return _text(400, 'Bad Request: expected a JSON object {"holder": "<32 lowercase hex digits>"}')
        try:
            if request.method == "PUT":
                return await self._renew(name, holder)
            return await self._take(name, holder)
        except KVCkptError as exc:
            return _text(500, str(exc))

    async def _take(self, name: str, holder: str) -> Response:
        held = self._held.get(name)
        if held is not None and held.holder != holder:
            return _text(409, f"Conflict: claim {name!r} is held by another client for {self._left(held)} more "
                              "seconds unless renewed")
        if held is None:
            claim = self.store.claim(name)
            try:
                await claim.__aenter__()
            except ConflictError as exc:
                return _text(409, f"Conflict: {exc}")
            held = self._held[name] = _Held(holder, 0.0, claim)
            self._sweep_later()
        held.expires_at = self._clock() + self.lease_seconds
        return JSONResponse({"seconds": self.lease_seconds}, status_code=201, headers=CORS)

    async def _renew(self, name: str, holder: str) -> Response:
        held = self._held.get(name)
        if held is None or held.holder != holder:
            return _text(409, f"Conflict: claim {name!r} is not this holder's any more (its lease ran out)")
        try:
            await self.store.renew_claim(name)
        except ConflictError as exc:
            await self._release(name, holder)
            return _text(409, f"Conflict: {exc}")
        held.expires_at = self._clock() + self.lease_seconds
        self._sweep_later()
        return JSONResponse({"seconds": self.lease_seconds}, headers=CORS)

    async def _release(self, name: str, holder: str) -> None:
        held = self._held.get(name)
        if held is not None and held.holder == holder:
            del self._held[name]
            await held.claim.__aexit__(None, None, None)

    def _left(self, held: _Held) -> int:
        return max(0, round(held.expires_at - self._clock()))

    async def _sweep(self) -> None:
        """Release the claims whose lease ran out (by more than the clocks of server and client may disagree)."""
        now = self._clock()
        for name, held in list(self._held.items()):
            if now > held.expires_at + CLOCK_SKEW_SECONDS:
                await self._release(name, held.holder)

    def _sweep_later(self) -> None:
        """Sweep once the lease just given may have run out, so a client that died leaves the name (to writers of
        the storage too) without waiting for the next claim request."""
        loop = asyncio.get_running_loop()

        def sweep() -> None:
            task = loop.create_task(self._sweep())
            self._sweeps.add(task)
            task.add_done_callback(self._sweeps.discard)

        loop.call_later(self.lease_seconds + CLOCK_SKEW_SECONDS + 1, sweep)


async def _holder(request: Request) -> str | None:
    """The holder id of a claim request's body; None unless it is ``{"holder": "<holder>"}`` of at most 1 KiB."""
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > MAX_BODY_BYTES:
            return None
    try:
        value = json.loads(body.decode("utf-8"), object_pairs_hook=unique_keys)
    except ValueError:
        return None
    if not isinstance(value, dict) or value.keys() != {"holder"} or not is_holder(value["holder"]):
        return None
    return value["holder"]


def _text(status: int, message: str) -> Response:
    return PlainTextResponse(message, status, headers=CORS)
