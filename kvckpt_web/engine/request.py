"""A request: a chat's whole message list, or a plain completion's raw prompt, and how to answer it, checked field
by field.

:meth:`ChatRequest.from_openai` reads the body of an OpenAI ``POST /v1/chat/completions`` and
:meth:`CompletionRequest.from_openai` that of a ``POST /v1/completions`` (what the HTTP API and the browser's
``engine.chat.completions.create`` / ``engine.completions.create`` are given); Python callers build a
:class:`ChatRequest` or :class:`CompletionRequest` directly. Either way every field is checked before anything runs, and a bad one is a :class:`FieldError`
naming it (``messages[2].role``, ``max_tokens``, ...).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..durable.keys import validate_name
from ..errors import FieldError, is_int
from ..generation.json_schema import response_shape
from ..model.protocol import MAX_TOP_LOGPROBS
from ..model.sampler import MAX_SEED

__all__ = ["ROLES", "ChatRequest", "CompletionRequest", "Message", "RequestSettings", "check_messages"]

ROLES = ("system", "developer", "user", "assistant")
"""The roles a message may have (``developer``: OpenAI's newer name for ``system``, rendered as the template's system
turn)."""

MAX_STOP_STRINGS = 4
"""Most stop strings a request may give (as OpenAI's API allows)."""

_IGNORED = frozenset({"model", "user", "n", "stream", "stream_options"})
"""OpenAI body keys that are read elsewhere (``model``, ``stream``, ``stream_options``) or checked for their
neutral value only (``n`` 1): the rest of the API."""

_SETTINGS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "repetition_penalty", "presence_penalty",
             "frequency_penalty", "cache_prompt", "conversation", "store")


@dataclass(frozen=True)
class Message:
    """One message of a conversation."""

    role: str
    content: str

    def to_json(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


def _content(value: Any, where: str) -> str:
    """A message's text: a string, or OpenAI's list of ``{"type": "text", "text": ...}`` parts joined."""
    if isinstance(value, str):
        return value
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        parts = []
        for i, part in enumerate(value):
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise FieldError(f"{where}[{i}]", "a text part {'type': 'text', 'text': str} (only text is supported)",
                                 part.get("type") if isinstance(part, Mapping) else type(part).__name__)
            parts.append(part["text"])
        return "".join(parts)
    raise FieldError(where, "a string", type(value).__name__)


def _message(value: Any, i: int) -> Message:
    where = f"messages[{i}]"
    if isinstance(value, Message):
        value = value.to_json()
    if not isinstance(value, Mapping):
        raise FieldError(where, "an object with 'role' and 'content'", type(value).__name__)
    for key in value:
        if key not in ("role", "content", "name"):
            raise FieldError(f"{where}.{key}", "only 'role', 'content' and 'name'", "an unsupported key")
    role = value.get("role")
    if role not in ROLES:
        raise FieldError(f"{where}.role", f"one of {list(ROLES)}", role if isinstance(role, str) else
                         type(role).__name__)
    if "content" not in value:
        raise FieldError(f"{where}.content", "a string", "none")
    content = _content(value["content"], f"{where}.content")
    if any(0xD800 <= ord(c) <= 0xDFFF for c in content):
        raise FieldError(f"{where}.content", "Unicode text (no lone surrogates)", "invalid text")
    return Message(role, content)


def check_messages(messages: Any) -> tuple[Message, ...]:
    """``messages`` as :class:`Message` objects: a non-empty list of system / developer / user / assistant
    messages whose last one is the user's (answered) or the assistant's (its reply continued from that text);
    FieldError naming the first bad field."""
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise FieldError("messages", "a list of {'role', 'content'} messages", type(messages).__name__)
    if not messages:
        raise FieldError("messages", "at least one message", "an empty list")
    checked = tuple(_message(m, i) for i, m in enumerate(messages))
    if checked[-1].role not in ("user", "assistant"):
        raise FieldError(f"messages[{len(checked) - 1}].role", "'user' (the last message is the one answered) or "
                         "'assistant' (its reply is continued)", checked[-1].role)
    return checked


def _number(name: str, value: Any, low: float, high: float, *, low_open: bool = False) -> float:
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
          and (value > low if low_open else value >= low) and value <= high)
    if not ok:
        bound = f"({low}, {high}]" if low_open else f"[{low}, {high}]"
        raise FieldError(name, f"a number in {bound}", value if isinstance(value, (int, float)) else
                         type(value).__name__)
    return float(value)


