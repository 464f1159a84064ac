"""``kvckpt sync`` between directories: a copy that went apart from the destination's is kept beside it under a
name of its own, said in one line; a destination that went on further is a one-line conflict."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from kvckpt_web.cli.main import main
from kvckpt_web.durable.catalog import load_manifest
from kvckpt_web.durable.save import save
from kvckpt_web.durable.sync import apart_name
from kvckpt_web.stores.file import FileStore

CONVERSATION = {"id": "c0" * 16, "created_ms": 1_700_000_000_000}


@pytest.fixture
def model(make_model: Any) -> Any:
    model = make_model()
    model.add(0, 6)
    return model


def save_turn(store: Path, model: Any, seq: int, tokens: list[int]) -> None:
    """Sequence ``seq`` saved as the next generation of 'chat' in ``store``, recording ``tokens`` as its tokens."""
    state = {"conversation": CONVERSATION, "prompt_tokens": tokens, "generated_tokens": []}
    asyncio.run(save(model.cache, seq, FileStore(store), "chat", app_state=state, keep=1, pages_per_chunk=2))


def test_a_sync_onto_a_copy_that_went_apart_keeps_both_and_says_so(tmp_path, model, capsys):
    here, there = tmp_path / "here", tmp_path / "there"
    save_turn(here, model, 0, [1] * 6)
    assert main(["sync", str(here), str(there)]) == 0
    model.fork(0, 1)
    model.append({0: 1, 1: 1})
    save_turn(there, model, 1, [1] * 6 + [3])  # the other device's turn
    for _ in range(3):
        save_turn(here, model, 0, [1] * 6 + [2])  # this one's, of a higher generation
    capsys.readouterr()
    assert main(["sync", str(here), str(there)]) == 0
    kept = apart_name("chat", asyncio.run(load_manifest(FileStore(here), "chat"))[1])
    out = capsys.readouterr().out
    assert f"copied manifests/{kept}/00000000000000000004" in out
    assert f"kept chat as {kept} (generation 4) in {there}: it went apart from the chat there" in out
    assert asyncio.run(load_manifest(FileStore(there), "chat"))[0].app_state["prompt_tokens"][-1] == 3
    assert main(["sync", str(here), str(there)]) == 0  # a rerun: nothing new
    assert f"up to date manifests/{kept}/00000000000000000004" in capsys.readouterr().out


def test_a_sync_onto_a_copy_that_went_on_further_is_a_one_line_conflict(tmp_path, model, capsys):
    here, there = tmp_path / "here", tmp_path / "there"
    save_turn(here, model, 0, [1] * 6)
    assert main(["sync", str(here), str(there)]) == 0
    model.append({0: 1})
    save_turn(there, model, 0, [1] * 7)
    capsys.readouterr()
    assert main(["sync", str(here), str(there)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"kvckpt: error: sync: chat: {there} holds generation 2, which goes on from the source's "
                   "generation 1: not copied (sync the other way to bring the source up to date)"]
