"""Only the files meant to be served are: no directory listing, dotfile, Python source, link out of a served
directory or ``..`` escape; each such path is answered 404."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from serve_helpers import request, serving


@pytest.fixture
def page(tmp_path: Path) -> Path:
    page = tmp_path / "page"
    (page / "js").mkdir(parents=True)
    (page / "index.html").write_text("<title>page</title>")
    (page / "js" / "app.mjs").write_text("export {}")
    return page


def status(url: str, path: str) -> int:
    return request(url, path)[0]


@pytest.mark.parametrize("path", ["/js_api.py", "/chat_api.py", "/__init__.py", "/runtime.py",
                                  "/kvckpt_web/web/js_api.py", "/__pycache__/", "/web/kvckpt.mjs"])
def test_the_runtime_package_serves_its_page_and_module_only(pyodide, path):
    with serving(pyodide) as url:
        assert status(url, "/kvckpt.mjs") == 200 and status(url, "/index.html") == 200
        assert status(url, path) == 404


@pytest.mark.parametrize("module", ["engine.mjs", "engine-worker.mjs", "errors.mjs", "weights.mjs"])
def test_the_modules_kvckpt_mjs_loads_are_served_as_javascript(pyodide, module):
    with serving(pyodide) as url:
        code, headers, _ = request(url, "/" + module)
        assert code == 200 and headers["content-type"].startswith("text/javascript")


@pytest.mark.parametrize("path", ["/js", "/js/", "/pyodide", "/pyodide/", "/pyodide/sub", "/pyodide/sub/",
                                  "/wheels/", "/wheels"])
def test_a_directory_is_not_listed(pyodide, tmp_path, page, path):
    (pyodide / "sub").mkdir()
    (pyodide / "sub" / "a.js").write_text("1")
    with serving(pyodide, [tmp_path], page_dir=page) as url:
        assert status(url, "/pyodide/sub/a.js") == 200 and status(url, "/js/app.mjs") == 200
        assert status(url, path) == 404


@pytest.mark.parametrize("path", ["/.env", "/.git/config", "/js/.secret", "/pyodide/.npmrc", "/pyodide/.cache/x",
                                  "/%2eenv"])
def test_dotfiles_and_dot_directories_are_not_served(pyodide, page, path):
    for where in (page / ".env", page / ".git" / "config", page / "js" / ".secret", pyodide / ".npmrc",
                  pyodide / ".cache" / "x"):
        where.parent.mkdir(exist_ok=True)
        where.write_text("secret")
    with serving(pyodide, page_dir=page) as url:
        assert status(url, path) == 404


@pytest.mark.parametrize("path", ["/../secret.txt", "/%2e%2e/secret.txt", "/js/%2E%2E/%2E%2E/secret.txt",
                                  "/js/..%2f..%2fsecret.txt", "/pyodide/../secret.txt", "/pyodide/%2e%2e/secret.txt",
                                  "/pyodide/..%5csecret.txt", "/wheels/..%2fsecret.txt", "//secret.txt",
                                  "/js//app.mjs", "/js/./app.mjs"])
def test_no_path_leaves_a_served_directory(pyodide, page, tmp_path, path):
    (tmp_path / "secret.txt").write_text("secret")
    with serving(pyodide, [tmp_path / "page"], page_dir=page) as url:
        code, _, body = request(url, path)
    assert code == 404 and b"secret" not in body


def test_a_link_out_of_a_served_directory_is_not_followed(pyodide, page, tmp_path):
    (tmp_path / "passwd").write_text("root:x:0:0")
    (pyodide / "leak.txt").symlink_to(tmp_path / "passwd")
    (page / "leak.txt").symlink_to(tmp_path / "passwd")
    (page / "outside").symlink_to(tmp_path, target_is_directory=True)
    with serving(pyodide, page_dir=page) as url:
        for path in ("/pyodide/leak.txt", "/leak.txt", "/outside/passwd"):
            code, _, body = request(url, path)
            assert code == 404 and b"root" not in body, path


def test_a_link_within_a_served_directory_is_served(pyodide):
    (pyodide / "real.js").write_text("export const real = 1;")
    (pyodide / "alias.js").symlink_to("real.js")
    with serving(pyodide) as url:
        assert request(url, "/pyodide/alias.js")[2] == b"export const real = 1;"


def test_a_link_to_a_dotfile_of_the_served_directory_is_not_followed(pyodide):
    (pyodide / ".token").write_text("secret")
    (pyodide / "token.txt").symlink_to(".token")
    with serving(pyodide) as url:
        assert status(url, "/pyodide/token.txt") == 404


def test_a_wheel_linked_from_outside_is_neither_listed_nor_served(pyodide, tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "micropip-0.11.1-py3-none-any.whl").write_bytes(b"PK")
    (tmp_path / "secret").write_text("secret")
    (wheels / "evil-1.0-py3-none-any.whl").symlink_to(tmp_path / "secret")
    (wheels / ".hidden-1.0-py3-none-any.whl").write_bytes(b"PK")
    with serving(pyodide, [wheels]) as url:
        listed = json.loads(request(url, "/wheels/index.json")[2])["wheels"]
        assert status(url, "/wheels/evil-1.0-py3-none-any.whl") == 404
        assert status(url, "/wheels/.hidden-1.0-py3-none-any.whl") == 404
    assert listed == ["micropip-0.11.1-py3-none-any.whl"]


def test_only_wheels_are_served_from_a_wheel_directory(pyodide, tmp_path):
    (tmp_path / "notes.txt").write_text("notes")
    (tmp_path / "micropip-0.11.1-py3-none-any.whl").write_bytes(b"PK")
    with serving(pyodide, [tmp_path]) as url:
        assert status(url, "/wheels/micropip-0.11.1-py3-none-any.whl") == 200
        assert status(url, "/wheels/notes.txt") == 404


def test_a_method_other_than_get_or_head_is_refused(pyodide):
    with serving(pyodide) as url:
        assert request(url, "/kvckpt.mjs", method="POST")[0] == 405
