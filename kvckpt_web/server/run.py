"""Listening and serving: the socket, and uvicorn running the app on it with bounded connections.

One event-loop thread serves every connection (file reads go to anyio's bounded thread pool), so idle
connections hold no thread. A connection must deliver a complete request head within ``idle_timeout``
seconds of opening or of its previous answer, however slowly its bytes trickle in, or it is closed: uvicorn
alone times out only a kept-alive connection that sends nothing, not a new one, nor one that sends half a
request line (a slowloris). While ``max_connections`` connections are open, or that many requests are being
answered, a request on a further connection is answered 503 Service Unavailable and that connection closed
(uvicorn's ``limit_concurrency``, which counts the requesting connection too); connections are not queued.
The idle timeout frees the places that idle connections hold.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from collections.abc import Callable, Sequence

import uvicorn
from starlette.routing import BaseRoute
from starlette.types import ASGIApp
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..errors import FieldError, KVCkptError, is_int
from .app import create_app
from .hosts import BindAddress, bind_address
from .static import DEFAULT_PYODIDE, DEFAULT_WHEELS, Site

DEFAULT_IDLE_TIMEOUT = 10.0
"""Seconds a connection may take to send a complete request head (the first, or the next kept-alive one)."""
DEFAULT_MAX_CONNECTIONS = 64
"""Open connections (or requests being answered) beyond which a request is answered 503."""


class RequestHeadDeadline(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, where bytes arriving do not stop the idle clock: only a complete request
    head does. Then no deadline runs until its answer is sent; then the next request gets the same time."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._deadline: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._await_request()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._answering():
            self._stop_clock()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._await_request()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_clock()
        super().connection_lost(exc)

    def _answering(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _await_request(self) -> None:
        """Close the connection in ``timeout_keep_alive`` seconds unless a request head arrives first."""
        self._stop_clock()
        if not self._answering() and not self.transport.is_closing():
            self._deadline = self.loop.call_later(self.timeout_keep_alive, self.transport.close)

    def _stop_clock(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, calling ``on_exit`` as soon as a signal asks it to stop, before it waits (5 s at
    most) for the answers under way to end."""

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None] | None) -> None:
        super().__init__(config)
        self.on_exit = on_exit

    def handle_exit(self, sig: int, frame: object) -> None:  # type: ignore[override]
        super().handle_exit(sig, frame)  # type: ignore[arg-type]
        if self.on_exit is not None:
            self.on_exit()


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


class Server:
    """A server listening (from construction on, so its port is known and listening errors come first),
    served by :meth:`serve_forever` in this thread or :meth:`start` in another."""

    def __init__(self, app: ASGIApp, sock: socket.socket, *, idle_timeout: float, max_connections: int,
                 on_exit: Callable[[], None] | None = None) -> None:
        self.socket = sock
        self.server_address: tuple[str, int] = sock.getsockname()[:2]
        self.url = _url(*self.server_address)
        config = uvicorn.Config(app, http=RequestHeadDeadline, ws="none", lifespan="off", loop="asyncio",
                                timeout_keep_alive=idle_timeout, limit_concurrency=max_connections + 1,
                                timeout_graceful_shutdown=5, proxy_headers=False, server_header=False,
                                log_config=None, log_level="error", access_log=False)
        self._uvicorn = _Uvicorn(config, on_exit)
        self._thread: threading.Thread | None = None

    def serve_forever(self) -> None:
        """Serve until SIGINT (then KeyboardInterrupt) or SIGTERM, or :meth:`shutdown` from another thread."""
        self._uvicorn.run(sockets=[self.socket])

    def start(self) -> str:
        """Serve in a daemon thread; returns the base URL."""
        self._thread = threading.Thread(target=self.serve_forever, daemon=True, name="kvckpt-serve")
        self._thread.start()
        return self.url

    def shutdown(self) -> None:
        """Stop serving (answers under way get a few seconds to finish) and wait for the serving thread."""
        self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join()

    def server_close(self) -> None:
        """Close the listening socket (serving closes it too when it stops)."""
        self.socket.close()


