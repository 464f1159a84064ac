"""``kill -9`` of processes chatting through the engine: a conversation gives the same tokens never interrupted,
killed after every turn, and killed mid-reply in every turn; each turn prefills only its own tokens, and a
restarted process restores the history from the store.

Workers are real processes (:mod:`kvckpt_web.cli.chat_worker`: an Engine on a FileStore, events as JSON lines)
running the tiny random llama GGUF (``tests/model/tiny_llama.py``), SmolLM2 once, and Gemma 3 270M (a base model)
once, through plain completions. A worker in lockstep waits for the test after each token and each save, so the
test SIGKILLs it exactly there, never after a sleep.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvckpt_web.cli.chat_worker import ChatProcess, WorkerConfig, after_tokens, done

TURNS = ["hi, who are you?", "tell me about the sea.", "and the wind?", "why is the sky blue?", "count to five.",
         "what is a boat?", "say something nice.", "goodbye!", "one more thing."]
"""Nine user turns: eight, and the ninth a restarted process answers."""
ENGINE = {"context": 512, "sequences": 2, "page_size": 16, "prefill_chunk": 16, "autosave_every": 4,
          "chunk_tokens": 32}
GREEDY = {"temperature": 0.0, "max_tokens": 6}
SEEDED = {"temperature": 0.9, "top_p": 0.9, "seed": 7, "max_tokens": 6}
SETTINGS = {"greedy": GREEDY, "seeded": SEEDED}
TINY = "tiny_llama:load"


@pytest.fixture(scope="module", autouse=True)
def workers(test_model_workers):
    """Workers load the session's tiny GGUF."""


def tiny(store: Path | None = None, lockstep: bool = False, **engine: Any) -> WorkerConfig:
    return WorkerConfig(TINY, None if store is None else str(store), {**ENGINE, **engine}, lockstep)


def asked(messages: list[dict[str, str]], turn: int) -> list[dict[str, str]]:
    return [*messages, {"role": "user", "content": TURNS[turn]}]


def answered(messages: list[dict[str, str]], reply: dict[str, Any]) -> list[dict[str, str]]:
    return [*messages, {"role": "assistant", "content": reply["text"]}]


def converse(worker: ChatProcess, settings: dict[str, Any], turns: range) -> list[dict[str, Any]]:
    """Chat ``turns`` turn by turn in ``worker``; the replies' ``done`` events."""
    messages, replies = [], []
    for turn in turns:
        messages = asked(messages, turn)
        replies.append(done(worker.run("chat", messages=messages, settings=settings)))
        messages = answered(messages, replies[-1])
    return replies


def history(reply: dict[str, Any]) -> int:
    """Tokens whose K/V a reply leaves for the next turn: its prompt and its reply but the last, pending, token."""
    return reply["usage"]["prompt_tokens"] + reply["usage"]["completion_tokens"] - 1


@pytest.fixture(scope="module")
def uninterrupted(device, tmp_path_factory):
    """``uninterrupted(setting)``: the nine replies (``done`` events) of one worker never interrupted."""
    made: dict[str, list[dict[str, Any]]] = {}

    def get(setting: str) -> list[dict[str, Any]]:
        if setting not in made:
            with ChatProcess(tiny(tmp_path_factory.mktemp("uninterrupted"))) as worker:
                made[setting] = converse(worker, SETTINGS[setting], range(len(TURNS)))
        return made[setting]

    return get


def test_each_turn_prefills_only_its_own_new_tokens(uninterrupted):
    replies = uninterrupted("greedy")
    for before, reply in zip(replies, replies[1:]):
        usage = reply["usage"]
        assert usage["cached_tokens"] == history(before)
        assert usage["timings"]["prefill_tokens"] == usage["prompt_tokens"] - history(before) > 0
        assert usage["timings"]["restore_s"] == 0  # the history was in the cache


