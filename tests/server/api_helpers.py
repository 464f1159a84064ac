"""Helpers of the API tests: the API served in a thread or by ``kvckpt serve --api`` in a process, the official
``openai`` client on it, raw requests whose bytes the test chooses, and a model whose forwards wait at a gate
the test opens."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import openai
from serve_helpers import PATIENCE

from kvckpt_web.server.api import make_api_server
from kvckpt_web.server.worker import EngineWorker

USER = {"role": "user", "content": "tell me a story about the sea."}
SEEDED = {"temperature": 0.9, "seed": 7, "max_tokens": 24}


@contextmanager
def api_serving(worker: EngineWorker, **kwargs: Any) -> Iterator[str]:
    """The base URL (``http://127.0.0.1:PORT/``) of the API over ``worker``, served in a thread for the block."""
    server = make_api_server(worker, port=0, **kwargs)
    url = server.start()
    try:
        yield url
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def serving_api(*args: str, env: dict[str, str] | None = None) -> Iterator[tuple[str, subprocess.Popen]]:
    """``kvckpt serve --api --port 0 ARGS`` in a process of its own (its environment ``env``, default this
    process's): its base URL (read from its stdout) and the process."""
    server = subprocess.Popen([sys.executable, "-m", "kvckpt_web.cli", "serve", "--api", "--port", "0", *args],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        line = server.stdout.readline()
        assert "/v1 " in line, f"no URL printed, exit status {server.poll()}"
        yield line.split(" on ")[1].split()[0].removesuffix("v1"), server
    finally:
        if server.poll() is None:
            server.terminate()
        server.wait(PATIENCE)
        server.stdout.close()


def client(url: str) -> openai.OpenAI:
    """The official client on the API at ``url``, as a user makes it (no retries: each answer is the test's)."""
    return openai.OpenAI(base_url=url + "v1", api_key="none", max_retries=0, timeout=PATIENCE)


def raw(url: str, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
        ) -> tuple[int, http.client.HTTPMessage, bytes]:
    """Status, headers and body of ``method path`` with ``body`` sent as given (JSON's Content-Type unless
    ``headers`` say otherwise)."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=PATIENCE)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        response = conn.getresponse()
        return response.status, response.headers, response.read()
    finally:
        conn.close()


def until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends on ``sock`` until it closes it (within PATIENCE seconds)."""
    sock.settimeout(PATIENCE)
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def error_of(body: bytes) -> dict[str, Any]:
    """The OpenAI error object of an error answer's body (it has exactly OpenAI's four keys)."""
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and "\n" not in error["message"]
    return error


class GatedModel:
    """A model whose forwards after the first ``after`` wait until :meth:`open`: blocking the engine's thread (as
    GPU work on lavapipe does) or, with ``blocking=False``, awaiting (the engine's loop stays free)."""

    def __init__(self, model: Any, after: int, *, blocking: bool = True) -> None:
        self._model = model
        self.after, self.blocking = after, blocking
        self.forwards = 0
        self.reached = threading.Event()
        """Set once a forward waits at the gate."""
        self._gate = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def open(self) -> None:
        self._gate.set()

    async def forward(self, cache: Any, seq_id: int, tokens: list[int]) -> Any:
        await self._pass()
        return await self._model.forward(cache, seq_id, tokens)

    async def forward_batch(self, cache: Any, runs: list[tuple[int, list[int]]]) -> Any:
        await self._pass()
        return await self._model.forward_batch(cache, runs)

    async def _pass(self) -> None:
        """Count a forward; past the first ``after``, wait at the gate until it opens."""
        self.forwards += 1
        if self.forwards > self.after and not self._gate.is_set():
            self.reached.set()
            if self.blocking:
                self._gate.wait(PATIENCE)
            else:
                await asyncio.to_thread(self._gate.wait, PATIENCE)