def listen(make_app: Callable[[BindAddress], ASGIApp], *, host: str = "127.0.0.1", port: int = 8000,
           allow_remote: bool = False, idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
           max_connections: int = DEFAULT_MAX_CONNECTIONS, on_exit: Callable[[], None] | None = None) -> Server:
    """A server listening on ``host`` and ``port`` (0 picks a free one), not yet serving, of the app
    ``make_app`` makes for the address it listens on; ``on_exit`` is called when a signal (Ctrl-C, SIGTERM)
    stops it, before the answers under way end. ``host`` must be loopback unless ``allow_remote``.
    FieldError for a bad port, host, timeout or limit; KVCkptError if it cannot listen there (a port in use,
    a host that does not resolve)."""
    if not is_int(port, 0, 65535):
        raise FieldError("port", "an integer in [0, 65535]", port)
    if isinstance(idle_timeout, bool) or not isinstance(idle_timeout, (int, float)) or not idle_timeout > 0:
        raise FieldError("idle_timeout", "a number of seconds > 0", idle_timeout)
    if not is_int(max_connections, 1):
        raise FieldError("max_connections", "an integer >= 1", max_connections)
    address = bind_address(host, port, allow_remote)
    app = make_app(address)
    sock = socket.socket(address.family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address.sockaddr)
        sock.listen()
    except OSError as exc:  # EADDRINUSE, EACCES, EADDRNOTAVAIL
        sock.close()
        raise KVCkptError(f"serve on {host}:{port}: cannot listen ({exc.strerror or exc})") from exc
    return Server(app, sock, idle_timeout=idle_timeout, max_connections=max_connections, on_exit=on_exit)


def make_server(pyodide_dir: str | os.PathLike[str] = DEFAULT_PYODIDE,
                wheel_dirs: list[str | os.PathLike[str]] | None = None, *, host: str = "127.0.0.1",
                port: int = 8000, page_dir: str | os.PathLike[str] | None = None,
                model: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None,
                allow_remote: bool = False,
                idle_timeout: float = DEFAULT_IDLE_TIMEOUT, max_connections: int = DEFAULT_MAX_CONNECTIONS,
                routes: Sequence[BaseRoute] = ()) -> Server:
    """A listening, not yet serving, server of the browser runtime (see :func:`listen`).

    ``page_dir`` (holding ``index.html``) is served before ``kvckpt_web/web``; ``model`` (a GGUF file's path, or
    several: a page picks one from ``/models.json``) at ``/models/<file name>``, the first at ``/model.gguf`` too:
    a model file that is missing, now or later, is reported by ``/model.json`` and ``/models.json``, not refused.
    ``routes`` (a served store's) are matched before the runtime's files. FieldError for a page directory without
    ``index.html`` or two model files of one name, KVCkptError without Pyodide, and :func:`listen`'s errors.
    """
    def make_app(address: BindAddress) -> ASGIApp:
        return create_app(Site.of(pyodide_dir, wheel_dirs if wheel_dirs is not None else [DEFAULT_WHEELS],
                                  page_dir=page_dir, model=model), address, routes)

    return listen(make_app, host=host, port=port, allow_remote=allow_remote, idle_timeout=idle_timeout,
                  max_connections=max_connections)


def make_routes_server(routes: Sequence[BaseRoute], *, host: str = "127.0.0.1", port: int = 8000,
                       allow_remote: bool = False, idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
                       max_connections: int = DEFAULT_MAX_CONNECTIONS) -> Server:
    """A listening server of ``routes`` alone (a store served where there is no browser runtime to serve),
    behind the same Host check, timeouts and connection limit as :func:`make_server`."""
    return listen(lambda address: create_app(None, address, routes), host=host, port=port,
                  allow_remote=allow_remote, idle_timeout=idle_timeout, max_connections=max_connections)


def serve_in_thread(*args, **kwargs) -> tuple[Server, str]:
    """:func:`make_server`, served in a daemon thread; returns the server and its base URL."""
    server = make_server(*args, **kwargs)
    return server, server.start()


def serve_routes_in_thread(routes: Sequence[BaseRoute], **kwargs) -> tuple[Server, str]:
    """:func:`make_routes_server`, served in a daemon thread; returns the server and its base URL."""
    server = make_routes_server(routes, **kwargs)
    return server, server.start()
