"""``kvckpt chat``'s session in-process: what each line typed does to the conversations on screen and in the store.

The engine runs the K/V-honest double (tests/model/lm_double.py: a reused K/V that is wrong changes the tokens)
on a FileStore; the terminal is scripted (lines in, stdout and stderr captured). Each ``chat(...)`` call is one
process: its engine is closed at the end, as ``kvckpt chat`` closes it, and the next call opens a new one on
the same store. The real terminal (tmux), the tiny GGUF and SmolLM2 are in test_chat_terminal.py.
"""

from __future__ import annotations

import io
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvckpt_web.cli.chat_session import ChatSession
from kvckpt_web.cli.chat_terminal import Terminal
from kvckpt_web.engine import Engine, EngineConfig
from kvckpt_web.model.protocol import LoadedModel
from kvckpt_web.stores.file import FileStore

from chat_records import saved, statuses
from support.kvmodel import run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))
from lm_double import DoubleLM, DoubleText  # noqa: E402

ENGINE = EngineConfig(context=512, sequences=3, page_size=4, prefill_chunk=8, autosave_every=5, chunk_tokens=16)
GREEDY = {"temperature": 0.0, "max_tokens": 12}
SEEDED = {"temperature": 0.9, "seed": 3, "max_tokens": 20}


@dataclass
class Chat:
    """One chat process: what it printed, and the conversation on screen when it ended."""

    out: str
    err: str
    name: str | None


