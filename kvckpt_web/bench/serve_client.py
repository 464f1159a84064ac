"""The clients of :mod:`kvckpt_web.bench.serve`: a streamed chat completion (or plain completion, for a base model)
over the standard library's HTTP client, timed from the request to its first token and to its last, and several
of them started at once on threads.

Only OpenAI's streaming surface is used (``POST /v1/chat/completions`` or ``/v1/completions`` with ``stream: true``,
server-sent events, ``data: [DONE]`` last), so the same client times any server that speaks it.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import KVCkptError

PATIENCE = 900.0
"""Seconds a reply may take at most (a socket timeout, never a measured time)."""


@dataclass(frozen=True)
class Reply:
    """One streamed reply, timed on the client's clock (``time.perf_counter``)."""

    sent: float
    """When the request was sent."""
    first: float
    """When the first chunk carrying text arrived."""
    done: float
    """When ``data: [DONE]`` arrived."""
    tokens: int
    """Tokens of the reply: the usage's ``completion_tokens`` where the server sent a usage, else the chunks that
    carried text (one a token on the servers benchmarked)."""
    refused: int = 0
    """503 answers (a full queue) before the request was taken."""

    @property
    def ttft(self) -> float:
        """Seconds from the request to its first token."""
        return self.first - self.sent


@dataclass(frozen=True)
class Endpoint:
    """Where a server takes the benchmark's requests: ``http://host:port`` and whether its model chats (a base model,
    without a chat template, is sent plain completions)."""

    url: str
    chat: bool = True

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.chat else "/v1/completions"

    def body(self, prompt: str, max_tokens: int) -> dict[str, Any]:
        """The request of one client: ``prompt`` as a one-message conversation (or as a completion's prompt),
        answered greedily, ``max_tokens`` at most, streamed with its usage."""
        asked = {"messages": [{"role": "user", "content": prompt}]} if self.chat else {"prompt": prompt}
        return {**asked, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
                "stream_options": {"include_usage": True}}


def text_of(choice: dict[str, Any]) -> str:
    """The text a streamed choice carries: a chat chunk's ``delta.content``, a completion chunk's ``text``."""
    return (choice.get("delta") or {}).get("content") or choice.get("text") or ""


def events(lines: Iterator[bytes]) -> Iterator[dict[str, Any]]:
    """The JSON payloads of the server-sent events in ``lines`` until ``data: [DONE]``; KVCkptError if the stream
    ends before it."""
    for raw in lines:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            return
        yield json.loads(data)
    raise KVCkptError("a streamed reply ended without data: [DONE]")


def stream_reply(endpoint: Endpoint, prompt: str, max_tokens: int, on_token: Callable[[int], None] = lambda n: None
                 ) -> Reply:
    """Send one streamed request to ``endpoint`` and time it from the first attempt; ``on_token(n)`` is called as
    the ``n``-th chunk with text arrives. A 503 (a full queue) is sent again after its ``Retry-After`` (1 s without
    one); KVCkptError if the server answers anything else but 200."""
    parts = urllib.parse.urlsplit(endpoint.url)
    body = json.dumps(endpoint.body(prompt, max_tokens))
    sent, refused = time.perf_counter(), 0
    while True:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=PATIENCE)
        try:
            conn.request("POST", endpoint.path, body=body, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            if response.status == 503:
                response.read()
                refused += 1
                time.sleep(float(response.getheader("Retry-After") or 1))
                continue
            if response.status != 200:
                raise KVCkptError(f"POST {endpoint.url}{endpoint.path}: expected 200, got {response.status}: "
                                  f"{response.read()[:500]!r}")
            first, chunks, usage = 0.0, 0, None
            for event in events(iter(response.readline, b"")):
                usage = event.get("usage") or usage
                if any(text_of(choice) for choice in event.get("choices") or ()):
                    chunks += 1
                    if chunks == 1:
                        first = time.perf_counter()
                    on_token(chunks)
            done = time.perf_counter()
        finally:
            conn.close()
        if not chunks:
            raise KVCkptError(f"POST {endpoint.url}{endpoint.path}: expected a reply of at least one token, got none")
        return Reply(sent, first, done, usage["completion_tokens"] if usage else chunks, refused)


@dataclass(frozen=True)
class Burst:
    """Replies of clients that sent their requests at the same moment."""

    replies: tuple[Reply, ...]

    @property
    def seconds(self) -> float:
        """From the first request sent to the last reply done."""
        return max(r.done for r in self.replies) - min(r.sent for r in self.replies)

    @property
    def tokens(self) -> int:
        return sum(r.tokens for r in self.replies)

    @property
    def rate(self) -> float:
        """All the replies' tokens over :attr:`seconds`: the tokens a second the server gave all its clients."""
        return self.tokens / self.seconds


class Clients:
    """Requests run each on a thread of its own; :meth:`join` returns their replies (or raises the first error)."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []
        self.replies: dict[int, Reply] = {}
        self.errors: list[BaseException] = []

    def start(self, request: Callable[[], Reply]) -> None:
        index = len(self.threads)

        def run() -> None:
            try:
                self.replies[index] = request()
            except BaseException as exc:  # noqa: BLE001 - handed to join(), which raises it in the caller
                self.errors.append(exc)

        thread = threading.Thread(target=run, name=f"bench-serve-client-{index}", daemon=True)
        self.threads.append(thread)
        thread.start()

    def join(self) -> list[Reply]:
        for thread in self.threads:
            thread.join()
        if self.errors:
            raise self.errors[0]
        return [self.replies[i] for i in range(len(self.threads))]


def burst(endpoint: Endpoint, prompts: list[str], max_tokens: int) -> Burst:
    """Every prompt sent at once, each by a client of its own (started together at a barrier)."""
    barrier = threading.Barrier(len(prompts))
    clients = Clients()
    for prompt in prompts:
        clients.start(lambda prompt=prompt: (barrier.wait(), stream_reply(endpoint, prompt, max_tokens))[1])
    return Burst(tuple(clients.join()))