def _stops(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, Sequence) or isinstance(value, bytes):
        raise FieldError("stop", "a string or a list of strings", type(value).__name__)
    if len(value) > MAX_STOP_STRINGS:
        raise FieldError("stop", f"at most {MAX_STOP_STRINGS} strings", len(value))
    for i, s in enumerate(value):
        if not isinstance(s, str) or not s:
            raise FieldError(f"stop[{i}]", "a non-empty string", s if isinstance(s, str) else type(s).__name__)
    return tuple(value)


@dataclass(frozen=True, kw_only=True)
class RequestSettings:
    """How to answer a request, whatever it asks (the settings :class:`ChatRequest` and :class:`CompletionRequest`
    share).

    ``max_tokens`` None stops the reply after the engine's default (:attr:`EngineConfig.max_tokens`, 1024 unless
    configured) or at the end of the context, if sooner. ``presence_penalty`` and ``frequency_penalty`` (OpenAI's,
    in [-2, 2]) lower the logit of each token this reply generated by the first and by the second times its count
    (:class:`~kvckpt_web.model.sampler.SamplingSettings`). ``logprobs`` (None: off) gives each token's log
    probability with that many most likely alternatives: the log-softmax of the model's raw logits (temperature 1,
    before any penalty), whatever the sampling settings. ``seed`` None draws a seed for the
    reply and records it, so a resumed reply continues the same draws. ``cache_prompt`` False prefills the
    whole prompt from nothing (the K/V of a prefix reused from another conversation may differ from a cold
    prefill in the last bits). ``conversation`` names the conversation the reply is saved under (default:
    the conversation the prompt continues that no request named, the one used last of several, else a new
    one: a request that names none is never saved into a conversation another request named). ``store`` False
    answers without writing anything to the engine's store for the reply (no checkpoint, no prefix index record:
    it cannot be resumed, and a next turn reuses its K/V only while the cache holds them); it names no
    conversation then.
    """

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    repetition_penalty: float = 1.0
    cache_prompt: bool = True
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int | None = None
    conversation: str | None = None
    store: bool = True

    def __post_init__(self) -> None:
        if self.max_tokens is not None and not is_int(self.max_tokens, 1):
            raise FieldError("max_tokens", "an integer >= 1 or null", self.max_tokens)
        object.__setattr__(self, "temperature", _number("temperature", self.temperature, 0, 2))
        object.__setattr__(self, "top_p", _number("top_p", self.top_p, 0, 1, low_open=True))
        if not is_int(self.top_k, 0):
            raise FieldError("top_k", "an integer >= 0 (0: off)", self.top_k)
        if self.seed is not None and not is_int(self.seed, 0, MAX_SEED):
            raise FieldError("seed", f"an integer in [0, {MAX_SEED}] or null", self.seed)
        object.__setattr__(self, "stop", _stops(self.stop))
        object.__setattr__(self, "repetition_penalty",
                           _number("repetition_penalty", self.repetition_penalty, 0, 10, low_open=True))
        for name in ("presence_penalty", "frequency_penalty"):
            object.__setattr__(self, name, _number(name, getattr(self, name), -2, 2))
        if self.logprobs is not None and not is_int(self.logprobs, 0, MAX_TOP_LOGPROBS):
            raise FieldError("logprobs", f"an integer in [0, {MAX_TOP_LOGPROBS}] or null", self.logprobs)
        if not isinstance(self.cache_prompt, bool):
            raise FieldError("cache_prompt", "true or false", self.cache_prompt)
        if self.conversation is not None:
            if not isinstance(self.conversation, str):
                raise FieldError("conversation", "a conversation name (string) or null",
                                 type(self.conversation).__name__)
            validate_name(self.conversation)
        if not isinstance(self.store, bool):
            raise FieldError("store", "true or false", self.store)
        if not self.store and self.conversation is not None:
            raise FieldError("store", "true when conversation names one (a named conversation is saved)", False)

    def settings_json(self) -> dict[str, Any]:
        """The request's settings (everything but the messages or prompt, and ``store``) as JSON."""
        return {"max_tokens": self.max_tokens, "temperature": self.temperature, "top_p": self.top_p,
                "top_k": self.top_k, "seed": self.seed, "stop": list(self.stop),
                "repetition_penalty": self.repetition_penalty, "presence_penalty": self.presence_penalty,
                "frequency_penalty": self.frequency_penalty, "logprobs": self.logprobs,
                "cache_prompt": self.cache_prompt,
                "conversation": self.conversation}


