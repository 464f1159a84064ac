"""``kvckpt chat`` in a real terminal (tmux): keys typed, the screen read back, ``kill -9`` and Ctrl-C sent.

The model is the tiny random llama GGUF (tests/model/tiny_llama.py; its replies are random bytes, shown with
their control characters made visible), and SmolLM2 in one test. Where a test stops a reply (``kill -9``,
Ctrl-C), it runs the command through tests/cli/chat_paused.py, which stops after the reply's k-th piece of
text until a signal comes, so the point is the test's choice, not the clock's.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path

import pytest

import kvckpt_web
from chat_paused import PAUSED
from chat_records import saved, statuses
from tmux_terminal import Tmux, Window

ROOT = Path(kvckpt_web.__file__).resolve().parents[1]
PAUSING = Path(__file__).with_name("chat_paused.py")
STORY = "tell me a story about the sea."
SEEDED = ["--temperature", "0.7", "--seed", "1", "--max-tokens", "40", "--autosave-every", "8"]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    sys.path.insert(0, str(ROOT / "tests" / "model"))
    from tiny_llama import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


@pytest.fixture(scope="module")
def tmux(device):
    """A tmux server of this module's own (skipped without tmux, unless KVCKPT_REQUIRE_GPU=1: CI installs it)."""
    if shutil.which("tmux") is None:
        if os.environ.get("KVCKPT_REQUIRE_GPU") == "1":
            pytest.fail("KVCKPT_REQUIRE_GPU=1 but tmux is not installed (make setup installs it)", pytrace=False)
        pytest.skip("tmux is not installed (apt-get install tmux; make setup installs it)")
    server = Tmux()
    yield server
    server.close()


def start(tmux: Tmux, model: Path, store: Path, *args: str, pause_after: int | None = None) -> Window:
    """``kvckpt chat --model MODEL --store STORE ARGS`` in a new window, once its prompt is there."""
    command = [sys.executable, str(PAUSING), str(pause_after)] if pause_after else [sys.executable, "-m",
                                                                                   "kvckpt_web.cli"]
    env = {"PYTHONPATH": str(ROOT), "XDG_RUNTIME_DIR": os.environ.get("XDG_RUNTIME_DIR", "/tmp")}
    window = tmux.start([*command, "chat", "--model", str(model), "--store", str(store), *args], env)
    window.wait(at_prompt, "the chat's prompt")
    return window


def at_prompt(screen: str) -> bool:
    return screen.splitlines()[-1:] == ["you>"]


def say(window: Window, text: str) -> str:
    """Send ``text`` and wait for its reply to end; the screen then."""
    replies = len(statuses(window.screen()))
    window.send(text)
    return window.wait(lambda s: len(statuses(s)) > replies and at_prompt(s), f"the reply to {text!r}")


def reply_to(screen: str, message: str) -> str:
    """The reply shown after the last ``you> message`` line of ``screen``, up to its status line."""
    lines = screen.splitlines()
    start = len(lines) - lines[::-1].index(f"you> {message}")
    end = next(i for i in range(start, len(lines)) if statuses(lines[i]))
    return "\n".join(lines[start:end])


def transcript(screen: str) -> list[str]:
    """The chat's lines from its first message on, without the status lines and the prompt at the end."""
    lines = screen.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("you> "))
    return [line for line in lines[first:-1] if not statuses(line)]


@pytest.fixture(scope="module")
def uninterrupted(tmux, tiny_model, tmp_path_factory) -> tuple[list[int], str]:
    """The seeded reply to STORY of a chat nobody stopped: its token ids and how the screen shows it."""
    store = tmp_path_factory.mktemp("uninterrupted") / "chats"
    window = start(tmux, tiny_model, store, *SEEDED)
    screen = say(window, STORY)
    window.send("/exit")
    assert window.exit_status() == 0
    (record,) = saved(store).values()
    assert record.finished and len(record.saved.generated) > 20  # long enough to stop after 20 pieces of text
    return record.saved.generated, reply_to(screen, STORY)


# ----- turns --------------------------------------------------------------------------------------


def test_a_second_turn_reuses_the_history_in_the_cache_and_exit_ends_with_status_0(tmux, tiny_model, tmp_path):
    window = start(tmux, tiny_model, tmp_path / "chats", "--max-tokens", "24")
    say(window, "hello")
    first, second = statuses(say(window, "what is the weather there?"))
    history = int(first["prompt"]) + int(first["reply"]) - 1  # the reply's last token runs with the next turn
    assert int(second["cached"]) == history and not second["restored"]
    assert int(second["prefilled"]) == int(second["prompt"]) - history
    window.send("/exit")
    assert window.exit_status() == 0
    (record,) = saved(tmp_path / "chats").values()
    assert [m.content for m in record.chat.messages] == ["hello", record.chat.messages[1].content,
                                                        "what is the weather there?"]


