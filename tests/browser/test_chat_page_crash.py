"""The chat page (examples/chat) when its reply is cut: the browser killed with SIGKILL, the page's Crash control
(the engine's worker terminated) or a reload. The conversation goes on by itself when the page opens again and ends
with the tokens of an uninterrupted run. A reply is cut where the test chooses (the worker held after k tokens, its
autosaves until then done), never after a sleep."""

from __future__ import annotations

import os

import pytest

from .browser_harness import CDPChromium
from .chat_page import REPO, ChatPage, open_chat, uninterrupted, user_turns

TOKENS, EVERY, CUT_AT = 24, 8, 13
SHOTS = REPO / "build" / "screenshots"


def reference(browser_prereqs, playwright_instance, url, tmp_path, turns, max_tokens=TOKENS, **settings) -> list:
    return uninterrupted(browser_prereqs, playwright_instance, url, tmp_path / "clean-profile", turns,
                         max_tokens=max_tokens, every=EVERY, **settings)


def until_cut(page: ChatPage, turns: list[str], cut_at: int) -> dict:
    """Every turn of ``turns`` but the last to its end, then the last held once its reply holds ``cut_at`` tokens."""
    for text in turns[:-1]:
        page.reply_to(text)
    return page.send_and_hold(turns[-1], cut_at)


def resumed(page: ChatPage) -> dict:
    """The state once the reply the page resumed by itself ended."""
    page.wait("d => d.opened && d.restored !== null && d.phase === 'ready' && d.finishReason !== null")
    return page.state()


@pytest.fixture(params=["tiny", pytest.param("smollm", marks=pytest.mark.real_model)])
def served_model(request, chat_server):
    """The model the server serves: the tiny random llama (three turns, the third cut), or the real SmolLM2 (one
    shorter turn)."""
    if request.param == "smollm":
        chat_server.use_file(request.getfixturevalue("smollm_path"))
        return {"name": "smollm", "turns": ["Tell me a story about the sea."], "tokens": 24, "cut_at": 10}
    return {"name": "tiny", "turns": user_turns(3), "tokens": TOKENS, "cut_at": CUT_AT}


def test_a_conversation_killed_with_the_browser_mid_reply_continues_after_relaunch_to_the_uninterrupted_tokens(
        browser_prereqs, playwright_instance, chat_server, served_model, tmp_path):
    turns, tokens, cut_at = served_model["turns"], served_model["tokens"], served_model["cut_at"]
    want = reference(browser_prereqs, playwright_instance, chat_server.url, tmp_path, turns, tokens, seed=7)
    profile = tmp_path / "profile"
    browser = CDPChromium(browser_prereqs["chromium"], profile, playwright_instance)
    try:
        page = open_chat(browser, chat_server.url).open(every=EVERY)
        page.configure(max_tokens=tokens, seed=7)
        held = until_cut(page, turns, cut_at)
        shot = SHOTS / f"chat-{served_model['name']}.png"
        shot.parent.mkdir(parents=True, exist_ok=True)
        page.page.screenshot(path=str(shot), full_page=True)
        if served_model["name"] == "smollm" and os.environ.get("KVCKPT_UPDATE_SCREENSHOT") == "1":
            (REPO / "docs" / "chat.png").write_bytes(shot.read_bytes())  # README's picture, from this run
    finally:
        browser.kill()  # SIGKILL: no unload handler, no save
    assert len(held["replyIds"]) == cut_at < tokens

    browser = CDPChromium(browser_prereqs["chromium"], profile, playwright_instance)
    try:
        got = resumed(open_chat(browser, chat_server.url).open(every=EVERY))
    finally:
        browser.close()
    assert got["conversation"] == held["conversation"]
    assert got["restored"]["kv_restored"] is True and got["restored"]["tokens"] > 0
    assert got["replyIds"] == want[-1]
    assert [m["role"] for m in got["messages"]] == ["user", "assistant"] * len(turns)
    assert [m["content"] for m in got["messages"][::2]] == turns


def test_the_crash_control_terminates_the_worker_and_reopen_continues_to_the_uninterrupted_tokens_and_chats_on(
        browser_prereqs, playwright_instance, chat_server, chat_browser, tmp_path):
    turns = user_turns(3)
    want = reference(browser_prereqs, playwright_instance, chat_server.url, tmp_path, turns)
    page = open_chat(chat_browser, chat_server.url).open(every=EVERY)
    page.configure(max_tokens=TOKENS)
    until_cut(page, turns[:2], CUT_AT)
    page.crash()
    crashed = page.state()
    page.reopen()
    got = resumed(page)
    third = page.reply_to(turns[2])  # no dead end: the reopened engine chats on
    assert crashed["problem"]["kind"] == "crashed"
    assert got["restored"]["kv_restored"] is True and got["replyIds"] == want[1]
    assert third["replyIds"] == want[2] and third["conversation"] == got["conversation"]


