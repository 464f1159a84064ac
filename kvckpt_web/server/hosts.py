"""Where the server listens and which ``Host`` it answers.

It binds a loopback address unless told otherwise in so many words (``allow_remote``, ``--allow-remote``):
the server has no authentication and no TLS, and a browser elsewhere gets no secure context from it anyway.

Every request must name a host this server is: a loopback name (``localhost``, ``*.localhost``, which
browsers resolve to loopback themselves, ``127.0.0.1``, ``[::1]``) or the ``--host`` it was started with;
bound beyond loopback, also any IP address. A page of another site that re-points its own DNS name at this
machine (DNS rebinding) sends that name, and is answered 421 Misdirected Request (RFC 9110 section 15.5.20);
a request without a Host, with several or with a malformed one is answered 400 (RFC 9112 section 3.2).
The port in ``Host`` is not compared: it guards against nothing (a rebinding page's name is refused
whatever its port) and differs wherever a port is forwarded (``ssh -L``, a container's port map).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass

from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import FieldError, KVCkptError

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_HOST = re.compile(r"(?:\[(?P<ip6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9._~-]+))(?::[0-9]*)?")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class BindAddress:
    """An address to listen on: ``host`` as given and what it resolved to (family, socket address)."""

    host: str
    family: socket.AddressFamily
    sockaddr: tuple
    loopback: bool

    def accepts(self, name: str) -> bool:
        """Whether a request naming ``name`` (a Host header's host, lower-cased, IPv6 without brackets) is
        for this server."""
        return (name in LOOPBACK_NAMES or name.endswith(".localhost") or name == self.host.lower()
                or (not self.loopback and _is_ip(name)))

    def exposure(self, port: int) -> str:
        """What listening here beyond loopback exposes, and to whom (one line, for stderr)."""
        return (f"kvckpt serve: WARNING: listening on {self.host} port {port}, beyond this machine: anyone who "
                "can reach it over the network can fetch every file served (the page, kvckpt.mjs, Pyodide, the "
                "wheels, the model file), with no authentication and no encryption (plain HTTP); a browser on "
                "another machine gets no secure context from it, so WebGPU, IndexedDB and OPFS stay off there")


def bind_address(host: str, port: int, allow_remote: bool = False, *, field: str = "host",
                 consent: str = "allow_remote=True") -> BindAddress:
    """Where to listen for ``host``: FieldError naming ``field`` for an empty host (it would mean every
    interface) and, without ``allow_remote`` (given as ``consent``), for one that is not loopback;
    KVCkptError for a host that does not resolve."""
    if not isinstance(host, str) or not host.strip() or "\x00" in host:
        raise FieldError(field, "an address or host name to listen on (default 127.0.0.1)", host,
                         "an empty host listens on every interface: name the address")
    try:
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:  # socket.gaierror; an IDNA-invalid name
        raise KVCkptError(f"serve on {host}:{port}: cannot listen ({getattr(exc, 'strerror', None) or exc})") from exc
    loopback = all(ipaddress.ip_address(sockaddr[0].partition("%")[0]).is_loopback
                   for _, _, _, _, sockaddr in found)
    if not loopback and not allow_remote:
        raise FieldError(field, "a loopback address (127.0.0.1, ::1, localhost)", host,
                         f"it reaches beyond this machine: add {consent} to serve other machines")
    family, _, _, _, sockaddr = min(found, key=lambda info: info[0] != socket.AF_INET)  # IPv4 first, as before
    return BindAddress(host, family, (sockaddr[0], port, *sockaddr[2:]), loopback)


def host_name(value: str) -> str | None:
    """The host of a Host header value, lower-cased, without port or IPv6 brackets; None if malformed."""
    match = _HOST.fullmatch(value)
    if match is None or (match["ip6"] is not None and not _is_ip(match["ip6"])):
        return None
    return (match["ip6"] or match["name"]).lower()


class HostCheck:
    """ASGI middleware: answers a request for another host 421, one without a valid Host 400 (see above).
    Only HTTP reaches it: the server speaks no WebSocket (uvicorn runs with ``ws="none"``)."""

    def __init__(self, app: ASGIApp, address: BindAddress) -> None:
        self.app = app
        self.address = address

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            values = [value.decode("latin-1") for name, value in scope["headers"] if name == b"host"]
            name = host_name(values[0]) if len(values) == 1 else None
            if name is None:
                return await PlainTextResponse("Bad Request: expected one valid Host header", 400)(scope, receive,
                                                                                                   send)
            if not self.address.accepts(name):
                return await PlainTextResponse(f"Misdirected Request: this server is not {name}", 421)(
                    scope, receive, send)
        await self.app(scope, receive, send)
