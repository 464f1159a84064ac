"""The chat engine: OpenAI-shaped chat completions on the paged cache, whose conversations survive a crash.

Each call gets the whole message list. The engine builds the prompt (its own replies put back as the ids it
generated), reuses the longest prefix whose K/V it has (a slot of its cache, or a checkpoint in its store
found through the prefix index), prefills only the rest and streams the reply, autosaving it under the
conversation's name before the prefill (a crash during it keeps the messages) and every ``autosave_every``
tokens. A reply cut by a crash or stopped by :meth:`Engine.interrupt` is listed by :meth:`Engine.unfinished`
and continued by :meth:`Engine.resume` with the tokens an uninterrupted run gives. All work on the cache runs holding one :class:`CacheLock`.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncGenerator, Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..checks import check_callable, check_instance
from ..durable.catalog import list_names
from ..durable.ledger import Ledger
from ..durable.prefix_index import PrefixIndex
from ..durable.results import Progress, SaveResult
from ..durable.retention import delete_name, delete_names
from ..errors import ConflictError, ContextFullError, FieldError, KVCkptError, NotFoundError, is_int
from ..kv.cache import PagedKVCache
from ..generation.app_state import StopRules
from ..generation.autosave import Autosave
from ..generation.conversation import Conversation
from ..generation.generator import Generator
from ..generation.json_constraint import Vocabulary
from ..generation.resume import resume
from ..model.protocol import MAX_TOP_LOGPROBS, TokenLogprob
from ..model.sampler import MAX_SEED, Sampler, SamplingSettings
from ..tvm.layout import CacheLimits
from .cache_lock import CacheLock
from .config import PRESETS, EngineConfig
from .listing import ConversationInfo, describe
from .prompt import Prompt, build_prompt, raw_prompt
from .record import ChatExtra
from .request import ChatRequest, CompletionRequest
from .responses import ChatChunk, ChatCompletion, ChatStream, TokenLogprobs
from .placement import Placement
from .scheduler import Scheduler
from .slots import Slot, Slots
from .sources import Sources
from .turn import Turn, committed

if TYPE_CHECKING:
    from ..gpu.device import Device
    from ..model.protocol import LoadedModel
    from ..stores.base import Store

__all__ = ["Engine", "new_name"]

_FINISH = {"eos": "stop", "stop": "stop", "length": "length", "context": "length"}


class Engine:
    """A model, its paged cache and (optionally) a store of conversations.

    ``config`` sets its context, cache and autosaves (:class:`EngineConfig`, default its ``desktop`` preset);
    :attr:`config` is what it runs with (the context no more than the model's). The cache evicts the least
    recently used idle conversation when full, once its K/V are committed to the store (an unfinished reply whose
    save had failed is saved first), never one whose reply is running.

    ``progress(phase, done, total)`` hears how a prompt's prefill (phase "prefill") or a resume's replay of
    tokens whose K/V could not be used ("replay") advances; ``on_save(conversation, result)`` hears of each
    checkpoint of a conversation committed, ``on_save_error(conversation, error)`` of each that failed in the
    store (a full disk, the lock not had in time): the reply goes on, the last committed generation stays, and
    the next save tries again.
    """

    def __init__(self, loaded: "LoadedModel", device: "Device", *, store: "Store | None" = None,
                 model_name: str = "kvckpt", config: EngineConfig = PRESETS["desktop"],
                 progress: Progress | None = None, on_save: Callable[[str, SaveResult], None] | None = None,
                 on_save_error: Callable[[str, Exception], None] | None = None) -> None:
        check_instance("config", config, EngineConfig, "an EngineConfig")
        if not isinstance(model_name, str) or not model_name:
            raise FieldError("model_name", "a non-empty string", model_name)
        self.progress = check_callable("progress", progress)
        self.on_save = check_callable("on_save", on_save)
        self.on_save_error = check_callable("on_save_error", on_save_error)
        self.model, self.codec = loaded.model, loaded.text
        #: The model's tokens as replies held to a JSON response_format are checked against (read on first use).
        self.vocabulary = Vocabulary(self.codec.token_pieces)
        self.model_name = model_name
        #: The settings it runs with: ``config`` with the context no more than the model's.
        self.config = config = config.fitted(self.model.max_context)
        self.context, self.prefill_chunk = config.context, config.prefill_chunk
        self.cache = PagedKVCache(device, self.model.kv_layout(config.page_size),
                                  CacheLimits(config.sequences, config.cache_tokens, config.prefill_chunk))
        self.store = store
        #: What this engine knows of its store's checkpoints: every save, restore and deletion goes through it.
        self.ledger = Ledger(store) if store is not None else None
        self.slots = Slots(self.cache, config.sequences, self.model.identity, store, self.ledger)
        self.scope = f"{self.model.identity}/{self.cache.get_layout_hash()}/{self.model.kernels}"
        self.cache_lock = CacheLock()
        #: Steps every running reply together (continuous batching).
        self.scheduler = Scheduler(self.model, self.cache, self.cache_lock)
        index = PrefixIndex(store, self.scope, config.page_size) if store is not None else None
        self.sources = Sources(self.slots, store, index, config.page_size, self._reply_text, self.model.identity)
        self.placement = Placement(self.slots, self.sources, store, self.model.identity)
        self._turns: list[Turn] = []

    # ----- chat ---------------------------------------------------------------------------------

    async def chat(self, messages: Any, *, stream: bool = False, **settings: Any
                   ) -> ChatCompletion | ChatStream:
        """The reply to ``messages`` (OpenAI's ``[{"role", "content"}, ...]``, the whole conversation each
        call): a :class:`ChatCompletion`, or with ``stream`` a :class:`ChatStream` of :class:`ChatChunk`.

        ``settings`` are :class:`ChatRequest`'s (``max_tokens``, ``temperature``, ``top_p``, ``top_k``,
        ``seed``, ``stop``, ``repetition_penalty``, ``presence_penalty``, ``frequency_penalty``, ``cache_prompt``,
        ``conversation``, ``response_format``, ``store``). Bad input and a prompt the context cannot answer raise
        here, before anything changes.
        """
        return await self.create(ChatRequest(messages, **settings), stream=stream)

    async def complete(self, prompt: Any, *, stream: bool = False, **settings: Any) -> ChatCompletion | ChatStream:
        """The plain completion of the raw text ``prompt`` (encoded as is, the model's BOS first if it adds one):
        what a base model, without a chat template, answers. ``settings`` and the answer as :meth:`chat`'s (its
        ``to_openai()`` a ``text_completion``). A completion is a turn as a chat's reply is: saved under a
        conversation (``completion-...`` unless ``settings`` name one, or it continues one's tokens), reusing
        the K/V of the longest prefix held, resumable."""
        return await self.create(CompletionRequest(prompt=prompt, **settings), stream=stream)

    async def create(self, request: ChatRequest | CompletionRequest, *, stream: bool = False
                     ) -> ChatCompletion | ChatStream:
        """:meth:`chat` or :meth:`complete` for a request built already (e.g. by :meth:`ChatRequest.from_openai`
        or :meth:`CompletionRequest.from_openai`)."""
        if not isinstance(request, (ChatRequest, CompletionRequest)):
            raise FieldError("request", "a ChatRequest or a CompletionRequest", type(request).__name__)
        async with self.cache_lock.hold():
            turn = await self._begin(request)
        return await self._reply(turn, stream)

    async def continued_by(self, request: ChatRequest | CompletionRequest) -> str | None:
        """The conversation ``request`` would continue if it ran now: the one it names, else the unnamed one its
        prompt goes on from; None if it would start a new one (or fail)."""
        if request.conversation is not None:
            return request.conversation
        async with self.cache_lock.hold():
            try:
                return await self.sources.continued((await self._prompt(request)).tokens)
            except KVCkptError:
                return None

    async def _begin(self, request: ChatRequest | CompletionRequest) -> Turn:
        started = time.perf_counter()
        completion = isinstance(request, CompletionRequest)
        prompt = await self._prompt(request)
        name = (request.conversation or await self.sources.continued(prompt.tokens)
                or new_name("completion" if completion else "chat"))
        warnings: list[str] = []
        conversation = await self.placement.conversation_of(name, warnings)
        max_tokens = min(request.max_tokens or self.config.max_tokens, self.context - len(prompt.tokens))
        slot, source, restore_s = await self.placement.kv_for(name, prompt.tokens, request.cache_prompt, max_tokens,
                                                              warnings)
        gen, extra = await self._start(request, prompt, name, slot, source.length, max_tokens, conversation)
        slot.tokens, slot.kv_length, slot.replies = list(prompt.tokens[:source.length]), source.length, prompt.replies
        slot.named = request.conversation is not None
        turn = self._track(Turn(gen, slot, extra.completion_id, extra.created, len(prompt.tokens), source.length,
                                restore_s, started, warnings=tuple(warnings), text_completion=completion))
        if gen.last_save is not None:  # its messages, committed as it started: before the first token
            turn.save_s = turn.save_before_s = gen.last_save.seconds
        return turn

    async def _prompt(self, request: ChatRequest | CompletionRequest) -> Prompt:
        """The prompt of ``request``'s messages, this engine's replies in them put back as the ids it generated (or
        of its raw text); ContextFullError if it leaves no room for a reply."""
        self.sources.begin()
        if isinstance(request, CompletionRequest):
            return raw_prompt(self.codec, request.prompt, self.context)
        try:
            prompt = await build_prompt(self.codec, request.messages, self.sources.known_reply, self.context - 1)
            replies = sum(m.role == "assistant" for m in request.messages)
            # a reply not recognised: records other writers committed since, or ones missing (a writer killed
            # before writing them)
            for recover in (self.sources.refresh,
                            lambda: self.sources.reindex(self.model.identity, self.cache.get_layout_hash())):
                if len(prompt.replies) < replies and await recover():
                    prompt = await build_prompt(self.codec, request.messages, self.sources.known_reply,
                                                self.context - 1)
        except FieldError as exc:
            if exc.field != "prompt":
                raise
            raise ContextFullError("messages", f"a prompt of at most {self.context - 1} tokens (the context is "
                                   f"{self.context} tokens, and the reply needs at least one)", exc.got) from None
        return prompt

    async def _start(self, request: ChatRequest | CompletionRequest, prompt: Prompt, name: str, slot: Slot, kv_length: int,
                     max_tokens: int, conversation: Conversation | None) -> tuple[Generator, ChatExtra]:
        """The generator of ``request``'s reply in ``slot`` (whose first ``kv_length`` tokens of ``prompt`` hold
        their K/V), and what its checkpoints record of the request, saved once before the prefill (with a store:
        the messages are committed, so a crash during the prefill keeps them); the slot is dropped if it cannot
        start."""
        seed = request.seed if request.seed is not None else secrets.randbelow(MAX_SEED + 1)
        settings = {**request.settings_json(), "seed": seed}  # its conversation: the one it named, or null
        sampling = SamplingSettings(request.temperature, request.top_k, request.top_p, request.repetition_penalty, seed,
                                    request.presence_penalty, request.frequency_penalty)
        extra = ChatExtra.of(request, settings)
        try:
            gen = await Generator.start(
                self.model, self.cache, prompt.tokens, sampling,
                stop=StopRules(max_tokens, self.codec.eos_ids, request.stop), seq_id=slot.seq_id,
                prefill_chunk=self.prefill_chunk, autosave=self._autosave(name) if request.store else None,
                decode=self.codec.decode,
                progress=self.progress, kv_length=kv_length, replies=prompt.replies, extra=extra.to_json(),
                conversation=conversation, context=self.context, save_first=True,
                response_format=request.response_format if isinstance(request, ChatRequest) else None,
                vocabulary=self.vocabulary, **self._save_callbacks(name))
        except BaseException:
            await self.slots.drop(slot)
            raise
        gen.logprobs = request.logprobs
        return gen, extra

    def _autosave(self, name: str) -> Autosave | None:
        if self.store is None:
            return None
        return Autosave(self.store, name, self.config.autosave_every, self.config.keep,
                        pages_per_chunk=self.config.pages_per_chunk, prefix_scope=self.scope, ledger=self.ledger)

    def _track(self, turn: Turn) -> Turn:
        turn.slot.busy = True
        turn.slot.gen = turn.gen
        self._turns.append(turn)
        self.scheduler.admit(turn.gen)
        return turn

    def _save_callbacks(self, name: str) -> dict[str, Any]:
        """The ``on_save`` and ``on_save_error`` of a generator of conversation ``name``, for every turn of it."""
        on_save_error = self.on_save_error
        return {"on_save": lambda result: self._saved(name, result),
                "on_save_error": None if on_save_error is None else lambda exc: on_save_error(name, exc)}

    def _saved(self, name: str, result: SaveResult) -> None:
        """Conversation ``name`` committed ``result``: its reply's time is told apart from its saves, the prefix index
        learns the checkpoint's tokens, and ``on_save`` hears of it."""
        for turn in self._turns:
            if turn.slot.conversation == name:
                turn.save_s += result.seconds
                if turn.first_token_at is None:
                    turn.save_before_s += result.seconds
        if result.prefix_record is not None:
            self.sources.index.note(result.prefix_record)
        if self.on_save is not None:
            self.on_save(name, result)

    async def _stream(self, turn: Turn) -> AsyncGenerator[ChatChunk, None]:
        gen, first, kind = turn.gen, True, turn.text_completion
        model_name, name = self.model_name, turn.slot.conversation
        offset = len(gen.text)  # where the next token's text starts (for a plain completion's logprobs)
        try:
            if gen.generated_tokens or turn.resumed is not None:  # a resumed reply: what it had written first
                yield ChatChunk(turn.completion_id, turn.created, model_name, name, gen.text,
                                tuple(gen.generated_tokens), first=True, resumed=turn.resumed, warnings=turn.warnings,
                                text_completion=kind)
                first = False
            while gen.finish_reason is None and not turn.interrupted:
                event = await self.scheduler.step(gen)
                if event is None:
                    continue
                now = time.perf_counter()
                turn.first_token_at = turn.first_token_at or now
                turn.last_token_at = now
                turn.made += 1
                logprobs = None if event.logprob is None else (self._token_logprobs(event.logprob, offset),)
                offset += 0 if logprobs is None else len(logprobs[0].text)
                yield ChatChunk(turn.completion_id, turn.created, model_name, name, event.text, (event.token,),
                                first=first, warnings=turn.warnings if first else (), text_completion=kind,
                                logprobs=logprobs)
                first = False
            await self._save_stopped(gen)
            yield ChatChunk(turn.completion_id, turn.created, model_name, name,
                            finish_reason=_FINISH.get(gen.finish_reason, "abort"),
                            usage=turn.usage(time.perf_counter()), first=first,
                            warnings=turn.warnings if first else (), text_completion=kind)
        finally:
            if not gen.failed:  # a consumer that went away stops the reply as an interrupt does
                try:
                    await self._save_stopped(gen)
                except (KVCkptError, OSError):
                    pass  # nobody to tell: the slot stays uncommitted, so it is not evicted unsaved
            await self._end(turn)

    def _token_logprobs(self, logprob: TokenLogprob, offset: int) -> TokenLogprobs:
        """A token's log probabilities with the text of it and of its alternatives (their bytes as UTF-8, bytes
        that are not valid UTF-8 read as U+FFFD)."""
        def text(token: int) -> tuple[str, bytes]:
            raw = self.codec.token_bytes(token)
            return raw.decode("utf-8", errors="replace"), raw

        return TokenLogprobs(*text(logprob.token), logprob.logprob,
                             tuple((*text(t), lp) for t, lp in logprob.top), offset)

    async def _save_stopped(self, gen: Generator) -> None:
        """Save a reply that stopped unfinished, unless the store holds its state already."""
        if gen.finish_reason is None and not committed(gen):
            async with self.cache_lock.hold():
                await gen.save()

    async def _reply(self, turn: Turn, stream: bool) -> ChatCompletion | ChatStream:
        """``turn``'s reply: streamed, or (without ``stream``) whole."""
        chunks = ChatStream(self._stream(turn), turn.resumed)
        return chunks if stream else ChatCompletion.from_chunks([chunk async for chunk in chunks])

    async def _end(self, turn: Turn) -> None:
        """The reply stopped (finished, interrupted, or its consumer went away): its slot keeps its state, and a
        finished reply's generator lets go of the conversation's name (an unfinished one keeps it, to go on)."""
        slot, gen = turn.slot, turn.gen
        if turn in self._turns:
            self._turns.remove(turn)
        self.scheduler.retire(gen)
        slot.busy = False
        if gen.failed:  # its K/V may hold part of a forward: nothing can follow it
            await self.slots.drop(slot)
            return
        if gen.finish_reason is not None:
            await gen.close()
        slot.tokens, slot.kv_length = gen.tokens, gen.kv_length
        slot.replies = gen.replies + ([(len(gen.prompt_tokens), len(gen.tokens))] if gen.generated_tokens else [])
        slot.committed = committed(gen)
        self.slots.touch(slot)

    def interrupt(self, name: str | None = None) -> None:
        """Stop the reply being generated in conversation ``name`` after its current token (nothing if none is), or
        without ``name`` every reply; each stays resumable (:meth:`resume`)."""
        if name is not None and not isinstance(name, str):
            raise FieldError("name", "a conversation's name or None", type(name).__name__)
        for turn in self._turns:
            if name is None or turn.slot.conversation == name:
                turn.interrupted = True

    def _reply_text(self, ids: list[int]) -> str:
        ended = bool(ids) and ids[-1] in self.codec.eos_ids
        return self.codec.decode(ids[:len(ids) - ended])

    # ----- conversations ------------------------------------------------------------------------

    async def resume(self, name: str, *, generation: int | None = None, stream: bool = False
                     ) -> ChatCompletion | ChatStream:
        """Continue conversation ``name``'s unfinished reply (cut by a crash, or stopped) with the tokens an
        uninterrupted run gives; its first chunk holds what was written before and, when the reply came back
        from the store, ``resumed``: how its K/V did (imported, or their tokens run again when they could not
        be used). ``generation`` continues that generation of it instead of the newest (e.g. an intact one
        beside a newest that cannot be read). FieldError if the reply finished, NotFoundError if there is no
        such conversation (or generation)."""
        if generation is not None and not is_int(generation, 1):
            raise FieldError("generation", "an integer >= 1 or None", generation)
        async with self.cache_lock.hold():
            turn = await self._resume_turn(name, generation)
        return await self._reply(turn, stream)

    async def _resume_turn(self, name: str, generation: int | None) -> Turn:
        started = time.perf_counter()
        own = self.slots.of_conversation(name)
        if own is not None and own.busy:
            raise ConflictError(f"conversation {name!r}: a reply is being generated in it")
        if (generation is None and own is not None and own.gen is not None and own.gen.finish_reason is None
                and own.committed):
            gen, restore_s, slot = own.gen, 0.0, own
        else:
            record = await self.sources.record(name, generation)
            if record is None:
                which = "" if generation is None else f" generation {generation}"
                raise NotFoundError(f"conversation: expected an unfinished conversation named {name!r}{which}, "
                                    "got none")
            if record.finished:
                raise FieldError("conversation", "a conversation whose last reply is unfinished", name,
                                 f"its reply finished ({record.saved.finish_reason})")
            if own is not None:
                await self.slots.drop(own)
            seq_id = await self.slots.free_sequence(())
            await self.slots.reserve(self.context, keep=())
            gen = await resume(self.store, name, self.model, self.cache, seq_id=seq_id, generation=record.generation,
                               autosave=self._autosave(name), decode=self.codec.decode, context=self.context,
                               progress=self.progress, ledger=self.ledger, vocabulary=self.vocabulary,
                               **self._save_callbacks(name))
            restore_s = gen.resume_report.restore_s + gen.resume_report.replay_s
            slot = self.slots.add(Slot(seq_id, gen.tokens, gen.kv_length, conversation=name))
        extra = ChatExtra.from_json(gen.extra)
        slot.named = extra.named
        logprobs = extra.settings.get("logprobs")  # as the request asked (a record of before them: none)
        gen.logprobs = logprobs if is_int(logprobs, 0, MAX_TOP_LOGPROBS) else None
        return self._track(Turn(gen, slot, extra.completion_id, extra.created, len(gen.prompt_tokens),
                                 len(gen.prompt_tokens), restore_s, started,
                                 resumed=gen.resume_report if slot is not own else None,
                                 text_completion=extra.prompt is not None))

    async def conversations(self) -> list[ConversationInfo]:
        """Every conversation in the store (or, without one, in the cache), the most recent first."""
        infos = []
        if self.store is not None:
            for name in await list_names(self.store):
                record = await self.sources.record(name)
                infos.append(describe(name, record, self.model.identity, self._reply_text))
        else:
            infos = [describe(s.conversation, None, self.model.identity, self._reply_text, s)
                     for s in self.slots if s.conversation]
        return sorted(infos, key=lambda i: -(i.updated_ms or 0))

    async def unfinished(self) -> list[ConversationInfo]:
        """Conversations of this model whose last reply was cut by a crash or stopped: :meth:`resume` them."""
        return [i for i in await self.conversations() if not i.finished and i.same_model and i.error is None]

    async def conversation(self, name: str) -> ConversationInfo:
        """Conversation ``name`` with its messages (the last reply so far included); NotFoundError if none."""
        for info in await self.conversations():
            if info.name == name:
                return info
        raise NotFoundError(f"conversation: expected a conversation named {name!r}, got none")

    async def delete(self, name: str) -> None:
        """Delete conversation ``name``: its slot, every generation and the chunks only it used."""
        async with self.cache_lock.hold():
            own = self.slots.of_conversation(name)
            if own is not None and own.busy:
                raise ConflictError(f"conversation {name!r}: a reply is being generated in it")
            if self.store is not None:
                await delete_name(self.store, name, ledger=self.ledger)
                self.sources.forget(name)
            elif own is None:
                raise NotFoundError(f"conversation: expected a conversation named {name!r}, got none")
            if own is not None:
                await self.slots.drop(own)

    async def delete_each(self, names: Iterable[str]) -> list[str]:
        """:meth:`delete` of each of ``names`` in a store, with one pass over its chunks for all of them; one a reply
        is being generated in, another writer holds, or that is gone is left. The names deleted."""
        async with self.cache_lock.hold():
            if self.store is None:
                return []
            busy = {slot.conversation for slot in self.slots if slot.busy}
            deleted = await delete_names(self.store, [name for name in names if name not in busy], ledger=self.ledger)
            for name in deleted:
                self.sources.forget(name)
                own = self.slots.of_conversation(name)
                if own is not None:
                    await self.slots.drop(own)
            return deleted

    async def warm_up(self) -> None:
        """Run what a turn runs through the model in a free sequence of the cache, reading the logits as a reply does
        (the best id; a sampled, penalized pick; log probabilities), so that a device that builds its kernels on
        first use builds every one of them now, not during a reply: a short prompt and a token after it (attention
        over one range of keys), then a prompt chunk (:attr:`prefill_chunk` tokens, or as many as the context
        allows) and a token after it (attention split over ranges of keys). The cache is as it was afterwards;
        nothing if every sequence is taken."""
        async with self.cache_lock.hold():
            seq_id = self.slots.free_seq_id()
            if seq_id is None:
                return
            self.cache.add_sequence(seq_id)
            chunk = min(self.prefill_chunk, self.context - 4)
            try:
                for n in (2, 1, chunk, 1) if chunk >= 1 else (1,):
                    logits = await self.model.forward(self.cache, seq_id, [0] * n)
                    await logits.argmax()
                await logits.pick(Sampler(SamplingSettings(temperature=1.0, top_p=0.5, repetition_penalty=1.1,
                                                           presence_penalty=0.1)), [0], [0])
                await logits.logprobs(0, 2)
            finally:
                self.cache.remove_sequence(seq_id)

    async def release(self, name: str) -> None:
        """Let go of conversation ``name`` in this engine: its slot leaves the cache and an unfinished reply of it
        releases the name's claim, so another engine (another tab or process) may continue it; the store keeps
        it as last committed. ConflictError while a reply is being generated in it; nothing if it is not here."""
        async with self.cache_lock.hold():
            own = self.slots.of_conversation(name)
            if own is not None and own.busy:
                raise ConflictError(f"conversation {name!r}: a reply is being generated in it; interrupt it first")
            if own is not None:
                await self.slots.drop(own)

    async def close(self) -> None:
        """Stop every reply (each stays resumable), let go of every conversation's name and release the cache's
        GPU memory; the engine cannot be used afterwards (the model stays loaded)."""
        self.interrupt()
        async with self.cache_lock.hold():
            for slot in list(self.slots):
                if slot.gen is not None:
                    await slot.gen.close()
        self.cache.close()


def new_name(kind: str) -> str:
    """A new conversation name of ``kind`` ("chat", "completion"): the UTC time and 6 random hex digits."""
    return time.strftime(f"{kind}-%Y%m%d-%H%M%S-", time.gmtime()) + secrets.token_hex(3)
