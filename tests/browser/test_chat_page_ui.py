"""The chat page (examples/chat) without dead ends and for everyone: Crash only while a reply runs, a failed start
that can be retried, a delete that asks and can be cancelled, an inspect panel that closes with its conversation,
the commit line naming the store, 390 px without sideways scrolling, a name for every control, status changes
announced but not each token, the focus kept where the user was, and the start's stages on the progress bar."""

from __future__ import annotations

import re

import pytest

from kvckpt_web.engine import PRESETS

from .chat_page import ChatPage, open_chat

TOKENS = 12


@pytest.fixture
def page(chat_browser, chat_server) -> ChatPage:
    chat = open_chat(chat_browser, chat_server.url).open()
    chat.configure(max_tokens=TOKENS)
    return chat


def enabled(page: ChatPage, selector: str) -> bool:
    return page.page.is_enabled(selector)


def test_crash_is_enabled_only_while_a_reply_is_generated(page):
    before = enabled(page, "#crash")
    page.send_and_hold("tell me about the sea.", 3)
    during = enabled(page, "#crash")
    page.release()
    page.wait("d => d.phase === 'ready' && d.finishReason !== null")
    after = enabled(page, "#crash")
    assert (before, during, after) == (False, True, False)


def test_a_start_that_failed_can_be_retried_and_the_page_then_chats(page, chat_server):
    page.reply_to("tell me about the sea.")
    chat_server.remove_model()
    page.page.reload()
    page.settle()
    failed = page.state()
    chat_server.use_tiny()
    page.page.click("#retry")
    page.settle()
    recovered = page.state()
    reply = page.reply_to("and the wind?")
    assert failed["problem"]["kind"] == "model-missing" and enabled(page, "#send")
    assert failed["model"] is None and len(failed["conversations"]) == 1  # what was saved stays listed
    assert recovered["problem"] is None and recovered["model"] is not None
    assert reply["finishReason"] == "length"


HOLD_ENGINE_STARTS = """
    window.engineStarts = { posted: 0, held: [] };   // each start of an engine (an init with a model), held
    const post = Worker.prototype.postMessage;
    Worker.prototype.postMessage = function (message, ...rest) {
        if (message?.op !== "init" || !message.args?.[0]?.model) return post.call(this, message, ...rest);
        window.engineStarts.posted += 1;
        window.engineStarts.held.push(() => post.call(this, message, ...rest));
    };
    window.releaseEngineStarts = () => { for (const go of window.engineStarts.held.splice(0)) go(); };
"""  # page script: the engine's start waits, in its worker's init message, until the test releases it


def test_restart_the_engine_while_it_starts_never_starts_a_second_engine(chat_browser, chat_server):
    page = open_chat(chat_browser, chat_server.url)
    page.page.add_init_script(HOLD_ENGINE_STARTS)
    page.page.goto(f"{chat_server.url}?store=indexeddb&every=8")
    page.page.wait_for_function("() => window.engineStarts.posted === 1")
    enabled_while_starting = enabled(page, "#apply-engine")
    page.page.evaluate("() => document.getElementById('apply-engine').click()")
    page.page.evaluate("() => window.releaseEngineStarts()")
    page.settle()
    got = page.state()
    starts = page.page.evaluate("() => window.engineStarts.posted")
    page.page.evaluate("() => window.releaseEngineStarts()")
    reply = page.reply_to("tell me about the sea.")
    assert starts == 1 and enabled_while_starting is False
    assert got["phase"] == "ready" and got["problem"] is None and got["model"] is not None
    assert reply["finishReason"] is not None and enabled(page, "#apply-engine")


def test_after_reopen_the_ready_line_times_the_new_start_not_the_page(page):
    page.send_and_hold("tell me about the sea.", 3)
    page.crash()
    before = page.page.evaluate("performance.now()")
    page.reopen()
    after = page.page.evaluate("performance.now()")
    line = page.page.inner_text("#load-text")
    number, unit = re.match(r"ready in ([0-9.]+) (ms|s) ", line).groups()
    shown = float(number) * (1000 if unit == "s" else 1)
    assert "since the engine was started again" in line and shown <= after - before + 50  # ms(): rounded


