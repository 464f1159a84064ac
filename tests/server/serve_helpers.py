"""Helpers of the server tests: a server in a thread, requests whose every header the test chooses, and raw
connections that wait for the server to close them."""

from __future__ import annotations

import http.client
import select
import socket
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from email.message import Message
from pathlib import Path

from kvckpt_web.server.run import serve_in_thread

#: Seconds a test waits at most for something the server does soon (never a measured time).
PATIENCE = 60


@contextmanager
def serving(pyodide: Path, wheel_dirs: list[Path] | None = None, **kwargs) -> Iterator[str]:
    """The base URL of a server of ``pyodide`` (and ``wheel_dirs``) on a free port, for the ``with`` block."""
    server, url = serve_in_thread(pyodide, wheel_dirs or [], port=0, **kwargs)
    try:
        yield url
    finally:
        server.shutdown()
        server.server_close()


def request(url: str, path: str, headers: dict[str, str] | None = None,
            method: str = "GET") -> tuple[int, Message, bytes]:
    """Status, headers and body of ``method path`` on the server of ``url`` (``path`` sent as given; a
    ``Host`` in ``headers`` replaces the one http.client would send)."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=PATIENCE)
    try:
        conn.request(method, path, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.headers, response.read()
    finally:
        conn.close()


def connect(url: str) -> socket.socket:
    """A raw TCP connection to the server of ``url``."""
    parts = urllib.parse.urlsplit(url)
    return socket.create_connection((parts.hostname, parts.port), timeout=PATIENCE)


def closed_by_server(sock: socket.socket, trickle: bytes = b"") -> bool:
    """Whether the server closes ``sock`` within PATIENCE seconds, reading (and discarding) what it sends;
    with ``trickle``, one byte of it is sent whenever the server stayed silent for a tenth of a second."""
    deadline = time.monotonic() + PATIENCE
    while time.monotonic() < deadline:
        if select.select([sock], [], [], 0.1)[0]:
            try:
                if sock.recv(65536) == b"":
                    return True
            except ConnectionResetError:
                return True
        elif trickle:
            try:
                sock.sendall(trickle[:1])
            except (BrokenPipeError, ConnectionResetError):
                return True
            trickle = trickle[1:]
    return False
