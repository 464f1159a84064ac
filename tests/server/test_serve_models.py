"""`kvckpt serve --model A.gguf --model B.gguf`: several model files served for a page to pick one, each at
/models/<file name> and described by /models.json (name, size, quant), the first at /model.gguf too."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kvckpt_web.cli.main import main
from kvckpt_web.errors import FieldError
from kvckpt_web.model.gguf import open_gguf
from kvckpt_web.server.models import quant_of
from kvckpt_web.server.run import make_server

from test_serve_page_and_model import fetch, serving, status_of


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))
from tiny_llama import write_tiny_llama  # noqa: E402


@pytest.fixture
def two_models(tmp_path):
    a = write_tiny_llama(tmp_path / "a.gguf", name="Tiny A")
    b = write_tiny_llama(tmp_path / "b.gguf", seed=1, chat_template=None)
    return a, b


def test_models_json_lists_each_model_with_its_name_size_and_quant_in_the_order_given(pyodide, two_models):
    a, b = two_models
    with serving(pyodide, model=[b, a]) as url:
        listed = json.loads(fetch(url + "models.json")[1])["models"]
    assert listed == [
        {"file": "b.gguf", "url": "/models/b.gguf", "available": True, "bytes": b.stat().st_size, "name": None,
         "quant": quant_of(open_gguf(b))},
        {"file": "a.gguf", "url": "/models/a.gguf", "available": True, "bytes": a.stat().st_size, "name": "Tiny A",
         "quant": quant_of(open_gguf(a))}]


def test_each_model_is_served_under_its_file_name_and_the_first_at_model_gguf(pyodide, two_models):
    a, b = two_models
    with serving(pyodide, model=[a, b]) as url:
        assert fetch(url + "models/a.gguf")[1] == a.read_bytes()
        assert fetch(url + "models/b.gguf")[1] == b.read_bytes()
        assert fetch(url + "model.gguf")[1] == a.read_bytes()
        assert status_of(url + "models/c.gguf") == 404


def test_the_quant_is_the_file_type_general_file_type_names(tmp_path):
    path = write_tiny_llama(tmp_path / "m.gguf")
    f = open_gguf(path)
    assert quant_of(f) in {t.type_name for t in f.tensors.values()}  # no file type: the tensors' main type
    f.metadata["general.file_type"] = 15
    assert quant_of(f) == "Q4_K_M"


def test_a_model_missing_now_is_listed_unavailable_with_its_path_and_one_that_appears_is_described(
        pyodide, tmp_path):
    late = tmp_path / "late.gguf"
    with serving(pyodide, model=[late]) as url:
        assert json.loads(fetch(url + "models.json")[1])["models"] == [
            {"file": "late.gguf", "url": "/models/late.gguf", "available": False, "expected": str(late)}]
        write_tiny_llama(late)
        assert json.loads(fetch(url + "models.json")[1])["models"][0]["available"] is True


def test_a_file_that_is_no_gguf_is_listed_with_why_its_header_cannot_be_read(pyodide, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf")
    with serving(pyodide, model=[bad]) as url:
        [listed] = json.loads(fetch(url + "models.json")[1])["models"]
    assert listed["available"] is True and listed["quant"] is None and "GGUF" in listed["error"]


def test_two_models_of_one_file_name_are_refused_naming_the_name(pyodide, tmp_path):
    (tmp_path / "x").mkdir()
    one, two = write_tiny_llama(tmp_path / "m.gguf"), write_tiny_llama(tmp_path / "x" / "m.gguf")
    with pytest.raises(FieldError, match="model: .*got 'm.gguf' \\(given more than once\\)"):
        make_server(pyodide, [], port=0, model=[one, two])


def test_serve_takes_model_repeated_and_api_refuses_more_than_one(pyodide, two_models, capsys, monkeypatch):
    from kvckpt_web.errors import KVCkptError
    from kvckpt_web.server import run

    seen = {}

    def make_server_seen(*args, **kwargs):
        seen.update(kwargs)
        raise KVCkptError("not listening in this test")

    monkeypatch.setattr(run, "make_server", make_server_seen)
    a, b = two_models
    assert main(["serve", "--pyodide", str(pyodide), "--model", str(a), "--model", str(b)]) == 1
    assert seen["model"] == [a, b]
    capsys.readouterr()
    assert main(["serve", "--api", "--model", str(a), "--model", str(b)]) == 1
    err = capsys.readouterr().err
    assert "--model: expected one model file with --api" in err and err.rstrip().endswith("got 2")