_CHAT_NEUTRAL: dict[str, tuple[str, tuple[Any, ...]]] = {
    "tools": ("[] or null (no tools are called)", ([],)),
    "tool_choice": ('"none" or null (no tools are called)', ("none",)),
    "parallel_tool_calls": ("true, false or null (no tools are called)", (True, False)),
    "metadata": ("an object or null (it is not stored)", (dict,)),
    "logit_bias": ("{} or null (no biases are applied)", ({},)),
}
"""Keys of OpenAI's chat-completions body accepted only with a value that changes nothing (or null): what that is,
and the values (of the same JSON type), or the type of any value, that do."""

_COMPLETION_NEUTRAL: dict[str, tuple[str, tuple[Any, ...]]] = {
    "echo": ("false or null (the prompt is not echoed)", (False,)),
    "suffix": ("null (no text after the completion)", ()),
    "best_of": ("1 or null (one completion is made)", (1,)),
}
"""The same for OpenAI's (legacy) completions body."""


def _changes_nothing(value: Any, neutral: tuple[Any, ...]) -> bool:
    """Whether ``value`` is one of ``neutral`` (of its JSON type: ``false`` is no ``0``) or of a type in it."""
    return any(isinstance(value, n) if isinstance(n, type) else type(value) is type(n) and value == n
               for n in neutral)


def _openai_settings(body: Any, what: str, own: tuple[str, ...],
                     neutral: dict[str, tuple[str, tuple[Any, ...]]]) -> dict[str, Any]:
    """The settings of the OpenAI ``what`` body ``body`` whose own keys (beside the settings) are ``own`` and whose
    keys ``neutral`` are accepted with a value that changes nothing: unknown keys and values the engine cannot
    honour (``n`` other than 1, a ``neutral`` key of another value) are refused, naming the key."""
    if not isinstance(body, Mapping):
        raise FieldError("body", "a JSON object", type(body).__name__)
    for key in body:
        if key not in _IGNORED and key not in _SETTINGS and key not in own and key not in neutral:
            raise FieldError(key, f"a supported {what} parameter", "an unknown or unsupported key")
    for key, (expected, values) in neutral.items():
        value = body.get(key)
        if value is not None and not _changes_nothing(value, values):
            raise FieldError(key, f"{expected}: not supported otherwise", value)
    if not is_int(body.get("n", 1), 1, 1):  # a bool is not an int here: true is refused, not taken for 1
        raise FieldError("n", "1 (one choice per request)", body.get("n"))
    return {k: body[k] for k in _SETTINGS if k in body and body[k] is not None}


