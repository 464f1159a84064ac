"""``kvckpt demo``: a reply generated with autosave, its worker SIGKILLed mid-reply, resumed in a fresh process.

Three worker processes (:mod:`.chat_worker`: a chat engine each, the model built by a factory named
``"module:function"``) answer the same prompt: one uninterrupted (the reference); one autosaving into a
FileStore, held after ``kill_after`` reply tokens and killed with SIGKILL there; a fresh one that resumes the
reply from the store and finishes it. The demo prints the reply, whether its tokens equal the reference's, and
the time the resume took to bring the K/V back next to a cold prefill of the prompt alone in that process. A base
model (``raw``: no chat template) continues the prompt as a plain completion instead of answering it.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..durable.catalog import load_manifest
from ..errors import KVCkptError
from ..generation.app_state import parse_app_state
from ..stores.file import FileStore
from .chat_worker import DEFAULT_FACTORY, ChatProcess, WorkerConfig, after_tokens, done

DEMO_PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
NAME = "demo"


@dataclass(frozen=True)
class DemoConfig:
    """What the demo's workers run."""

    factory: str = DEFAULT_FACTORY
    prompt: str = DEMO_PROMPT
    max_tokens: int = 64
    sampler: dict[str, Any] = field(default_factory=lambda: {"seed": 0, "temperature": 0.7, "top_k": 40,
                                                             "top_p": 0.9})
    engine: dict[str, Any] = field(default_factory=lambda: {"context": 1024, "sequences": 1, "cache_tokens": 1024,
                                                            "prefill_chunk": 256, "page_size": 16,
                                                            "autosave_every": 8})
    model: str | None = None
    """A GGUF file the workers load instead of calling ``factory``."""
    raw: bool = False
    """Whether the prompt is continued as a plain completion (a base model's) rather than answered in a chat."""

    def worker(self, store: Path | None = None, lockstep: bool = False) -> WorkerConfig:
        return WorkerConfig(self.factory, None if store is None else str(store), self.engine, lockstep, self.model)

    def request(self, **settings: Any) -> dict[str, Any]:
        """The worker command of the demo's turn (``op`` and its arguments): its prompt with the demo's settings,
        saved as conversation NAME, or with ``settings`` instead."""
        settings = settings or {"max_tokens": self.max_tokens, **self.sampler, "conversation": NAME}
        if self.raw:
            return {"op": "complete", "prompt": self.prompt, "settings": settings}
        return {"op": "chat", "messages": [{"role": "user", "content": self.prompt}], "settings": settings}


@dataclass(frozen=True)
class DemoReport:
    """What the demo found: the reference's ``done``, where the worker was killed and what its store held
    then, the resume's report and the resumed reply's ``done`` (with ``prefill_s``)."""

    reference: dict[str, Any]
    killed_after: dict[str, Any]
    resumed: dict[str, Any]
    result: dict[str, Any]

    @property
    def identical(self) -> bool:
        return self.result["token_ids"] == self.reference["token_ids"]


async def _newest(store: Path) -> dict[str, Any]:
    """The generation, K/V length and reply tokens of the newest checkpoint of NAME in ``store``."""
    manifest, _ = await load_manifest(FileStore(store, read_only=True), NAME)
    saved = parse_app_state(manifest.app_state)
    return {"generation": manifest.generation, "kv_length": saved.kv_length, "saved_generated": len(saved.generated)}


def run_generation_demo(config: DemoConfig = DemoConfig(), *, kill_after: int = 16, directory: Path | None = None,
                        echo: Callable[[str], None] = print) -> DemoReport:
    """Run the crash/resume demo and print what happened; KVCkptError if the resumed reply differs."""
    with tempfile.TemporaryDirectory(prefix="kvckpt-demo-") as tmp:
        store = directory or Path(tmp) / "store"
        echo(f"reference: generating up to {config.max_tokens} tokens uninterrupted in a worker ...")
        with ChatProcess(config.worker()) as worker:
            reference = done(worker.run(**config.request()))
        echo(f"worker: generating with autosave every {config.engine['autosave_every']} tokens into {store}; "
             f"SIGKILL after {kill_after} reply tokens ...")
        with ChatProcess(config.worker(store, lockstep=True)) as worker:
            worker.run(until=after_tokens(kill_after), **config.request())
            worker.kill()
        killed = {"generated": kill_after, **asyncio.run(_newest(store))}
        echo(f"worker: killed with SIGKILL after {kill_after} generated tokens; its last checkpoint, generation "
             f"{killed['generation']}, holds {killed['kv_length']} tokens of K/V ({killed['saved_generated']} "
             "generated tokens)")
        with ChatProcess(config.worker(store)) as worker:
            events = worker.run("resume", name=NAME)
            cold = done(worker.run(scratch=True, **config.request(max_tokens=1, temperature=0.0, cache_prompt=False)))
    first = events[0]
    resumed = {**first["resumed"], "generated": len(first["token_ids"])}
    result = {**done(events), "prefill_s": cold["usage"]["timings"]["prefill_s"],
              "prompt_tokens": cold["usage"]["prompt_tokens"]}
    report = DemoReport(reference, killed, resumed, result)
    echo(f"fresh process: resumed from {resumed['generated']} generated tokens "
         + ("(K/V restored)" if resumed["kv_restored"] else f"(K/V re-run: {resumed['message']})"))
    echo("reply: " + result["text"])
    n, before = len(result["token_ids"]), resumed["generated"]
    if not report.identical:
        raise KVCkptError(f"token_ids: expected the {len(reference['token_ids'])} tokens of the uninterrupted run, "
                          f"got {n} tokens that differ (resumed after {before})")
    echo(f"identical: the {n} tokens ({before} before the kill + {n - before} after the resume) equal the "
         "uninterrupted run's")
    echo(f"resume: restore + import of {resumed['kv_length']} tokens of K/V {resumed['restore_s'] * 1e3:.0f} ms; "
         f"a cold prefill of the {result['prompt_tokens']}-token prompt alone in that process "
         f"{result['prefill_s'] * 1e3:.0f} ms")
    return report
