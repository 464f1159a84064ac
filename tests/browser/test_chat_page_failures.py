"""The crash-resume page (examples/crash_resume) when something goes wrong: no WebGPU, a checkpoint of another
model, a damaged, partial or unreadable record, a full storage quota, no model file. Each time the page says
what happened, offers what can be done (``#replay``, ``#fresh``, ``#retry-save``), and the last good checkpoint
stays: listed, and where it applies, continued to the tokens of an uninterrupted run (the tiny random llama)."""

from __future__ import annotations

import hashlib
import re

import pytest

from kvckpt_web.model.loader import INSTALL_HINT

from .browser_harness import CDPChromium
from .demo_page import DemoPage, edit_record, open_demo, stored_records

TOKENS, EVERY, CRASH_AFTER = 32, 8, 12
OTHER_MODEL = {"seed": 1}  # other weights, the same shapes and header: another model identity
ACTIONS = ("replay", "fresh", "retry-save")


def offered(page: DemoPage) -> set[str]:
    """The problem's action buttons a person sees."""
    return {a for a in ACTIONS if page.page.is_visible(f"#{a}")}


def crash_midway(page: DemoPage, store: str = "indexeddb") -> dict:
    """Generate with the test's settings, then the page's crash control once a checkpoint is committed and
    tokens were generated after it; the state at the crash."""
    page.configure(max_tokens=TOKENS, every=EVERY, store=store)
    page.generate()
    page.wait(f"d => d.tokens >= {CRASH_AFTER} && d.committed !== null")
    page.page.click("#crash")
    page.wait("d => d.phase === 'crashed'")
    return page.state()


def listed(state: dict, name: str) -> dict:
    rows = [row for row in state["conversations"] if row["name"] == name]
    assert rows, f"{name} is not listed: {state['conversations']}"
    return rows[0]


def newest_manifest(page: DemoPage, name: str) -> tuple[str, list[str]]:
    """The key of the newest manifest of ``name`` and the chunk keys it references."""
    records = stored_records(page)
    key = max(k for k in records if k.startswith(f"manifests/{name}/"))
    return key, sorted({f"chunks/{h}" for h in re.findall(r'"sha256":"([0-9a-f]{64})"', records[key])})


@pytest.fixture
def browser(browser_prereqs, playwright_instance, tmp_path):
    chromium = CDPChromium(browser_prereqs["chromium"], tmp_path / "profile", playwright_instance)
    yield chromium
    chromium.close()


# ----- no WebGPU ---------------------------------------------------------------------------------------------

def test_without_webgpu_the_page_says_so_and_still_lists_the_saved_conversations(
        browser_prereqs, playwright_instance, demo_server, tmp_path):
    with_gpu = CDPChromium(browser_prereqs["chromium"], tmp_path / "profile", playwright_instance)
    try:
        page = open_demo(with_gpu, demo_server.url).open()
        page.configure(max_tokens=TOKENS, every=EVERY)
        saved = page.run_to_end()
    finally:
        with_gpu.close()
    without = CDPChromium(browser_prereqs["chromium"], tmp_path / "profile", playwright_instance, webgpu=False)
    try:
        page = open_demo(without, demo_server.url).open()
        adapter = page.page.evaluate("async () => String(await navigator.gpu?.requestAdapter())")
        got = page.state()
        actions = offered(page)
    finally:
        without.close()
    assert adapter in ("null", "undefined")
    assert got["problem"]["kind"] == "webgpu" and got["problem"]["title"] == "No WebGPU in this browser"
    assert "navigator.gpu" in got["problem"]["message"] and "WebGPU adapter" in got["problem"]["message"]
    assert actions == set() and got["model"] is None
    assert listed(got, saved["name"])["generation"] == saved["committed"]["generation"]


# ----- a checkpoint of another model ---------------------------------------------------------------------------