def test_reopening_a_conversation_prints_its_history_and_restores_its_kv_from_the_store(tmux, tiny_model, tmp_path):
    args = (tiny_model, tmp_path / "chats", "--conversation", "talk", "--max-tokens", "24")
    first = start(tmux, *args)
    say(first, "hello")
    before = say(first, "what is the weather there?")
    first.keys("C-d")
    assert first.exit_status() == 0
    again = start(tmux, *args)
    assert transcript(again.screen()) == transcript(before)
    assert "talk: 4 messages" in again.screen()
    last = statuses(before)[-1]
    status = statuses(say(again, "and the sea?"))[-1]
    assert status["restored"] and int(status["cached"]) == int(last["prompt"]) + int(last["reply"]) - 1


def test_edit_starts_from_the_message_as_it_was_and_sends_it_as_edited(tmux, tiny_model, tmp_path):
    window = start(tmux, tiny_model, tmp_path / "chats", "--max-tokens", "8")
    say(window, "hello")
    window.send("/edit")
    window.wait(lambda s: s.splitlines()[-1] == "edit> hello", "the last message to edit")
    window.send(" there")  # typed after the text in place
    window.wait(lambda s: len(statuses(s)) == 2 and at_prompt(s), "the reply to the edited message")
    users = sorted(r.chat.messages[-1].content for r in saved(tmp_path / "chats").values())
    assert users == ["hello", "hello there"]


# ----- crashes and interrupts ---------------------------------------------------------------------


def stopped_mid_reply(tmux: Tmux, model: Path, store: Path, pieces: int) -> Window:
    """A seeded chat whose reply to STORY stopped after its ``pieces``-th piece of text (until a signal)."""
    window = start(tmux, model, store, *SEEDED, pause_after=pieces)
    window.send(STORY)
    window.wait(lambda s: PAUSED in s, "the reply to stop mid-way")
    return window


def test_after_kill_9_mid_reply_the_same_command_continues_the_reply_as_an_uninterrupted_run(
        tmux, tiny_model, tmp_path, uninterrupted):
    ids, shown = uninterrupted
    store = tmp_path / "chats"
    killed = stopped_mid_reply(tmux, tiny_model, store, 20)
    os.kill(killed.pid, signal.SIGKILL)
    killed.exit_status()
    (cut,) = saved(store).values()
    assert cut.saved.finish_reason is None and 0 < len(cut.saved.generated) < len(ids)
    again = start(tmux, tiny_model, store, *SEEDED)  # the same command
    screen = again.screen()
    status = statuses(screen)[-1]
    assert int(status["resumed"]) == len(cut.saved.generated) and status["restored"] and status["end"] == "token limit"
    assert reply_to(screen, STORY) == shown
    assert saved(store)[cut.name].saved.generated == ids


def test_ctrl_c_mid_reply_stops_it_at_the_prompt_and_continue_finishes_it_as_an_uninterrupted_run(
        tmux, tiny_model, tmp_path, uninterrupted):
    ids, _ = uninterrupted
    store = tmp_path / "chats"
    window = stopped_mid_reply(tmux, tiny_model, store, 10)
    window.keys("C-c")
    screen = window.wait(lambda s: statuses(s) and at_prompt(s), "the prompt after Ctrl-C")
    assert statuses(screen)[-1]["end"] == "interrupted: /continue goes on"
    (cut,) = saved(store).values()
    assert cut.saved.finish_reason is None and len(cut.saved.generated) < len(ids)
    status = statuses(say(window, "/continue"))[-1]
    assert status["resumed"] and status["end"] == "token limit"
    assert saved(store)[cut.name].saved.generated == ids


def test_ctrl_c_at_the_prompt_ends_the_chat_with_one_line_and_status_130(tmux, tiny_model, tmp_path):
    window = start(tmux, tiny_model, tmp_path / "chats")
    window.keys("C-c")
    assert window.exit_status() == 130
    screen = window.screen()
    assert screen.splitlines()[-2:] == ["you>", "kvckpt: interrupted"]
    assert "Traceback" not in screen


# ----- the real model -----------------------------------------------------------------------------


@pytest.mark.real_model
def test_smollm2_chats_two_turns_the_second_reusing_the_first(tmux, smollm_path, tmp_path):
    window = start(tmux, smollm_path, tmp_path / "chats", "--max-tokens", "16")
    screen = say(window, "What is the capital of France?")
    assert "Paris" in reply_to(screen, "What is the capital of France?")
    first, second = statuses(say(window, "And of Italy?"))
    assert int(second["cached"]) == int(first["prompt"]) + int(first["reply"]) - 1
    window.send("/exit")
    assert window.exit_status() == 0
