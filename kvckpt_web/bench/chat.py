"""``kvckpt bench chat``: the time to first token of a long conversation's next turn, three ways, in one run.

A conversation of ``history_tokens`` tokens (2,000 by default: user and assistant messages) is answered once
by an engine on a FileStore, so its K/V are in the engine's cache and in the store. Then, in rounds, its next
turn (the history, that reply and a new user message) is timed from the call to the first token's chunk:

- with the history in the cache: the same engine;
- restored from the store: a fresh engine on the same store, as a process restarted after ``kill -9`` has
  (its construction is not timed: a restarted process has done it before the first request);
- re-prefilled from nothing: the same engine with ``cache_prompt=False``.

Each turn is saved as a conversation of its own, so every path does the same work after its prefill (the
reply's first token is autosaved before its chunk is yielded). The three run back to back in each round, in
an order that rotates from round to round, after one warm-up round of the first two (the history's own
prefill warmed the third). Every row prints the median and range, the re-prefill's time over the path's per
round, and the 1-minute load average over the rounds.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..engine import Engine
from ..gpu.device import Device
from ..gpu.open import open_device
from ..model.loader import default_model_path, load_model
from ..model.protocol import LoadedModel
from ..stores.file import FileStore
from .rows import load_average

HISTORY_TOKENS = 2000
STORE_TARGET = 20.0
"""The store-hit path must be at least this many times faster than the re-prefill (on lavapipe)."""
USER_TEXT = ("Tell me more about the lighthouse keeper: what did he see from the gallery on the night of the storm, "
             "and who answered the letter he sent?")
ASSISTANT_TEXT = ("The keeper climbed the stairs every evening, counted the ships on the horizon, and wrote their "
                  "names in a book that nobody else would ever read. That night the sea rose over the rocks.")
PATHS = ("cache", "store", "prefill")
TITLES = {"cache": "history in the cache (the same engine)",
          "store": "history restored from the store (a fresh engine, as after a restart)",
          "prefill": "history re-prefilled from nothing (cache_prompt=False)"}


def history_messages(loaded: LoadedModel, tokens: int) -> list[dict[str, str]]:
    """User and assistant messages, the last a user's, whose prompt holds at least ``tokens`` tokens."""
    messages: list[dict[str, str]] = []
    while True:
        messages.append({"role": "user", "content": f"{len(messages) // 2 + 1}. {USER_TEXT}"})
        if len(loaded.text.encode_chat(messages)) >= tokens:
            return messages
        messages.append({"role": "assistant", "content": ASSISTANT_TEXT})


@dataclass
class ChatRow:
    """One path's rounds."""

    path: str
    seconds: list[float] = field(default_factory=list)
    cached: list[int] = field(default_factory=list)
    prefilled: list[int] = field(default_factory=list)
    restores: list[float] = field(default_factory=list)
    """Seconds the call spent restoring K/V from the store (its usage's ``timings.restore_s``)."""
    loads: list[float] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)
    """The re-prefill's time over this path's, round by round."""

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    def format(self, baseline: "ChatRow") -> str:
        ms = self.median < 1
        unit, scale, digits = ("ms", 1e3, 0) if ms else ("s", 1.0, 2)
        times = f"{min(self.seconds) * scale:.{digits}f}-{max(self.seconds) * scale:.{digits}f} {unit}"
        return (f"| {TITLES[self.path]} | {_span(self.cached, '{}')} | {_span(self.prefilled, '{}')} | "
                f"{self.median * scale:.{digits}f} {unit} | {times} | {statistics.median(self.restores) * 1e3:.0f} ms | "
                f"{baseline.median / self.median:.1f}x "
                f"({_span(self.ratios, '{:.1f}')}) | {_span(self.loads, '{:.1f}')} |")


def _span(values: list[Any], form: str) -> str:
    """``min-max`` of ``values`` in ``form``, or the one value when they are all equal."""
    low, high = form.format(min(values)), form.format(max(values))
    return low if low == high else f"{low}-{high}"


