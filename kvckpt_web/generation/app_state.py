"""What a generation saves with its K/V: the ``app_state`` of its checkpoints, a :class:`SavedGeneration`
written by its :meth:`~SavedGeneration.to_json` and read back, checked field by field, by
:func:`parse_app_state`.

The K/V of a checkpoint never include the last token picked: that token is *pending*. ``kv_length`` says
how many of the tokens the K/V hold; with the sampler's state after the last pick and the stop rules, that is
everything a resumed run needs to take exactly the step an uninterrupted run takes next. ``prefill_chunk``
and ``replies`` say how the tokens were split into forward calls, so a replay of them (when the K/V cannot
be used) runs the same calls; ``conversation`` names the conversation the reply belongs to
(:mod:`~kvckpt_web.generation.conversation`); ``extra`` is the caller's own JSON object.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..checks import check_each, check_int, type_name
from ..errors import FieldError, FormatError, is_int
from ..model.sampler import Sampler
from .conversation import Conversation
from .json_schema import response_shape

__all__ = ["APP_FORMAT", "APP_VERSION", "CONSTRAINED_VERSION", "FINISH_REASONS", "SavedGeneration", "StopRules", "check_replies",
           "check_token_ids", "parse_app_state", "resume_limits"]

APP_FORMAT = "kvckpt.generation"
"""The ``format`` tag of a generation's ``app_state``."""
APP_VERSION = 1
"""The ``version`` of the ``app_state`` schema this module writes for a reply of free text (and reads)."""
CONSTRAINED_VERSION = 2
"""The ``version`` it writes for a reply held to a ``response_format`` (and reads): a reader of version 1 alone
would resume such a reply unconstrained, so it must refuse it."""
FINISH_REASONS = ("eos", "stop", "length", "context")
"""Why a generation ended: an end-of-sequence id, a stop string, ``max_tokens``, the context is full."""


def check_token_ids(field_name: str, tokens: Any) -> list[int]:
    """``tokens`` as a list if it is a sequence of token ids (integers >= 0); FieldError naming the field if not."""
    if not isinstance(tokens, Sequence):  # token ids are in order: a list or tuple, not a set
        raise FieldError(field_name, "a list of token ids", type_name(tokens))
    return check_each(field_name, tokens, "a list of token ids", lambda field, t: check_int(field, t, 0))