def test_a_delete_asks_can_be_cancelled_and_the_inspect_panel_closes_with_its_conversation(page):
    name = page.reply_to("tell me about the sea.")["conversation"]
    row = f"#conversations li[data-name='{name}']"
    page.page.click(f"{row} .inspect")
    page.page.wait_for_selector("#inspect:not([hidden])")
    inspected = page.page.inner_text("#inspect-text")
    page.page.click(f"{row} .delete")
    asked = page.page.inner_text(row)
    page.page.click(f"{row} .cancel-delete")
    focused_after_cancel = page.page.evaluate("document.activeElement.className")
    kept = [r["name"] for r in page.state()["conversations"]]
    page.page.click(f"{row} .delete")
    page.page.click(f"{row} .confirm-delete")
    page.wait("d => d.conversations.length === 0")
    assert "generation" in inspected and "tokens of K/V" in inspected
    assert "Delete “" in asked and "Cancel" in asked
    assert kept == [name] and focused_after_cancel == "delete"
    assert page.page.is_hidden("#inspect") and page.state()["conversation"] is None


def test_the_commit_line_names_the_store_that_was_written(chat_browser, chat_server):
    page = open_chat(chat_browser, chat_server.url).open(store="opfs")
    page.configure(max_tokens=TOKENS)
    state = page.reply_to("tell me about the sea.")
    line = page.page.inner_text("#committed")
    assert state["committed"]["store"] == "OPFS 'kvckpt-demo'"
    assert line.startswith("last committed: OPFS 'kvckpt-demo' · generation ") and state["conversation"] in line


def test_the_page_fits_390_px_without_sideways_scrolling(page):
    page.page.set_viewport_size({"width": 390, "height": 800})
    page.reply_to("tell me about the sea, and a very long word: " + "sea" * 60)
    page.page.click("#settings summary")
    widths = page.page.evaluate("() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    assert widths[0] <= widths[1] <= 390


def test_every_control_has_an_accessible_name(page, chat_browser):
    page.reply_to("tell me about the sea.")
    page.open_settings()
    page.open_device()
    controls, unnamed = page.controls(chat_browser)
    assert controls > 20 and unnamed == []


def test_status_changes_are_announced_and_tokens_are_not(page):
    live = page.page.evaluate("""() => [...document.querySelectorAll("[aria-live], [role=status], [role=alert]")]
        .map((e) => e.id)""")
    page.reply_to("tell me about the sea.")
    status = page.page.inner_text("#status")
    assert "messages" not in live and "status" in live
    assert page.page.evaluate("document.getElementById('messages').closest('[aria-live]')") is None
    assert status == f"Reply finished: {TOKENS} tokens"


def test_the_focus_stays_where_the_user_was(page):
    name = page.reply_to("tell me about the sea.")["conversation"]
    page.send_and_hold("and the wind?", 3)
    page.page.click("#stop")  # Stop is disabled once the reply stopped: the focus goes on to Continue
    page.release()
    page.wait("d => d.phase === 'ready' && d.finishReason === 'abort'")
    after_stop = page.page.evaluate("document.activeElement.id")
    page.page.click("#continue")
    page.wait("d => d.phase === 'ready' && d.finishReason === 'length'")
    page.hold_after(3)
    page.send("and the sky?")
    page.wait_held()
    page.page.focus(f"#conversations li[data-name='{name}'] .inspect")
    page.release()
    page.wait("d => d.phase === 'ready' && d.finishReason !== null")  # the list was drawn again meanwhile
    kept = page.page.evaluate("[document.activeElement.className, document.activeElement.closest('li')?.dataset.name]")
    assert after_stop == "continue"
    assert kept == ["inspect", name]


def test_the_progress_bar_names_each_stage_of_the_start(page):
    state = page.state()
    text = page.page.inner_text("#load-text")
    assert state["stages"] == ["python", "packages", "weights", "upload", "engine", "kernels"]
    assert page.page.evaluate("document.getElementById('load-bar').value") == 1
    assert text.startswith("ready in ") and "weights downloaded" in text


def test_without_an_interval_given_the_autosave_field_shows_the_browser_presets(chat_browser, chat_server):
    page = open_chat(chat_browser, chat_server.url)
    page.page.goto(chat_server.url)
    page.settle()
    assert page.state()["problem"] is None
    assert page.page.input_value("#every") == str(PRESETS["browser"].autosave_every)
