"""The chat page (examples/chat) as a chat, with the tiny random llama: messages shown as messages, Enter and
Shift+Enter, turns that prefill only their own tokens, a conversation reopened with its history and settings,
regenerate, edit (a fork), new conversation, and figures that come from finished work."""

from __future__ import annotations

import pytest

from .browser_harness import CDPChromium
from .chat_page import ChatPage, open_chat, user_turns

TOKENS = 16
TEMPLATE_MARKS = ("<|im_start|>", "<|im_end|>", "<|", "|>")


@pytest.fixture
def page(browser_prereqs, playwright_instance, chat_server, tmp_path):
    browser = CDPChromium(browser_prereqs["chromium"], tmp_path / "profile", playwright_instance)
    chat = open_chat(browser, chat_server.url).open()
    chat.configure(max_tokens=TOKENS)
    yield chat
    browser.close()


def shown_messages(page: ChatPage) -> list[tuple[str, str]]:
    """The messages on screen: (role, text) of each."""
    return page.page.evaluate("""() => [...document.querySelectorAll("#messages li")].map((li) =>
        [li.dataset.role, li.querySelector(".content")?.textContent ?? ""])""")


def history_tokens(state: dict) -> int:
    """Tokens whose K/V the conversation holds after a reply (its last token is pending)."""
    usage = state["usage"]
    return usage["prompt_tokens"] + usage["completion_tokens"] - 1


def test_messages_are_shown_as_messages_and_enter_sends_while_shift_enter_breaks_the_line(page):
    page.page.fill("#prompt", "first line")
    page.page.press("#prompt", "Shift+Enter")
    page.page.type("#prompt", "second line")
    typed = page.page.input_value("#prompt")
    page.page.press("#prompt", "Enter")
    page.wait("d => d.phase === 'ready' && d.finishReason !== null")
    state = page.state()
    shown = shown_messages(page)
    focused = page.page.evaluate("document.activeElement.id")
    assert typed == "first line\nsecond line"
    assert [role for role, _ in shown] == ["user", "assistant"] and shown[0][1] == "first line\nsecond line"
    assert shown[1][1] == state["messages"][1]["content"]
    assert not any(mark in text for _, text in shown for mark in TEMPLATE_MARKS)
    assert page.page.input_value("#prompt") == "" and focused == "prompt"