HEADER = ("| next turn, history | cached tokens | prefilled tokens | time to first token (median) | range | "
          "of which restore (median) | re-prefill / this (rounds) | load average |\n|---|---|---|---|---|---|---|---|")


async def first_token(engine: Engine, messages: list[dict[str, str]], name: str, **settings: Any
                      ) -> tuple[float, Any]:
    """Seconds from the call to the first token's chunk of a greedy one-token reply saved as ``name``, and
    the call's usage."""
    start = time.perf_counter()
    stream = await engine.chat(messages, stream=True, max_tokens=1, temperature=0.0, conversation=name, **settings)
    seconds = None
    async for chunk in stream:
        if seconds is None and chunk.token_ids:
            seconds = time.perf_counter() - start
        last = chunk
    return seconds, last.usage


async def bench_chat(device: Device | None = None, repeats: int = 5, paths: tuple[str, ...] = (),
                     echo: Callable[[str], None] = print, *, model: str | Path | None = None,
                     history_tokens: int = HISTORY_TOKENS) -> list[ChatRow]:
    """Run the benchmark on ``model`` (default: the installed SmolLM2) and print its rows and verdict; the rows."""
    device = device or open_device()
    path = Path(model) if model is not None else default_model_path()
    start = time.perf_counter()
    loaded = load_model(path, device)
    echo(f"model {path.name}: loaded in {time.perf_counter() - start:.1f} s on {device.info.adapter} "
         f"({device.info.backend})")
    history = history_messages(loaded, history_tokens)
    with tempfile.TemporaryDirectory(prefix="kvckpt-bench-chat-") as root:
        engine = Engine(loaded, device, store=FileStore(Path(root)))
        try:
            print(f"prefilling the history ({len(history)} messages) ...", file=sys.stderr, flush=True)
            start = time.perf_counter()
            reply = await engine.chat(history, max_tokens=1, temperature=0.0, conversation="history")
            echo(f"history: {reply.usage.prompt_tokens} tokens in {len(history)} messages, answered in "
                 f"{time.perf_counter() - start:.1f} s (the engine's defaults: prefill chunk "
                 f"{engine.config.prefill_chunk}, page {engine.config.page_size}, chunks of "
                 f"{engine.config.pages_per_chunk * engine.config.page_size} tokens)\n")
            history = [*history, {"role": "assistant", "content": reply.text}]
            rows = {p: ChatRow(p) for p in PATHS}

            turns = iter(range(100, 200))  # every turn asks its own question, all of them as many tokens long

            async def timed(p: str, row: ChatRow | None) -> None:
                turn = next(turns)
                messages = [*history, {"role": "user", "content": f"Question {turn}: and what happened after that?"}]
                name = f"turn-{turn}-{p}"
                if p == "store":
                    fresh = Engine(loaded, device, store=FileStore(Path(root)))
                    try:
                        seconds, usage = await first_token(fresh, messages, name)
                    finally:
                        await fresh.close()
                else:
                    seconds, usage = await first_token(engine, messages, name, cache_prompt=p == "cache")
                if row is not None:
                    row.seconds.append(seconds)
                    row.cached.append(usage.cached_tokens)
                    row.prefilled.append(usage.prompt_tokens - usage.cached_tokens)
                    row.restores.append(usage.timings.restore_s)
                    row.loads.append(load_average())

            for p in PATHS[:2]:  # warm-up
                await timed(p, None)
            for i in range(repeats):
                for p in PATHS[i % 3:] + PATHS[:i % 3]:
                    await timed(p, rows[p])
        finally:
            await engine.close()
    base = rows["prefill"]
    for row in rows.values():
        row.ratios = [b / s for b, s in zip(base.seconds, row.seconds)]
    echo(HEADER)
    for row in rows.values():
        echo(row.format(base))
    ratio = base.median / rows["store"].median
    echo(f"\nstore hit vs re-prefill of the {base.prefilled[0]}-token prompt: {ratio:.0f}x faster (target >= "
         f"{STORE_TARGET:g}x on lavapipe: {'met' if ratio >= STORE_TARGET else 'NOT met'}); history in the cache: "
         f"{base.median / rows['cache'].median:.0f}x")
    return list(rows.values())