@dataclass(frozen=True)
class ChatRequest(RequestSettings):
    """What to answer (the whole conversation's ``messages``) and how (:class:`RequestSettings`).

    ``response_format`` is OpenAI's: ``{"type": "json_object"}`` or ``{"type": "json_schema", ...}`` hold the
    reply to a JSON value of that shape (:mod:`~kvckpt_web.generation.json_schema` says which schemas);
    ``{"type": "text"}`` is as None, free text (and is kept as None).
    """

    messages: tuple[Message, ...]
    response_format: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "messages", check_messages(self.messages))
        if response_shape(self.response_format) is None:
            object.__setattr__(self, "response_format", None)
        elif self.messages[-1].role == "assistant":
            raise FieldError("response_format", "free text with a last assistant message (its reply continues a "
                             "text, not a JSON value)", self.response_format["type"])
        super().__post_init__()

    @classmethod
    def from_openai(cls, body: Any) -> "ChatRequest":
        """The request in an OpenAI chat-completions body (plus ``top_k``, ``repetition_penalty``,
        ``cache_prompt`` and ``conversation``); the standard parameters with a value that changes nothing
        (``tools`` [], ``response_format`` text, ...: ``_CHAT_NEUTRAL``) are accepted, and ``logprobs`` with
        ``top_logprobs``; unknown keys and values the engine cannot honour (``n`` other than 1, tools, a JSON
        schema of keywords not held to) are refused, naming the key."""
        given = _openai_settings(body, "chat-completions", ("messages", "max_completion_tokens", "response_format",
                                                            "logprobs", "top_logprobs"), _CHAT_NEUTRAL)
        top = body.get("top_logprobs")
        if not (body.get("logprobs") is None or isinstance(body["logprobs"], bool)):
            raise FieldError("logprobs", "true, false or null", body["logprobs"])
        if top is not None and not is_int(top, 0, MAX_TOP_LOGPROBS):
            raise FieldError("top_logprobs", f"an integer in [0, {MAX_TOP_LOGPROBS}] or null", top)
        if body.get("logprobs") is True:
            given["logprobs"] = top or 0
        elif top:
            raise FieldError("top_logprobs", "0 or null unless logprobs is true", top)
        if "max_tokens" in body and "max_completion_tokens" in body:
            raise FieldError("max_completion_tokens", "not together with max_tokens", body["max_completion_tokens"])
        if body.get("max_completion_tokens") is not None:
            given["max_tokens"] = body["max_completion_tokens"]
        if "messages" not in body:
            raise FieldError("messages", "a list of {'role', 'content'} messages", "none")
        return cls(body["messages"], body.get("response_format"), **given)


OPENAI_COMPLETION_MAX_TOKENS = 16
"""The ``max_tokens`` of an OpenAI completions body that gives none (OpenAI's default)."""

@dataclass(frozen=True)
class CompletionRequest(RequestSettings):
    """A plain completion: the raw ``prompt`` text, encoded as is (the model's BOS first if it adds one), and how
    to continue it (:class:`RequestSettings`). What a base model, without a chat template, answers."""

    prompt: str

    def __post_init__(self) -> None:
        if not isinstance(self.prompt, str):
            raise FieldError("prompt", "a string", type(self.prompt).__name__)
        if any(0xD800 <= ord(c) <= 0xDFFF for c in self.prompt):
            raise FieldError("prompt", "Unicode text (no lone surrogates)", "invalid text")
        super().__post_init__()

    @classmethod
    def from_openai(cls, body: Any) -> "CompletionRequest":
        """The request in an OpenAI (legacy) completions body: ``prompt`` a string (or a list of one), ``max_tokens``
        (default 16, as OpenAI's), the sampling settings, plus ``top_k``, ``repetition_penalty``, ``cache_prompt``
        and ``conversation``, ``logprobs`` (how many alternatives each token's log probability comes with); ``echo``,
        ``suffix`` and ``best_of`` only with their neutral values,
        unknown keys refused, naming the key."""
        given = _openai_settings(body, "completions", ("prompt", "logprobs"), _COMPLETION_NEUTRAL)
        if body.get("logprobs") is not None:
            given["logprobs"] = body["logprobs"]
        given.setdefault("max_tokens", OPENAI_COMPLETION_MAX_TOKENS)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise FieldError("prompt", "a string (or a list of one string)",
                             "none" if prompt is None else type(prompt).__name__)
        return cls(prompt=prompt, **given)
