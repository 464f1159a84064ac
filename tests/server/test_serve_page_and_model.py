"""`kvckpt serve` with a page directory and a model: the page's files before the runtime's, the model file at
/model.gguf and its description at /model.json (no browser needed)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from email.message import Message
from pathlib import Path

import pytest

from kvckpt_web.errors import FieldError
from kvckpt_web.model.loader import DEFAULT_MODEL_FILE, INSTALL_HINT
from kvckpt_web.server.run import make_server, serve_in_thread


def fetch(url: str) -> tuple[Message, bytes]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.headers, r.read()


def status_of(url: str) -> int:
    with pytest.raises(urllib.error.HTTPError) as exc:
        fetch(url)
    return exc.value.code


@pytest.fixture
def page(tmp_path: Path) -> Path:
    page = tmp_path / "page"
    page.mkdir()
    (page / "index.html").write_text("<title>crash resume</title>")
    (page / "app.mjs").write_text("export const app = 1;")
    return page


@contextmanager
def serving(pyodide: Path, **kwargs) -> Iterator[str]:
    server, url = serve_in_thread(pyodide, [], port=0, **kwargs)
    try:
        yield url
    finally:
        server.shutdown()
        server.server_close()


def test_root_is_the_index_html_of_the_page_directory(pyodide, page):
    with serving(pyodide, page_dir=page) as url:
        headers, body = fetch(url)
    assert headers["Content-Type"].startswith("text/html") and body == b"<title>crash resume</title>"


def test_a_file_of_the_page_directory_is_served(pyodide, page):
    with serving(pyodide, page_dir=page) as url:
        headers, body = fetch(url + "app.mjs")
    assert headers["Content-Type"] == "text/javascript" and body == b"export const app = 1;"


def test_a_path_not_in_the_page_directory_falls_back_to_the_runtime_files(pyodide, page):
    with serving(pyodide, page_dir=page) as url:
        headers, body = fetch(url + "kvckpt.mjs")
    runtime = Path(__file__).resolve().parents[2] / "kvckpt_web/web/kvckpt.mjs"
    assert headers["Content-Type"] == "text/javascript" and body == runtime.read_bytes()


def test_a_page_file_hides_the_runtime_file_of_the_same_name(pyodide, page):
    (page / "kvckpt.mjs").write_text("export const mine = 1;")
    with serving(pyodide, page_dir=page) as url:
        assert fetch(url + "kvckpt.mjs")[1] == b"export const mine = 1;"


def test_a_path_in_neither_directory_is_not_found(pyodide, page):
    with serving(pyodide, page_dir=page) as url:
        assert status_of(url + "nothing.mjs") == 404


def test_dot_dot_does_not_leave_the_page_directory(pyodide, page, tmp_path):
    (tmp_path / "secret.txt").write_text("secret")
    with serving(pyodide, page_dir=page) as url:
        assert status_of(url + "%2e%2e/secret.txt") == 404


def test_without_a_page_directory_root_is_the_runtime_page(pyodide):
    with serving(pyodide) as url:
        assert b"kvckpt.mjs" in fetch(url)[1]


def test_a_page_directory_without_index_html_is_refused(pyodide, tmp_path):
    with pytest.raises(FieldError, match=r"page_dir: expected a page directory holding index\.html.*no index\.html"):
        make_server(pyodide, [], port=0, page_dir=tmp_path)


def test_a_page_directory_that_does_not_exist_is_refused(pyodide, tmp_path):
    with pytest.raises(FieldError, match="page_dir: .*not a directory"):
        make_server(pyodide, [], port=0, page_dir=tmp_path / "absent")


def test_the_model_file_is_served_as_octet_stream_with_its_length(pyodide, tmp_path):
    model = tmp_path / "tiny.gguf"
    model.write_bytes(bytes(range(256)) * 4096)  # 1 MiB: more than one buffer of the file copy
    with serving(pyodide, model=model) as url:
        headers, body = fetch(url + "model.gguf")
    assert headers["Content-Type"] == "application/octet-stream"
    assert headers["Content-Length"] == str(2**20) and body == model.read_bytes()


def test_model_json_describes_the_model_file(pyodide, tmp_path):
    model = tmp_path / "tiny.gguf"
    model.write_bytes(b"GGUF" * 10)
    with serving(pyodide, model=model) as url:
        headers, body = fetch(url + "model.json")
    assert headers["Content-Type"] == "application/json"
    assert json.loads(body) == {"available": True, "file": "tiny.gguf", "bytes": 40}


def test_without_a_model_model_gguf_is_not_found(pyodide):
    with serving(pyodide) as url:
        assert status_of(url + "model.gguf") == 404


def test_without_a_model_model_json_names_the_default_model_and_how_to_install_it(pyodide):
    with serving(pyodide) as url:
        description = json.loads(fetch(url + "model.json")[1])
    assert description == {"available": False, "expected": DEFAULT_MODEL_FILE, "hint": INSTALL_HINT}


def test_a_missing_model_file_is_not_found_and_reported_unavailable_with_its_path(pyodide, tmp_path):
    model = tmp_path / "gone.gguf"
    with serving(pyodide, model=model) as url:
        assert status_of(url + "model.gguf") == 404
        description = json.loads(fetch(url + "model.json")[1])
    assert description == {"available": False, "expected": str(model), "hint": INSTALL_HINT}


def test_a_model_file_that_appears_after_start_is_served(pyodide, tmp_path):
    model = tmp_path / "late.gguf"
    with serving(pyodide, model=model) as url:
        assert json.loads(fetch(url + "model.json")[1])["available"] is False
        model.write_bytes(b"GGUF")
        assert fetch(url + "model.gguf")[1] == b"GGUF"
