"""The app an API builds on: routes given to it come before the files, behind the same Host check and
Cache-Control (called as ASGI, without a socket)."""

from __future__ import annotations

import asyncio
import socket

from starlette.responses import PlainTextResponse
from starlette.routing import Route

from kvckpt_web.server.app import create_app
from kvckpt_web.server.hosts import BindAddress
from kvckpt_web.server.static import Site

LOOPBACK = BindAddress("127.0.0.1", socket.AF_INET, ("127.0.0.1", 8000), loopback=True)


def get(app, path: str, host: str = "localhost:8000") -> tuple[int, dict[bytes, bytes], bytes]:
    """Status, headers and body of ``GET path`` answered by the ASGI ``app``."""
    sent = []
    requests = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive():  # the request, then nothing until the client leaves (it never does)
        return requests.pop() if requests else await asyncio.Event().wait()

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": "GET", "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "headers": [(b"host", host.encode())], "client": ("127.0.0.1", 50000),
             "server": ("127.0.0.1", 8000)}
    asyncio.run(app(scope, receive, send))
    return sent[0]["status"], dict(sent[0]["headers"]), b"".join(m.get("body", b"") for m in sent[1:])


def app_with_route(pyodide):
    route = Route("/model.json", lambda request: PlainTextResponse("from the API"))
    return create_app(Site.of(pyodide, []), LOOPBACK, [route])


def test_a_route_given_is_matched_before_the_files(pyodide):
    status, headers, body = get(app_with_route(pyodide), "/model.json")
    assert (status, body, headers[b"cache-control"]) == (200, b"from the API", b"no-cache")


def test_a_route_given_is_behind_the_host_check(pyodide):
    assert get(app_with_route(pyodide), "/model.json", host="evil.example")[0] == 421


def test_the_files_are_still_served_beside_the_routes_given(pyodide):
    status, _, body = get(app_with_route(pyodide), "/pyodide/pyodide.mjs")
    assert (status, body) == (200, b"export {}")
