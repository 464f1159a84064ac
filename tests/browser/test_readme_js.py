"""The JavaScript snippets of README.md run as written in a page of the served origin."""

from __future__ import annotations

from readme_snippets import snippets

from .browser_harness import BOOT_TIMEOUT_MS

JS = snippets("js")

PAGE = """<!doctype html>
<meta charset="utf-8">
<script>
  const failed = (e) => { window.readmeError = String(e.reason ?? e.error ?? e.message); };
  window.addEventListener("error", failed);
  window.addEventListener("unhandledrejection", failed);
</script>
<script type="module">
{snippet}
window.readmeResult = {appState, seqLength};
</script>
"""


def test_the_readme_has_a_browser_snippet():
    assert len(JS) == 1 and 'from "/kvckpt.mjs"' in JS[0] and "appState: {tokens: [1, 2, 3]}" in JS[0]


def test_js_snippet_restores_the_app_state_it_checkpointed(browser_context, web_server):
    page = browser_context.new_page()
    try:
        url = web_server + "readme.html"
        page.route(url, lambda route: route.fulfill(content_type="text/html", body=PAGE.replace("{snippet}", JS[0])))
        page.goto(url)
        page.wait_for_function("() => window.readmeResult || window.readmeError", timeout=BOOT_TIMEOUT_MS)
        error, result = page.evaluate("() => [window.readmeError ?? null, window.readmeResult ?? null]")
    finally:
        page.close()
    assert error is None
    assert result == {"appState": {"tokens": [1, 2, 3]}, "seqLength": 20}
