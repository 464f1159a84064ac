"""The chat page (examples/chat) in two tabs of one browser: a conversation is written by one tab at a time (Web
Locks). The second tab shows it read-only and can take it over; the first then stops writing it, and the second
continues the reply the first was writing to the tokens of an uninterrupted run -- never two writers interleaving."""

from __future__ import annotations

import json

from .chat_page import ChatPage, open_chat, uninterrupted

TOKENS, EVERY = 24, 8


def tab(browser, url) -> ChatPage:
    page = open_chat(browser, url).open(every=EVERY)
    page.configure(max_tokens=TOKENS)
    return page


def test_a_second_tab_shows_the_conversation_read_only_and_cannot_write_it(chat_browser, chat_server):
    first = tab(chat_browser, chat_server.url)
    name = first.reply_to("tell me about the sea.")["conversation"]
    second = tab(chat_browser, chat_server.url)
    second.open_conversation(name)
    state = second.state()
    writable = {b: second.page.is_enabled(f"#{b}") for b in ("send", "regenerate", "continue", "push")}
    edits = second.page.locator("#messages .edit-button").count()
    assert state["readOnly"] is True and second.page.is_visible("#take-over")
    assert [m["role"] for m in state["messages"]] == ["user", "assistant"]
    assert writable == {"send": False, "regenerate": False, "continue": False, "push": False} and edits == 0
    assert first.state()["readOnly"] is False and first.page.is_enabled("#send")


def test_taking_over_stops_the_first_tab_and_the_second_continues_its_reply_to_the_uninterrupted_tokens(
        browser_prereqs, playwright_instance, chat_server, chat_browser, tmp_path):
    want, = uninterrupted(browser_prereqs, playwright_instance, chat_server.url, tmp_path / "clean-profile",
                          ["tell me about the sea."], max_tokens=TOKENS, every=EVERY)
    first = tab(chat_browser, chat_server.url)
    held = first.send_and_hold("tell me about the sea.", 9)
    second = tab(chat_browser, chat_server.url)
    second.page.click(f"#conversations li[data-name='{held['conversation']}'] .open")
    second.wait("d => d.readOnly === true")
    second.page.click("#take-over")
    first.wait("d => d.readOnly === true")  # it heard, and asked its worker to stop the reply
    first.release()  # the held reply goes on only to stop
    second.wait("d => d.readOnly === false && d.restored !== null && d.phase === 'ready' && d.finishReason !== null")
    reply = second.state()["messages"][-1]["content"]
    first.wait(f"d => d.readOnly && d.phase === 'ready' && d.messages[d.messages.length - 1].content === {json.dumps(reply)}")
    got, lost = second.state(), first.state()  # the read-only tab follows what the writer saves
    assert got["conversation"] == held["conversation"] and got["replyIds"] == want
    assert lost["errors"] == [] and not first.page.is_enabled("#send") and first.page.is_visible("#take-over")
    assert not first.page.is_enabled("#push") and first.page.inner_text("#figures") == ""
