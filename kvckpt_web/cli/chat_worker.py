"""A chat engine in a worker process, driven over pipes: what ``kvckpt demo`` (and the crash tests) SIGKILL.

``python -m kvckpt_web.cli.chat_worker CONFIG_JSON`` opens the GPU, loads the GGUF file the config names or builds
the model with the factory it names (``"module:function"``, called with the device), and runs an :class:`~kvckpt_web.engine.Engine`
on a FileStore (or on none). It reads commands from stdin and answers on stdout, one JSON object a line:

- ``{"op": "chat", "messages": [...], "settings": {...}}``: a ``chunk`` event for each chunk of the streamed
  reply (``token_ids``, ``text``; on the first chunk of a resumed reply ``resumed``, how its K/V came back),
  then ``done`` (the reply's ``conversation``, ``token_ids``, ``text``, ``finish_reason`` and ``usage``);
  with ``"scratch": true`` the reply runs on a second engine of the same model without a store;
- ``{"op": "complete", "prompt": ..., "settings": {...}}``: the same, for :meth:`Engine.complete` (a plain
  completion of the raw ``prompt``, what a base model answers);
- ``{"op": "resume", "name": ..., "generation": null}``: the same, for :meth:`Engine.resume`;
- ``{"op": "unfinished"}``: ``{"event": "unfinished", "names": [...]}``.

It says ``ready`` once the model is loaded, and ``saved`` (conversation, generation, kv_length) after each
save. With ``lockstep`` it waits for a line on stdin after each ``chunk`` that brings tokens and after each
``saved``, so the parent chooses where a SIGKILL lands (after token j, after the save at n tokens) without
racing the worker. An error is one ``error`` event and exit status 1; Ctrl-C exits 130; EOF on stdin ends it.
:class:`ChatProcess` is the parent's side.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from ..engine import PRESETS, Engine
from ..errors import FieldError, KVCkptError, ModelUnavailableError
from ..gpu.open import open_device
from ..model.loader import load_model
from ..model.protocol import LoadedModel
from ..stores.file import FileStore

DEFAULT_FACTORY = "kvckpt_web.model.loader:load_default"

Event = dict[str, Any]


@dataclass(frozen=True)
class WorkerConfig:
    """What a worker runs (all JSON)."""

    factory: str = DEFAULT_FACTORY
    store: str | None = None
    engine: dict[str, Any] = field(default_factory=dict)
    """The fields of the ``desktop`` preset its :class:`Engine` replaces (context, sequences, page_size,
    prefill_chunk, ...: :class:`~kvckpt_web.engine.EngineConfig`'s)."""
    lockstep: bool = False
    model: str | None = None
    """A GGUF file to load instead of calling ``factory``."""


def resolve_factory(spec: str) -> Callable[[Any], LoadedModel]:
    """The model factory ``"module:function"`` names."""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise KVCkptError(f"factory: expected 'module:function', got {spec!r}")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise KVCkptError(f"factory: expected an importable 'module:function', got {spec!r} ({exc})") from None


async def _serve(config: WorkerConfig, read_line: Callable[[], str], emit: Callable[[Event], None]) -> None:
    start = time.perf_counter()
    device = open_device()
    loaded = load_model(config.model, device) if config.model else resolve_factory(config.factory)(device)
    hold = read_line if config.lockstep else lambda: ""

    def saved(name: str, result: Any) -> None:
        emit({"event": "saved", "conversation": name, "generation": result.generation,
              "kv_length": result.seq_length})
        hold()

    store = FileStore(config.store) if config.store else None
    settings = PRESETS["desktop"].replace(**config.engine)
    engine = Engine(loaded, device, store=store, on_save=saved, config=settings)
    scratch: Engine | None = None
    emit({"event": "ready", "load_s": time.perf_counter() - start})
    try:
        while line := read_line():
            command = json.loads(line)
            op = command.get("op")
            if op == "unfinished":
                emit({"event": "unfinished", "names": [info.name for info in await engine.unfinished()]})
                continue
            if op in ("chat", "complete"):
                target = engine
                if command.get("scratch"):
                    scratch = scratch or Engine(loaded, device, config=settings)
                    target = scratch
                if op == "chat":
                    stream = await target.chat(command["messages"], stream=True, **command.get("settings", {}))
                else:
                    stream = await target.complete(command["prompt"], stream=True, **command.get("settings", {}))
            elif op == "resume":
                stream = await engine.resume(command["name"], generation=command.get("generation"), stream=True)
            else:
                raise FieldError("op", "'chat', 'complete', 'resume' or 'unfinished'", op)
            ids, text = [], []
            async for chunk in stream:
                ids += chunk.token_ids
                text.append(chunk.text)
                if chunk.finish_reason is None or chunk.token_ids:
                    resumed = {} if chunk.resumed is None else {"resumed": asdict(chunk.resumed)}
                    emit({"event": "chunk", "token_ids": list(chunk.token_ids), "text": chunk.text, **resumed})
                    if chunk.token_ids:
                        hold()
                if chunk.finish_reason is not None:
                    emit({"event": "done", "conversation": chunk.conversation, "token_ids": ids, "text": "".join(text),
                          "finish_reason": chunk.finish_reason, "usage": dataclasses.asdict(chunk.usage)})
    finally:
        for made in (engine, scratch):
            if made is not None:
                await made.close()


def chat_worker_main(argv: list[str] | None = None) -> int:
    """Entry of a worker: ``python -m kvckpt_web.cli.chat_worker CONFIG_JSON``; errors as one JSON line."""
    parser = argparse.ArgumentParser(prog="kvckpt_web.cli.chat_worker")
    parser.add_argument("config")
    args = parser.parse_args(argv)

    def emit(event: Event) -> None:
        print(json.dumps(event), flush=True)

    try:
        asyncio.run(_serve(WorkerConfig(**json.loads(args.config)), sys.stdin.readline, emit))
    except KVCkptError as exc:
        emit({"event": "error", "type": type(exc).__name__, "message": str(exc)})
        return 1
    except KeyboardInterrupt:  # Ctrl-C reaches the workers with the demo: the demo says it was interrupted
        return 130
    return 0


# ----- the parent -----------------------------------------------------------------------------------


def after_tokens(count: int) -> Callable[[Event], bool]:
    """A :meth:`ChatProcess.run` ``until`` that holds the worker at the chunk that brings its reply to ``count``
    tokens (the chunks of a resumed reply's earlier tokens included)."""
    seen = [0]

    def reached(event: Event) -> bool:
        if event["event"] == "chunk":
            seen[0] += len(event["token_ids"])
        return seen[0] >= count

    return reached


class ChatProcess:
    """A worker process (the parent's side): ``with ChatProcess(config) as w: w.run("chat", messages=...)``.

    Leaving the ``with`` ends the worker: by closing its stdin, or with SIGKILL when an exception leaves it.
    """

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.proc = subprocess.Popen([sys.executable, "-m", "kvckpt_web.cli.chat_worker", json.dumps(asdict(config))],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.ready = self.event()

    def __enter__(self) -> "ChatProcess":
        return self

    def __exit__(self, kind: Any, *exc_info: Any) -> None:
        if kind is None:
            self.close()
        else:
            self.kill()

    def event(self) -> Event:
        """The worker's next event; KVCkptError (ModelUnavailableError where it lacked the model) with its
        message if it failed, or if its output ended."""
        line = self.proc.stdout.readline()
        if not line:
            raise KVCkptError(f"chat worker: expected an event, got the end of its output (exit status "
                              f"{self.proc.wait()})")
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            raise KVCkptError(f"chat worker: expected a JSON line, got {line.strip()[:200]!r}") from None
        if event.get("event") == "error":
            kind = ModelUnavailableError if event.get("type") == ModelUnavailableError.__name__ else KVCkptError
            raise kind(event["message"])
        return event

    def _send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def run(self, op: str, until: Callable[[Event], bool] | None = None, **command: Any) -> list[Event]:
        """Send command ``op`` and read its events to its ``done`` (or ``unfinished``), letting a lockstep worker
        go on after each; with ``until``, stop at the first event it accepts, the worker held there (SIGKILL
        it, or go on with :meth:`go`). The events read; KVCkptError if the reply ended before ``until``."""
        self._send(json.dumps({"op": op, **command}))
        events = []
        while True:
            events.append(self.event())
            kind = events[-1]["event"]
            if until is not None and until(events[-1]):
                return events
            if kind in ("done", "unfinished"):
                if until is not None:
                    raise KVCkptError(f"chat worker: expected to be held mid-reply, got the reply finished "
                                      f"({len(events[-1].get('token_ids', []))} tokens)")
                return events
            if self.config.lockstep and (kind == "saved" or events[-1].get("token_ids")):
                self.go()

    def go(self) -> None:
        """Let a lockstep worker held at an event go on."""
        self._send("")

    def kill(self) -> None:
        """SIGKILL the worker (if it still runs) and reap it."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.close()

    def close(self) -> None:
        """End the worker's input (it closes its engine and exits) and reap it."""
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        self.proc.wait()
        self.proc.stdout.close()


def done(events: list[Event]) -> Event:
    """The ``done`` event of a reply's events."""
    return next(e for e in events if e["event"] == "done")


if __name__ == "__main__":
    sys.exit(chat_worker_main())
