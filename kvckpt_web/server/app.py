"""The ASGI app of ``kvckpt serve``: the routes of a :class:`~.static.Site` and any given before them (an API's),
behind the middleware every answer passes: the Host check, then ``Cache-Control: no-cache``."""

from __future__ import annotations

from collections.abc import Sequence

from starlette.applications import Starlette
from starlette.datastructures import MutableHeaders
from starlette.middleware import Middleware
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .hosts import BindAddress, HostCheck
from .static import Site


class NoCache:
    """ASGI middleware: every HTTP answer says ``Cache-Control: no-cache`` (a browser revalidates each file, so
    a rebuilt wheel or page is picked up on reload), unless the answer set its own."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_no_cache(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message).setdefault("cache-control", "no-cache")
            await send(message)

        await self.app(scope, receive, send_no_cache if scope["type"] == "http" else send)


def create_app(site: Site | None, address: BindAddress, routes: Sequence[BaseRoute] = ()) -> Starlette:
    """The app serving ``site`` (None: nothing but ``routes``) to requests for ``address``; ``routes`` (an API's, a
    store's) are matched first."""
    return Starlette(routes=[*routes, *(site.routes() if site is not None else ())],
                     middleware=[Middleware(NoCache), Middleware(HostCheck, address=address)])
