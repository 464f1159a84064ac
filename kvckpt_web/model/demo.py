"""``kvckpt demo``: generate a reply with autosave, SIGKILL the worker mid-reply, resume it in a fresh process.

Three worker processes run the same model (built by a factory named ``"module:function"``, called
with the GPU device): one generates the reply uninterrupted (the reference); one generates it with
autosave and is killed with SIGKILL once a checkpoint holds ``kill_after`` generated tokens; a fresh
one resumes from the store and finishes the reply. The demo prints the reply, whether the joined
tokens equal the reference's, and the time the resume took to restore the K/V next to the time the
same context takes to prefill in that process. Workers report JSON lines on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import KVCkptError, ModelUnavailableError
from ..gpu.open import open_device
from ..stores.file import FileStore
from .protocol import LoadedModel
from .sampler import SamplingSettings
from .app_state import StopRules
from .generator import Autosave, Generator, new_cache
from .resume import resume

DEFAULT_FACTORY = "kvckpt_web.model.loader:load_default"
DEMO_PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
NAME = "demo"


@dataclass(frozen=True)
class WorkerConfig:
    """What a demo worker runs (all JSON)."""

    factory: str = DEFAULT_FACTORY
    prompt: str = DEMO_PROMPT
    max_tokens: int = 64
    sampler: dict[str, Any] = field(default_factory=lambda: {"seed": 0, "temperature": 0.7, "top_k": 40,
                                                             "top_p": 0.9})
    context: int = 1024
    prefill_chunk: int = 256
    page_size: int = 16
    store: str | None = None
    name: str = NAME
    autosave_every: int = 8
    hold_after_saves: int | None = None
    """Stop working (and wait to be killed) after this many saves."""


def resolve_factory(spec: str) -> Callable[[Any], LoadedModel]:
    """The model factory ``"module:function"`` names."""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise KVCkptError(f"factory: expected 'module:function', got {spec!r}")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise KVCkptError(f"factory: expected an importable 'module:function', got {spec!r} ({exc})") from None


async def _worker(config: WorkerConfig, mode: str, emit: Callable[[dict[str, Any]], None]) -> None:
    start = time.perf_counter()
    device = open_device()
    loaded = resolve_factory(config.factory)(device)
    model, text = loaded.model, loaded.text
    cache = new_cache(model, device, max_tokens=config.context, prefill_chunk=config.prefill_chunk,
                      page_size=config.page_size, num_seqs=2)
    emit({"event": "loaded", "load_s": time.perf_counter() - start})
    autosave = Autosave(FileStore(config.store), config.name, config.autosave_every) if config.store else None
    saves = [0]

    def on_save(result: Any) -> None:
        saves[0] += 1
        emit({"event": "saved", "generation": result.generation, "kv_length": result.seq_length,
              "generated": len(gen.generated_tokens)})
        if config.hold_after_saves is not None and saves[0] >= config.hold_after_saves:
            signal.pause()

    if mode == "generate":
        prompt = text.encode_chat([{"role": "user", "content": config.prompt}],
                                  max_tokens=min(config.context, model.max_context))
        gen = await Generator.start(model, cache, prompt, SamplingSettings(**config.sampler),
                                    stop=StopRules(config.max_tokens, text.eos_ids), prefill_chunk=config.prefill_chunk,
                                    autosave=autosave, decode=text.decode, on_save=on_save)
        async with gen:
            emit(_done(await gen.run()))
        return
    if autosave is None:
        raise KVCkptError("store: expected a store directory to resume from, got none")
    gen = await resume(autosave.store, config.name, model, cache, autosave=autosave,
                       decode=text.decode, on_save=on_save)
    report = gen.resume_report
    emit({"event": "resumed", "kv_restored": report.kv_restored, "reason": report.reason, "message": report.message,
          "kv_length": report.kv_length, "generated": len(gen.generated_tokens), "restore_s": report.restore_s,
          "replay_s": report.replay_s})
    async with gen:
        result = await gen.run()
    # the same context, prefilled from scratch in this process and cache, for comparison
    context = list(result.prompt_tokens + result.generated_tokens)[:report.kv_length]
    cache.add_sequence(1)
    begin = time.perf_counter()
    for i in range(0, len(context), config.prefill_chunk):
        logits = await model.forward(cache, 1, context[i:i + config.prefill_chunk])
    await logits.argmax()  # a GPU model's forward only submits its work: reading the logits waits for it
    prefill_s = time.perf_counter() - begin
    cache.remove_sequence(1)
    emit({**_done(result), "prefill_s": prefill_s})


def _done(result: Any) -> dict[str, Any]:
    return {"event": "done", "prompt_tokens": list(result.prompt_tokens),
            "generated_tokens": list(result.generated_tokens), "text": result.text,
            "finish_reason": result.finish_reason}


def worker_main(argv: list[str] | None = None) -> int:
    """Entry of a demo worker: ``python -m kvckpt_web.model.demo MODE CONFIG_JSON``; errors as one JSON line."""
    parser = argparse.ArgumentParser(prog="kvckpt_web.model.demo")
    parser.add_argument("mode", choices=["generate", "resume"])
    parser.add_argument("config")
    args = parser.parse_args(argv)

    def emit(event: dict[str, Any]) -> None:
        print(json.dumps(event), flush=True)

    try:
        asyncio.run(_worker(WorkerConfig(**json.loads(args.config)), args.mode, emit))
    except KVCkptError as exc:
        emit({"event": "error", "type": type(exc).__name__, "message": str(exc)})
        return 1
    except KeyboardInterrupt:  # Ctrl-C reaches the workers with the demo: the demo says it was interrupted
        return 130
    return 0


# ----- the parent -----------------------------------------------------------------------------------


def _command(mode: str, config: WorkerConfig) -> list[str]:
    return [sys.executable, "-m", "kvckpt_web.model.demo", mode, json.dumps(asdict(config))]


def _event(line: str, what: str) -> dict[str, Any]:
    try:
        event = json.loads(line)
    except json.JSONDecodeError:
        raise KVCkptError(f"{what}: expected a JSON line, got {line.strip()[:200]!r}") from None
    if event.get("event") == "error":
        kind = ModelUnavailableError if event.get("type") == ModelUnavailableError.__name__ else KVCkptError
        raise kind(event["message"])
    return event


def run_worker(mode: str, config: WorkerConfig) -> list[dict[str, Any]]:
    """Run a worker to its end; its events (KVCkptError with its message if it failed)."""
    proc = subprocess.run(_command(mode, config), stdout=subprocess.PIPE, text=True)
    events = [_event(line, f"{mode} worker") for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0 or not events or events[-1]["event"] != "done":
        raise KVCkptError(f"{mode} worker: expected exit 0 after a done line, got exit code {proc.returncode}")
    return events


def run_until_killed(config: WorkerConfig, kill_when: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    """Start a generating worker and SIGKILL it at the first event ``kill_when`` accepts; the events it sent.

    KVCkptError if it ends before such an event.
    """
    proc = subprocess.Popen(_command("generate", config), stdout=subprocess.PIPE, text=True)
    events = []
    try:
        for line in proc.stdout:
            events.append(_event(line, "generate worker"))
            if kill_when(events[-1]):
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                return events
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()
    raise KVCkptError(f"generate worker: expected to be killed mid-reply, got it finished ({events[-1:]})")


@dataclass(frozen=True)
class DemoReport:
    """What the demo found."""

    reference: dict[str, Any]
    killed_after: dict[str, Any]
    resumed: dict[str, Any]
    result: dict[str, Any]

    @property
    def identical(self) -> bool:
        return self.result["generated_tokens"] == self.reference["generated_tokens"]


def run_generation_demo(config: WorkerConfig = WorkerConfig(), *, kill_after: int = 16, directory: Path | None = None,
                        echo: Callable[[str], None] = print) -> DemoReport:
    """Run the crash/resume demo and print what happened; KVCkptError if the resumed reply differs."""
    with tempfile.TemporaryDirectory(prefix="kvckpt-demo-") as tmp:
        store = directory or Path(tmp) / "store"
        echo(f"reference: generating up to {config.max_tokens} tokens uninterrupted in a worker ...")
        reference = run_worker("generate", config)[-1]
        echo(f"worker: generating with autosave every {config.autosave_every} tokens into {store}; SIGKILL once a "
             f"checkpoint holds {kill_after} generated tokens ...")
        events = run_until_killed(replace(config, store=str(store)),
                                  lambda e: e["event"] == "saved" and e["generated"] >= kill_after)
        killed = events[-1]
        echo(f"worker: killed with SIGKILL after checkpoint generation {killed['generation']} "
             f"({killed['kv_length']} tokens of K/V, {killed['generated']} generated tokens)")
        events = run_worker("resume", replace(config, store=str(store)))
        resumed = next(e for e in events if e["event"] == "resumed")
        result = events[-1]
    report = DemoReport(reference, killed, resumed, result)
    echo(f"fresh process: resumed from {resumed['generated']} generated tokens "
         + ("(K/V restored)" if resumed["kv_restored"] else f"(K/V re-run: {resumed['message']})"))
    echo("reply: " + result["text"])
    n, before = len(result["generated_tokens"]), resumed["generated"]
    if not report.identical:
        raise KVCkptError(f"generated_tokens: expected the {len(reference['generated_tokens'])} tokens of the "
                          f"uninterrupted run, got {n} tokens that differ (resumed after {before})")
    echo(f"identical: the {n} tokens ({before} before the kill + {n - before} after the resume) equal the "
         "uninterrupted run's")
    echo(f"resume: restore + import of {resumed['kv_length']} tokens of K/V {resumed['restore_s'] * 1e3:.0f} ms (the "
         f"fresh process's first GPU work); prefill of the same {resumed['kv_length']} tokens in that process "
         f"{result['prefill_s'] * 1e3:.0f} ms")
    return report


if __name__ == "__main__":
    sys.exit(worker_main())
