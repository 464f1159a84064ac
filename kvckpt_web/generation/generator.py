"""Generating text on a paged K/V cache, autosaved as it goes.

A :class:`Generator` runs a :class:`~kvckpt_web.model.protocol.CausalLM` over a prompt and then one token at
a time, picking each next token with a :class:`~kvckpt_web.model.sampler.Sampler`, until an end-of-sequence
id, a stop string, the token limit or the context ends it. Every ``Autosave.every`` tokens, at the end of the
prefill and when it finishes, it saves the sequence with :func:`kvckpt_web.durable.save.save`; the
checkpoint's ``app_state`` (:mod:`~kvckpt_web.generation.app_state`) holds what a resumed run needs
(:mod:`~kvckpt_web.generation.resume`). A save that fails in the store (a full disk, the store's lock not had in
time) does not end the generation: it is reported, the last committed checkpoint stays, and the next save
tries again.

A generator that autosaves holds its name's :meth:`~kvckpt_web.stores.base.Store.claim` from
:meth:`Generator.start` or :func:`~kvckpt_web.generation.resume.resume` until :meth:`Generator.close`: a second
writer of the name is refused while it runs, and :meth:`Generator.start` refuses a name that holds another
conversation, so no reply's retention drops another's generations.

Every save happens between two steps, when the tokens the cache holds are a strict prefix of the tokens
known; the next step always runs the tokens from ``kv_length`` on (the rest of the prefill chunk, or the one
pending token) and picks from their logits. Prefill chunks end at multiples of ``prefill_chunk`` counted
from token 0, so the forward calls depend only on the tokens and on where each turn began.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

from ..checks import check_bool, check_callable, check_instance, check_int
from ..durable.prefix_records import PrefixKey
from ..durable.results import Progress, SaveResult
from ..durable.retention import DEFAULT_KEEP
from ..durable.save import save
from ..errors import CheckpointStateError, FieldError, StoreError
from ..kv.cache import check_cache
from ..kv.pool import check_seq_id
from ..model.caches import check_chunk, context_of
from ..model.protocol import CausalLM, Logits, TokenLogprob, choose
from ..model.sampler import Sampler, SamplingSettings
from .app_state import SavedGeneration, StopRules, check_replies, check_token_ids
from .autosave import DEFAULT_AUTOSAVE_EVERY, Autosave
from .conversation import Conversation, check_owner
from .json_constraint import JsonConstraint, Vocabulary
from .reply_text import ReplyText
from .results import GenerationResult, ResumeReport, TokenEvent

if TYPE_CHECKING:
    from ..kv.cache import PagedKVCache

__all__ = ["Generator", "check_callbacks", "check_run_options"]


def check_callbacks(**callbacks: Any) -> None:
    """FieldError naming the first of ``callbacks`` (name=value) that is neither None nor callable."""
    for name, value in callbacks.items():
        check_callable(name, value)


def check_run_options(model: Any, cache: Any, seq_id: Any, autosave: Any) -> None:
    """FieldError (SequenceError for ``seq_id``) for a start or resume argument of the wrong type."""
    check_instance("model", model, CausalLM, "a CausalLM (a loaded model)")
    check_cache(cache)
    check_seq_id("seq_id", seq_id)
    if autosave is not None:
        check_instance("autosave", autosave, Autosave, "an Autosave or None")


class Generator:
    """One sequence being generated; iterate it (``async for``) for :class:`TokenEvent` as tokens come.

    Build one with :meth:`start` (a new prompt, or the next turn of a sequence) or
    :func:`~kvckpt_web.generation.resume.resume` (a checkpoint), and :meth:`close` it (or use it as ``async with``)
    to release its autosave name.
    """

    def __init__(self, model: CausalLM, cache: "PagedKVCache", seq_id: int, saved: SavedGeneration, *,
                 autosave: Autosave | None, decode: Callable[[Sequence[int]], str] | None,
                 on_token: Callable[[TokenEvent], None] | None, on_save: Callable[[SaveResult], None] | None,
                 on_save_error: Callable[[Exception], None] | None, progress: Progress | None,
                 vocabulary: Vocabulary | None = None) -> None:
        self.model = model
        self.cache = cache
        self.seq_id = seq_id
        self.autosave = None if autosave is None else dataclasses.replace(
            autosave, every=_first(autosave.every, saved.autosave_every, DEFAULT_AUTOSAVE_EVERY),
            keep=_first(autosave.keep, saved.autosave_keep, DEFAULT_KEEP))
        self.saved = dataclasses.replace(
            saved, model=model.identity, prompt=list(saved.prompt), generated=list(saved.generated),
            context=context_of(model, cache, saved.context), replies=list(saved.replies),
            autosave_every=None if self.autosave is None else self.autosave.every,
            autosave_keep=None if self.autosave is None else self.autosave.keep)
        """The generation as its next save records it (its ``app_state``): the one source of its tokens, K/V
        length, sampler, stop rules, conversation and settings (the caller's ``saved`` is left as it was)."""
        self.on_token = on_token
        self.on_save = on_save
        self.on_save_error = on_save_error
        self.progress = progress
        self.last_save: SaveResult | None = None
        self.save_error: Exception | None = None
        """Why the last save failed (a StoreError or OSError); None once a save succeeds."""
        self.resume_report: ResumeReport | None = None
        self.logprobs: int | None = None
        """With how many most likely alternatives each token's log probability goes into its event (0 to
        :data:`~kvckpt_web.model.protocol.MAX_TOP_LOGPROBS`); None: none are computed."""
        self._tried_at = saved.kv_length  # the kv_length of the last save or failed try: autosave counts from it
        self._failed: BaseException | None = None
        self._held = AsyncExitStack()  # the autosave name's claim
        self._closed = False
        if saved.stop.stop_strings and decode is None:
            raise FieldError("stop_strings", "a decode function to match them against", "none")
        self._text = ReplyText(decode, saved.stop)
        self.constraint: JsonConstraint | None = None
        """What holds the reply to its ``response_format`` (None: free text)."""
        if saved.response_format is not None:
            if vocabulary is None:
                raise FieldError("vocabulary", "the model's token vocabulary, to hold the reply to its response_format",
                                 "none")
            self.constraint = JsonConstraint(saved.response_format, vocabulary, saved.stop.eos_ids)
        if saved.generated:
            self._text.push(saved.generated, saved.finish_reason is not None)

    @classmethod
    async def start(cls, model: CausalLM, cache: "PagedKVCache", prompt: Sequence[int],
                    sampler: Sampler | SamplingSettings, *,
                    stop: StopRules = StopRules(), seq_id: int = 0, prefill_chunk: int | None = None,
                    autosave: Autosave | None = None, decode: Callable[[Sequence[int]], str] | None = None,
                    on_token: Callable[[TokenEvent], None] | None = None,
                    on_save: Callable[[SaveResult], None] | None = None,
                    on_save_error: Callable[[Exception], None] | None = None,
                    progress: Progress | None = None, kv_length: int = 0, replies: Sequence[tuple[int, int]] = (),
                    extra: dict[str, Any] | None = None, conversation: Conversation | None = None,
                    context: int | None = None, save_first: bool = False,
                    response_format: dict[str, Any] | None = None,
                    vocabulary: Vocabulary | None = None) -> "Generator":
        """A generation of ``prompt`` (token ids) in sequence ``seq_id`` of ``cache``: a new sequence, or with
        ``kv_length`` > 0 the existing one, which holds the K/V of ``prompt[:kv_length]`` (an earlier turn's,
        or a prefix restored or forked), so only the rest is prefilled.

        Refuses, before the cache is touched, an empty prompt or one longer than the context
        (the smaller of the model's and the cache's, and ``context`` if given), a ``kv_length`` the sequence
        does not hold or that leaves no prompt token to run, and a ``prefill_chunk`` (default: the cache's
        prefill_chunk_size) the cache cannot take in one forward; stop strings need ``decode``. ``replies``
        are the ``[start, end)`` spans of earlier replies' generated ids in ``prompt`` (how they ran, for a
        replay), ``extra`` the caller's JSON object saved with every checkpoint. The reply belongs to
        ``conversation`` (None: a new one): with ``autosave``, ConflictError (nothing written) while another
        writer holds the name, or if the name holds generations of another conversation (resume it, or use
        another name, or delete it); the generator holds the name's claim until :meth:`close`. With
        ``save_first`` it is saved once before it returns (a prompt's messages committed before its prefill, so a
        crash during it keeps them; a failure in the store goes to ``on_save_error``), and that save's own check
        of the name, at its commit under the store's lock, is the check of the conversation it holds.
        ``on_save_error`` hears of each autosave that failed (generation goes on; see :meth:`step`).
        ``response_format`` (OpenAI's, a JSON one; None: free text) holds the reply to a JSON value of its shape
        (:mod:`~kvckpt_web.generation.json_constraint`, over the tokens of ``vocabulary``), resumed replies too.
        """
        check_run_options(model, cache, seq_id, autosave)
        check_instance("sampler", sampler, (Sampler, SamplingSettings), "a Sampler or SamplingSettings")
        check_instance("stop", stop, StopRules, "a StopRules")
        check_callbacks(decode=decode, on_token=on_token, on_save=on_save, progress=progress)
        if conversation is not None:
            check_instance("conversation", conversation, Conversation, "a Conversation or None")
        check_bool("save_first", save_first)
        if extra is not None:
            check_instance("extra", extra, dict, "a JSON object or None")
        prompt = check_token_ids("prompt", prompt)
        for i, t in enumerate(prompt):
            if t >= model.vocab_size:
                raise FieldError(f"prompt[{i}]", f"a token id below the vocabulary size {model.vocab_size}", t)
        context = context_of(model, cache, None if context is None else check_int("context", context, 1))
        if not prompt:
            raise FieldError("prompt", "at least one token", "an empty prompt")
        if len(prompt) > context:
            raise FieldError("prompt", f"at most {context} tokens (the context of the model and cache)",
                             f"{len(prompt)} tokens")
        chunk = check_chunk(cache.limits.prefill_chunk_size if prefill_chunk is None else prefill_chunk, cache)
        check_int("kv_length", kv_length, 0, len(prompt) - 1)  # a prompt token is left to run
        if kv_length and (seq_id not in cache.sequence_ids() or cache.get_sequence_length(seq_id) != kv_length):
            held = cache.get_sequence_length(seq_id) if seq_id in cache.sequence_ids() else "no sequence"
            raise FieldError("kv_length", f"the length of sequence {seq_id} in the cache", kv_length,
                             f"it holds {held}")
        if isinstance(sampler, SamplingSettings):
            sampler = Sampler(sampler)
        saved = SavedGeneration(model.identity, prompt, [], kv_length, chunk, sampler, stop, None,
                                conversation or Conversation.new(), context,
                                replies=check_replies("replies", replies, len(prompt)), extra=dict(extra or {}),
                                response_format=response_format)
        gen = cls(model, cache, seq_id, saved, autosave=autosave, decode=decode, on_token=on_token,
                  on_save=on_save, on_save_error=on_save_error, progress=progress, vocabulary=vocabulary)
        await gen._hold_name(check=not save_first)
        try:
            if not kv_length:
                cache.add_sequence(seq_id)
            if save_first and autosave is not None:
                await gen._autosave()
        except BaseException:
            await gen.close()
            if not kv_length and seq_id in cache.sequence_ids():
                cache.remove_sequence(seq_id)  # the sequence this call added
            raise
        return gen

    async def _hold_name(self, check: bool) -> None:
        """Claim the autosave name until :meth:`close` (ConflictError at once while another writer holds it);
        with ``check``, refuse a name that holds another conversation than this one (ConflictError, see
        :func:`check_owner`)."""
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
    def prompt_tokens(self) -> list[int]:
        """Every token before this reply, earlier turns' included."""
        return self.saved.prompt

    @property
    def generated_tokens(self) -> list[int]:
        """This reply's tokens so far (the last one pending: the K/V do not hold it yet)."""
        return self.saved.generated

    @property
    def tokens(self) -> list[int]:
        """The prompt and the generated tokens."""
        return self.saved.prompt + self.saved.generated

    @property
    def kv_length(self) -> int:
        """How many of :attr:`tokens` the sequence's K/V hold."""
        return self.saved.kv_length

    @property
    def finish_reason(self) -> str | None:
        """Why the generation ended ("eos", "stop", "length", "context"); None while it goes on."""
        return self.saved.finish_reason

    @property
    def conversation(self) -> Conversation | None:
        """The conversation the reply belongs to (None: resumed from a checkpoint that recorded none)."""
        return self.saved.conversation

    @property
    def replies(self) -> list[tuple[int, int]]:
        """The ``[start, end)`` spans of earlier replies' generated ids in the prompt."""
        return self.saved.replies

    @property
    def extra(self) -> dict[str, Any]:
        """The caller's JSON object, saved with every checkpoint."""
        return self.saved.extra

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
        """What a save of this generation records now (see :meth:`SavedGeneration.to_json`)."""
        return self.saved.to_json()

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
            auto = self.autosave
            prefix = None if auto.prefix_scope is None else PrefixKey(auto.prefix_scope, self.tokens[:self.kv_length])
            result = await save(self.cache, self.seq_id, auto.store, auto.name, app_state=self.app_state(),
                                keep=auto.keep, pages_per_chunk=auto.pages_per_chunk, prefix=prefix,
                                ledger=auto.ledger)
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

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` released the autosave name: the generator steps and saves no more."""
        return self._closed

    @property
    def failed(self) -> bool:
        """Whether a step failed part-way (a forward, or the pick of the token after it): the sequence may hold K/V
        the known tokens do not account for, and this generator cannot go on or save (resume its last checkpoint)."""
        return self._failed is not None

    def _check_usable(self) -> None:
        if self._closed:
            raise CheckpointStateError("generator: closed (its autosave name released); resume it to go on")
        if self._failed is not None:
            raise CheckpointStateError(f"generator: a step failed ({self._failed!r}) and the sequence may hold "
                                       "part of it: resume from the last checkpoint instead")

    async def _forward(self, tokens: list[int]) -> Logits:
        before = self.cache.sequence_state(self.seq_id)
        try:
            logits = await self.model.forward(self.cache, self.seq_id, tokens)
        except BaseException as exc:
            self.forward_failed(exc, before)
            raise
        return logits

    def forward_failed(self, exc: BaseException, before: object) -> None:
        """The forward of :meth:`next_run` raised ``exc``; ``before`` is the sequence's
        :meth:`~kvckpt_web.kv.cache.PagedKVCache.sequence_state` from before it. Refused before it touched the
        sequence (an import in progress, no free page), the step can be taken again; otherwise the sequence may hold
        part of that forward and nothing can follow it (:attr:`failed`)."""
        if self.cache.closed or self.cache.sequence_state(self.seq_id) != before:
            self._failed = exc

    async def _pick(self, logits: Logits) -> int:
        if self.constraint is not None:
            return await self.constraint.pick(logits, self.saved.sampler, self.tokens, self.generated_tokens,
                                              self.model.vocab_size)
        return await choose(logits, self.saved.sampler, self.tokens, self.generated_tokens)

    async def next_run(self) -> list[int]:
        """The tokens the next step runs after the K/V the sequence holds (the rest of the prefill chunk, or the
        pending token); none once finished. A scheduler runs them (in one forward, alone or with other sequences')
        and hands their logits to :meth:`take`. With autosave, it first renews the name's claim when due (a lease
        past half its time), so it holds between saves for as long as the reply runs; ConflictError, before the step
        runs, if another writer took it over."""
        self._check_usable()
        if self.finish_reason is not None:
            return []
        if self.autosave is not None:
            await self.autosave.store.renew_claim(self.autosave.name)
        prompt_len = len(self.prompt_tokens)
        if self.kv_length < prompt_len:
            end = min(prompt_len, (self.kv_length // self.saved.prefill_chunk + 1) * self.saved.prefill_chunk)
            return self.prompt_tokens[self.kv_length:end]
        return [self.generated_tokens[-1]]

    async def take(self, ran: list[int], logits: Logits) -> TokenEvent | None:
        """The forward of ``ran`` (what :meth:`next_run` gave) ran and gave ``logits``: its K/V are the sequence's;
        after the prompt's last chunk or a reply's token, the next token is picked and its event returned (None
        while the prompt is prefilled). Saves nothing: :meth:`save_if_due` does, once every logits of the forward
        were read."""
        prompt_len = len(self.prompt_tokens)
        prefill = self.kv_length < prompt_len
        self.saved.kv_length += len(ran)
        if prefill:
            if self.progress is not None:
                self.progress("prefill", self.kv_length, prompt_len)
            if self.kv_length < prompt_len:
                if self.save_due:
                    await logits.argmax()  # the chunk run on the device first: the save's time is its own
                return None
        try:
            token = await self._pick(logits)
            logprob = None if self.logprobs is None else await logits.logprobs(token, self.logprobs)
        except BaseException as exc:
            # cancelled (Ctrl-C under asyncio.run) or failed once the forward ran: the sequence holds the K/V of
            # every known token and no token follows them, a state no checkpoint may record
            self._failed = exc
            raise
        self.saved.generated.append(token)
        event = self._finish_check(token, logprob)
        if self.on_token is not None:
            self.on_token(event)
        return event

    @property
    def save_due(self) -> bool:
        """Whether an autosave is due now: every ``Autosave.every`` tokens, after the first token and at the end."""
        if self.autosave is None or self._tried_at >= self.kv_length:
            return False
        interval = self.kv_length - self._tried_at >= self.autosave.every
        if self.kv_length < len(self.prompt_tokens):
            return interval
        return interval or len(self.generated_tokens) == 1 or self.finish_reason is not None

    async def save_if_due(self) -> None:
        """Autosave if :attr:`save_due`; a save that fails in the store goes to ``on_save_error`` (see :meth:`step`)."""
        if self.save_due:
            await self._autosave()

    async def step(self) -> TokenEvent | None:
        """Run the next forward (a prefill chunk or the pending token); the token it produced, if any.

        Autosaves when due; a save that fails in the store (StoreError, OSError) is reported to
        ``on_save_error`` and kept in ``save_error``, and the generation goes on. A save refused because the name is
        no longer this reply's (another writer took its claim over, or committed another conversation there) raises
        ConflictError: nothing is saved under the name any more. The claim is renewed as :meth:`next_run` says."""
        tokens = await self.next_run()
        if not tokens:
            return None
        event = await self.take(tokens, await self._forward(tokens))
        await self.save_if_due()
        return event

    def _finish_check(self, token: int, logprob: TokenLogprob | None = None) -> TokenEvent:
        """Record why the generation ends after ``token``, if it does; the token's event."""
        saved = self.saved
        reason = ("eos" if token in saved.stop.eos_ids else "length" if len(saved.generated) >= saved.stop.max_tokens
                  else "context" if saved.kv_length >= saved.context else None)
        text, stopped = self._text.push(saved.generated, reason is not None)
        saved.finish_reason = "stop" if stopped else reason
        return TokenEvent(token, len(saved.generated) - 1, text, logprob)

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
        made (see :meth:`SavedGeneration.call_end`). K/V an earlier turn took from another conversation's prefix
        were made by that conversation's calls: replayed as a prefill, they may differ in the last bits. Returns
        once the device has run them (the last forward's logits are read), so the time it took is the replay's
        own."""
        target, tokens = self.kv_length, self.tokens
        self.saved.kv_length = 0
        logits = None
        while self.kv_length < target:
            run = tokens[self.kv_length:self.saved.call_end(self.kv_length, target)]
            logits = await self._forward(run)
            self.saved.kv_length += len(run)
            if self.progress is not None:
                self.progress("replay", self.kv_length, target)
        if logits is not None:
            await logits.argmax()


def _first(*values: int | None) -> int:
    """The first of ``values`` that is not None (the last never is)."""
    return next(v for v in values if v is not None)
