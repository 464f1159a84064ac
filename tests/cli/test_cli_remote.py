"""The kvckpt commands on store URLs (moto's S3 server on 127.0.0.1, reached through the AWS_* environment
variables): sync between a directory and S3, inspect, verify, gc and convert on s3:// URLs."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from kvckpt_web.cli.main import main
from kvckpt_web.durable.catalog import list_generations
from kvckpt_web.durable.save import save
from kvckpt_web.stores.file import FileStore

pytest.importorskip("obstore")

CONVERSATION = {"conversation": {"id": "c0" * 16, "created_ms": 1_700_000_000_000}}


@pytest.fixture
def s3_env(s3_server, monkeypatch) -> str:
    """A fresh s3:// URL, with the AWS_* variables pointing at the test server."""
    for key, value in s3_server.env.items():
        monkeypatch.setenv(key, value)
    return s3_server.new_url()


@pytest.fixture
def model(make_model):
    model = make_model()
    model.add(2, 40)
    return model


def save_turn(store: Path, model, name: str = "chat", tokens: int = 0) -> None:
    if tokens:
        model.append({2: tokens})
    asyncio.run(save(model.cache, 2, FileStore(store), name, app_state=CONVERSATION, keep=None, pages_per_chunk=2))


def sync_line(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("synced "))


def counts(line: str) -> tuple[int, int]:
    """(chunks sent, chunks already there) of a sync's summary line."""
    match = re.search(r"; (\d+) chunks sent, (\d+) already there", line)
    return int(match[1]), int(match[2])


def test_sync_from_a_directory_to_s3_and_back_moves_each_chunk_once(tmp_path, s3_env, model, capsys):
    save_turn(tmp_path / "here", model)
    assert main(["sync", str(tmp_path / "here"), s3_env]) == 0
    first = sync_line(capsys.readouterr().out)
    assert "1 generations copied" in first and counts(first)[1] == 0
    assert main(["sync", str(tmp_path / "here"), s3_env]) == 0  # nothing left to move
    assert counts(sync_line(capsys.readouterr().out))[0] == 0
    save_turn(tmp_path / "here", model, tokens=20)
    assert main(["sync", str(tmp_path / "here"), s3_env]) == 0
    second = sync_line(capsys.readouterr().out)
    one, two = (set(i.chunk_keys) for i in asyncio.run(list_generations(FileStore(tmp_path / "here"))))
    assert "1 generations copied" in second and counts(second) == (len(two - one), len(two & one))
    assert main(["sync", s3_env, str(tmp_path / "there")]) == 0
    capsys.readouterr()
    back = [(i.name, i.generation, i.chunk_keys) for i in asyncio.run(list_generations(FileStore(tmp_path / "there")))]
    here = [(i.name, i.generation, i.chunk_keys) for i in asyncio.run(list_generations(FileStore(tmp_path / "here")))]
    assert back == here[-1:]


def test_inspect_verify_and_gc_take_an_s3_url(tmp_path, s3_env, model, capsys):
    save_turn(tmp_path / "here", model)
    assert main(["sync", str(tmp_path / "here"), s3_env]) == 0
    capsys.readouterr()
    assert main(["inspect", s3_env, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["path"] == s3_env and list(info["names"]) == ["chat"] and info["chunks"]["unreferenced"] == 0
    assert main(["verify", s3_env, "--no-load"]) == 0
    assert "intact" in capsys.readouterr().out
    assert main(["gc", s3_env]) == 0
    assert "deleted 0 manifests and 0 unreferenced chunks" in capsys.readouterr().out


def test_convert_loads_a_checkpoint_from_s3_into_a_gpu_cache(tmp_path, s3_env, model, capsys):
    save_turn(tmp_path / "here", model)
    assert main(["sync", str(tmp_path / "here"), s3_env]) == 0
    assert main(["convert", s3_env, str(tmp_path / "tvm"), "--to", "tvm"]) == 0
    assert main(["convert", str(tmp_path / "tvm"), s3_env, "--to", "kvckpt", "--name", "other"]) == 0
    assert "as 'other' generation 1" in capsys.readouterr().out


def test_a_sync_onto_a_newer_generation_is_a_one_line_conflict(tmp_path, s3_env, model, capsys):
    save_turn(tmp_path / "here", model)
    assert main(["sync", str(tmp_path / "here"), s3_env]) == 0
    assert main(["sync", s3_env, str(tmp_path / "ahead")]) == 0  # another device pulls it, goes on, pushes
    save_turn(tmp_path / "ahead", model, tokens=3)
    assert main(["sync", str(tmp_path / "ahead"), s3_env]) == 0
    capsys.readouterr()
    assert main(["sync", str(tmp_path / "here"), s3_env]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kvckpt: error: sync: chat: ") and "goes on from" in err[0]


def test_a_url_of_no_known_scheme_is_a_path_and_a_bad_s3_url_is_refused(tmp_path, capsys):
    assert main(["inspect", "s3://"]) == 1
    assert "url: expected an object storage URL obstore can open" in capsys.readouterr().err


def test_generate_autosaves_into_s3_and_resumes_from_it(tmp_path, s3_env, capsys, monkeypatch):
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))
    from tiny_llama import write_tiny_llama

    from kvckpt_web.cli import generate

    model = str(write_tiny_llama(tmp_path / "tiny.gguf"))
    argv = ["generate", "--prompt", "tell me a story", "--model", model, "--name", "story", "--max-tokens", "12",
            "--autosave-every", "4"]
    assert main([*argv, "--store", str(tmp_path / "whole")]) == 0
    whole = capsys.readouterr().out
    real, count = generate._write, [0]

    def ctrl_c_on_the_first_piece(text):
        count[0] += 1
        if count[0] == 1:
            monkeypatch.setattr(generate, "_write", real)
            raise KeyboardInterrupt
        real(text)

    monkeypatch.setattr(generate, "_write", ctrl_c_on_the_first_piece)
    assert main([*argv, "--store", s3_env]) == 130  # cut: the reply is saved unfinished in the bucket
    capsys.readouterr()
    assert main(["inspect", s3_env, "--json"]) == 0
    assert list(json.loads(capsys.readouterr().out)["names"]) == ["story"]
    assert main(["generate", "--resume", "--model", model, "--store", s3_env, "--name", "story"]) == 0
    assert capsys.readouterr().out == whole
