"""The chat page with the real Gemma 3 270M (a base model: the composer sends a plain completion) in headless
Chromium: its kernels (Q4_K, Q5_0, Q6_K, Q8_0 weights; the gemma3 architecture) run there, and a completion the Crash
control cut goes on after Reopen to the tokens an uninterrupted run gives. The 253 MB file loads once over the network
per module; the page keeps it in the browser's cache for the reopened worker. Token counts are small: SwiftShader is
slow."""

from __future__ import annotations

import pytest

from .chat_page import CHAT_DIR, ChatPage, open_chat

pytestmark = pytest.mark.real_model

PROMPT, TOKENS, EVERY, CUT_AT = "Paris is the capital of", 6, 2, 3


@pytest.fixture(scope="module")
def gemma_server(browser_prereqs, fresh_wheel, gemma_path):
    from kvckpt_web.server.run import serve_in_thread

    server, url = serve_in_thread(browser_prereqs["pyodide"], [fresh_wheel, browser_prereqs["wheels"]], port=0,
                                  page_dir=CHAT_DIR, model=gemma_path)
    try:
        yield url
    finally:
        server.shutdown()


def test_gemma_runs_in_the_page_as_a_base_model_and_a_crashed_completion_resumes_to_the_uninterrupted_tokens(
        gemma_server, chat_browser):
    page: ChatPage = open_chat(chat_browser, gemma_server).open(every=EVERY)
    opened = page.state()
    assert opened["problem"] is None, opened["problem"]
    assert opened["model"]["chat_template"] is None
    assert "plain completion" in page.page.inner_text("#base-note")
    page.configure(max_tokens=TOKENS)
    held = page.send_and_hold(PROMPT, CUT_AT)
    page.crash()
    page.reopen()
    page.wait("d => d.opened && d.restored !== null && d.phase === 'ready' && d.finishReason !== null")
    got = page.state()
    page.page.click("#new-chat")
    want = page.reply_to(PROMPT)  # the same completion, never interrupted (greedy), in a conversation of its own
    assert len(held["replyIds"]) == CUT_AT
    assert got["conversation"] == held["conversation"] and got["restored"]["kv_restored"] is True
    assert len(want["replyIds"]) == TOKENS and got["replyIds"] == want["replyIds"]
    assert [m["role"] for m in got["messages"]] == ["user", "assistant"] and got["messages"][0]["content"] == PROMPT
