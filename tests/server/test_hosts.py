"""The server listens on loopback unless allowed beyond it, and answers only requests that name it (``Host``),
which defeats DNS rebinding."""

from __future__ import annotations

import socket

import pytest
from serve_helpers import connect, request, serving

from kvckpt_web.errors import FieldError
from kvckpt_web.server.hosts import BindAddress, bind_address, host_name
from kvckpt_web.server.run import make_server


@pytest.fixture
def url(pyodide):
    with serving(pyodide) as url:
        yield url


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "[::1]", "q1a2b3.localhost", "LocalHost"])
def test_a_loopback_name_with_any_port_is_answered(url, host):
    for port in ("", f":{url.rsplit(':', 1)[1].strip('/')}", ":9999"):
        assert request(url, "/kvckpt.mjs", {"Host": host + port})[0] == 200, host + port


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "localhost.evil.example", "10.0.0.1",
                                  "[fe80::1]", "127.0.0.1.nip.io", "localhost."])
def test_a_request_for_another_host_is_misdirected(url, host):
    code, _, body = request(url, "/kvckpt.mjs", {"Host": host})
    assert code == 421 and b"export" not in body


@pytest.mark.parametrize("head", [b"GET /kvckpt.mjs HTTP/1.0\r\n\r\n",
                                  b"GET /kvckpt.mjs HTTP/1.1\r\nHost: a b\r\n\r\n",
                                  b"GET /kvckpt.mjs HTTP/1.1\r\nHost: [::1\r\n\r\n",
                                  b"GET /kvckpt.mjs HTTP/1.1\r\nHost: localhost\r\nHost: evil.example\r\n\r\n"])
def test_a_request_without_one_valid_host_is_bad(url, head):
    with connect(url) as sock:
        sock.sendall(head)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 400 ") and b"export" not in answer


def test_a_refused_host_is_answered_before_any_route(url):
    assert request(url, "/nothing-here", {"Host": "evil.example"})[0] == 421


@pytest.mark.parametrize("value, name", [("localhost:8000", "localhost"), ("[::1]:80", "::1"),
                                         ("A.Localhost", "a.localhost"), ("127.0.0.1:", "127.0.0.1"), ("a b", None),
                                         ("[::1", None), ("[zz]", None), ("::1", None), ("host:port", None),
                                         ("", None)])
def test_the_host_of_a_host_header(value, name):
    assert host_name(value) == name


@pytest.mark.parametrize("host", ["", " "])
def test_an_empty_host_is_refused_as_every_interface(host):
    with pytest.raises(FieldError, match="host: expected an address or host name.*every interface"):
        bind_address(host, 0)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.1"])
def test_a_host_beyond_loopback_is_refused_without_allow_remote(host):
    with pytest.raises(FieldError, match=f"host: expected a loopback address .*got '{host}'.*allow_remote=True"):
        bind_address(host, 0)


def test_make_server_refuses_a_host_beyond_loopback_before_listening(pyodide):
    with pytest.raises(FieldError, match="allow_remote"):
        make_server(pyodide, [], host="0.0.0.0", port=0)


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "127.0.0.2"])
def test_loopback_hosts_need_no_consent(host):
    try:
        address = bind_address(host, 0)
    except OSError:  # a machine without IPv6
        pytest.skip(f"{host} does not resolve here")
    assert address.loopback


def test_beyond_loopback_the_given_name_and_any_ip_address_are_answered():
    address = BindAddress("mybox.lan", socket.AF_INET, ("192.0.2.1", 8000), loopback=False)
    assert all(address.accepts(name) for name in ("mybox.lan", "192.0.2.7", "::1", "localhost", "x.localhost"))
    assert not address.accepts("evil.example")


def test_on_loopback_only_loopback_names_and_the_given_host_are_answered():
    address = BindAddress("127.0.0.2", socket.AF_INET, ("127.0.0.2", 8000), loopback=True)
    assert address.accepts("127.0.0.2") and address.accepts("localhost")
    assert not address.accepts("192.0.2.7") and not address.accepts("evil.example")


def test_the_exposure_warning_says_what_is_exposed_and_to_whom():
    line = BindAddress("0.0.0.0", socket.AF_INET, ("0.0.0.0", 8000), loopback=False).exposure(8000)
    assert "\n" not in line and "WARNING" in line and "0.0.0.0 port 8000" in line
    assert "anyone who can reach it" in line and "model file" in line and "no authentication" in line
