"""Generating text on a paged K/V cache, autosaved as it goes, resumed after a crash with the same tokens.

A :class:`Generator` runs a :class:`~kvckpt_web.model.protocol.CausalLM` over a prompt and then
one token at a time, picking each next token with a
:class:`~kvckpt_web.model.sampler.Sampler`, until an end-of-sequence id, a stop string, the
token limit or the context ends it. Every ``Autosave.every`` tokens, at the end of the prefill and
when it finishes, it saves the sequence with :func:`kvckpt_web.durable.save.save`; the checkpoint's
``app_state`` (see :func:`app_state_of`) holds every token id, where the K/V end, the sampler's
state, the model's identity, the settings a resumed run continues with and the conversation the reply
belongs to (:mod:`~kvckpt_web.model.conversation`). A save that fails in the store (a full disk, the store's
lock not had in time) does not end the generation: it is reported, the last committed checkpoint stays,
and the next save tries again.

A generator that autosaves holds its name's :meth:`~kvckpt_web.stores.base.Store.claim` from
:meth:`Generator.start` or :func:`resume` until :meth:`Generator.close`: a second writer of the name is
refused while it runs, and :meth:`Generator.start` refuses a name that holds another conversation, so no
reply's retention drops another's generations.

The K/V of a checkpoint never include the last token picked: that token is *pending*. Every
save happens between two steps, when the tokens the cache holds are a strict prefix of the
tokens known (``kv_length < len(tokens)``), and the sampler's state is the one after the last
pick. The next step always runs the tokens from ``kv_length`` on (the rest of the prefill chunk,
or the one pending token) and picks from their logits, so :func:`resume` takes exactly the step
an uninterrupted run takes next. If the checkpoint's K/V cannot be used (another model, another
layout, damaged or missing chunks), :func:`resume` says why and runs the saved tokens through the
model again, in the same forward calls as the original run (prefill chunks from token 0, then
one token per call), so the K/V and the continuation are the same either way.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..checks import check_bool, check_callable, check_each, check_instance, check_int, type_name
from ..durable.catalog import load_manifest
from ..durable.container import Manifest, validate_name
from ..durable.restore import restore
from ..durable.results import Progress, SaveResult
from ..durable.retention import DEFAULT_KEEP
from ..durable.save import save
from ..errors import (CheckpointStateError, CorruptionError, FieldError, FormatError, MetadataError, SequenceError,
                      StoreError, UnusableCheckpointError)
from ..kv.cache import PagedKVCache, check_cache
from ..kv.pool import check_seq_id
from ..stores.base import check_store
from ..tvm.layout import CacheLimits
from .conversation import Conversation, check_owner
from .protocol import CausalLM, Logits
from .sampler import Sampler, SamplingSettings

if TYPE_CHECKING:
    from ..gpu.device import Device
    from ..stores.base import Store

__all__ = ["APP_FORMAT", "APP_VERSION", "Autosave", "DEFAULT_AUTOSAVE_EVERY", "FINISH_REASONS", "GenerationResult",
           "Generator", "ResumeReport", "StopRules", "TokenEvent", "app_state_of", "candidate_count", "new_cache",
           "resume", "resume_limits"]

APP_FORMAT = "kvckpt.generation"
"""The ``format`` tag of a generation's ``app_state``."""
APP_VERSION = 1
"""The ``version`` of the ``app_state`` schema this module writes and reads."""
FINISH_REASONS = ("eos", "stop", "length", "context")
"""Why a generation ended: an end-of-sequence id, a stop string, ``max_tokens``, the context is full."""
DEFAULT_AUTOSAVE_EVERY = 64
"""Tokens between two autosaves of a new generation that does not say."""


def _token_ids(field_name: str, tokens: Any) -> list[int]:
    if not isinstance(tokens, Sequence):  # token ids are in order: a list or tuple, not a set
        raise FieldError(field_name, "a list of token ids", type_name(tokens))
    return check_each(field_name, tokens, "a list of token ids", lambda field, t: check_int(field, t, 0))