@pytest.mark.parametrize("store", ["indexeddb", "opfs"])
def test_a_checkpoint_of_another_model_offers_replay_which_continues_the_saved_reply_with_the_new_model(
        browser, demo_server, store):
    page = open_demo(browser, demo_server.url).open()
    page.configure(max_tokens=TOKENS, every=EVERY, store=store)
    first_model = page.run_to_end()
    crash_midway(page, store)
    demo_server.use_tiny(**OTHER_MODEL)
    page.page.reload()  # the page takes the store it remembered
    page.wait("d => d.problem !== null")
    problem = page.state()
    actions = offered(page)
    page.page.click("#replay")
    page.wait("d => d.phase === 'finished'")
    got = page.state()
    assert page.page.input_value("#store") == store
    assert problem["problem"]["kind"] == "model"
    assert problem["problem"]["title"] == "This checkpoint was written by another model"
    assert "app_state.model" in problem["problem"]["message"] and "another model" in problem["problem"]["message"]
    assert actions == {"replay", "fresh"}
    saved_text = got["restored"]["text"]
    assert got["restored"]["kvRestored"] is False and got["restored"]["reason"] == "model"
    assert saved_text and first_model["reply"].startswith(saved_text)  # what the first model wrote is kept
    assert got["reply"].startswith(saved_text) and len(got["generated"]) == TOKENS  # the new model went on


def test_starting_fresh_after_a_checkpoint_of_another_model_keeps_that_conversation_listed(browser, demo_server):
    page = open_demo(browser, demo_server.url).open()
    crashed = crash_midway(page)
    demo_server.use_tiny(**OTHER_MODEL)
    page.page.click("#fresh")  # "Reopen": a new worker, as a reopened tab
    page.wait("d => d.problem !== null && d.problem.kind === 'model'")
    page.page.click("#fresh")
    page.page.click("#refresh")
    page.wait(f"d => d.problem === null && d.phase === 'ready' && d.conversations.length > 0")
    got = page.state()
    assert listed(got, crashed["name"])["generation"] == crashed["committed"]["generation"]
    assert not page.page.is_visible("#problem")


# ----- damaged or partial records -------------------------------------------------------------------------------

@pytest.mark.parametrize("action, says", [("flip", "sha256"), ("delete", "missing")],
                         ids=["a-changed-chunk", "a-missing-chunk"])
def test_a_damaged_checkpoint_offers_replay_which_continues_to_the_uninterrupted_tokens(
        browser, demo_server, action, says):
    page = open_demo(browser, demo_server.url).open()
    page.configure(max_tokens=TOKENS, every=EVERY)
    want = page.run_to_end()
    crashed = crash_midway(page)
    _, chunks = newest_manifest(page, crashed["name"])
    edit_record(page, chunks[0], action)
    page.page.click("#fresh")  # "Reopen"
    page.wait("d => d.problem !== null")
    problem = page.state()["problem"]
    actions = offered(page)
    page.page.click("#replay")
    page.wait("d => d.phase === 'finished'")
    got = page.state()
    assert problem["kind"] == "corrupt" and problem["title"] == "This checkpoint is damaged or incomplete"
    assert says in problem["message"].lower() and chunks[0].split("/")[1][:16] in problem["message"]
    assert actions == {"replay", "fresh"}
    assert listed(got, crashed["name"])
    assert got["restored"]["kvRestored"] is False and got["restored"]["reason"] == "corrupt"
    assert got["generated"] == want["generated"] and got["reply"] == want["reply"]


def test_an_unreadable_newest_manifest_offers_the_older_generation_which_continues_to_the_uninterrupted_tokens(
        browser, demo_server):
    page = open_demo(browser, demo_server.url).open()
    page.configure(max_tokens=TOKENS, every=EVERY)
    want = page.run_to_end()
    crashed = crash_midway(page)
    newest, _ = newest_manifest(page, crashed["name"])
    edit_record(page, newest, "garbage")
    page.page.click("#fresh")  # "Reopen"
    page.wait("d => d.problem !== null")
    problem = page.state()["problem"]
    actions = offered(page)
    label = page.page.inner_text("#replay")
    page.page.click("#replay")
    page.wait("d => d.phase === 'finished'")
    got = page.state()
    older = crashed["committed"]["generation"] - 1
    assert problem["kind"] == "record" and problem["title"] == "This checkpoint cannot be read"
    assert newest in problem["message"]
    assert actions == {"replay", "fresh"} and label.startswith(f"Resume generation {older} (")
    assert got["restored"]["kvRestored"] is True and got["restored"]["generation"] == older
    assert got["generated"] == want["generated"] and got["reply"] == want["reply"]