def test_a_reload_mid_reply_shows_the_time_to_the_first_resumed_token_stage_by_stage_and_fetches_no_weights(
        chat_server, chat_browser):
    gets = []
    chat_browser.context.on("request", lambda r: gets.append(r.url) if r.method == "GET" and "model.gguf" in r.url else 0)
    page = open_chat(chat_browser, chat_server.url).open(every=EVERY)
    page.configure(max_tokens=TOKENS)
    page.send_and_hold(user_turns(1)[0], CUT_AT)
    page.page.reload()
    got = resumed(page)
    line = page.page.inner_text("#timeline")
    timeline = got["timeline"]
    labels = [stage["label"] for stage in timeline["stages"]]
    assert labels == ["page", "Python", "weights (browser cache)", "upload", "engine", "kernels", "restore",
                      "first token"]
    assert timeline["weights_source"] == "cache" and len(gets) == 1  # the first load's only
    assert all(stage["ms"] >= 0 for stage in timeline["stages"])
    assert timeline["total_ms"] >= sum(stage["ms"] for stage in timeline["stages"][-2:])
    assert line.startswith("reload to the first resumed token: ") and "restore" in line


def test_a_reply_the_user_stopped_waits_for_continue_after_a_reload_and_continue_gives_the_uninterrupted_tokens(
        browser_prereqs, playwright_instance, chat_server, chat_browser, tmp_path):
    turns = user_turns(1)
    want = reference(browser_prereqs, playwright_instance, chat_server.url, tmp_path, turns)
    page = open_chat(chat_browser, chat_server.url).open(every=EVERY)
    page.configure(max_tokens=TOKENS)
    held = page.send_and_hold(turns[0], 5)
    page.page.click("#stop")
    page.release()
    page.wait("d => d.phase === 'ready' && d.finishReason === 'abort'")
    page.page.reload()
    page.settle()
    after_reload = page.state()
    listed = page.conversation(held["conversation"])
    page.open_conversation(held["conversation"])
    page.page.click("#continue")
    got = resumed(page)
    assert after_reload["restored"] is None and after_reload["conversation"] is None
    assert listed["finished"] is False and listed["stopped"] is True
    assert got["replyIds"] == want[0]


def test_a_new_conversation_stopped_before_its_first_token_is_kept_stopped_under_its_own_name_after_a_reload(
        chat_server, chat_browser):
    page = open_chat(chat_browser, chat_server.url).open(every=EVERY)
    page.configure(max_tokens=TOKENS)
    page.hold_after(0)  # the worker holds before the prompt's prefill
    page.send(user_turns(1)[0])
    page.wait_held()
    page.page.click("#stop")
    page.release()
    page.wait("d => d.phase === 'ready' && d.finishReason === 'abort'")
    stopped = page.state()
    figures = page.page.inner_text("#figures")
    keys = page.page.evaluate("() => Object.keys(localStorage).filter((k) => k.startsWith('kvckpt-chat:stopped:'))")
    page.page.reload()
    page.settle()
    after_reload = page.state()
    assert stopped["replyIds"] == [] and stopped["conversation"] is not None
    assert keys == [f"kvckpt-chat:stopped:indexeddb:kvckpt-demo:{stopped['conversation']}"]
    assert "stopped before the first token" in figures and " in 0 ms" not in figures
    assert after_reload["restored"] is None and after_reload["conversation"] is None
    assert page.conversation(stopped["conversation"])["stopped"] is True


def test_a_message_whose_prefill_a_crash_cut_is_shown_after_reopen_and_answered_to_the_uninterrupted_tokens(
        browser_prereqs, playwright_instance, chat_server, chat_browser, tmp_path):
    turns = user_turns(1)
    want = reference(browser_prereqs, playwright_instance, chat_server.url, tmp_path, turns)
    page = open_chat(chat_browser, chat_server.url).open(every=EVERY)
    page.configure(max_tokens=TOKENS)
    page.hold_after(0)  # the worker holds before the prompt's prefill
    page.send(turns[0])
    page.wait_held()
    page.crash()
    page.reopen()
    got = resumed(page)
    assert got["messages"][0] == {"role": "user", "content": turns[0]} and got["replyIds"] == want[0]
