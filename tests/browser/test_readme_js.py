"""The JavaScript snippets of README.md and docs/js-api.md run as written in a page of the served origin: the chat
engine's (the README's quick start, with the tiny random llama as /model.gguf) and the raw cache's (docs/js-api.md)."""

from __future__ import annotations

import re

import pytest
from support.readme_snippets import snippets

from .browser_harness import BOOT_TIMEOUT_MS, run_desktop
from .chat_page import chat_served

JS = snippets("js")
ENGINE = [js for js in JS if "createEngine" in js]
CACHE = [js for js in JS if "createCache" in js]

PAGE = """<!doctype html>
<meta charset="utf-8">
<script>
  const failed = (e) => { window.readmeError = String(e.reason ?? e.error ?? e.message); };
  window.addEventListener("error", failed);
  window.addEventListener("unhandledrejection", failed);
</script>
<script type="module">
{snippet}
window.readmeResult = {result};
</script>
"""


def run_snippet(context, url: str, snippet: str, result: str):
    page = context.new_page()
    try:
        page.route(url + "readme.html", lambda route: route.fulfill(
            content_type="text/html", body=PAGE.replace("{snippet}", snippet).replace("{result}", result)))
        page.goto(url + "readme.html")
        page.wait_for_function("() => window.readmeResult || window.readmeError", timeout=BOOT_TIMEOUT_MS)
        return page.evaluate("() => [window.readmeError ?? null, window.readmeResult ?? null]")
    finally:
        page.close()


def test_the_docs_have_the_engines_snippet_and_the_caches():
    assert len(JS) == 2 and all('from "/kvckpt.mjs"' in js for js in JS)
    assert len(ENGINE) == 1 and len(CACHE) == 1 and "appState: {tokens: [1, 2, 3]}" in CACHE[0]


@pytest.fixture
def snippet_server(browser_prereqs, fresh_wheel, tmp_path):
    """The chat page's server, serving a store with the token the engine's snippet sends."""
    token = re.search(r'const token = "([^"]+)"', ENGINE[0]).group(1)
    with chat_served(browser_prereqs, fresh_wheel, tmp_path, token=token) as served:
        yield served


def test_the_engine_snippet_chats_two_turns_the_second_reusing_the_first(browser_context, snippet_server):
    error, result = run_snippet(browser_context, snippet_server.url, ENGINE[0],
                                "{reply, cached: next.usage.prompt_tokens_details.cached_tokens, "
                                "prompt: next.usage.prompt_tokens, finish: next.choices[0].finish_reason, sent, got}")
    assert error is None
    assert result["reply"] and result["finish"] in ("stop", "length")
    assert 0 < result["cached"] < result["prompt"]
    assert result["sent"]["copied"] and result["sent"]["chunks_sent"] > 0  # pushed to the served store
    assert result["got"]["name"] == result["sent"]["name"]
    assert run_desktop(snippet_server.store.list_prefix(f"manifests/{result['sent']['name']}/"))


def test_the_cache_snippet_restores_the_app_state_it_checkpointed(browser_context, web_server):
    error, result = run_snippet(browser_context, web_server, CACHE[0], "{appState, seqLength}")
    assert error is None
    assert result == {"appState": {"tokens": [1, 2, 3]}, "seqLength": 20}
