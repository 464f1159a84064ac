"""The chat page (examples/chat) when something goes wrong: no WebGPU, a conversation of another model, a damaged
chunk, an unreadable newest manifest, stored K/V a turn cannot use, a full storage quota, no model file. Each time
the page says what happened, offers what can be done, and what was saved stays: listed, and where it applies,
continued to the tokens of an uninterrupted run (the tiny random llama). Replies are cut where the test holds the
worker, never after a sleep."""

from __future__ import annotations

import hashlib
import re

import pytest

from kvckpt_web.model.loader import INSTALL_HINT

from .browser_harness import CDPChromium
from .chat_page import ChatPage, edit_record, open_chat, stored_records, uninterrupted

TOKENS, EVERY, CUT_AT = 24, 4, 14
PROMPT = "tell me about the sea."
OTHER_MODEL = {"seed": 1}  # other weights, the same shapes and header: another model identity


def cut(page: ChatPage) -> dict:
    """A reply of PROMPT held at CUT_AT tokens (several checkpoints committed), then the page's Crash control."""
    held = page.send_and_hold(PROMPT, CUT_AT)
    page.crash()
    return held


def newest_manifest(page: ChatPage, name: str) -> tuple[str, list[str]]:
    """The key of the newest manifest of ``name`` and the chunk keys it references."""
    records = stored_records(page)
    key = max((k for k in records if k.startswith(f"manifests/{name}/")), key=lambda k: int(k.rsplit("/", 1)[1]))
    return key, sorted({f"chunks/{h}" for h in re.findall(r'"sha256":"([0-9a-f]{64})"', records[key])})


def resumed(page: ChatPage) -> dict:
    page.wait("d => d.opened && d.restored !== null && d.phase === 'ready' && d.finishReason !== null")
    return page.state()


@pytest.fixture
def want(browser_prereqs, playwright_instance, chat_server, tmp_path) -> list[int]:
    """The reply ids of PROMPT, never interrupted."""
    return uninterrupted(browser_prereqs, playwright_instance, chat_server.url, tmp_path / "clean-profile", [PROMPT],
                         max_tokens=TOKENS, every=EVERY)[0]


@pytest.fixture
def page(chat_browser, chat_server) -> ChatPage:
    chat = open_chat(chat_browser, chat_server.url).open(every=EVERY)
    chat.configure(max_tokens=TOKENS)
    return chat


# ----- no WebGPU, no model file ------------------------------------------------------------------------------

def test_without_webgpu_the_page_says_so_and_still_lists_the_saved_conversations(
        browser_prereqs, playwright_instance, chat_server, tmp_path):
    with_gpu = CDPChromium(browser_prereqs["chromium"], tmp_path / "profile", playwright_instance)
    try:
        page = open_chat(with_gpu, chat_server.url).open()
        saved = page.reply_to(PROMPT)
    finally:
        with_gpu.close()
    without = CDPChromium(browser_prereqs["chromium"], tmp_path / "profile", playwright_instance, webgpu=False)
    try:
        page = open_chat(without, chat_server.url).open()
        adapter = page.page.evaluate("async () => String(await navigator.gpu?.requestAdapter())")
        got = page.state()
        actions = page.offered()
        row = page.page.inner_text(f"#conversations li[data-name='{saved['conversation']}']")
    finally:
        without.close()
    assert adapter in ("null", "undefined")
    assert got["problem"]["kind"] == "webgpu" and got["problem"]["title"] == "No WebGPU in this browser"
    assert "navigator.gpu" in got["problem"]["message"] and "WebGPU adapter" in got["problem"]["message"]
    assert actions == set() and got["model"] is None
    assert [r["name"] for r in got["conversations"]] == [saved["conversation"]] and PROMPT in row


def test_a_missing_model_file_is_named_with_the_install_hint_and_saved_conversations_stay_listed(page, chat_server):
    saved = page.reply_to(PROMPT)
    chat_server.remove_model()
    page.page.reload()
    page.settle()
    got = page.state()
    message = got["problem"]["message"]
    assert got["problem"]["kind"] == "model-missing" and got["problem"]["title"] == "The model cannot be loaded"
    assert str(chat_server.model_path) in message and INSTALL_HINT in message, message
    assert page.offered() == {"retry"} and got["model"] is None
    assert [r["name"] for r in got["conversations"]] == [saved["conversation"]]


# ----- a conversation of another model --------------------------------------------------------------------------

