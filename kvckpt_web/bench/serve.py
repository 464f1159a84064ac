"""``kvckpt bench serve``: ``kvckpt serve --api`` beside llama-cpp-python's server under 1, 2, 4 and 8 concurrent
clients, on the same GGUF and machine, in one run.

Both servers run at once, each a process of its own (:mod:`.serve_servers`); the clients are threads of this
process speaking OpenAI's streaming chat completions (plain completions where the GGUF is a base model, without a
chat template, as the Gemma 3 270M file is) over the standard library's HTTP client (:mod:`.serve_client`).
Every client is a separate conversation: a one-message prompt of its own, answered greedily, ``tokens`` tokens at
most (64), the same prompts sent to both servers and no prompt sent twice to one. A round runs every case on
both servers, one after the other, in an order that alternates from round to round, after a warm-up round of
short replies (not counted):

- N clients (1, 2, 4, 8) send their requests at once: the aggregate tokens/s is all their replies' tokens over
  the wall time from the first request sent to the last reply done (prefills included), and each reply's time to
  first token (TTFT) is kept;
- a new request's TTFT alone, and while 3 other requests run: it is sent once each of the 3 has streamed a token
  (all decoding), or as soon as one of them has finished (a server that answers one at a time never decodes 3
  at once: the row says how many were decoding and how many in flight when it was sent).

Each row gives the median aggregate with the rounds' range, its ratio to one client's and to llama.cpp's (ratio of
the medians, the rounds' ratios' range), TTFT p50 / p95 over every reply of the case, the tokens a reply got, the
1-minute load average over the rounds and the CPU (model name, AVX2 or AVX-512); then the issue's two goals, met or
not. llama.cpp is skipped, with the reason printed, where the peers venv or its ``[server]`` extra is missing.
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import KVCkptError
from ..model.codec import ChatCodec
from ..model.gguf import open_gguf
from ..model.loader import default_model_path
from .rows import cpu_description, load_average, load_range
from .serve_client import PATIENCE, Burst, Clients, Endpoint, Reply, burst, stream_reply
from .serve_servers import LlamaSupport, ServerProcess, llama_support, start_llama, start_ours

CLIENTS = (1, 2, 4, 8)
TOKENS = 64
WARM_TOKENS = 8
"""Tokens a reply of the warm-up round (and of every round with ``--quick``)."""
RUNNING = 3
"""Requests running when the new request of the TTFT case is sent."""
AGGREGATE_TARGET = 2.5
"""The goal: 4 clients' aggregate tokens/s at least this many times one client's."""
TTFT_TARGET = 2.0
"""The goal: a new request's TTFT while 3 others decode at most this many times its TTFT alone."""
PEER_PYTHON = "build/peers-venv/bin/python"
TOPICS = ("a lighthouse keeper on a stormy night", "a baker who wakes before the town", "a train crossing a desert",
          "a cat that guards a library", "two sisters sailing around an island", "a clockmaker and a broken watch",
          "a village that keeps bees", "an astronaut who grows tomatoes", "a fisherman and a silver whale",
          "a girl who maps the stars", "a mountain road in winter", "a postman in a city of bridges",
          "an old piano in a school hall")


def prompt(tag: str, index: int) -> str:
    """The prompt of client ``index`` of the case and round named by ``tag``: a story, long enough to fill
    the reply."""
    return f"Story {tag}-{index}: write a long, detailed story about {TOPICS[index % len(TOPICS)]}."


@dataclass(frozen=True)
class Probe:
    """A new request's replies: sent alone, and sent while others ran (``decoding`` of them streaming, ``running``
    not finished)."""

    alone: Reply
    loaded: Reply
    decoding: int
    running: int