class Lines:
    """A scripted terminal's input: each line in turn, then the end of input (Ctrl-D)."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = list(lines)

    def __call__(self, prompt: str) -> str:
        if not self.lines:
            raise EOFError
        return self.lines.pop(0)


@pytest.fixture
def store(tmp_path) -> Path:
    return tmp_path / "chats"


@pytest.fixture
def chat(device, store):
    """``chat(lines, conversation=None, system=None, settings=GREEDY, stop_after=None, **engine)``: a chat
    process reading ``lines``; ``stop_after`` k presses Ctrl-C once the first reply has printed k pieces."""

    def start(lines, *, conversation=None, system=None, settings=GREEDY, stop_after=None, **engine_kwargs) -> Chat:
        engine = Engine(LoadedModel(DoubleLM(max_context=1024), DoubleText()), device, store=FileStore(store),
                        model_name="double", config=ENGINE.replace(**engine_kwargs))
        out, err = io.StringIO(), io.StringIO()
        terminal = Terminal(out, err, read=Lines(lines))
        session = ChatSession(engine, terminal, settings=dict(settings), system=system)
        if stop_after is not None:
            pieces, reply = [], terminal.reply

            def counted(text: str) -> None:
                reply(text)
                pieces.append(text)
                if len(pieces) == stop_after:
                    assert session.stop_reply()

            terminal.reply = counted

        async def whole() -> None:
            try:
                await session.run(conversation)
            finally:
                await engine.close()

        run(whole())
        return Chat(out.getvalue(), err.getvalue(), session.name)

    return start


def errors(chat: Chat) -> list[str]:
    return [line for line in chat.err.splitlines() if line.startswith("error: ")]


# ----- turns --------------------------------------------------------------------------------------


def test_a_second_message_continues_the_conversation_prefilling_only_its_own_tokens(chat, store):
    done = chat(["hello there", "tell me about the sea"])
    first, second = statuses(done.err)
    assert first["name"] == second["name"] == done.name and list(saved(store)) == [done.name]
    history = int(first["prompt"]) + int(first["reply"]) - 1  # the reply's last token is run by the next turn
    assert int(second["cached"]) == history
    assert int(second["prefilled"]) == int(second["prompt"]) - history
    assert [m.content for m in saved(store)[done.name].chat.messages if m.role == "user"] == ["hello there",
                                                                                              "tell me about the sea"]


def test_a_new_conversations_first_reply_is_saved_as_named_so_no_servers_retention_deletes_it(chat, store):
    done = chat(["hello there"])
    assert done.name.startswith("chat-") and saved(store)[done.name].chat.named


def test_the_reply_goes_to_stdout_and_its_status_line_to_stderr(chat, store):
    done = chat(["hello there"])
    reply = saved(store)[done.name]
    text = DoubleText().decode([t for t in reply.saved.generated if t != 0])
    assert done.out == text + "\n\n"  # the reply, then the line ended at the end of input
    assert len(statuses(done.err)) == 1 and errors(done) == []


def test_kv_in_the_store_that_cannot_be_used_are_a_warning_and_the_reply_goes_on(chat, store):
    chat(["hello there"], conversation="talk")
    for chunk in (store / "chunks").iterdir():
        data = bytearray(chunk.read_bytes())
        data[-1] ^= 0xFF
        chunk.write_bytes(bytes(data))
    again = chat(["and the wind?"], conversation="talk")
    warnings = [line for line in again.err.splitlines() if line.startswith("warning: ")]
    assert warnings and all("'talk' generation" in w and "prefilled the prompt instead" in w for w in warnings)
    assert errors(again) == [] and int(statuses(again.err)[-1]["cached"]) == 0
    assert [m.content for m in saved(store)["talk"].chat.messages if m.role == "user"] == ["hello there",
                                                                                          "and the wind?"]


def test_a_message_starting_with_two_slashes_is_sent_with_one(chat, store):
    done = chat(["//etc is a folder"])
    assert saved(store)[done.name].chat.messages[-1].content == "/etc is a folder"


# ----- opening ------------------------------------------------------------------------------------


def test_a_named_conversation_that_does_not_exist_is_begun_under_that_name(chat, store):
    chat(["hello there"], conversation="talk")
    assert list(saved(store)) == ["talk"]


def test_reopening_a_conversation_prints_its_history_and_restores_its_kv_from_the_store(chat, store):
    first = chat(["hello there"], conversation="talk")
    again = chat(["and the wind?"], conversation="talk")
    assert again.out.startswith("you> hello there\n" + first.out.rstrip("\n") + "\n")
    status = statuses(again.err)[-1]
    history = int(statuses(first.err)[0]["prompt"]) + int(statuses(first.err)[0]["reply"]) - 1
    assert status["restored"] and int(status["cached"]) == history


def test_without_a_name_a_new_conversation_begins_when_the_latest_reply_finished(chat, store):
    chat(["hello there"])
    again = chat(["hello there"])
    assert "new conversation" in again.err and len(saved(store)) == 2


def test_without_a_name_the_latest_conversation_reopens_and_its_cut_reply_continues(chat, store):
    whole = chat(["hello there"], settings=SEEDED)
    expected = saved(store)[whole.name].saved.generated
    cut = chat(["hello there"], settings=SEEDED, stop_after=4)
    assert saved(store)[cut.name].saved.finish_reason is None
    again = chat([], settings=SEEDED)
    assert again.name == cut.name and saved(store)[cut.name].saved.generated == expected
    assert statuses(again.err)[-1]["resumed"]
    reply = DoubleText().decode([t for t in expected if t != 0])
    assert again.out == f"you> hello there\n{reply}\n\n"  # the history's part of the reply is not printed twice


def test_without_a_name_a_cut_conversation_another_process_is_writing_is_left_to_it(chat, store):
    cut = chat(["hello there"], settings=SEEDED, stop_after=4)
    held = FileStore(store).claim(cut.name)  # the process writing it
    run(held.__aenter__())
    try:
        again = chat(["what is a boat?"], settings=SEEDED)
    finally:
        run(held.__aexit__(None, None, None))
    assert len(errors(again)) == 1 and "another writer" in errors(again)[0]
    assert again.name != cut.name and saved(store)[cut.name].saved.finish_reason is None


def test_open_by_number_counts_conversations_as_list_shows_them_newest_first(chat, store):
    chat(["hello there"], conversation="older")
    chat(["what is a boat?"], conversation="newer")
    done = chat(["/list", "/open 2"])
    assert list(list_rows(done.out)) == ["newer", "older"]
    assert done.name == "older" and "you> hello there" in done.out


def list_rows(out: str) -> dict[str, tuple[bool, str]]:
    """The rows ``/list`` printed: name -> (whether it is the conversation on screen, its mark)."""
    rows = re.finditer(r"^(?P<current>[> ])\s*\d+  (?P<name>\S+)  .*\d+ tokens  \S+ \S+(?:  (?P<mark>.+))?$", out, re.M)
    return {row["name"]: (row["current"] == ">", row["mark"] or "") for row in rows}


def test_list_marks_the_conversation_on_screen_and_a_cut_one(chat, store):
    chat(["hello there"], conversation="cut", settings=SEEDED, stop_after=3)
    chat(["hello there"], conversation="whole")
    done = chat(["/list"], conversation="whole")
    assert list_rows(done.out) == {"whole": (True, ""), "cut": (False, "cut")}


def test_open_of_a_missing_conversation_is_one_line_and_the_chat_goes_on(chat, store):
    done = chat(["/open nothing-here", "hello there"])
    assert len(errors(done)) == 1 and "nothing-here" in errors(done)[0]
    assert len(statuses(done.err)) == 1


# ----- commands -----------------------------------------------------------------------------------


def test_new_begins_a_conversation_and_open_goes_back_to_the_first(chat, store):
    done = chat(["hello there", "/new", "what is a boat?", "/open talk"], conversation="talk")
    assert len(saved(store)) == 2 and done.name == "talk"
    assert done.out.count("you> hello there") == 1  # the history /open printed


def test_new_with_the_name_of_a_conversation_is_refused_in_one_line(chat, store):
    done = chat(["hello there", "/new talk"], conversation="talk")
    assert len(errors(done)) == 1 and "/open talk" in errors(done)[0] and done.name == "talk"


def test_regen_answers_the_last_message_again_with_a_new_seed_under_the_same_name(chat, store):
    done = chat(["hello there", "/regen"], conversation="talk", settings=SEEDED)
    records = saved(store)
    assert list(records) == ["talk"] and [m.content for m in records["talk"].chat.messages] == ["hello there"]
    first, again = statuses(done.err)
    assert first["name"] == again["name"] == "talk"
    assert records["talk"].chat.settings["seed"] != SEEDED["seed"]


def test_edit_forks_a_new_conversation_from_the_edited_message_and_leaves_the_old_one(chat, store):
    done = chat(["hello there", "tell me about the sea", "/edit 2 tell me about the wind"], conversation="talk")
    records = saved(store)
    assert len(records) == 2 and done.name != "talk"
    assert [m.content for m in records["talk"].chat.messages if m.role == "user"] == ["hello there",
                                                                                      "tell me about the sea"]
    fork = records[done.name].chat.messages
    assert [m.content for m in fork if m.role == "user"] == ["hello there", "tell me about the wind"]
    assert fork[1] == records["talk"].chat.messages[1]  # the first reply, shared
    first = statuses(done.err)[0]
    assert int(statuses(done.err)[-1]["cached"]) >= int(first["prompt"])  # the shared turn came from the cache


def test_edit_without_a_number_edits_the_last_message(chat, store):
    done = chat(["hello there", "tell me about the sea", "/edit tell me about the wind"])
    assert [m.content for m in saved(store)[done.name].chat.messages if m.role == "user"] == [
        "hello there", "tell me about the wind"]


def test_the_end_of_input_at_the_edit_prompt_cancels_the_edit(chat, store):
    done = chat(["hello there", "/edit"])
    assert "the edit was cancelled" in done.err and errors(done) == [] and len(saved(store)) == 1


def test_edit_of_a_message_that_does_not_exist_is_one_line(chat, store):
    done = chat(["hello there", "/edit 2 what?"])
    assert len(errors(done)) == 1 and "[1, 1]" in errors(done)[0] and len(saved(store)) == 1


def test_system_starts_a_new_conversation_with_that_system_prompt(chat, store):
    done = chat(["hello there", "/system answer briefly.", "what is a boat?"], conversation="talk")
    records = saved(store)
    assert records["talk"].chat.messages[0].role == "user"
    assert [(m.role, m.content) for m in records[done.name].chat.messages] == [
        ("system", "answer briefly."), ("user", "what is a boat?")]


def test_system_on_a_conversation_without_messages_sets_its_system_prompt_and_keeps_its_name(chat, store):
    chat(["/system answer briefly.", "what is a boat?"], conversation="talk")
    assert saved(store)["talk"].chat.messages[0].content == "answer briefly."


def test_the_system_flag_is_the_system_prompt_of_new_conversations_only(chat, store):
    chat(["hello there"], conversation="talk")
    done = chat(["/new", "what is a boat?"], conversation="talk", system="answer briefly.")
    assert "--system applies to new conversations" in done.err
    assert saved(store)["talk"].chat.messages[0].role == "user"
    assert saved(store)[done.name].chat.messages[0].content == "answer briefly."


def test_an_unknown_command_gets_one_line_of_help(chat):
    done = chat(["/frobnicate"])
    assert errors(done) == [next(line for line in done.err.splitlines() if line.startswith("error: unknown"))]
    assert "/regen" in errors(done)[0] and "/exit" in errors(done)[0]


def test_exit_ends_the_chat_before_the_lines_after_it(chat, store):
    done = chat(["/exit", "hello there"])
    assert statuses(done.err) == [] and saved(store) == {}


# ----- interrupts and errors ----------------------------------------------------------------------


def test_continue_after_an_interrupt_finishes_the_reply_as_an_uninterrupted_run(chat, store):
    whole = chat(["hello there"], settings=SEEDED)
    expected = saved(store)[whole.name].saved.generated
    done = chat(["hello there", "/continue"], settings=SEEDED, stop_after=5)
    cut, resumed = statuses(done.err)
    assert cut["end"].startswith("interrupted") and resumed["resumed"]
    assert saved(store)[done.name].saved.generated == expected


def test_a_conversation_held_by_another_writer_is_one_line_and_the_chat_goes_on(chat, store):
    chat(["hello there"], conversation="talk")

    held = FileStore(store).claim("talk")  # another process writing the conversation
    run(held.__aenter__())
    try:
        done = chat(["and the wind?", "/new", "what is a boat?"], conversation="talk")
    finally:
        run(held.__aexit__(None, None, None))
    assert len(errors(done)) == 1 and "another writer" in errors(done)[0]
    assert len(statuses(done.err)) == 1 and len(saved(store)) == 2


def test_a_full_context_is_one_line_naming_new_and_the_chat_goes_on(chat, store):
    done = chat(["a" * 80, "/new", "hi"], context=64)
    assert len(errors(done)) == 1 and "context" in errors(done)[0] and "/new" in errors(done)[0]
    assert len(statuses(done.err)) == 1


def test_open_of_a_plain_completion_is_refused_in_one_line_and_the_chat_goes_on(chat, store, device):
    engine = Engine(LoadedModel(DoubleLM(max_context=1024), DoubleText()), device, store=FileStore(store),
                    config=ENGINE)
    try:
        run(engine.complete("once upon a time", conversation="story", **GREEDY))
    finally:
        run(engine.close())
    done = chat(["/open story", "hello there"])
    assert len(errors(done)) == 1 and "a plain completion's" in errors(done)[0]
    assert done.name != "story"