def _stop_string(field_name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise FieldError(field_name, "a non-empty string", value if isinstance(value, str) else type_name(value))
    return value


@dataclass(frozen=True)
class StopRules:
    """When a generation ends (besides a full context)."""

    max_tokens: int = 256
    """The most tokens to generate."""
    eos_ids: tuple[int, ...] = ()
    """Token ids that end the reply (kept in the tokens, not in the text)."""
    stop_strings: tuple[str, ...] = ()
    """Texts that end the reply where they first appear in it (not part of the text)."""

    def __post_init__(self) -> None:
        check_int("max_tokens", self.max_tokens, 1)
        object.__setattr__(self, "eos_ids", tuple(check_token_ids("eos_ids", self.eos_ids)))
        object.__setattr__(self, "stop_strings", tuple(check_each("stop_strings", self.stop_strings,
                                                                  "a list of strings", _stop_string)))

    def to_json(self) -> dict[str, Any]:
        return {"max_tokens": self.max_tokens, "eos_ids": list(self.eos_ids), "stop_strings": list(self.stop_strings)}

    @classmethod
    def from_json(cls, value: Any, field_name: str = "stop") -> "StopRules":
        if not isinstance(value, dict):
            raise FormatError(field_name, "a JSON object", type(value).__name__)
        try:
            return cls(value.get("max_tokens"), value.get("eos_ids", ()), value.get("stop_strings", ()))
        except FieldError as exc:
            raise FormatError(f"{field_name}.{exc.field}", exc.expected, exc.got) from None


@dataclass
class SavedGeneration:
    """A generation's ``app_state``: what a save of it records (:meth:`to_json`) and what
    :func:`parse_app_state` reads back, checked."""

    model: str
    prompt: list[int]
    generated: list[int]
    kv_length: int
    prefill_chunk: int
    sampler: Sampler
    stop: StopRules
    finish_reason: str | None
    conversation: Conversation | None
    """None: a checkpoint written before generations recorded their conversation."""
    context: int | None = None
    autosave_every: int | None = None
    autosave_keep: int | None = None
    replies: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    response_format: dict[str, Any] | None = None
    """OpenAI's ``response_format`` the reply is held to (None: free text)."""

    def to_json(self) -> dict[str, Any]:
        """The ``app_state`` a generation saves with its K/V.

        ``prompt_tokens + generated_tokens`` are every token so far; the checkpoint's K/V are those of the
        first ``kv_length`` of them (always fewer than all: the rest are pending); ``sampler`` is the sampler's
        state after the last pick; ``prefill_chunk`` fixes how the prompt was split into forward calls;
        ``conversation`` (``{"id", "created_ms"}``, left out if None) is the conversation the reply belongs to.
        What a resumed run continues with unless told otherwise: ``context`` (the most tokens of prompt and
        reply), ``autosave_every`` and ``autosave_keep`` (its autosave's interval and generations kept). Each
        optional key is left out when None; version 1 readers that predate them ignore them, and a checkpoint
        without them still resumes (a conversation of unknown id, the caller's or default settings).
        ``replies`` (``[start, end)`` of each earlier reply's generated ids in the prompt: those tokens ran one per
        forward call) say how earlier turns ran, for a replay; ``extra`` is the caller's own JSON object, kept as it
        is (both left out when empty). ``response_format`` (left out when None, and then the version is 1, else 2)
        is the JSON format the reply is held to: a resumed reply is held to it too.
        """
        version = APP_VERSION if self.response_format is None else CONSTRAINED_VERSION
        state = {"format": APP_FORMAT, "version": version, "model": self.model,
                 "prompt_tokens": list(self.prompt), "generated_tokens": list(self.generated),
                 "kv_length": self.kv_length, "prefill_chunk": self.prefill_chunk, "sampler": self.sampler.to_json(),
                 "stop": self.stop.to_json(), "finish_reason": self.finish_reason}
        if self.conversation is not None:
            state["conversation"] = self.conversation.to_json()
        for key in ("context", "autosave_every", "autosave_keep"):
            if getattr(self, key) is not None:
                state[key] = getattr(self, key)
        if self.replies:
            state["replies"] = [list(r) for r in self.replies]
        if self.extra:
            state["extra"] = self.extra
        if self.response_format is not None:
            state["response_format"] = self.response_format
        return state

    def call_end(self, position: int, target: int) -> int:
        """Where the forward call that ran token ``position`` ended, in the run that made these tokens (stopping
        at ``target``; APP_STATE.md section 2): a reply's generated tokens ran one per call (but its last, which
        the next turn's prefill ran), every other stretch in prefill chunks aligned to multiples of
        ``prefill_chunk``."""
        aligned = (position // self.prefill_chunk + 1) * self.prefill_chunk
        current = (len(self.prompt), len(self.prompt) + len(self.generated))
        for start, end in (*self.replies, current):
            if start <= position < end - 1:
                return position + 1
            if position < start:
                return min(target, start, aligned)
        return min(target, aligned)


def parse_app_state(app_state: Any) -> SavedGeneration:
    """The generation state in a checkpoint's ``app_state``; FormatError naming the field if it is not one."""
    if not isinstance(app_state, dict):
        raise FormatError("app_state", "a JSON object", type(app_state).__name__)
    if app_state.get("format") != APP_FORMAT:
        raise FormatError("app_state.format", repr(APP_FORMAT), app_state.get("format"),
                          "the checkpoint was not written by a generation")
    if app_state.get("version") not in (APP_VERSION, CONSTRAINED_VERSION):
        raise FormatError("app_state.version", f"{APP_VERSION} or {CONSTRAINED_VERSION}", app_state.get("version"))
    try:
        prompt = check_token_ids("app_state.prompt_tokens", app_state.get("prompt_tokens"))
        generated = check_token_ids("app_state.generated_tokens", app_state.get("generated_tokens"))
        kv_length = check_int("app_state.kv_length", app_state.get("kv_length"), 0)
        prefill_chunk = check_int("app_state.prefill_chunk", app_state.get("prefill_chunk"), 1)
        context, every, keep = (None if app_state.get(key) is None else check_int(f"app_state.{key}", app_state[key], 1)
                                for key in ("context", "autosave_every", "autosave_keep"))
    except FieldError as exc:
        raise FormatError(exc.field, exc.expected, exc.got) from None
    if not prompt:
        raise FormatError("app_state.prompt_tokens", "at least one token", 0)
    if kv_length >= len(prompt) + len(generated):
        raise FormatError("app_state.kv_length", f"less than the {len(prompt) + len(generated)} tokens saved",
                          kv_length)
    if generated and kv_length != len(prompt) + len(generated) - 1:
        raise FormatError("app_state.kv_length", f"{len(prompt) + len(generated) - 1} (all tokens but the pending "
                          "one, once tokens were generated)", kv_length)
    model = app_state.get("model")
    if not isinstance(model, str):
        raise FormatError("app_state.model", "a string", type(model).__name__)
    try:
        sampler = Sampler.from_json(app_state.get("sampler"))
    except FieldError as exc:
        raise FormatError(f"app_state.{exc.field}", exc.expected, exc.got) from None
    reason = app_state.get("finish_reason")
    if reason is not None and reason not in FINISH_REASONS:
        raise FormatError("app_state.finish_reason", f"null or one of {FINISH_REASONS}", reason)
    conversation = Conversation.from_json(app_state["conversation"]) if "conversation" in app_state else None
    extra = app_state.get("extra", {})
    if not isinstance(extra, dict):
        raise FormatError("app_state.extra", "a JSON object", type(extra).__name__)
    try:
        replies = check_replies("app_state.replies", app_state.get("replies", []), len(prompt))
    except FieldError as exc:
        raise FormatError(exc.field, exc.expected, exc.got) from None
    response_format = app_state.get("response_format")
    if (response_format is None) != (app_state["version"] == APP_VERSION):
        raise FormatError("app_state.response_format", f"present exactly in version {CONSTRAINED_VERSION}",
                          "present" if response_format is not None else "absent")
    if response_format is not None:
        try:
            if response_shape(response_format) is None:
                raise FieldError("response_format", "a JSON response format", response_format)
        except FieldError as exc:
            raise FormatError(f"app_state.{exc.field}", exc.expected, exc.got) from None
    return SavedGeneration(model, prompt, generated, kv_length, prefill_chunk, sampler,
                           StopRules.from_json(app_state.get("stop"), "app_state.stop"), reason, conversation, context,
                           every, keep, replies, extra, response_format)


def check_replies(field_name: str, replies: Any, prompt_length: int) -> list[tuple[int, int]]:
    """``replies`` as ``(start, end)`` pairs: in order, apart, each of at least one token, all within the
    prompt's ``prompt_length`` tokens; FieldError naming the first bad one."""
    if isinstance(replies, (str, bytes)) or not isinstance(replies, Sequence):
        raise FieldError(field_name, "a list of [start, end] pairs", type_name(replies))
    out: list[tuple[int, int]] = []
    for i, pair in enumerate(replies):
        floor = out[-1][1] if out else 0
        if (isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2
                or not all(is_int(v) for v in pair) or not floor <= pair[0] < pair[1] <= prompt_length):
            raise FieldError(f"{field_name}[{i}]", f"[start, end] with {floor} <= start < end <= {prompt_length}",
                             repr(pair))
        out.append((pair[0], pair[1]))
    return out


def resume_limits(app_state: Any) -> tuple[int, int | None]:
    """What a cache must take to resume the generation saved with ``app_state``: its prefill chunk, and its
    context (None in checkpoints written before it was recorded); FormatError naming the field if
    ``app_state`` is not a generation's."""
    saved = parse_app_state(app_state)
    return saved.prefill_chunk, saved.context