@pytest.mark.parametrize("store", ["indexeddb", "opfs"])
def test_a_conversation_of_another_model_is_not_resumed_by_itself_and_continue_runs_it_again_with_this_model(
        chat_browser, chat_server, store):
    page = open_chat(chat_browser, chat_server.url).open(store=store, every=EVERY)
    page.configure(max_tokens=TOKENS)
    held = cut(page)
    chat_server.use_tiny(**OTHER_MODEL)
    page.page.reload()
    page.settle()
    opened = page.state()
    listed = page.conversation(held["conversation"])
    page.open_conversation(held["conversation"])
    problem = page.state()["problem"]
    actions = page.offered()
    page.page.click("#replay")
    got = resumed(page)
    assert opened["restored"] is None and listed["same_model"] is False
    assert problem["kind"] == "model" and problem["title"] == "This conversation was written by another model"
    assert actions == {"replay"}
    assert got["restored"]["kv_restored"] is False and got["restored"]["reason"] == "model"
    assert "another model's" in got["restored"]["message"]
    assert got["replyIds"][:8] == held["replyIds"][:8] and len(got["replyIds"]) == TOKENS  # the new model went on
    assert got["committed"]["store"].startswith({"indexeddb": "IndexedDB", "opfs": "OPFS"}[store])


# ----- damaged or partial records -------------------------------------------------------------------------------

@pytest.mark.parametrize("action, says", [("flip", "sha256"), ("delete", "missing")],
                         ids=["a-changed-chunk", "a-missing-chunk"])
def test_a_damaged_chunk_is_replaced_by_running_the_saved_tokens_again_to_the_uninterrupted_tokens(
        page, want, action, says):
    held = cut(page)
    _, chunks = newest_manifest(page, held["conversation"])
    edit_record(page, chunks[0], action)
    page.reopen()
    got = resumed(page)
    restored = got["restored"]
    shown = page.page.inner_text("#restored-text")
    assert restored["kv_restored"] is False and restored["reason"] == "corrupt"
    assert says in restored["message"].lower() and chunks[0].split("/")[1][:16] in restored["message"]
    assert "could not be used" in shown and "were run again" in shown
    assert got["replyIds"] == want


def test_an_unreadable_newest_manifest_offers_the_generation_before_which_continues_to_the_uninterrupted_tokens(
        page, want):
    held = cut(page)
    newest, _ = newest_manifest(page, held["conversation"])
    edit_record(page, newest, "garbage")
    page.reopen()
    listed = page.conversation(held["conversation"])
    page.open_conversation(held["conversation"])
    problem = page.state()["problem"]
    label = page.page.inner_text("#replay")
    page.page.click("#replay")
    got = resumed(page)
    older = int(newest.rsplit("/", 1)[1]) - 1
    assert listed["error"] is not None and page.state()["conversation"] == held["conversation"]
    assert problem["kind"] == "record" and problem["title"] == "This checkpoint cannot be read"
    assert newest in problem["message"]
    assert page.offered() == set() and label.startswith(f"Resume generation {older} (")
    assert got["restored"]["kv_restored"] is True and got["restored"]["generation"] == older
    assert got["replyIds"] == want


def test_a_turn_whose_stored_kv_cannot_be_used_shows_the_engines_notice_beside_the_reply(page):
    first = page.reply_to(PROMPT)
    _, chunks = newest_manifest(page, first["conversation"])
    for key in chunks:
        edit_record(page, key, "flip")
    page.restart_engine(every=EVERY)  # a new engine: its next turn reads the K/V from the store
    page.open_conversation(first["conversation"])
    assert page.page.is_hidden("#reply-warnings")
    got = page.reply_to("and the wind?")
    notice = page.page.inner_text("#reply-warnings")
    assert got["conversation"] == first["conversation"] and got["replyIds"]
    assert page.page.is_visible("#reply-warnings")
    assert notice.startswith("Note: ") and "cannot be used" in notice and "instead" in notice
    assert page.page.eval_on_selector("#reply-warnings", "e => e.children.length") == 0  # text only


# ----- a full storage quota -------------------------------------------------------------------------------------

QUOTA_MARGIN = 256 * 1024  # the first checkpoints fit, the store's growth soon does not


@pytest.fixture
def full_quota_page(chat_browser, chat_server, request):
    """The page on an origin of its own (a name under .localhost) whose quota, set before its first write, is
    its usage plus QUOTA_MARGIN: IndexedDB grants writes from the free space it last asked for during up to 30 s,
    so an origin that wrote before would not see the new quota. ``lift()`` gives the browser's quota back."""
    label = hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:12]
    page = open_chat(chat_browser, chat_server.url.replace("127.0.0.1", f"q{label}.localhost"))
    cdp = chat_browser.context.new_cdp_session(page.page)
    page.open(every=EVERY)  # lists the (empty) store: nothing written yet
    page.configure(max_tokens=TOKENS * 4)
    origin = page.page.evaluate("location.origin")
    usage = cdp.send("Storage.getUsageAndQuota", {"origin": origin})["usage"]
    cdp.send("Storage.overrideQuotaForOrigin", {"origin": origin, "quotaSize": usage + QUOTA_MARGIN})
    page.lift = lambda: cdp.send("Storage.overrideQuotaForOrigin", {"origin": origin})
    yield page
    page.lift()


