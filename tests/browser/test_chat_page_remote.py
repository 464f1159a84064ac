"""The chat page (examples/chat) continued on another device: two Chromium profiles (two devices) against one server
that serves the page and a store (``kvckpt serve --page examples/chat --store DIR --token T``). Profile A pushes a
multi-turn conversation ("Continue on another device"), profile B opens the link A shows, pulls the conversation and
continues it with the tokens A's uninterrupted run gives, its history restored from the store (cached_tokens), not
computed again; B's push after that turn sends only the new chunks. Copies that went apart (A and B each went on its
own way) are both kept, listed and offered, by a pull and by a push. A wrong token and a name the server lacks are
said so, with nothing written and a retry offered. The tiny random llama; every wait is on the page's state."""

from __future__ import annotations

import random
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from kvckpt_web.durable.catalog import load_manifest

from .browser_harness import CDPChromium, run_desktop
from .chat_page import ChatPage, chat_served, chromium_of, open_chat

from tiny_llama import CORPUS  # noqa: E402 - on sys.path through chat_page

TOKEN = "two-devices-one-store-token"
TOKENS, EVERY, SEED = 16, 8, 11  # seeded sampling: the random tiny model repeats one token when greedy
LONG = " ".join(random.Random(0).choice(CORPUS.split()) for _ in range(300))  # more than one chunk (256 tokens)


@pytest.fixture
def store_server(browser_prereqs, fresh_wheel, tmp_path):
    with chat_served(browser_prereqs, fresh_wheel, tmp_path, token=TOKEN) as served:
        yield served


@pytest.fixture
def other_browser(browser_prereqs, playwright_instance, tmp_path) -> Iterator[CDPChromium]:
    """The second device: a Chromium of another profile."""
    with chromium_of(browser_prereqs, playwright_instance, tmp_path / "profile-b") as chromium:
        yield chromium


def device(browser: CDPChromium, url: str, fragment: str = "") -> ChatPage:
    page = open_chat(browser, url).open(every=EVERY, fragment=fragment)
    page.configure(max_tokens=TOKENS, seed=SEED)
    return page


def served_generation(server, name: str) -> tuple[dict[str, int], int]:
    """The chunks (key: bytes) of ``name``'s newest generation in the served store, and the bytes of its manifest and
    prefix index records."""
    manifest, envelope = run_desktop(load_manifest(server.store, name))
    suffix = manifest.key.partition("/")[2]
    records = [k for k in run_desktop(server.store.list_prefix("prefixes/")) if k.endswith(suffix)]
    return ({r.key: r.nbytes for r in manifest.chunk_refs()},
            len(envelope) + sum(len(run_desktop(server.store.get(k))) for k in records))


