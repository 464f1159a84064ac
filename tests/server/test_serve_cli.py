"""`kvckpt serve --page --model --open`: arguments checked before listening, the URL printed and opened."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from kvckpt_web.cli.main import main


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read()


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


def test_a_page_directory_without_index_html_is_a_one_line_error_naming_page(pyodide, tmp_path, capsys):
    status = main(["serve", "--port", "0", "--pyodide", str(pyodide), "--page", str(tmp_path)])
    err = one_line_error(capsys)
    assert status == 1
    assert f"--page: expected a page directory holding index.html, got '{tmp_path}'" in err


def test_a_model_path_that_is_not_a_file_is_a_one_line_error_naming_model(pyodide, tmp_path, capsys):
    status = main(["serve", "--port", "0", "--pyodide", str(pyodide), "--model", str(tmp_path)])
    err = one_line_error(capsys)
    assert status == 1 and f"--model: expected a GGUF model file, got '{tmp_path}' (not a file)" in err


def test_bad_arguments_are_refused_before_listening(pyodide, tmp_path, capsys):
    with socket.socket() as taken:  # a port in use: listening would fail with another error
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        status = main(["serve", "--port", str(port), "--pyodide", str(pyodide), "--model", str(tmp_path / "x")])
    assert status == 1 and "--model: expected a GGUF model file" in one_line_error(capsys)


def test_open_prints_the_url_and_opens_it_in_the_default_browser(pyodide, tmp_path):
    page = tmp_path / "page"
    page.mkdir()
    (page / "index.html").write_text("<title>demo</title>")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF1234")
    opened = tmp_path / "opened.txt"
    browser = tmp_path / "browser.sh"
    browser.write_text(f'#!/bin/sh\necho "$1" > {opened}\n')
    browser.chmod(0o755)
    server = subprocess.Popen([sys.executable, "-m", "kvckpt_web.cli", "serve", "--port", "0", "--pyodide",
                               str(pyodide), "--wheels", str(tmp_path), "--page", str(page), "--model", str(model),
                               "--open"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "BROWSER": str(browser)})
    try:
        line = server.stdout.readline()
        assert "http://127.0.0.1:" in line, server.stderr.read() if server.poll() is not None else line
        url = re.search(r"http://\S+/", line).group()
        deadline = time.monotonic() + 30
        while not (opened.exists() and opened.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.1)
        page_body = fetch(url)
        description = json.loads(fetch(url + "model.json"))
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert opened.read_text().strip() == url
    assert page_body == b"<title>demo</title>"
    assert description == {"available": True, "file": "m.gguf", "bytes": 8}


def served_model(monkeypatch, argv: list[str]) -> object:
    """The model `kvckpt serve argv` hands the server (the server itself is not started)."""
    from kvckpt_web.errors import KVCkptError
    from kvckpt_web.server import run

    seen = {}

    def make_server(*args, **kwargs):
        seen.update(kwargs)
        raise KVCkptError("not listening in this test")

    monkeypatch.setattr(run, "make_server", make_server)
    assert main(["serve", *argv]) == 1
    return seen["model"]


def test_without_model_the_installed_default_model_is_served(monkeypatch, tmp_path):
    from kvckpt_web.cli import main as cli

    default = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    default.write_bytes(b"GGUF")
    monkeypatch.setattr(cli, "default_model_path", lambda: default)
    assert served_model(monkeypatch, []) == [default]


def test_without_model_and_no_default_installed_no_model_is_served(monkeypatch):
    from kvckpt_web.cli import main as cli
    from kvckpt_web.errors import ModelUnavailableError

    def missing():
        raise ModelUnavailableError("model: not installed")

    monkeypatch.setattr(cli, "default_model_path", missing)
    assert served_model(monkeypatch, []) is None


@pytest.mark.parametrize("host", ["", " "])
def test_an_empty_host_is_a_one_line_error_before_listening(pyodide, capsys, host):
    status = main(["serve", "--port", "0", "--pyodide", str(pyodide), "--host", host])
    err = one_line_error(capsys)
    assert status == 1 and "--host: expected an address or host name to listen on" in err and "every interface" in err


def test_a_host_beyond_loopback_without_allow_remote_is_a_one_line_error(pyodide, capsys):
    status = main(["serve", "--port", "0", "--pyodide", str(pyodide), "--host", "0.0.0.0"])
    err = one_line_error(capsys)
    assert status == 1 and "--host: expected a loopback address" in err and "add --allow-remote" in err


class NotServing:
    """What `run.make_server` returns in a test that must not listen beyond loopback: serving stops at once."""

    server_address = ("0.0.0.0", 8123)
    url = "http://0.0.0.0:8123/"

    def serve_forever(self) -> None:
        raise KeyboardInterrupt

    def server_close(self) -> None:
        pass


def test_allow_remote_serves_beyond_loopback_with_a_loud_warning(monkeypatch, pyodide, capsys):
    from kvckpt_web.server import run, wheel

    given = {}
    monkeypatch.setattr(run, "make_server", lambda *args, **kwargs: given.update(kwargs) or NotServing())
    monkeypatch.setattr(wheel, "source_checkout", lambda: None)
    status = main(["serve", "--pyodide", str(pyodide), "--host", "0.0.0.0", "--allow-remote"])
    out, err = capsys.readouterr()
    assert status == 0 and given["host"] == "0.0.0.0" and given["allow_remote"] is True
    assert "http://0.0.0.0:8123/" in out
    warning = err.splitlines()[0]
    assert warning.startswith("kvckpt serve: WARNING: listening on 0.0.0.0 port 8123, beyond this machine")


def test_a_loopback_host_gets_no_warning(monkeypatch, pyodide, capsys):
    from kvckpt_web.server import run, wheel

    monkeypatch.setattr(run, "make_server", lambda *args, **kwargs: NotServing())
    monkeypatch.setattr(wheel, "source_checkout", lambda: None)
    assert main(["serve", "--pyodide", str(pyodide)]) == 0
    assert "WARNING" not in capsys.readouterr().err


def test_without_the_serve_extra_serve_is_a_one_line_error_naming_it(monkeypatch, pyodide, capsys):
    import kvckpt_web

    for name in [m for m in sys.modules if m.startswith("kvckpt_web.server")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delattr(kvckpt_web, "server", raising=False)
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # import uvicorn fails as if not installed
    status = main(["serve", "--port", "0", "--pyodide", str(pyodide)])
    err = one_line_error(capsys)
    assert status == 1 and "expected the serve extra (Starlette, uvicorn)" in err
    assert "pip install 'kvckpt_web[serve]'" in err