def _stop_string(field_name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise FieldError(field_name, "a non-empty string", value if isinstance(value, str) else type_name(value))
    return value


def _check_callbacks(**callbacks: Any) -> None:
    """FieldError naming the first of ``callbacks`` (name=value) that is neither None nor callable."""
    for name, value in callbacks.items():
        check_callable(name, value)


def _check_run_options(model: Any, cache: Any, seq_id: Any, autosave: Any) -> None:
    """FieldError (SequenceError for ``seq_id``) for a start or resume argument of the wrong type."""
    check_instance("model", model, CausalLM, "a CausalLM (a loaded model)")
    check_cache(cache)
    check_seq_id("seq_id", seq_id)
    if autosave is not None:
        check_instance("autosave", autosave, Autosave, "an Autosave or None")


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
        object.__setattr__(self, "eos_ids", tuple(_token_ids("eos_ids", self.eos_ids)))
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


@dataclass(frozen=True)
class Autosave:
    """Where and how often a generation saves itself."""

    store: "Store"
    name: str
    every: int | None = None
    """Save once this many tokens were added to the cache since the last save or failed try (prefill
    included); None: the checkpoint's interval when resumed, else :data:`DEFAULT_AUTOSAVE_EVERY`."""
    keep: int | None = None
    """Generations of ``name`` to keep; None: the checkpoint's when resumed, else
    :data:`~kvckpt_web.durable.retention.DEFAULT_KEEP`."""

    def __post_init__(self) -> None:
        check_store(self.store, "autosave.store")
        validate_name(self.name)
        if self.every is not None:
            check_int("autosave.every", self.every, 1)
        if self.keep is not None:
            check_int("autosave.keep", self.keep, 1)


@dataclass(frozen=True)
class TokenEvent:
    """One generated token as it is produced."""

    token: int
    index: int
    """Its index among the generated tokens (0: the first token of the reply)."""
    text: str
    """The reply text that became final with this token (text that may still turn into a stop string or an
    incomplete UTF-8 character waits for later tokens)."""


@dataclass(frozen=True)
class GenerationResult:
    """A finished generation."""

    prompt_tokens: tuple[int, ...]
    generated_tokens: tuple[int, ...]
    text: str
    finish_reason: str


@dataclass(frozen=True)
class ResumeReport:
    """How :func:`resume` got its K/V back."""

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


def app_state_of(model_identity: str, prompt: Sequence[int], generated: Sequence[int], kv_length: int,
                 prefill_chunk: int, sampler_state: dict[str, Any], stop: StopRules,
                 finish_reason: str | None, conversation: Conversation | None = None, *, context: int | None = None,
                 autosave_every: int | None = None, autosave_keep: int | None = None) -> dict[str, Any]:
    """The ``app_state`` a generation saves with its K/V.

    ``prompt_tokens + generated_tokens`` are every token so far; the checkpoint's K/V are those of the
    first ``kv_length`` of them (always fewer than all: the rest are pending); ``sampler`` is the sampler's
    state after the last pick; ``prefill_chunk`` fixes how the prompt was split into forward calls;
    ``conversation`` (``{"id", "created_ms"}``, left out if None) is the conversation the reply belongs to.
    What a resumed run continues with unless told otherwise: ``context`` (the most tokens of prompt and
    reply), ``autosave_every`` and ``autosave_keep`` (its autosave's interval and generations kept). Each
    optional key is left out when None; version 1 readers that predate them ignore them, and a checkpoint
    without them still resumes (a conversation of unknown id, the caller's or default settings).
    """
    state = {"format": APP_FORMAT, "version": APP_VERSION, "model": model_identity,
             "prompt_tokens": list(prompt), "generated_tokens": list(generated), "kv_length": kv_length,
             "prefill_chunk": prefill_chunk, "sampler": sampler_state, "stop": stop.to_json(),
             "finish_reason": finish_reason}
    if conversation is not None:
        state["conversation"] = conversation.to_json()
    for key, value in (("context", context), ("autosave_every", autosave_every), ("autosave_keep", autosave_keep)):
        if value is not None:
            state[key] = value
    return state


@dataclass
class _Saved:
    """A generation's ``app_state``, checked."""

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


def _parse_app_state(app_state: Any) -> _Saved:
    """The generation state in a checkpoint's ``app_state``; FormatError naming the field if it is not one."""
    if not isinstance(app_state, dict):
        raise FormatError("app_state", "a JSON object", type(app_state).__name__)
    if app_state.get("format") != APP_FORMAT:
        raise FormatError("app_state.format", repr(APP_FORMAT), app_state.get("format"),
                          "the checkpoint was not written by a generation")
    if app_state.get("version") != APP_VERSION:
        raise FormatError("app_state.version", APP_VERSION, app_state.get("version"))
    try:
        prompt = _token_ids("app_state.prompt_tokens", app_state.get("prompt_tokens"))
        generated = _token_ids("app_state.generated_tokens", app_state.get("generated_tokens"))
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
    return _Saved(model, prompt, generated, kv_length, prefill_chunk, sampler,
                  StopRules.from_json(app_state.get("stop"), "app_state.stop"), reason, conversation, context, every,
                  keep)


def resume_limits(app_state: Any) -> tuple[int, int | None]:
    """What a cache must take to resume the generation saved with ``app_state``: its prefill chunk, and its
    context (None in checkpoints written before it was recorded); FormatError naming the field if
    ``app_state`` is not a generation's."""
    saved = _parse_app_state(app_state)
    return saved.prefill_chunk, saved.context


class _Text:
    """The reply text of the generated tokens, released as it becomes final, cut at the first stop string."""

    def __init__(self, decode: Callable[[Sequence[int]], str] | None, stop: StopRules) -> None:
        self.decode = decode
        self.stops = stop.stop_strings
        self.eos = frozenset(stop.eos_ids)
        self.final = ""       # text released so far
        self.anchor = 0       # tokens before this index are all in ``final``
        self.released = 0     # characters of the text since ``anchor`` already in ``final``

    def _held(self, text: str) -> int:
        """How many characters at the end of ``text`` may still change: an incomplete UTF-8 character or
        the beginning of a stop string."""
        keep = len(text) - len(text.rstrip("\ufffd"))
        for s in self.stops:
            for n in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:n]):
                    keep = max(keep, n)
                    break
        return keep

    def push(self, generated: Sequence[int], finished: bool) -> tuple[str, bool]:
        """Newly final text after ``generated`` (all tokens so far), and whether a stop string ended it."""
        if self.decode is None:
            return "", False
        tail = self.decode([t for t in generated[self.anchor:] if t not in self.eos])
        cut = min((i for i in (tail.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            end, stopped = cut, True
        else:
            end, stopped = (len(tail) if finished else len(tail) - self._held(tail)), False
        delta = tail[self.released:end] if end > self.released else ""
        self.final += delta
        self.released += len(delta)
        if not stopped and end == len(tail):
            self.anchor, self.released = len(generated), 0
        return delta, stopped


def _check_chunk(prefill_chunk: int, cache: "PagedKVCache") -> int:
    limit = cache.limits.prefill_chunk_size
    if isinstance(prefill_chunk, bool) or not isinstance(prefill_chunk, int) or not 1 <= prefill_chunk <= limit:
        raise FieldError("prefill_chunk", f"an integer in [1, {limit}] (the cache's prefill_chunk_size)",
                         prefill_chunk)
    return prefill_chunk


class Generator:
    """One sequence being generated; iterate it (``async for``) for :class:`TokenEvent` as tokens come.

    Build one with :meth:`start` (a new prompt) or :func:`resume` (a checkpoint), and :meth:`close` it (or use
    it as ``async with``) to release its autosave name.
    """

    def __init__(self, model: CausalLM, cache: "PagedKVCache", seq_id: int, saved: _Saved, *,
                 autosave: Autosave | None, decode: Callable[[Sequence[int]], str] | None,
                 on_token: Callable[[TokenEvent], None] | None, on_save: Callable[[SaveResult], None] | None,
                 on_save_error: Callable[[Exception], None] | None, progress: Progress | None) -> None:
        self.model = model
        self.cache = cache
        self.seq_id = seq_id
        self.sampler = saved.sampler
        self.autosave = None if autosave is None else dataclasses.replace(
            autosave, every=_first(autosave.every, saved.autosave_every, DEFAULT_AUTOSAVE_EVERY),
            keep=_first(autosave.keep, saved.autosave_keep, DEFAULT_KEEP))
        self.on_token = on_token
        self.on_save = on_save
        self.on_save_error = on_save_error
        self.progress = progress
        self.stop = saved.stop
        self.prompt_tokens = list(saved.prompt)
        self.generated_tokens = list(saved.generated)
        self.kv_length = saved.kv_length
        self.prefill_chunk = saved.prefill_chunk
        self.finish_reason = saved.finish_reason
        self.conversation = saved.conversation  # None: resumed from a checkpoint that recorded none
        self.context = _context(model, cache, saved.context)
        self.last_save: SaveResult | None = None
        self.save_error: Exception | None = None
        """Why the last save failed (a StoreError or OSError); None once a save succeeds."""
        self.resume_report: ResumeReport | None = None
        self._tried_at = saved.kv_length  # the kv_length of the last save or failed try: autosave counts from it
        self._failed: BaseException | None = None
        self._held = AsyncExitStack()  # the autosave name's claim
        self._closed = False
        if self.stop.stop_strings and decode is None:
            raise FieldError("stop_strings", "a decode function to match them against", "none")
        self._text = _Text(decode, self.stop)
        if self.generated_tokens:
            self._text.push(self.generated_tokens, self.finish_reason is not None)

    @classmethod
    async def start(cls, model: CausalLM, cache: "PagedKVCache", prompt: Sequence[int],
                    sampler: Sampler | SamplingSettings, *,
                    stop: StopRules = StopRules(), seq_id: int = 0, prefill_chunk: int | None = None,
                    autosave: Autosave | None = None, decode: Callable[[Sequence[int]], str] | None = None,
                    on_token: Callable[[TokenEvent], None] | None = None,
                    on_save: Callable[[SaveResult], None] | None = None,
                    on_save_error: Callable[[Exception], None] | None = None,
                    progress: Progress | None = None) -> "Generator":
        """A generation of ``prompt`` (token ids) in a new sequence ``seq_id`` of ``cache``.

        Refuses, before the cache is touched, an empty prompt or one longer than the context
        (the smaller of the model's and the cache's), and a ``prefill_chunk`` (default: the cache's
        prefill_chunk_size) the cache cannot take in one forward; stop strings need ``decode``. The reply is
        a new conversation: with ``autosave``, ConflictError (nothing written) while another writer holds
        the name, or if the name holds generations of another conversation (resume it, or use another
        name, or delete it); the generator holds the name's claim until :meth:`close`.
        ``on_save_error`` hears of each autosave that failed (generation goes on; see :meth:`step`).
        """
        _check_run_options(model, cache, seq_id, autosave)
        check_instance("sampler", sampler, (Sampler, SamplingSettings), "a Sampler or SamplingSettings")
        check_instance("stop", stop, StopRules, "a StopRules")
        _check_callbacks(decode=decode, on_token=on_token, on_save=on_save, progress=progress)
        prompt = _token_ids("prompt", prompt)
        for i, t in enumerate(prompt):
            if t >= model.vocab_size:
                raise FieldError(f"prompt[{i}]", f"a token id below the vocabulary size {model.vocab_size}", t)
        context = _context(model, cache)
        if not prompt:
            raise FieldError("prompt", "at least one token", "an empty prompt")
        if len(prompt) > context:
            raise FieldError("prompt", f"at most {context} tokens (the context of the model and cache)",
                             f"{len(prompt)} tokens")
        chunk = _check_chunk(cache.limits.prefill_chunk_size if prefill_chunk is None else prefill_chunk, cache)
        if isinstance(sampler, SamplingSettings):
            sampler = Sampler(sampler)
        saved = _Saved(model.identity, prompt, [], 0, chunk, sampler, stop, None, Conversation.new())
        gen = cls(model, cache, seq_id, saved, autosave=autosave, decode=decode, on_token=on_token,
                  on_save=on_save, on_save_error=on_save_error, progress=progress)
        await gen._hold_name(check=True)
        try:
            cache.add_sequence(seq_id)
        except BaseException:
            await gen.close()
            raise
        return gen

    async def _hold_name(self, check: bool) -> None:
        """Claim the autosave name until :meth:`close` (ConflictError at once while another writer holds it);
        with ``check``, refuse a name that holds another conversation than this one (ConflictError)."""
        if self.autosave is None:
            return
        store, name = self.autosave.store, self.autosave.name
        await self._held.enter_async_context(store.claim(name))
        if check:
            try:
                await check_owner(store, name, self.conversation)
            except BaseException:
                await self.close()
                raise

    async def close(self) -> None:
        """Release the autosave name (idempotent); the generator steps and saves no more. The cache and the
        sequence stay the caller's."""
        self._closed = True
        await self._held.aclose()

    async def __aenter__(self) -> "Generator":
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    # ----- state --------------------------------------------------------------------------------

    @property
    def tokens(self) -> list[int]:
        """The prompt and the generated tokens."""
        return self.prompt_tokens + self.generated_tokens

    @property
    def text(self) -> str:
        """The reply text released so far (all of it once finished)."""
        return self._text.final

    @property
    def finished(self) -> bool:
        """Whether the generation has ended (``finish_reason`` says why)."""
        return self.finish_reason is not None

    @property
    def committed_generation(self) -> int | None:
        """The generation of the last checkpoint this generation committed, else of the one it resumed from;
        None if neither (what a resume after a crash now would continue from)."""
        if self.last_save is not None:
            return self.last_save.generation
        return None if self.resume_report is None else self.resume_report.generation

    def app_state(self) -> dict[str, Any]:
        """What a save of this generation records now (see :func:`app_state_of`)."""
        auto = self.autosave
        return app_state_of(self.model.identity, self.prompt_tokens, self.generated_tokens, self.kv_length,
                            self.prefill_chunk, self.sampler.to_json(), self.stop, self.finish_reason,
                            self.conversation, context=self.context, autosave_every=auto.every if auto else None,
                            autosave_keep=auto.keep if auto else None)

    def result(self) -> GenerationResult:
        """The finished generation; FieldError while it is still running."""
        if self.finish_reason is None:
            raise FieldError("generation", "finished", "still running")
        return GenerationResult(tuple(self.prompt_tokens), tuple(self.generated_tokens), self.text,
                                self.finish_reason)

    # ----- running ------------------------------------------------------------------------------

    async def save(self) -> SaveResult:
        """Save the sequence and its ``app_state`` now (to the autosave store and name); a failure in the store
        (StoreError, OSError) is also kept in ``save_error``."""
        if self.autosave is None:
            raise FieldError("autosave", "a store and name to save to", "none")
        self._check_usable()
        self._tried_at = self.kv_length
        try:
            result = await save(self.cache, self.seq_id, self.autosave.store, self.autosave.name,
                                app_state=self.app_state(), keep=self.autosave.keep)
        except (StoreError, OSError) as exc:
            self.save_error = exc
            raise
        self.save_error = None
        self.last_save = result
        if self.on_save is not None:
            self.on_save(result)
        return result

    async def _autosave(self) -> None:
        """:meth:`save`, except that a failure in the store goes to ``on_save_error`` and generation goes on:
        the last committed checkpoint stays, and the next interval (or the end) tries again."""
        try:
            await self.save()
        except (StoreError, OSError) as exc:
            if self.on_save_error is not None:
                self.on_save_error(exc)

    def _check_usable(self) -> None:
        if self._closed:
            raise CheckpointStateError("generator: closed (its autosave name released); resume it to go on")
        if self._failed is not None:
            raise CheckpointStateError(f"generator: a forward failed ({self._failed!r}) and the sequence may hold "
                                       "part of it: resume from the last checkpoint instead")

    async def _forward(self, tokens: list[int]) -> Logits:
        try:
            logits = await self.model.forward(self.cache, self.seq_id, tokens)
        except BaseException as exc:  # the sequence may hold part of this forward: nothing can follow it
            self._failed = exc
            raise
        self.kv_length += len(tokens)
        return logits

    async def _pick(self, logits: Logits) -> int:
        tokens = self.tokens
        k = candidate_count(self.sampler.settings, tokens, self.model.vocab_size)
        if k == 0:
            return await logits.argmax()
        return self.sampler.pick(await logits.top_k(k), tokens)

    async def step(self) -> TokenEvent | None:
        """Run the next forward (a prefill chunk or the pending token); the token it produced, if any.

        Autosaves when due; a save that fails in the store (StoreError, OSError) is reported to
        ``on_save_error`` and kept in ``save_error``, and the generation goes on."""
        self._check_usable()
        if self.finish_reason is not None:
            return None
        prompt_len = len(self.prompt_tokens)
        if self.kv_length < prompt_len:
            end = min(prompt_len, (self.kv_length // self.prefill_chunk + 1) * self.prefill_chunk)
            logits = await self._forward(self.prompt_tokens[self.kv_length:end])
            if self.progress is not None:
                self.progress("prefill", self.kv_length, prompt_len)
            if self.kv_length < prompt_len:
                if self.autosave is not None and self.kv_length - self._tried_at >= self.autosave.every:
                    await self._autosave()
                return None
        else:
            logits = await self._forward([self.generated_tokens[-1]])
        token = await self._pick(logits)
        self.generated_tokens.append(token)
        event = self._finish_check(token)
        if self.on_token is not None:
            self.on_token(event)
        if self.autosave is not None and (len(self.generated_tokens) == 1 or self.finish_reason is not None
                                          or self.kv_length - self._tried_at >= self.autosave.every):
            await self._autosave()
        return event

    def _finish_check(self, token: int) -> TokenEvent:
        """Record why the generation ends after ``token``, if it does; the token's event."""
        index = len(self.generated_tokens) - 1
        ends = (token in self.stop.eos_ids or len(self.generated_tokens) >= self.stop.max_tokens
                or self.kv_length >= self.context)
        text, stopped = self._text.push(self.generated_tokens, ends)
        if stopped:
            self.finish_reason = "stop"
        elif token in self.stop.eos_ids:
            self.finish_reason = "eos"
        elif len(self.generated_tokens) >= self.stop.max_tokens:
            self.finish_reason = "length"
        elif self.kv_length >= self.context:
            self.finish_reason = "context"
        return TokenEvent(token, index, text)

    async def __aiter__(self) -> AsyncIterator[TokenEvent]:
        while self.finish_reason is None:
            event = await self.step()
            if event is not None:
                yield event

    async def run(self) -> GenerationResult:
        """Generate to the end; the result."""
        async for _ in self:
            pass
        return self.result()

    async def _replay(self) -> None:
        """Run the first ``kv_length`` tokens into the (empty) sequence in the forward calls the original run
        made: prompt chunks from token 0, then one token per call."""
        target, tokens, prompt_len = self.kv_length, self.tokens, len(self.prompt_tokens)
        self.kv_length = 0
        while self.kv_length < target:
            if self.kv_length < prompt_len:
                end = min(target, prompt_len, (self.kv_length // self.prefill_chunk + 1) * self.prefill_chunk)
            else:
                end = self.kv_length + 1
            await self._forward(tokens[self.kv_length:end])
            if self.progress is not None:
                self.progress("replay", self.kv_length, target)


def candidate_count(settings: SamplingSettings, previous: Sequence[int], vocab_size: int) -> int:
    """How many of the largest logits :meth:`Sampler.pick` needs to choose as it would from all of them;
    0 when the argmax is the choice (greedy, no repetition penalty).

    A penalty above 1 only lowers seen tokens, so the ``n`` best after it are among the ``n`` best before
    it plus the distinct seen tokens; a penalty below 1 can lift any seen token: all logits then.
    """
    penalty = settings.repetition_penalty
    if settings.greedy and penalty == 1:
        return 0
    if penalty < 1 or (settings.top_k == 0 and not settings.greedy):
        return vocab_size
    keep = 1 if settings.greedy else settings.top_k
    return min(vocab_size, keep + (len(set(previous)) if penalty > 1 else 0))


def _context(model: CausalLM, cache: "PagedKVCache", limit: int | None = None) -> int:
    """The most tokens of prompt and reply a generation holds: the least of the model's context, the cache's
    and ``limit`` (None: no other limit)."""
    return min(model.max_context, cache.limits.max_total_seq_len, limit or model.max_context)


def _first(*values: int | None) -> int:
    """The first of ``values`` that is not None (the last never is)."""
    return next(v for v in values if v is not None)


def new_cache(model: CausalLM, device: "Device", *, max_tokens: int | None = None, prefill_chunk: int = 512,
              page_size: int = 16, num_seqs: int = 1) -> "PagedKVCache":
    """A cache of ``model``'s layout for ``num_seqs`` sequences of up to ``max_tokens`` (default: the model's
    context) tokens each, taking up to ``prefill_chunk`` tokens per forward."""
    check_instance("model", model, CausalLM, "a CausalLM (a loaded model)")
    for name, value in (("prefill_chunk", prefill_chunk), ("page_size", page_size), ("num_seqs", num_seqs)):
        check_int(name, value, 1)
    tokens = model.max_context if max_tokens is None else check_int("max_tokens", max_tokens, 1)
    return PagedKVCache(device, model.kv_layout(page_size), CacheLimits(num_seqs, num_seqs * tokens, prefill_chunk))


def _why_not(exc: Exception) -> str:
    if isinstance(exc, CorruptionError):
        return "corrupt"
    return "layout"


async def resume(store: "Store", name: str, model: CausalLM, cache: "PagedKVCache", *,
                 seq_id: int = 0, generation: int | None = None, autosave: Autosave | None = None,
                 max_tokens: int | None = None, context: int | None = None,
                 decode: Callable[[Sequence[int]], str] | None = None,
                 on_token: Callable[[TokenEvent], None] | None = None,
                 on_save: Callable[[SaveResult], None] | None = None,
                 on_save_error: Callable[[Exception], None] | None = None,
                 progress: Progress | None = None, replay: bool = True) -> Generator:
    """The generation saved as ``name`` in ``store`` (its newest generation, or ``generation``), ready to
    continue in sequence ``seq_id`` of ``cache``.

    Imports the checkpoint's K/V if they fit ``model`` and ``cache``; otherwise (another model identity,
    another layout, a damaged or missing chunk, another length) runs the saved tokens through ``model``
    again. Either way the continuation is the one an uninterrupted run produces; the generator's
    ``resume_report`` says which happened and why. The run goes on with the checkpoint's settings: its
    prefill chunk, its context (also when ``cache`` holds more) and, where ``autosave`` leaves them None,
    its autosave interval and generations kept. ``max_tokens`` and ``context`` replace the saved limits
    (a generation that ended at a limit goes on under a higher one; one that ended otherwise stays
    finished). Raises NotFoundError if there is no checkpoint, and CorruptionError or FormatError if its
    manifest or ``app_state`` cannot be read: only then are its tokens lost. With ``replay=False`` K/V that
    cannot be used raise UnusableCheckpointError (naming the reason) instead, and the cache is left as it was.

    With ``autosave``, the generator holds that name's claim until :meth:`Generator.close`: ConflictError at
    once, nothing changed, while another writer holds it, or if ``autosave`` saves under another name or
    store than ``name`` in ``store`` and that name holds another conversation.
    """
    check_store(store)
    _check_run_options(model, cache, seq_id, autosave)
    if max_tokens is not None:
        check_int("max_tokens", max_tokens, 1)
    _check_callbacks(decode=decode, on_token=on_token, on_save=on_save, progress=progress)
    check_bool("replay", replay)
    if seq_id in cache.sequence_ids():
        raise SequenceError(f"seq_id: expected a sequence id not in the cache, got {seq_id}")
    manifest, _ = await load_manifest(store, name, generation)
    saved = _parse_app_state(manifest.app_state)
    if max_tokens is not None:
        saved.stop = StopRules(max_tokens, saved.stop.eos_ids, saved.stop.stop_strings)
    if context is not None:
        saved.context = check_int("context", context, 1)
    _check_chunk(saved.prefill_chunk, cache)
    room = _context(model, cache)
    if saved.kv_length > room:
        raise FieldError("app_state.kv_length", f"at most {room} tokens (the context of the model and cache)",
                         saved.kv_length)
    if (max_tokens, context) != (None, None) and saved.finish_reason in (None, "length", "context"):
        # the limits alone decide whether it goes on
        saved.finish_reason = ("length" if len(saved.generated) >= saved.stop.max_tokens
                               else "context" if saved.kv_length >= _context(model, cache, saved.context) else None)
    gen = Generator(model, cache, seq_id, saved, autosave=autosave, decode=decode, on_token=on_token,
                    on_save=on_save, on_save_error=on_save_error, progress=progress)
    # continuing the name it was saved as needs no check: the checkpoint read is that name's conversation
    await gen._hold_name(check=autosave is not None and (autosave.store is not store or autosave.name != name))
    try:
        gen.resume_report = await _bring_back(gen, store, manifest, saved, replay)
    except BaseException:
        await gen.close()
        raise
    return gen


async def _bring_back(gen: Generator, store: "Store", manifest: Manifest, saved: _Saved, replay: bool
                      ) -> ResumeReport:
    """Put the K/V of ``manifest`` (the checkpoint ``gen`` was made from) into ``gen``'s sequence: imported if
    they can be used, else (``replay``) its tokens run again; what happened."""
    model, cache, seq_id, name = gen.model, gen.cache, gen.seq_id, manifest.name
    reason, message, restore_s = None, "", 0.0
    if saved.model != model.identity:
        reason, message = "model", (f"app_state.model: expected {model.identity!r} (this model), got "
                                    f"{saved.model!r}: the K/V are another model's")
    else:
        start = time.perf_counter()
        try:
            restored = await restore(store, name, cache, seq_id=seq_id, generation=manifest.generation)
        except (MetadataError, FormatError, CorruptionError) as exc:
            reason, message = _why_not(exc), str(exc)
        else:
            if restored.seq_length != saved.kv_length:
                cache.remove_sequence(seq_id)
                reason, message = "length", (f"{manifest.key}: seq_length expected {saved.kv_length} "
                                             f"(app_state.kv_length), got {restored.seq_length}")
        restore_s = time.perf_counter() - start
    replay_s = 0.0
    if reason is not None and not replay:
        raise UnusableCheckpointError(reason, message)
    if reason is not None:
        start = time.perf_counter()
        cache.add_sequence(seq_id)
        try:
            await gen._replay()
        except BaseException:
            cache.remove_sequence(seq_id)
            raise
        replay_s = time.perf_counter() - start
    return ResumeReport(name, manifest.generation, reason is None, reason,
                        message or "restored the checkpoint's K/V", gen.kv_length, restore_s, replay_s)
