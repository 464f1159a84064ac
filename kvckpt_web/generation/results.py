"""What generating gives back: each token as it comes (:class:`TokenEvent`), a finished generation
(:class:`GenerationResult`), and how :func:`~kvckpt_web.generation.resume.resume` got its K/V back
(:class:`ResumeReport`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..model.protocol import TokenLogprob

__all__ = ["GenerationResult", "ResumeReport", "TokenEvent"]


@dataclass(frozen=True)
class TokenEvent:
    """One generated token as it is produced."""

    token: int
    index: int
    """Its index among the generated tokens (0: the first token of the reply)."""
    text: str
    """The reply text that became final with this token (text that may still turn into a stop string or an
    incomplete UTF-8 character waits for later tokens)."""
    logprob: TokenLogprob | None = None
    """The token's log probability (and its alternatives') where :attr:`Generator.logprobs` asked for them."""


@dataclass(frozen=True)
class ResumeReport:
    """How :func:`~kvckpt_web.generation.resume.resume` got its K/V back."""

    name: str
    generation: int
    kv_restored: bool
    """True: the checkpoint's K/V were imported; False: the saved tokens were run through the model again."""
    reason: str | None
    """Why the K/V were not used: "model" (another model identity), "layout" (another cache layout),
    "corrupt" (a chunk damaged or missing), "length" (K/V of another length than app_state says); None if used."""
    message: str
    kv_length: int
    """Tokens whose K/V the cache holds after the resume."""
    restore_s: float
    """Seconds spent restoring the K/V (store read, verify, import), failed attempts included."""
    replay_s: float
    """Seconds spent running the saved tokens through the model (0 if the K/V were restored)."""


@dataclass(frozen=True)
class GenerationResult:
    """A finished generation."""

    prompt_tokens: tuple[int, ...]
    generated_tokens: tuple[int, ...]
    text: str
    finish_reason: str
