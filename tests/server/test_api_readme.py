"""The HTTP API snippets of the README and docs/http-api.md, each curl command and the ``openai`` client's Python, run
as written against ``kvckpt serve --api`` (the tiny llama under the snippets' model name, on a free port instead of
8000)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from api_helpers import serving_api
from serve_helpers import PATIENCE
from support.readme_snippets import NEEDS_API, snippets

README_URL = "http://127.0.0.1:8000/"
PYTHON = [s for s in snippets("python") if s.startswith(NEEDS_API)]
CURL = [s for s in snippets("sh") if s.startswith("curl ")]


@pytest.fixture(scope="module")
def url(tiny_llama_path, tmp_path_factory):
    store = tmp_path_factory.mktemp("readme") / "chats"
    with serving_api("--model", str(tiny_llama_path), "--model-name", "smollm2", "--store", str(store)) as (url, _):
        yield url


def test_the_docs_have_an_api_snippet_of_each_kind():
    assert len(PYTHON) == 1 and "from openai import OpenAI" in PYTHON[0] and README_URL in PYTHON[0]
    assert CURL and all(README_URL in command for command in CURL)


@pytest.mark.parametrize("command", CURL, ids=[f"curl{i}" for i in range(len(CURL))])
def test_the_curl_command_gets_a_chat_completion_or_a_text_completion(url, command):
    if shutil.which("curl") is None:
        pytest.skip("no curl on this machine")
    done = subprocess.run(["bash", "-c", command.replace(README_URL, url)], capture_output=True, text=True,
                          timeout=PATIENCE)
    assert done.returncode == 0, done.stderr
    expected = "text_completion" if "/v1/completions" in command else "chat.completion"
    assert json.loads(done.stdout)["object"] == expected


def test_the_python_snippet_chats_two_turns_and_reports_the_history_cached(url, tmp_path):
    done = subprocess.run([sys.executable, "-c", PYTHON[0].replace(README_URL, url)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=PATIENCE)
    assert done.returncode == 0, done.stderr
    cached = int(done.stdout.rpartition("cached tokens: ")[2])
    assert cached > 0
