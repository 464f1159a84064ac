"""What the engine answers: a whole reply (:class:`ChatCompletion`) or its pieces as they come
(:class:`ChatChunk`), with the :class:`Usage` of the call; ``to_openai()`` gives OpenAI's wire format: a chat's
``chat.completion`` (``chat.completion.chunk``), or a plain completion's ``text_completion``.

Beyond OpenAI's fields, ``usage`` carries ``timings`` (seconds of restoring K/V, of prefill, of saves and of
decode, measured once the GPU work has finished and adding up to the call's time, and the rates they give), and
a top-level ``kvckpt`` object names the conversation the reply is saved under and the reply's token ids, and,
only when there are some, ``warnings``: what the reply did without (K/V in the store that could not be used, and
what was done instead). Clients that do not know them ignore them.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..generation.results import ResumeReport

__all__ = ["FINISH_REASONS", "ChatChunk", "ChatCompletion", "ChatStream", "Timings", "TokenLogprobs", "Usage"]

FINISH_REASONS = ("stop", "length", "abort")
"""Why a reply ended, as OpenAI's ``finish_reason`` says it: an end-of-turn token or a stop string, the token
limit or the context, an interrupt (the reply stays resumable)."""


@dataclass(frozen=True)
class Timings:
    """Where the time of one call went, measured when the GPU work had finished: ``restore_s + prefill_s + save_s +
    decode_s`` is the time from the call to its last chunk."""

    restore_s: float = 0.0
    """Reading, verifying and importing K/V from the store (a persistent prefix hit or a resume)."""
    prefill_s: float = 0.0
    """Running the prompt tokens the cache did not hold, to the first token (its saves apart)."""
    decode_s: float = 0.0
    """Generating the reply after its first token (which the prefill produced), its saves apart."""
    prefill_tokens: int = 0
    decode_tokens: int = 0
    save_s: float = 0.0
    """Committing the reply's checkpoints to the store (each timed once the device had run the work queued before
    it, which is the prefill's or the decode's); 0 without a store."""

    def to_json(self) -> dict[str, Any]:
        rate = lambda n, s: n / s if n and s > 0 else None  # noqa: E731
        return {"restore_s": self.restore_s, "prefill_s": self.prefill_s, "save_s": self.save_s,
                "decode_s": self.decode_s,
                "prefill_tokens_per_s": rate(self.prefill_tokens, self.prefill_s),
                "decode_tokens_per_s": rate(self.decode_tokens, self.decode_s)}


@dataclass(frozen=True)
class Usage:
    """Token counts of one call: ``cached_tokens`` of the ``prompt_tokens`` came from the cache or the store
    instead of being prefilled."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    timings: Timings = field(default_factory=Timings)

    def to_openai(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
                "timings": self.timings.to_json()}


@dataclass(frozen=True)
class TokenLogprobs:
    """One reply token's log probability, as text: the token's ``text`` and ``bytes``, its ``logprob`` (the
    log-softmax of the model's raw logits: temperature 1, before any penalty), the ``top`` alternatives as (text,
    bytes, logprob), most likely first, and where its text starts in the reply (``offset``, in characters)."""

    text: str
    bytes: bytes
    logprob: float
    top: tuple[tuple[str, bytes, float], ...]
    offset: int

    def to_openai(self) -> dict[str, Any]:
        """A chat's ``logprobs.content`` entry."""
        return {"token": self.text, "logprob": self.logprob, "bytes": list(self.bytes),
                "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(b)} for t, b, lp in self.top]}


def _logprobs(entries: "tuple[TokenLogprobs, ...] | None", text_completion: bool) -> dict[str, Any] | None:
    """A choice's ``logprobs``: a chat's ``{"content", "refusal"}``, a plain completion's legacy ``{"tokens",
    "token_logprobs", "top_logprobs", "text_offset"}``; None when they were not asked for."""
    if entries is None:
        return None
    if not text_completion:
        return {"content": [e.to_openai() for e in entries], "refusal": None}
    return {"tokens": [e.text for e in entries], "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{t: lp for t, _, lp in e.top} for e in entries],
            "text_offset": [e.offset for e in entries]}


@dataclass(frozen=True)
class ChatChunk:
    """A piece of a streamed reply: new text and the token ids that made it final; the last chunk has the
    ``finish_reason`` and the ``usage``."""

    id: str
    created: int
    model: str
    conversation: str
    text: str = ""
    token_ids: tuple[int, ...] = ()
    finish_reason: str | None = None
    usage: Usage | None = None
    first: bool = False
    """The first chunk of the reply (it carries the assistant role)."""
    resumed: "ResumeReport | None" = None
    """On the first chunk of a reply :meth:`Engine.resume` brought back from the store: whether its K/V were
    imported or (unusable: another model or layout, a damaged chunk) their tokens run again, and the times."""
    warnings: tuple[str, ...] = ()
    """On the first chunk: what the reply did without (K/V of the store that could not be used: a damaged chunk or
    manifest), and what was done instead (an older generation restored, the prompt prefilled)."""
    text_completion: bool = False
    """A plain completion's chunk (OpenAI's ``text_completion`` on the wire), not a chat's."""
    logprobs: tuple[TokenLogprobs, ...] | None = None
    """The log probabilities of ``token_ids`` where the request asked for them (None: it did not)."""

    def to_openai(self) -> dict[str, Any]:
        if self.text_completion:
            out = _text_completion(self.id, self.created, self.model, self.text, self.finish_reason,
                                   _logprobs(self.logprobs, True))
            out["kvckpt"] = _kvckpt(self.conversation, self.token_ids, self.warnings)
            if self.usage is not None:
                out["usage"] = self.usage.to_openai()
            return out
        delta: dict[str, Any] = {"role": "assistant"} if self.first else {}
        if self.text or self.first:
            delta["content"] = self.text
        out = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
               "choices": [{"index": 0, "delta": delta, "logprobs": _logprobs(self.logprobs, False),
                            "finish_reason": self.finish_reason}],
               "kvckpt": _kvckpt(self.conversation, self.token_ids, self.warnings)}
        if self.usage is not None:
            out["usage"] = self.usage.to_openai()
        return out


