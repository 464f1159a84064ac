"""`kvckpt bench serve --quick` runs end to end against `kvckpt serve --api` on the tiny random llama GGUF (nothing
here is timed), and its parts: the streamed replies it reads, and why llama.cpp is left out where it cannot run."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kvckpt_web.bench.serve import CLIENTS, RUNNING, WARM_TOKENS, bench_serve
from kvckpt_web.bench.serve_client import Endpoint, events, stream_reply
from kvckpt_web.bench.serve_servers import llama_support
from kvckpt_web.errors import KVCkptError


def test_the_quick_mode_times_every_client_count_and_the_new_request_on_our_server_alone(device, tiny_llama_path):
    lines: list[str] = []
    ours, peer = bench_serve(echo=lines.append, model=tiny_llama_path, peer_python=None, quick=True)
    assert peer is None and lines[1] == "llama.cpp: not benchmarked: not asked for (no peer python)"
    assert ours.endpoint.chat
    assert sorted(ours.bursts) == list(CLIENTS)
    assert all(len(ours.bursts[n]) == 1 and len(ours.bursts[n][0].replies) == n for n in CLIENTS)
    assert all(0 < r.tokens <= WARM_TOKENS for b in ours.bursts.values() for r in b[0].replies)
    assert len(ours.probes) == 1 and ours.probes[0].running <= RUNNING
    rows = [line.split(" | ")[:2] for line in lines if line.startswith("| kvckpt_web | ")]
    assert rows[:len(CLIENTS)] == [["| kvckpt_web", str(n)] for n in CLIENTS] and len(rows) == len(CLIENTS) + 1
    goals = [line for line in lines if line.startswith("goal, ")]
    assert len(goals) == 2 and all(line.endswith((": met", ": not met")) for line in goals)


def test_a_base_model_is_benchmarked_over_plain_completions(device, tiny_base_path):
    lines: list[str] = []
    ours, _ = bench_serve(echo=lines.append, model=tiny_base_path, peer_python=None, quick=True)
    assert not ours.endpoint.chat and "greedy, plain completions (a base model)" in lines[0]
    assert sorted(ours.bursts) == list(CLIENTS) and len(ours.probes) == 1


def test_a_missing_peers_venv_is_the_reason_llama_cpp_is_not_benchmarked(tmp_path):
    support = llama_support(str(tmp_path / "peers-venv" / "bin" / "python"))
    assert support.missing and support.describe().startswith(f"llama.cpp: not benchmarked: no {tmp_path}")


def test_a_stream_is_read_up_to_its_done_event():
    lines = [b'data: {"n": 1}\n', b"\n", b": a comment\n", b'data: {"n": 2}\n', b"data: [DONE]\n", b'data: {"n": 3}\n']
    assert list(events(iter(lines))) == [{"n": 1}, {"n": 2}]


def test_a_stream_cut_before_its_done_event_is_an_error():
    with pytest.raises(KVCkptError, match="without data: \\[DONE\\]"):
        list(events(iter([b'data: {"n": 1}\n'])))


class QueueFullOnce(BaseHTTPRequestHandler):
    """Answers its server's first POST with 503 and ``Retry-After: 0``, the next with a two-token stream."""

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.posts += 1
        if self.server.posts == 1:
            self.send_response(503)
            self.send_header("Retry-After", "0")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        chunks = [{"choices": [{"delta": {"content": text}}]} for text in ("Once", " upon")]
        body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args) -> None:
        pass


def test_a_request_refused_by_a_full_queue_is_sent_again_after_its_retry_after():
    server = ThreadingHTTPServer(("127.0.0.1", 0), QueueFullOnce)
    server.posts = 0
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        reply = stream_reply(Endpoint(f"http://127.0.0.1:{server.server_port}"), "a story", 8)
    finally:
        server.shutdown()
        server.server_close()
    assert (server.posts, reply.refused, reply.tokens) == (2, 1, 2)
    assert reply.sent < reply.first <= reply.done