def test_a_conversation_pushed_from_one_profile_is_pulled_in_another_and_continues_with_the_uninterrupted_tokens(
        chat_browser, other_browser, store_server):
    a = device(chat_browser, store_server.url)
    a.reply_to(LONG)
    name = a.reply_to("and then?")["conversation"]
    history = a.conversation(name)["tokens"]
    pushed = a.push(TOKEN)
    sent = pushed["device"]["pushed"]
    chunks, rest = served_generation(store_server, name)
    link = a.page.get_attribute("#pushed-link", "href")
    assert pushed["problem"] is None and history > 256
    assert (sent["name"], sent["chunks_sent"], sent["bytes_sent"]) == (name, len(chunks), sum(chunks.values()) + rest)
    assert name in a.page.inner_text("#pushed") and link.endswith(f"#pull={name}") and TOKEN not in link

    b = device(other_browser, store_server.url, "#" + urlsplit(link).fragment)
    named = b.page.input_value("#pull-name")
    pulled = b.pull(name, TOKEN)
    got = pulled["device"]["pulled"]
    assert named == name and pulled["problem"] is None and pulled["conversation"] == name
    assert (got["chunks_sent"], got["bytes_sent"]) == (sent["chunks_sent"], sent["bytes_sent"])
    assert pulled["messages"] == a.state()["messages"]  # its history shown

    theirs = b.reply_to("and the wind?")
    mine = a.reply_to("and the wind?")  # the run that never moved
    cached = theirs["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert theirs["conversation"] == name and theirs["replyIds"] == mine["replyIds"] and len(set(mine["replyIds"])) > 1
    assert cached == mine["usage"]["prompt_tokens_details"]["cached_tokens"] >= history - 16  # from the store
    assert theirs["usage"]["prompt_tokens"] == mine["usage"]["prompt_tokens"] < cached + 32  # the new turn prefilled
    assert f"({cached} from the cache or the store" in b.page.inner_text("#figures")

    again = b.push(TOKEN)["device"]["pushed"]  # after one more turn: only the new chunks
    newer, rest = served_generation(store_server, name)
    new = set(newer) - set(chunks)
    assert (again["chunks_sent"], again["chunks_present"]) == (len(new), len(newer) - len(new))
    assert again["bytes_sent"] == sum(newer[k] for k in new) + rest and 0 < len(new) < len(newer)


def test_a_wrong_token_is_said_so_nothing_is_written_and_retry_sends_the_conversation(chat_browser, store_server):
    a = device(chat_browser, store_server.url)
    a.reply_to("tell me about the sea.")
    failed = a.push("not-the-token-of-this-server")
    written = run_desktop(store_server.store.list_prefix(""))
    remembered = a.page.evaluate("localStorage.getItem('kvckpt-chat:store-token')")
    assert failed["problem"]["kind"] == "remote" and failed["problem"]["name"] == "StoreError"
    assert "refused the token" in a.page.inner_text("#problem-text") and failed["device"]["pushed"] is None
    assert written == [] and remembered is None and a.offered() == {"retry-push"}

    a.page.fill("#store-token", TOKEN)
    a.page.click("#retry-push")
    a.wait("d => d.device.busy === null && d.device.pushed !== null")
    assert a.state()["problem"] is None and run_desktop(store_server.store.list_prefix("manifests/"))
    assert a.page.evaluate("localStorage.getItem('kvckpt-chat:store-token')") == TOKEN


def test_pulling_a_name_the_server_does_not_hold_says_so_and_offers_retry(chat_browser, store_server):
    b = device(chat_browser, store_server.url)
    got = b.pull("chat-20260101-000000-abcdef", TOKEN)
    assert got["problem"]["title"] == "Not on the server" and got["problem"]["name"] == "NotFoundError"
    assert "chat-20260101-000000-abcdef" in b.page.inner_text("#problem-text") and b.offered() == {"retry-pull"}
    assert got["conversation"] is None and got["device"]["pulled"] is None and b.page.is_enabled("#pull")


def test_the_device_panel_fits_390_px_and_names_every_control(chat_browser, store_server):
    a = device(chat_browser, store_server.url)
    a.page.set_viewport_size({"width": 390, "height": 800})
    a.reply_to("tell me about the sea.")
    a.push(TOKEN)
    widths = a.page.evaluate("() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    assert a.page.is_visible("#pushed-link") and a.page.is_visible("#pull")
    assert widths[0] <= widths[1] <= 390
    assert a.page.is_visible("#store-token") and a.controls(chat_browser)[1] == []


def test_copies_that_went_apart_are_both_kept_listed_and_offered_by_pull_and_push(chat_browser, other_browser,
                                                                                  store_server):
    a = device(chat_browser, store_server.url)
    name = a.reply_to("tell me about the sea.")["conversation"]
    a.push(TOKEN)
    b = device(other_browser, store_server.url)
    b.pull(name, TOKEN)
    theirs = b.reply_to("and the wind?")["messages"]
    b.push(TOKEN)
    mine = a.reply_to("and the boats?")["messages"]  # each device went on its own way

    pulled = a.pull(name, TOKEN)
    kept = pulled["device"]["pulled"]["name"]
    assert pulled["problem"]["kind"] == "apart" and a.offered() == {"open-theirs", "open-mine"}
    assert kept.startswith(f"{name}.apart-") and kept in a.page.inner_text("#problem-text")
    assert pulled["conversation"] == name and pulled["messages"] == mine  # this device's copy stays as it was
    assert {name, kept} <= {row["name"] for row in pulled["conversations"]}
    a.page.click("#open-theirs")
    a.wait(f"d => d.conversation === {kept!r} && d.phase === 'ready'")
    assert a.state()["messages"] == theirs and a.state()["problem"] is None

    a.open_conversation(name)
    a.wait(f"d => d.conversation === {name!r} && d.phase === 'ready'")
    sent = a.push(TOKEN)["device"]["pushed"]  # this device's copy goes beside the server's, which stays
    assert sent["apart_from"] == name and sent["name"].startswith(f"{name}.apart-") and sent["name"] != kept
    assert f"both are kept there, this one as {sent['name']}" in a.page.inner_text("#pushed-text")
    assert run_desktop(load_manifest(store_server.store, name))[0].app_state["extra"]["messages"][-1]["content"] \
        == "and the wind?"