# ----- a full storage quota -------------------------------------------------------------------------------------

QUOTA_MARGIN = 160 * 1024  # the first checkpoint fits (about 60 KiB), the store's growth soon does not


@pytest.fixture
def full_quota_page(browser, demo_server, request):
    """The page on an origin of its own (a name under .localhost) whose quota, set before its first write, is
    its usage plus QUOTA_MARGIN: IndexedDB grants writes from the free space it last asked for during up to 30 s,
    so an origin that wrote before would not see the new quota. ``lift()`` gives the browser's quota back."""
    label = hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:12]
    page = open_demo(browser, demo_server.url.replace("127.0.0.1", f"q{label}.localhost"))
    cdp = browser.context.new_cdp_session(page.page)
    page.open()  # lists the (empty) store: nothing written yet
    origin = page.page.evaluate("location.origin")
    usage = cdp.send("Storage.getUsageAndQuota", {"origin": origin})["usage"]
    cdp.send("Storage.overrideQuotaForOrigin", {"origin": origin, "quotaSize": usage + QUOTA_MARGIN})
    page.lift = lambda: cdp.send("Storage.overrideQuotaForOrigin", {"origin": origin})
    yield page
    page.lift()


def run_into_the_quota(page: DemoPage) -> tuple[dict, dict]:
    """Generate until an autosave fails; the state then, and once the generation ended."""
    page.configure(max_tokens=TOKENS * 3, every=EVERY)
    page.generate()
    page.wait("d => d.problem !== null")
    failed = page.state()
    page.wait("d => d.phase === 'finished'")
    return failed, page.state()


def test_an_autosave_over_the_quota_shows_the_problem_and_the_generation_goes_on(full_quota_page):
    failed, ended = run_into_the_quota(full_quota_page)
    page = full_quota_page
    assert failed["problem"]["kind"] == "quota" and failed["problem"]["title"] == "Saving failed"
    assert "quota" in failed["problem"]["message"] and failed["committed"] is not None
    assert offered(page) == {"retry-save"}
    assert len(ended["generated"]) == TOKENS * 3
    assert listed(ended, failed["name"])["generation"] == failed["committed"]["generation"]


def test_the_checkpoint_committed_before_the_quota_ran_out_continues_to_the_uninterrupted_tokens(full_quota_page):
    page = full_quota_page
    failed, ended = run_into_the_quota(page)
    page.page.click("#crash")
    page.page.click("#fresh")  # "Reopen": continues the unfinished conversation from its committed generation
    page.wait("d => d.restored !== null && d.phase === 'finished'")
    got = page.state()
    assert got["name"] == failed["name"]
    assert got["restored"]["kvRestored"] is True and got["restored"]["generation"] == failed["committed"]["generation"]
    assert got["generated"] == ended["generated"]


def test_retry_saving_after_the_quota_is_lifted_commits_a_new_generation(full_quota_page):
    page = full_quota_page
    failed, ended = run_into_the_quota(page)
    page.lift()
    page.page.click("#retry-save")
    page.wait(f"d => d.committed.generation > {failed['committed']['generation']}")
    page.page.click("#refresh")
    page.wait(f"d => d.conversations.some(r => r.name === '{failed['name']}' && r.finishReason === 'length')")
    got = page.state()
    assert got["problem"] is None
    assert listed(got, failed["name"])["generation"] == got["committed"]["generation"]


# ----- no model file -----------------------------------------------------------------------------------------

def test_a_missing_model_file_is_named_with_the_install_hint_and_saved_conversations_stay_listed(
        browser, demo_server):
    page = open_demo(browser, demo_server.url).open()
    page.configure(max_tokens=TOKENS, every=EVERY)
    saved = page.run_to_end()
    demo_server.remove_model()
    page.open()
    got = page.state()
    assert got["problem"]["kind"] == "model-missing" and got["problem"]["title"] == "The model cannot be loaded"
    message = got["problem"]["message"]
    assert str(demo_server.model_path) in message and INSTALL_HINT in message, message
    assert offered(page) == set() and got["model"] is None
    assert listed(got, saved["name"])["generation"] == saved["committed"]["generation"]