@dataclass(frozen=True)
class ChatCompletion:
    """A whole reply."""

    id: str
    created: int
    model: str
    conversation: str
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str
    usage: Usage
    warnings: tuple[str, ...] = ()
    """What the reply did without (see :attr:`ChatChunk.warnings`)."""
    resumed: "ResumeReport | None" = None
    """How the K/V of a reply :meth:`Engine.resume` brought back from the store came back (see
    :attr:`ChatChunk.resumed`); None when they did not come from the store."""
    text_completion: bool = False
    """A plain completion (OpenAI's ``text_completion`` on the wire), not a chat's reply."""
    logprobs: tuple[TokenLogprobs, ...] | None = None
    """The log probabilities of ``token_ids`` where the request asked for them (None: it did not)."""

    @classmethod
    def from_chunks(cls, chunks: Sequence[ChatChunk]) -> "ChatCompletion":
        """The whole reply that ``chunks`` (a whole stream, its final chunk last) tell in pieces."""
        last = chunks[-1]
        asked = any(c.logprobs is not None for c in chunks)
        return cls(last.id, last.created, last.model, last.conversation, "".join(c.text for c in chunks),
                   tuple(t for c in chunks for t in c.token_ids), last.finish_reason, last.usage,
                   tuple(w for c in chunks for w in c.warnings), chunks[0].resumed, last.text_completion,
                   tuple(e for c in chunks for e in c.logprobs or ()) if asked else None)

    def to_openai(self) -> dict[str, Any]:
        if self.text_completion:
            return {**_text_completion(self.id, self.created, self.model, self.text, self.finish_reason,
                                       _logprobs(self.logprobs, True)),
                    "usage": self.usage.to_openai(), "kvckpt": _kvckpt(self.conversation, self.token_ids, self.warnings)}
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": self.text},
                             "logprobs": _logprobs(self.logprobs, False), "finish_reason": self.finish_reason}],
                "usage": self.usage.to_openai(),
                "kvckpt": _kvckpt(self.conversation, self.token_ids, self.warnings)}


class ChatStream:
    """A reply streamed as it comes: an async iterator of :class:`ChatChunk` that says from the start how the K/V
    of a reply :meth:`Engine.resume` brought back from the store came back (:attr:`resumed`, the same report its
    first chunk carries)."""

    def __init__(self, chunks: AsyncGenerator[ChatChunk, None], resumed: "ResumeReport | None" = None) -> None:
        self._chunks = chunks
        #: How the reply's K/V came back from the store; None when they did not come from there.
        self.resumed = resumed

    def __aiter__(self) -> "ChatStream":
        return self

    async def __anext__(self) -> ChatChunk:
        return await anext(self._chunks)

    async def aclose(self) -> None:
        """Stop reading: the reply stops as an interrupt stops it (saved, resumable)."""
        await self._chunks.aclose()


def _text_completion(id: str, created: int, model: str, text: str, finish_reason: str | None,
                     logprobs: dict[str, Any] | None) -> dict[str, Any]:
    """OpenAI's ``text_completion`` object (a whole completion, or a chunk of a streamed one), without usage."""
    return {"id": id, "object": "text_completion", "created": created, "model": model,
            "choices": [{"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish_reason}]}


def _kvckpt(conversation: str, token_ids: Sequence[int], warnings: Sequence[str]) -> dict[str, Any]:
    """The wire's ``kvckpt`` object: ``warnings`` only when there are some."""
    out: dict[str, Any] = {"conversation": conversation, "token_ids": list(token_ids)}
    if warnings:
        out["warnings"] = list(warnings)
    return out
