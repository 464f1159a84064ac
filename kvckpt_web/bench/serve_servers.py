"""The servers of :mod:`kvckpt_web.bench.serve`, each a process of its own on a free port of 127.0.0.1:
``kvckpt serve --api`` (this interpreter, this checkout) and llama-cpp-python's server (``python -m
llama_cpp.server`` from the peers venv), and what that server supports for concurrent requests.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from ..errors import KVCkptError

START_PATIENCE = 600.0
"""Seconds a server may take to load its model and listen (a limit, never a measured time)."""
OURS_READY = re.compile(r"API on (http://[^/\s]+)/v1")
LLAMA_READY = re.compile(r"Uvicorn running on (http://\S+)")
LLAMA_SUPPORT = """\
import json, llama_cpp
from llama_cpp.server import app, settings
names = [*settings.ModelSettings.model_fields, *settings.ServerSettings.model_fields]
print(json.dumps({"version": llama_cpp.__version__, "one_lock": hasattr(app, "llama_outer_lock"),
                  "parallel": [n for n in names if any(w in n for w in ("parallel", "slot", "seq"))]}))
"""
"""Run in the peers venv: its version, whether its app holds one lock around the model, and any setting whose
name speaks of parallel slots or sequences."""


class ServerProcess:
    """A server process, its output drained by a thread (the last lines kept for errors); :attr:`url` is its
    base URL once it printed the line ``ready`` matches."""

    def __init__(self, name: str, argv: list[str], ready: re.Pattern[str], env: dict[str, str] | None = None) -> None:
        self.name = name
        self.url = ""
        self.tail: collections.deque[str] = collections.deque(maxlen=30)
        self._ready = threading.Event()
        self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, env=env)
        self._reader = threading.Thread(target=self._drain, args=(ready,), name=f"bench-serve-{name}", daemon=True)
        self._reader.start()

    def _drain(self, ready: re.Pattern[str]) -> None:
        for line in self.process.stdout:
            self.tail.append(line.rstrip())
            found = ready.search(line)
            if found and not self.url:
                self.url = found.group(1).rstrip("/")
                self._ready.set()
        self._ready.set()  # ended: wait_ready() finds no url

    def wait_ready(self) -> str:
        """The base URL once the server listens; KVCkptError with its last lines if it ended or took too long."""
        self._ready.wait(START_PATIENCE)
        if not self.url:
            self.close()
            lines = "\n".join(self.tail)
            raise KVCkptError(f"{self.name}: expected a server listening within {START_PATIENCE:.0f} s, got "
                              f"exit status {self.process.returncode}; its last lines:\n{lines}")
        return self.url

    def close(self) -> None:
        """Stop it as Ctrl-C does (killed if it has not ended a minute later)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._reader.join()


def start_ours(model: Path) -> ServerProcess:
    """``kvckpt serve --api`` of this checkout on ``model``, its conversations in memory."""
    argv = [sys.executable, "-m", "kvckpt_web.cli", "serve", "--api", "--model", str(model), "--port", "0"]
    return ServerProcess("kvckpt serve --api", argv, OURS_READY)


def start_llama(python: str, model: Path, threads: int) -> ServerProcess:
    """llama-cpp-python's server on ``model`` with ``threads`` threads, each request run to its end (its default,
    ``interrupt_requests``, ends a streaming reply as soon as another request arrives)."""
    argv = [python, "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1", "--port", "0",
            "--n_threads", str(threads), "--n_threads_batch", str(threads), "--n_ctx", "2048",
            "--interrupt_requests", "False"]
    return ServerProcess("llama_cpp.server", argv, LLAMA_READY, env=dict(os.environ, OMP_WAIT_POLICY="passive"))


@dataclass(frozen=True)
class LlamaSupport:
    """What the peers venv's llama-cpp-python server is, or why it cannot run."""

    version: str = ""
    one_lock: bool = False
    parallel: tuple[str, ...] = ()
    missing: str = ""
    """Why llama.cpp is not benchmarked ("" where it is)."""

    def describe(self) -> str:
        """One line saying what its server does with concurrent requests."""
        if self.missing:
            return f"llama.cpp: not benchmarked: {self.missing}"
        if self.one_lock and not self.parallel:
            how = ("no parallel slots and no batching: one Llama behind one lock, so requests run one at a time, "
                   "in turn (no setting names parallel slots or sequences; llama.cpp's own C++ llama-server has "
                   "them, --parallel)")
        else:
            how = (f"settings {', '.join(self.parallel) or 'none'} name parallel slots or sequences; one lock around "
                   f"the model: {'yes' if self.one_lock else 'no'}")
        return (f"llama.cpp: llama-cpp-python {self.version}'s server (python -m llama_cpp.server), "
                f"--interrupt_requests False: {how}")


def llama_support(python: str) -> LlamaSupport:
    """Ask the peers venv's ``python`` what its llama-cpp-python server supports; a LlamaSupport whose
    ``missing`` says why where it cannot run (no such venv, no ``[server]`` extra)."""
    if not Path(python).is_file():
        return LlamaSupport(missing=f"no {python} (make bench-peers builds llama-cpp-python into build/peers-venv)")
    done = subprocess.run([python, "-c", LLAMA_SUPPORT], capture_output=True, text=True)
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return LlamaSupport(missing=f"{python} cannot import llama-cpp-python's server ({last}; its [server] "
                            "extra: pip install fastapi uvicorn sse-starlette starlette-context pydantic-settings)")
    found = json.loads(done.stdout)
    return LlamaSupport(found["version"], found["one_lock"], tuple(found["parallel"]))