@pytest.mark.parametrize("setting", SETTINGS)
def test_a_worker_killed_after_every_turn_restores_the_history_and_gives_the_same_tokens(uninterrupted, tmp_path,
                                                                                       setting):
    want = uninterrupted(setting)
    messages, got = [], []
    for turn in range(len(TURNS)):
        messages = asked(messages, turn)
        with ChatProcess(tiny(tmp_path / "store")) as worker:  # a new process for every turn
            reply = done(worker.run("chat", messages=messages, settings=SETTINGS[setting]))
            worker.kill()
        if turn:  # the history came back whole from the store: only the turn's own tokens were prefilled
            assert reply["usage"]["cached_tokens"] == history(got[-1])
            assert reply["usage"]["timings"]["restore_s"] > 0
        got.append(reply)
        messages = answered(messages, reply)
    assert [r["token_ids"] for r in got] == [r["token_ids"] for r in want]


def unfinished_names(worker: ChatProcess) -> list[str]:
    """The names of the conversations whose last reply was cut."""
    return worker.run("unfinished")[-1]["names"]


def resume_cut(worker: ChatProcess, cut_after: int) -> dict[str, Any]:
    """Resume the one reply cut after ``cut_after`` tokens; its ``done`` event."""
    (name,) = unfinished_names(worker)
    events = worker.run("resume", name=name)
    assert events[0]["resumed"]["kv_restored"] and 1 <= len(events[0]["token_ids"]) <= cut_after
    return done(events)


@pytest.mark.parametrize("setting", SETTINGS)
def test_a_worker_killed_mid_reply_in_every_turn_resumes_to_the_same_tokens(uninterrupted, tmp_path, setting):
    want = uninterrupted(setting)[:8]
    assert all(len(r["token_ids"]) >= 2 for r in want)  # every reply can be cut after a token
    messages, got, cut_after = [], [], 0
    for turn in range(9):  # a new process for every turn: it resumes the reply cut before, then cuts its own
        with ChatProcess(tiny(tmp_path / "store", lockstep=True)) as worker:
            if turn:
                got.append(resume_cut(worker, cut_after))
                messages = answered(messages, got[-1])
            if turn < 8:
                messages = asked(messages, turn)
                cut_after = min(1 + turn % 3, len(want[turn]["token_ids"]) - 1)
                worker.run("chat", until=after_tokens(cut_after), messages=messages, settings=SETTINGS[setting])
                worker.kill()
    assert [r["token_ids"] for r in got] == [r["token_ids"] for r in want]


def test_a_worker_killed_in_the_prefill_of_a_long_prompt_resumes_to_the_same_tokens(device, tmp_path):
    messages = [{"role": "user", "content": " ".join(TURNS)}]
    with ChatProcess(tiny(tmp_path / "reference")) as worker:
        want = done(worker.run("chat", messages=messages, settings=SEEDED))
    assert want["usage"]["prompt_tokens"] > 48
    config = tiny(tmp_path / "store", lockstep=True, autosave_every=16)
    with ChatProcess(config) as worker:
        held = worker.run("chat", until=lambda e: e["event"] == "saved" and e["kv_length"] == 32,
                          messages=messages, settings=SEEDED)
        assert not [e for e in held if e["event"] == "chunk"]  # no token yet: killed inside the prefill
        worker.kill()
    with ChatProcess(tiny(tmp_path / "store")) as worker:
        (name,) = unfinished_names(worker)
        events = worker.run("resume", name=name)
    resumed = events[0]["resumed"]
    assert resumed["kv_restored"] and resumed["kv_length"] == 32 and events[0]["token_ids"] == []
    assert done(events)["token_ids"] == want["token_ids"]


# ----- SmolLM2 ----------------------------------------------------------------------------------------------------


SMOLLM = WorkerConfig("kvckpt_web.model.loader:load_default",
                      engine={"context": 1024, "sequences": 1, "page_size": 16, "prefill_chunk": 64,
                              "autosave_every": 8})
SMOLLM_GREEDY = {"temperature": 0.0, "max_tokens": 4}


