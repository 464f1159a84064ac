"""The crash-resume page (examples/crash_resume) with the tiny random llama: a reply interrupted by a killed
browser or by the page's crash control continues, on reopening, to the tokens of an uninterrupted run."""

from __future__ import annotations

import os

import pytest

from .browser_harness import CDPChromium
from .demo_page import REPO, open_demo

TOKENS, EVERY, KILL_AFTER = 48, 8, 20
SHOTS = REPO / "build" / "screenshots"


def uninterrupted(browser_prereqs, playwright_instance, url, tmp_path, max_tokens=TOKENS, **settings) -> dict:
    browser = CDPChromium(browser_prereqs["chromium"], tmp_path / "clean-profile", playwright_instance)
    try:
        page = open_demo(browser, url).open()
        page.configure(max_tokens=max_tokens, every=EVERY, **settings)
        return page.run_to_end()
    finally:
        browser.close()


@pytest.fixture(params=["tiny", pytest.param("smollm", marks=pytest.mark.real_model)])
def served_model(request, demo_server):
    """The model the demo server serves: the tiny random llama, or the real SmolLM2 (a shorter reply)."""
    if request.param == "smollm":
        demo_server.use_file(request.getfixturevalue("smollm_path"))
        return {"name": "smollm", "tokens": 24, "kill_after": 10}
    return {"name": "tiny", "tokens": TOKENS, "kill_after": KILL_AFTER}


def test_a_reply_killed_with_the_browser_continues_after_relaunch_to_the_uninterrupted_tokens(
        browser_prereqs, playwright_instance, demo_server, served_model, tmp_path):
    tokens, kill_after = served_model["tokens"], served_model["kill_after"]
    want = uninterrupted(browser_prereqs, playwright_instance, demo_server.url, tmp_path, max_tokens=tokens, seed=7)
    profile = tmp_path / "profile"
    browser = CDPChromium(browser_prereqs["chromium"], profile, playwright_instance)
    try:
        page = open_demo(browser, demo_server.url).open()
        page.configure(max_tokens=tokens, every=EVERY, seed=7)
        page.generate()
        page.wait(f"d => d.tokens >= {kill_after} && d.committed !== null")
        shot = SHOTS / f"crash_resume-{served_model['name']}.png"
        shot.parent.mkdir(parents=True, exist_ok=True)
        page.page.screenshot(path=str(shot), full_page=True)
        if served_model["name"] == "smollm" and os.environ.get("KVCKPT_UPDATE_SCREENSHOT") == "1":
            (REPO / "docs" / "crash_resume.png").write_bytes(shot.read_bytes())  # README's picture, from this run
        killed_at = page.state()["tokens"]
    finally:
        browser.kill()  # SIGKILL: no unload handler, no save
    assert killed_at < tokens

    browser = CDPChromium(browser_prereqs["chromium"], profile, playwright_instance)
    try:
        page = open_demo(browser, demo_server.url).open()
        page.wait("d => d.phase === 'finished'")
        got = page.state()
    finally:
        browser.close()
    assert got["restored"]["kvRestored"] is True and got["restored"]["tokens"] > 0
    assert got["generated"] == want["generated"] and got["reply"] == want["reply"]


def test_the_crash_control_terminates_the_worker_and_reopening_continues_to_the_uninterrupted_tokens(
        browser_prereqs, playwright_instance, demo_server, tmp_path):
    want = uninterrupted(browser_prereqs, playwright_instance, demo_server.url, tmp_path)
    browser = CDPChromium(browser_prereqs["chromium"], tmp_path / "profile", playwright_instance)
    try:
        page = open_demo(browser, demo_server.url).open()
        page.configure(max_tokens=TOKENS, every=EVERY)
        page.crash_and_reopen(after_tokens=KILL_AFTER)
        page.wait("d => d.phase === 'finished'")
        got = page.state()
    finally:
        browser.close()
    assert got["restored"]["kvRestored"] is True
    assert got["generated"] == want["generated"] and got["reply"] == want["reply"]


def test_a_restore_shows_its_time_beside_a_measured_re_prefill_of_the_same_tokens(
        browser_prereqs, playwright_instance, demo_server, tmp_path):
    browser = CDPChromium(browser_prereqs["chromium"], tmp_path / "profile", playwright_instance)
    try:
        page = open_demo(browser, demo_server.url).open()
        page.configure(max_tokens=TOKENS, every=EVERY)
        page.crash_and_reopen(after_tokens=KILL_AFTER)
        page.wait("d => d.restored !== null")
        restored = page.state()["restored"]
        text = page.page.inner_text("#restored")
    finally:
        browser.close()
    assert restored["reprefillMs"] > 0 and restored["restoreMs"] > 0
    assert text.startswith(f"restored {restored['tokens']} tokens in ") and "re-prefill of the same" in text