def test_the_next_turn_prefills_only_its_own_tokens_and_the_figures_show_prefill_and_decode_apart(page):
    first = page.reply_to("tell me about the sea.")
    second = page.reply_to("and the wind?")
    figures = page.page.inner_text("#figures")
    usage = second["usage"]
    timings = usage["timings"]
    assert second["conversation"] == first["conversation"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == history_tokens(first)
    prefilled = usage["prompt_tokens"] - history_tokens(first)
    assert f"prefill {prefilled} tokens in " in figures and f"{timings['prefill_tokens_per_s']:.0f} tokens/s" in figures
    assert f"decode {timings['decode_tokens_per_s']:.0f} tokens/s" in figures
    assert f"({history_tokens(first)} from the cache or the store" in figures


def test_a_reopened_conversation_shows_its_history_and_settings_and_its_next_turn_costs_only_its_own_tokens(page):
    page.configure(max_tokens=12, seed=5, system="You are terse.")
    page.page.fill("#temperature", "0.7")
    first = page.reply_to("tell me about the sea.")
    page.page.reload()
    page.settle()
    page.configure(max_tokens=30)  # other settings: the reopened conversation brings its own back
    page.page.fill("#system", "")
    page.open_conversation(first["conversation"])
    shown = shown_messages(page)
    form = page.page.evaluate("""() => ({system: system.value, seed: seed.value, temperature: temperature.value,
        maxTokens: document.getElementById("max-tokens").value,
        mode: document.querySelector("input[name=mode]:checked").value})""")
    second = page.reply_to("and the wind?")
    assert shown == [["user", "tell me about the sea."], ["assistant", first["messages"][-1]["content"]]]
    assert form == {"system": "You are terse.", "seed": "5", "temperature": "0.7", "maxTokens": "12", "mode": "sample"}
    assert second["conversation"] == first["conversation"]
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == history_tokens(first)
    assert second["messages"][0] == {"role": "user", "content": "tell me about the sea."}


def test_regenerate_replaces_the_last_reply_in_the_same_conversation_reusing_its_prompt(page):
    page.configure(max_tokens=TOKENS, seed=1)
    first = page.reply_to("tell me about the sea.")
    page.page.fill("#seed", "2")
    page.page.click("#regenerate")
    page.wait("d => d.phase === 'ready' && d.finishReason !== null && d.usage.prompt_tokens_details.cached_tokens > 0")
    again = page.state()
    usage = again["usage"]
    assert again["conversation"] == first["conversation"] and len(again["messages"]) == 2
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1
    assert again["replyIds"] != first["replyIds"]
    assert [row["name"] for row in again["conversations"]] == [first["conversation"]]


def test_regenerate_with_temperature_sampling_draws_a_new_seed_shown_and_saved_with_the_reply(page):
    page.configure(max_tokens=TOKENS, seed=1)
    first = page.reply_to("tell me about the sea.")
    page.page.click("#regenerate")
    page.wait("d => d.phase === 'ready' && d.finishReason !== null && d.usage.prompt_tokens_details.cached_tokens > 0")
    again = page.state()
    shown = page.page.input_value("#seed")
    saved = page.conversation(first["conversation"])["settings"]
    assert shown != "1" and saved["seed"] == int(shown)
    assert again["conversation"] == first["conversation"] and again["replyIds"] != first["replyIds"]


def test_editing_a_past_message_forks_a_new_conversation_reusing_the_shared_prefix(page):
    first_turns = user_turns(2)
    page.reply_to(first_turns[0])
    before = page.reply_to(first_turns[1])
    page.page.click("#messages li[data-index='2'] .edit-button")
    page.page.fill("#edit-text", "and the wind instead?")
    page.page.click("#messages form.edit button[type=submit]")
    page.wait(f"d => d.phase === 'ready' && d.finishReason !== null && d.conversation !== '{before['conversation']}'")
    fork = page.state()
    assert [m["content"] for m in fork["messages"][::2]] == [first_turns[0], "and the wind instead?"]
    assert fork["messages"][1] == before["messages"][1]
    assert fork["usage"]["prompt_tokens_details"]["cached_tokens"] >= 16  # the shared turn, whole pages of it
    names = {row["name"] for row in fork["conversations"]}
    titles = {name: page.page.inner_text(f"#conversations li[data-name='{name}'] .open")
              for name in (before["conversation"], fork["conversation"])}
    assert {before["conversation"], fork["conversation"]} <= names
    assert titles == {before["conversation"]: f"{first_turns[0]} · {first_turns[1]}",
                      fork["conversation"]: f"{first_turns[0]} · and the wind instead?"}
    assert page.conversation(before["conversation"])["tokens"] == history_tokens(before) + 1  # left as it was


def test_a_new_conversation_starts_empty_and_its_reply_is_saved_apart(page):
    first = page.reply_to("tell me about the sea.")
    page.page.click("#new-chat")
    empty = page.state()
    focused = page.page.evaluate("document.activeElement.id")
    second = page.reply_to("what is a boat?")
    assert empty["messages"] == [] and empty["conversation"] is None and focused == "prompt"
    assert page.page.inner_text("#chat-title") != "New conversation"
    assert second["conversation"] != first["conversation"] and len(second["messages"]) == 2
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] < second["usage"]["prompt_tokens"]


def test_a_turn_is_saved_into_the_open_conversation_when_another_holds_the_same_history(page):
    first = page.reply_to("Hi")
    page.page.click("#new-chat")
    second = page.reply_to("Hi")  # greedy: the same reply, a second conversation
    page.open_conversation(first["conversation"])
    again = page.reply_to("What can you do?")  # its tokens continue both; the second was used last
    assert second["conversation"] != first["conversation"] and second["replyIds"] == first["replyIds"]
    assert again["conversation"] == first["conversation"] and len(again["messages"]) == 4
    assert page.conversation(second["conversation"])["tokens"] == history_tokens(second) + 1  # left as it was


def test_the_lists_token_count_keeps_up_with_the_commit_line_while_a_reply_runs(page):
    first = page.reply_to("tell me about the sea.")
    held = page.send_and_hold("and the wind?", 12)  # autosave every 8 tokens: a commit during this reply
    committed = held["committed"]
    meta = page.page.inner_text(f"#conversations li[data-name='{first['conversation']}'] .meta")
    assert committed["conversation"] == first["conversation"] and committed["tokens"] > history_tokens(first) + 1
    assert page.conversation(first["conversation"])["tokens"] == committed["tokens"]
    assert f"{committed['tokens']} tokens" in meta


def test_a_restore_is_compared_with_an_estimate_from_the_shown_prefill_rate_and_measured_only_when_asked(page):
    page.reply_to("tell me about the sea.")  # a prefill this device has shown
    page.send_and_hold("and the wind?", 4)
    page.crash()
    page.reopen()
    page.wait("d => d.restored !== null && d.phase === 'ready' && d.finishReason !== null")
    estimated = page.state()
    estimate_line = page.page.inner_text("#restored-text")
    page.page.click("#measure")
    page.wait("d => d.measured !== null")
    measured = page.state()["measured"]
    measured_line = page.page.inner_text("#restored-text")
    assert estimated["measured"] is None
    restored = estimated["restored"]
    assert estimate_line.startswith(f"restored {restored['tokens']} tokens of K/V in ")
    assert "prefill this device has shown (an estimate)" in estimate_line
    assert measured["tokens"] == restored["tokens"] and measured["ms"] > 0
    assert "measured now" in measured_line and "estimate" not in measured_line