def probe(endpoint: Endpoint, tag: str, tokens: int, alone_first: bool) -> Probe:
    """The TTFT case on the server at ``endpoint``, its two requests (prompts of one length) in the order
    ``alone_first`` says."""
    lock = threading.Condition()
    streaming, finished = [False] * RUNNING, [False] * RUNNING

    def note(i: int, flags: list[bool]) -> None:
        with lock:
            flags[i] = True
            lock.notify_all()

    def running(i: int) -> Reply:
        try:
            return stream_reply(endpoint, prompt(tag, i), tokens, lambda n: note(i, streaming))
        finally:
            note(i, finished)

    def loaded() -> tuple[Reply, int, int]:
        clients = Clients()
        for i in range(RUNNING):
            clients.start(lambda i=i: running(i))
        with lock:
            if not lock.wait_for(lambda: all(streaming) or any(finished), PATIENCE):
                raise KVCkptError(f"{endpoint.url}: expected the {RUNNING} running replies to stream within "
                                  f"{PATIENCE:.0f} s, got none")
            decoding = sum(s and not f for s, f in zip(streaming, finished))
            left = finished.count(False)
        reply = stream_reply(endpoint, prompt(f"{tag}b", RUNNING), tokens)
        clients.join()
        return reply, decoding, left

    if alone_first:
        alone = stream_reply(endpoint, prompt(f"{tag}a", RUNNING), tokens)
        reply, decoding, left = loaded()
    else:
        reply, decoding, left = loaded()
        alone = stream_reply(endpoint, prompt(f"{tag}a", RUNNING), tokens)
    return Probe(alone, reply, decoding, left)


@dataclass
class Side:
    """One server's rounds."""

    name: str
    endpoint: Endpoint
    bursts: dict[int, list[Burst]] = field(default_factory=dict)
    probes: list[Probe] = field(default_factory=list)
    loads: dict[str, list[float]] = field(default_factory=dict)

    def run(self, case: str, tag: str, tokens: int, alone_first: bool, counted: bool) -> None:
        """One case (a number of clients, or "ttft"), kept if ``counted``."""
        if case == "ttft":
            got: Burst | Probe = probe(self.endpoint, tag, tokens, alone_first)
        else:
            got = burst(self.endpoint, [prompt(tag, i) for i in range(int(case))], tokens)
        if counted:
            if isinstance(got, Probe):
                self.probes.append(got)
            else:
                self.bursts.setdefault(len(got.replies), []).append(got)
            self.loads.setdefault(case, []).append(load_average())

    def rates(self, clients: int) -> list[float]:
        return [b.rate for b in self.bursts[clients]]

    def refused(self) -> int:
        """503 answers to the counted requests."""
        return (sum(r.refused for bursts in self.bursts.values() for b in bursts for r in b.replies)
                + sum(p.alone.refused + p.loaded.refused for p in self.probes))


def percentile(values: list[float], q: int) -> float:
    """The ``q``-th percentile of ``values`` (inclusive: between the smallest and the largest)."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def ratio(numerators: list[float], denominators: list[float]) -> tuple[float, str]:
    """The ratio of the medians, and it printed with the range of the rounds' ratios."""
    value = statistics.median(numerators) / statistics.median(denominators)
    rounds = [n / d for n, d in zip(numerators, denominators)]
    return value, f"{value:.2f}x ({min(rounds):.2f}-{max(rounds):.2f})"


def verdict(value: float, target: float, at_least: bool) -> str:
    """Whether ``value`` meets ``target`` (judged unrounded)."""
    return "met" if (value >= target if at_least else value <= target) else "not met"


HEADER = ("| server | clients | aggregate tokens/s, median (rounds) | vs 1 client | vs llama.cpp | TTFT p50 / p95 | "
          "tokens a reply | load average | CPU |\n|---|---|---|---|---|---|---|---|---|")
TTFT_HEADER = (f"| server | new request's TTFT alone, median | while {RUNNING} others run, median | decoding / running "
               "when sent | ratio (rounds) | load average | CPU |\n|---|---|---|---|---|---|---|")


def burst_row(side: Side, clients: int, peer: Side | None, cpu: str) -> str:
    """The row of ``side`` with ``clients`` clients (beside ``peer``'s, where there is one)."""
    rates = side.rates(clients)
    ttfts = [r.ttft for b in side.bursts[clients] for r in b.replies]
    tokens = [r.tokens for b in side.bursts[clients] for r in b.replies]
    lengths = f"{min(tokens)}" if min(tokens) == max(tokens) else f"{min(tokens)}-{max(tokens)}"
    alone = "1.00x" if clients == 1 else ratio(rates, side.rates(1))[1]
    versus = ratio(rates, peer.rates(clients))[1] if peer else "-"
    return (f"| {side.name} | {clients} | {statistics.median(rates):.1f} ({min(rates):.1f}-{max(rates):.1f}) | "
            f"{alone} | {versus} | {percentile(ttfts, 50):.2f} / {percentile(ttfts, 95):.2f} s | "
            f"{lengths} | {load_range(side.loads[str(clients)])} | {cpu} |")


