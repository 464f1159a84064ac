"""The chat page with several models served (`kvckpt serve --page examples/chat --model A.gguf --model B.gguf`): its
picker shows each one's name, quant, size and whether its weights are in this browser already; the picked one is
kept in the browser's cache and remembered; a conversation says which model wrote it and switches to it; a base
model's composer sends plain completions, which a crash cuts and Reopen resumes as a chat's replies. Tiny random
models; replies cut where the test holds the worker, never after a sleep."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvckpt_web.model.gguf import open_gguf
from kvckpt_web.server.models import quant_of

from .chat_page import CHAT_DIR, ChatPage, open_chat, write_tiny_llama

TOKENS, EVERY, CUT_AT = 12, 4, 6
CHAT_FILE, BASE_FILE = "tiny-chat.gguf", "tiny-base.gguf"


@pytest.fixture
def two_models(browser_prereqs, fresh_wheel, tmp_path) -> dict:
    """The chat page served with a tiny chat model (named "Tiny chat", first) and a tiny base model (no name, no chat
    template, other weights)."""
    from kvckpt_web.server.run import serve_in_thread

    chat = write_tiny_llama(tmp_path / CHAT_FILE, name="Tiny chat")
    base = write_tiny_llama(tmp_path / BASE_FILE, seed=1, chat_template=None)
    server, url = serve_in_thread(browser_prereqs["pyodide"], [fresh_wheel, browser_prereqs["wheels"]], port=0,
                                  page_dir=CHAT_DIR, model=[chat, base])
    try:
        yield {"url": url, "chat": chat, "base": base}
    finally:
        server.shutdown()


def options(page: ChatPage) -> list[str]:
    """The picker's options as a person reads them."""
    return page.page.eval_on_selector_all("#model option", "os => os.map((o) => o.textContent)")


def pick(page: ChatPage, file: str) -> dict:
    """Pick model ``file``; the state once the engine started again with it."""
    page.page.select_option("#model", file)
    page.settle()
    return page.state()


def weights_source(page: ChatPage) -> str:
    return page.page.evaluate("() => window.chatPage.engine.info.weights.source")


def mib(path: Path) -> str:
    return f"{path.stat().st_size / (1 << 20):.1f} MiB" if path.stat().st_size >= 1 << 20 else \
        f"{path.stat().st_size / 1024:.0f} KiB"


def test_the_picker_shows_each_models_name_quant_size_and_whether_its_weights_are_in_this_browser(
        two_models, chat_browser):
    chat, base = two_models["chat"], two_models["base"]
    page = open_chat(chat_browser, two_models["url"]).open(every=EVERY)
    first = options(page)
    picked = pick(page, BASE_FILE)
    both = options(page)
    assert first == [f"Tiny chat · {quant_of(open_gguf(chat))} · {mib(chat)} · in this browser",
                     f"{BASE_FILE} · {quant_of(open_gguf(base))} · {mib(base)} · to download"]
    assert picked["picked"] == BASE_FILE and picked["problem"] is None
    assert [m["kept"] for m in picked["models"]] == [True, True] and both[1].endswith("· in this browser")


def test_the_picked_model_is_remembered_and_its_weights_read_from_the_browser_after_a_reload(two_models, chat_browser):
    page = open_chat(chat_browser, two_models["url"]).open(every=EVERY)
    base = pick(page, BASE_FILE)["model"]
    page.page.reload()
    page.settle()
    again = page.state()
    assert again["picked"] == BASE_FILE and again["model"]["identity"] == base["identity"]
    assert weights_source(page) == "cache"


def test_a_base_model_is_said_so_and_its_composer_sends_a_completion_of_the_text(two_models, chat_browser):
    page = open_chat(chat_browser, two_models["url"]).open(every=EVERY)
    chat_note = page.page.is_visible("#base-note")
    pick(page, BASE_FILE)
    page.configure(max_tokens=TOKENS)
    got = page.reply_to("Once upon a time")
    assert chat_note is False and page.page.is_visible("#base-note")
    assert "plain completion" in page.page.inner_text("#base-note") and page.page.is_disabled("#system")
    assert got["model"]["chat_template"] is None and len(got["replyIds"]) == TOKENS
    assert [m["role"] for m in got["messages"]] == ["user", "assistant"]
    assert got["messages"][0]["content"] == "Once upon a time"


def test_a_base_models_next_message_continues_the_text_so_far_in_the_same_conversation(two_models, chat_browser):
    page = open_chat(chat_browser, two_models["url"]).open(every=EVERY)
    pick(page, BASE_FILE)
    page.configure(max_tokens=TOKENS)
    first = page.reply_to("Once upon a time")
    more = page.reply_to(" and then")
    text = "Once upon a time" + first["reply"] + " and then"
    assert more["conversation"] == first["conversation"]
    assert more["messages"] == [{"role": "user", "content": text}, {"role": "assistant", "content": more["reply"]}]


def test_a_completion_the_crash_control_cut_goes_on_after_reopen_to_the_uninterrupted_tokens(
        two_models, chat_browser):
    page = open_chat(chat_browser, two_models["url"]).open(every=EVERY)
    pick(page, BASE_FILE)
    page.configure(max_tokens=TOKENS)
    want = page.reply_to("Once upon a time")["replyIds"]
    page.page.click("#new-chat")
    held = page.send_and_hold("Once upon a time", CUT_AT)
    page.crash()
    page.reopen()
    page.wait("d => d.opened && d.restored !== null && d.phase === 'ready' && d.finishReason !== null")
    got = page.state()
    assert len(held["replyIds"]) == CUT_AT and got["conversation"] == held["conversation"]
    assert got["restored"]["kv_restored"] is True and got["replyIds"] == want


def test_a_conversation_of_another_served_model_says_which_in_one_line_and_switches_to_it(two_models, chat_browser):
    page = open_chat(chat_browser, two_models["url"]).open(every=EVERY)
    page.configure(max_tokens=TOKENS)
    written = page.reply_to("tell me about the sea.")
    pick(page, BASE_FILE)
    page.open_conversation(written["conversation"])
    problem = page.state()["problem"]
    offered = page.offered()
    page.page.click("#switch-model")
    page.wait(f"d => d.opened && d.picked === '{CHAT_FILE}' && d.conversation === '{written['conversation']}' "
              "&& d.phase === 'ready'")
    got = page.state()
    assert problem["kind"] == "model" and problem["title"] == f"This conversation was written by Tiny chat ({CHAT_FILE})"
    assert offered == {"switch-model"}  # its reply finished: nothing to run again with this model
    assert got["model"]["identity"] == written["model"]["identity"] and got["readOnly"] is False
    assert got["messages"] == written["messages"] and got["problem"] is None
