"""`kvckpt serve`: routes and MIME types of the offline browser-runtime server (no browser needed)."""

from __future__ import annotations

import json
import urllib.request

import pytest

from kvckpt_web.errors import KVCkptError
from kvckpt_web.server.run import make_server, serve_in_thread


def fetch(url: str) -> tuple[str, bytes]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.headers["Content-Type"], r.read()


def test_serves_page_module_pyodide_and_wheels(tmp_path):
    pyo = tmp_path / "pyodide"
    pyo.mkdir()
    (pyo / "pyodide.mjs").write_text("export {}")
    (pyo / "pyodide.asm.wasm").write_bytes(b"\0asm")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "kvckpt_web-0.1.0-py3-none-any.whl").write_bytes(b"PK")
    server, url = serve_in_thread(pyo, [wheels], port=0)
    try:
        assert url.startswith("http://127.0.0.1:")
        ctype, body = fetch(url)
        assert ctype.startswith("text/html") and b"kvckpt.mjs" in body
        assert fetch(url + "kvckpt.mjs")[0] == "text/javascript"
        assert fetch(url + "pyodide/pyodide.mjs")[0] == "text/javascript"
        assert fetch(url + "pyodide/pyodide.asm.wasm")[0] == "application/wasm"
        ctype, body = fetch(url + "wheels/index.json")
        assert json.loads(body) == {"wheels": ["kvckpt_web-0.1.0-py3-none-any.whl"]}
        assert fetch(url + "wheels/kvckpt_web-0.1.0-py3-none-any.whl")[1] == b"PK"
        with pytest.raises(urllib.error.HTTPError):
            fetch(url + "wheels/../../etc/passwd")
    finally:
        server.shutdown()
        server.server_close()


def test_refuses_a_directory_without_pyodide(tmp_path):
    with pytest.raises(KVCkptError, match="pyodide"):
        make_server(tmp_path, [tmp_path], port=0)


def test_a_path_with_a_nul_byte_is_not_found(tmp_path, capsys):
    (tmp_path / "pyodide.mjs").write_text("export {}")
    server, url = serve_in_thread(tmp_path, [tmp_path], port=0)
    try:
        for path in ("%00", "pyodide/pyodide%00.mjs"):
            with pytest.raises(urllib.error.HTTPError) as exc:
                fetch(url + path)
            assert exc.value.code == 404
    finally:
        server.shutdown()
        server.server_close()
    assert capsys.readouterr().err == ""


def test_an_ipv6_loopback_url_is_bracketed(pyodide):
    try:
        server, url = serve_in_thread(pyodide, [], host="::1", port=0)
    except KVCkptError:
        pytest.skip("no IPv6 loopback here")
    try:
        assert url.startswith("http://[::1]:") and fetch(url + "kvckpt.mjs")[0] == "text/javascript"
    finally:
        server.shutdown()
        server.server_close()