@pytest.mark.real_model
def test_smollm2_killed_after_turns_and_mid_reply_gives_the_uninterrupted_tokens(smollm_path, tmp_path):
    with ChatProcess(SMOLLM) as worker:
        want = converse(worker, SMOLLM_GREEDY, range(9))
    for before, reply in zip(want, want[1:]):
        assert reply["usage"]["cached_tokens"] == history(before)  # each turn prefilled only its own tokens
    assert len(want[7]["token_ids"]) >= 3  # turn 8's reply can be cut after its second token
    store = WorkerConfig(SMOLLM.factory, str(tmp_path / "store"), SMOLLM.engine)
    with ChatProcess(store) as worker:  # turns 1-4, then kill -9
        got = converse(worker, SMOLLM_GREEDY, range(4))
        worker.kill()
    messages = []
    for turn, reply in enumerate(got):
        messages = answered(asked(messages, turn), reply)
    with ChatProcess(WorkerConfig(SMOLLM.factory, store.store, SMOLLM.engine, lockstep=True)) as worker:
        for turn in range(4, 7):  # turns 5-7 after a restart, then kill -9 in turn 8's reply after 2 tokens
            messages = asked(messages, turn)
            got.append(done(worker.run("chat", messages=messages, settings=SMOLLM_GREEDY)))
            messages = answered(messages, got[-1])
        assert got[4]["usage"]["cached_tokens"] == history(got[3]) and got[4]["usage"]["timings"]["restore_s"] > 0
        messages = asked(messages, 7)
        worker.run("chat", until=after_tokens(2), messages=messages, settings=SMOLLM_GREEDY)
        worker.kill()
    with ChatProcess(store) as worker:  # turn 8's reply resumed, then kill -9
        got.append(resume_cut(worker, 2))
        worker.kill()
    messages = answered(messages, got[-1])
    with ChatProcess(store) as worker:  # turn 9 after a restart: the history comes back from the store
        ninth = done(worker.run("chat", messages=asked(messages, 8), settings=SMOLLM_GREEDY))
    assert ninth["usage"]["cached_tokens"] == history(got[-1]) and ninth["usage"]["timings"]["restore_s"] > 0
    assert [r["token_ids"] for r in got] + [ninth["token_ids"]] == [r["token_ids"] for r in want]


# ----- Gemma 3 270M: a base model, through plain completions -------------------------------------------------------


GEMMA_ENGINE = {"context": 256, "sequences": 1, "page_size": 16, "prefill_chunk": 64, "autosave_every": 4}
GEMMA_PROMPT = "Paris is the capital of"


@pytest.mark.real_model
def test_gemma3_killed_mid_completion_resumes_to_the_uninterrupted_tokens_greedy_and_seeded(gemma_path, tmp_path):
    def gemma(store: Path | None = None, lockstep: bool = False) -> WorkerConfig:
        return WorkerConfig(store=None if store is None else str(store), engine=GEMMA_ENGINE, lockstep=lockstep,
                            model=str(gemma_path))

    def complete(worker: ChatProcess, setting: str, **until: Any) -> list[dict[str, Any]]:
        settings = {**SETTINGS[setting], "max_tokens": 8, "conversation": setting}
        return worker.run("complete", prompt=GEMMA_PROMPT, settings=settings, **until)

    def resumed(worker: ChatProcess, setting: str) -> dict[str, Any]:
        events = worker.run("resume", name=setting)
        assert events[0]["resumed"]["kv_restored"]
        return done(events)

    with ChatProcess(gemma()) as worker:
        want = {setting: done(complete(worker, setting))["token_ids"] for setting in SETTINGS}
    with ChatProcess(gemma(tmp_path / "store", lockstep=True)) as worker:  # kill -9 after 3 greedy tokens
        complete(worker, "greedy", until=after_tokens(3))
        worker.kill()
    with ChatProcess(gemma(tmp_path / "store", lockstep=True)) as worker:  # resumed; kill -9 after 5 seeded tokens
        got = {"greedy": resumed(worker, "greedy")["token_ids"]}
        complete(worker, "seeded", until=after_tokens(5))
        worker.kill()
    with ChatProcess(gemma(tmp_path / "store")) as worker:
        got["seeded"] = resumed(worker, "seeded")["token_ids"]
    assert got == want and all(len(tokens) == 8 for tokens in want.values())
