"""`kvckpt bench serve --quick` runs end to end against `kvckpt serve --api` on the tiny random llama GGUF (nothing
here is timed), and its parts: the streamed replies it reads, and why llama.cpp is left out where it cannot run."""

from __future__ import annotations

import pytest

from kvckpt_web.bench.serve import CLIENTS, RUNNING, WARM_TOKENS, bench_serve
from kvckpt_web.bench.serve_client import events
from kvckpt_web.bench.serve_servers import llama_support
from kvckpt_web.errors import KVCkptError


def test_the_quick_mode_times_every_client_count_and_the_new_request_on_our_server_alone(device, tiny_llama_path):
    lines: list[str] = []
    ours, peer = bench_serve(echo=lines.append, model=tiny_llama_path, peer_python=None, quick=True)
    assert peer is None and lines[1] == "llama.cpp: not benchmarked: not asked for (no peer python)"
    assert sorted(ours.bursts) == list(CLIENTS)
    assert all(len(ours.bursts[n]) == 1 and len(ours.bursts[n][0].replies) == n for n in CLIENTS)
    assert all(0 < r.tokens <= WARM_TOKENS for b in ours.bursts.values() for r in b[0].replies)
    assert len(ours.probes) == 1 and ours.probes[0].running <= RUNNING
    rows = [line.split(" | ")[:2] for line in lines if line.startswith("| kvckpt_web | ")]
    assert rows[:len(CLIENTS)] == [["| kvckpt_web", str(n)] for n in CLIENTS] and len(rows) == len(CLIENTS) + 1
    goals = [line for line in lines if line.startswith("goal, ")]
    assert len(goals) == 2 and all(line.endswith((": met", ": not met")) for line in goals)


def test_a_missing_peers_venv_is_the_reason_llama_cpp_is_not_benchmarked(tmp_path):
    support = llama_support(str(tmp_path / "peers-venv" / "bin" / "python"))
    assert support.missing and support.describe().startswith(f"llama.cpp: not benchmarked: no {tmp_path}")


def test_a_stream_is_read_up_to_its_done_event():
    lines = [b'data: {"n": 1}\n', b"\n", b": a comment\n", b'data: {"n": 2}\n', b"data: [DONE]\n", b'data: {"n": 3}\n']
    assert list(events(iter(lines))) == [{"n": 1}, {"n": 2}]


def test_a_stream_cut_before_its_done_event_is_an_error():
    with pytest.raises(KVCkptError, match="without data: \\[DONE\\]"):
        list(events(iter([b'data: {"n": 1}\n'])))