def run_into_the_quota(page: ChatPage) -> tuple[dict, dict]:
    """A reply that runs until an autosave fails, and on to its end; the state then, and at the end."""
    page.send(PROMPT)
    page.wait("d => d.problem !== null")
    failed = page.state()
    page.wait("d => d.phase === 'ready' && d.finishReason !== null")
    return failed, page.state()


def test_an_autosave_over_the_quota_shows_the_problem_and_the_reply_goes_on(full_quota_page):
    page = full_quota_page
    failed, ended = run_into_the_quota(page)
    assert failed["problem"]["kind"] == "quota" and failed["problem"]["title"] == "Saving failed"
    assert "quota" in failed["problem"]["message"] and "IndexedDB 'kvckpt-demo'" in failed["problem"]["message"]
    assert failed["committed"] is not None and len(ended["replyIds"]) == TOKENS * 4
    assert ended["committed"]["generation"] == failed["committed"]["generation"]  # nothing committed since


def test_the_checkpoint_committed_before_the_quota_ran_out_continues_to_the_same_tokens(full_quota_page):
    page = full_quota_page
    failed, ended = run_into_the_quota(page)
    page.page.reload()  # the worker ends as in a crash: the reply's last commit is mid-way
    got = resumed(page)
    assert got["conversation"] == failed["conversation"]
    assert got["restored"]["kv_restored"] is True and got["restored"]["generation"] == failed["committed"]["generation"]
    assert got["replyIds"] == ended["replyIds"]


def test_once_the_quota_is_lifted_the_next_autosave_commits_and_the_problem_goes(full_quota_page):
    page = full_quota_page
    failed, _ = run_into_the_quota(page)
    page.lift()
    page.configure(max_tokens=TOKENS)
    got = page.reply_to("and the wind?")
    assert got["problem"] is None and got["committed"]["generation"] > failed["committed"]["generation"]
    assert page.conversation(failed["conversation"])["finished"] is True


# ----- a send that is refused --------------------------------------------------------------------------------

@pytest.mark.parametrize("field, value, says, good", [
    ("#temperature", "5", "temperature: expected a number in [0.05, 2], got 5", "0.8"),
    ("#seed", "-1", "seed: expected an integer >= 0, got -1", "3"),
    ("#max-tokens", "", "max tokens: expected an integer in [1, 900], got nothing", str(TOKENS)),
    ("#max-tokens", "901", "max tokens: expected an integer in [1, 900], got 901", str(TOKENS)),
], ids=["temperature-5", "seed-minus-1", "empty-max-tokens", "max-tokens-over-its-max"])
def test_a_refused_send_keeps_the_text_in_the_box_and_the_history_as_it_was_and_the_next_send_answers(
        page, field, value, says, good):
    first = page.reply_to(PROMPT)
    page.configure(max_tokens=TOKENS, seed=3)
    page.page.fill(field, value)
    page.send("and the wind?")
    page.wait("d => d.problem !== null")
    refused = page.state()
    box = page.page.input_value("#prompt")
    page.page.fill(field, good)
    page.page.click("#send")
    page.wait("d => d.phase === 'ready' && d.finishReason !== null && d.messages.length === 4")
    got = page.state()
    assert refused["problem"]["message"] == says and box == "and the wind?"
    assert refused["messages"] == first["messages"] and refused["finishReason"] == first["finishReason"]
    assert [m["role"] for m in got["messages"]] == ["user", "assistant"] * 2
    assert got["messages"][2]["content"] == "and the wind?" and got["conversation"] == first["conversation"]


def test_a_message_over_the_context_says_the_conversation_is_full_keeps_it_as_it_was_and_offers_a_new_one(page):
    first = page.reply_to(PROMPT)
    too_long = "the sea " * 2000
    page.send(too_long)
    page.wait("d => d.problem !== null")
    full = page.state()
    actions = page.offered()
    box = page.page.input_value("#prompt")
    page.page.click("#new-conversation")
    page.wait("d => d.conversation === null && d.messages.length === 0")
    listed = page.conversation(first["conversation"])
    assert full["problem"]["kind"] == "full" and full["problem"]["title"] == "This conversation is full"
    assert "context" in full["problem"]["message"] and actions == {"new-conversation"}
    assert full["messages"] == first["messages"] and box == too_long
    assert listed["finished"] is True and listed["tokens"] == first["usage"]["prompt_tokens"] + TOKENS