def ttft_row(side: Side, cpu: str) -> tuple[float, str]:
    """The TTFT case's ratio (while running / alone) and row."""
    alone = [p.alone.ttft for p in side.probes]
    loaded = [p.loaded.ttft for p in side.probes]
    value, text = ratio(loaded, alone)
    counts = sorted({f"{p.decoding} / {p.running}" for p in side.probes})
    return value, (f"| {side.name} | {statistics.median(alone):.2f} s | {statistics.median(loaded):.2f} s | "
                   f"{', '.join(counts)} | {text} | {load_range(side.loads['ttft'])} | {cpu} |")


def report(sides: list[Side], cpu: str, echo: Callable[[str], None]) -> None:
    """The tables and the two goals of ``sides`` (this project's first, then llama.cpp's where it ran)."""
    ours, peer = sides[0], sides[1] if len(sides) > 1 else None
    echo(HEADER)
    for clients in CLIENTS:
        for side in sides:
            echo(burst_row(side, clients, peer if side is ours else None, cpu))
    echo("\n" + TTFT_HEADER)
    ttft = [ttft_row(side, cpu) for side in sides]
    for _, row in ttft:
        echo(row)
    echo("")
    for side in sides:
        if side.refused():
            echo(f"{side.name} answered 503 (a full queue) {side.refused()} times: those requests were sent again "
                 "after its Retry-After, their time to first token counted from the first attempt")
    for side in sides:
        value, text = ratio(side.rates(4), side.rates(1))
        echo(f"goal, 4 clients' aggregate >= {AGGREGATE_TARGET:g}x one client's: {side.name} {text}: "
             f"{verdict(value, AGGREGATE_TARGET, True)}")
    for side, (value, _) in zip(sides, ttft):
        echo(f"goal, a new request's TTFT while {RUNNING} others decode <= {TTFT_TARGET:g}x its TTFT alone: "
             f"{side.name} {value:.2f}x: {verdict(value, TTFT_TARGET, False)}")


def bench_serve(repeats: int = 5, echo: Callable[[str], None] = print, *, model: Path | None = None,
                peer_python: str | None = PEER_PYTHON, quick: bool = False) -> tuple[Side, Side | None]:
    """Run the benchmark on ``model`` (default SmolLM2) and print its tables and goals: ``repeats`` rounds of
    ``TOKENS``-token replies after a warm-up round, or with ``quick`` one round of ``WARM_TOKENS``-token replies and
    no warm-up; llama.cpp from ``peer_python`` (None: not benchmarked). Returns both servers' rounds (llama.cpp's
    None where it was not benchmarked)."""
    path = Path(model) if model is not None else default_model_path()
    if not path.is_file():
        raise KVCkptError(f"bench serve: expected a GGUF model file, got no file {path}")
    chat = ChatCodec.from_gguf(open_gguf(path)).can_chat
    support = llama_support(peer_python) if peer_python else LlamaSupport(missing="not asked for (no peer python)")
    cpu = cpu_description()
    rounds, tokens = (1, WARM_TOKENS) if quick else (repeats, TOKENS)
    echo(f"model {path.name}; {rounds} round(s) of {', '.join(map(str, CLIENTS))} concurrent clients and the TTFT "
         f"case, {tokens} tokens a reply, greedy, {'chat completions' if chat else 'plain completions (a base model)'}"
         f"{'' if quick else ', after a warm-up round'}{' (--quick)' * quick}; "
         f"{os.cpu_count()} CPUs, {cpu}")
    echo(support.describe())
    servers: list[ServerProcess] = []
    try:
        servers.append(start_ours(path))
        if not support.missing:
            servers.append(start_llama(peer_python, path, os.cpu_count() or 1))
        sides = [Side("kvckpt_web", Endpoint(servers[0].wait_ready(), chat))]
        if len(servers) > 1:
            try:
                sides.append(Side("llama.cpp", Endpoint(servers[1].wait_ready(), chat)))
            except KVCkptError as exc:
                echo(f"llama.cpp: not benchmarked: {exc}")
        cases = [str(n) for n in CLIENTS] + ["ttft"]
        for r in range(0 if quick else -1, rounds):
            for case in cases:
                for side in sides if r % 2 == 0 else sides[::-1]:
                    side.run(case, f"{r + 1}.{case}", WARM_TOKENS if r < 0 else tokens, r % 2 == 0, r >= 0)
            print(f"round {r + 1} done (load {load_average():.1f})", file=sys.stderr, flush=True)
    finally:
        for server in servers:
            server.close()
    echo("")
    report(sides, cpu, echo)
    return sides[0], sides[1] if len(sides) > 1 else None

