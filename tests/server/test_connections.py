"""Connections are bounded: one that takes too long to send a request (idle, half a request line, or bytes
trickling in) is closed, a request beyond the connection limit is answered 503, idle connections hold no
thread."""

from __future__ import annotations

import threading

import pytest
from serve_helpers import closed_by_server, connect, request, serving

from kvckpt_web.errors import FieldError
from kvckpt_web.server.run import make_server


@pytest.fixture
def url(pyodide):
    with serving(pyodide, idle_timeout=1) as url:
        yield url


def test_a_connection_that_sends_nothing_is_closed(url):
    with connect(url) as sock:
        assert closed_by_server(sock)


def test_a_connection_that_sends_half_a_request_line_is_closed(url):
    with connect(url) as sock:
        sock.sendall(b"GET /kvckpt.mj")
        assert closed_by_server(sock)


def test_a_connection_trickling_a_request_head_is_closed(url):
    head = b"GET /kvckpt.mjs HTTP/1.1\r\nHost: localhost\r\n" + b"X-Slow: " + b"a" * 1000
    with connect(url) as sock:
        assert closed_by_server(sock, trickle=head)


def test_a_kept_alive_connection_is_closed_once_idle(url):
    with connect(url) as sock:
        sock.sendall(b"GET /kvckpt.mjs HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert closed_by_server(sock)


def test_an_answer_outlasting_the_idle_timeout_is_sent_whole(pyodide, tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(bytes(range(256)) * (32 << 12))  # 32 MiB: more than the socket buffers hold
    with serving(pyodide, model=model, idle_timeout=0.5) as url, connect(url) as sock:
        sock.sendall(b"GET /model.gguf HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        received = sock.recv(65536)
        with connect(url) as witness:  # opened later, idle: once it is closed, sock's idle time is up too
            assert closed_by_server(witness)
        while chunk := sock.recv(1 << 20):
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and body == model.read_bytes()


def test_a_request_beyond_the_connection_limit_is_answered_503(pyodide):
    with serving(pyodide, max_connections=2, idle_timeout=120) as url:
        with connect(url), connect(url):
            assert request(url, "/kvckpt.mjs")[0] == 503
        with connect(url):
            assert request(url, "/kvckpt.mjs")[0] == 200


def test_idle_connections_hold_no_thread(pyodide):
    with serving(pyodide, max_connections=200, idle_timeout=120) as url:
        before = threading.active_count()
        idle = [connect(url) for _ in range(100)]
        try:
            assert request(url, "/kvckpt.mjs")[0] == 200  # accepted after the 100 before it
            assert threading.active_count() - before < 10
        finally:
            for sock in idle:
                sock.close()


@pytest.mark.parametrize("field, value", [("idle_timeout", 0), ("idle_timeout", -1.0), ("idle_timeout", True),
                                          ("max_connections", 0), ("max_connections", 2.5)])
def test_a_bad_timeout_or_limit_is_refused(pyodide, field, value):
    with pytest.raises(FieldError, match=field):
        make_server(pyodide, [], port=0, **{field: value})
