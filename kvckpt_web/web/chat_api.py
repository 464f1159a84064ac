"""What the engine's Web Worker (``kvckpt_web/web/engine-worker.mjs``) calls: the chat engine on this worker's
WebGPU device and an IndexedDB or OPFS store.

A :class:`BrowserEngine` holds one model and one :class:`~kvckpt_web.engine.Engine`. Requests and results cross as
JSON text in the engine's shapes (OpenAI's chat completions, or with ``kind`` "completion" its plain completions,
:class:`~kvckpt_web.engine.ConversationInfo`: snake_case keys); a streamed reply is a handle whose chunks :meth:`BrowserEngine.next_chunk` gives one by one.
What happens meanwhile reaches JavaScript as events, JSON text given to ``emit``:

* ``{"type": "upload", "done", "total"}`` -- weights uploaded to the GPU, in parts;
* ``{"type": "saved", "conversation", "generation", "tokens", "bytes", "ms", "store"}`` -- a committed
  checkpoint (``store`` names the store written, e.g. ``IndexedDB 'kvckpt'``);
* ``{"type": "save_failed", "conversation", "error", "store"}`` -- an autosave failed in the store (the reply goes
  on; the last committed generation stays).

A conversation moves to another device through the store ``kvckpt serve --store DIR --token T`` serves
(:meth:`BrowserEngine.push`, :meth:`BrowserEngine.pull`, over :mod:`kvckpt_web.engine.remote` with an
:class:`~kvckpt_web.stores.http.HTTPStore`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from ..durable.catalog import list_generations, list_names, load_manifest
from ..durable.keys import parse_manifest_key
from ..durable.results import GenerationInfo, SaveResult, SyncResult
from ..engine import PRESETS, ChatRequest, ChatStream, CompletionRequest, Engine, pull, push
from ..engine.listing import describe
from ..engine.record import ChatRecord
from ..errors import FieldError, KVCkptError, NotFoundError, is_int
from ..generation.results import ResumeReport
from ..model.caches import new_cache
from ..model.gguf import parse_gguf
from ..model.loader import load_gguf
from ..model.protocol import LoadedModel
from ..stores.http import HTTPStore
from .runtime import device, error_fields, open_store, to_py

__all__ = ["BrowserEngine", "saved_conversations"]

STORE_LABELS = {"indexeddb": "IndexedDB", "opfs": "OPFS"}

OPEN_OPTIONS = {"store": "indexeddb", "store_name": "kvckpt", "model_name": "kvckpt"}
"""What :meth:`BrowserEngine.open` takes beside :data:`ENGINE_SETTINGS`, and its defaults."""
ENGINE_SETTINGS = ("context", "sequences", "autosave_every", "prefill_chunk")
"""The fields of the engine's ``browser`` preset (:data:`~kvckpt_web.engine.PRESETS`) that :meth:`BrowserEngine.open`
may replace."""


def _object(what: str, value: Any) -> dict[str, Any]:
    """``value`` (JSON text, a JS object or a dict) as a dict; FieldError naming ``what`` if it is none."""
    value = to_py(value)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise FieldError(what, "a JSON object", f"invalid JSON ({exc})") from None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise FieldError(what, "an object", type(value).__name__)
    return value


def _request(body: Any, kind: str) -> ChatRequest | CompletionRequest:
    """The request of an OpenAI ``body`` of ``kind`` "chat" (chat completions) or "completion" (plain
    completions: a raw prompt, what a base model answers)."""
    if kind == "completion":
        return CompletionRequest.from_openai(_object("body", body))
    if kind != "chat":
        raise FieldError("kind", "'chat' or 'completion'", kind)
    return ChatRequest.from_openai(_object("body", body))


def _options(value: Any, known: dict[str, Any]) -> dict[str, Any]:
    """``value`` over the defaults ``known``; FieldError naming an unknown option."""
    given = _object("options", value)
    for key in given:
        if key not in known:
            raise FieldError(f"options.{key}", f"one of {sorted(known)}", "an unknown option")
    return {**known, **{k: v for k, v in given.items() if v is not None}}


def _report(report: ResumeReport) -> dict[str, Any]:
    """How a resume got its K/V back, as the page shows it."""
    return {"kv_restored": report.kv_restored, "reason": report.reason, "message": report.message,
            "generation": report.generation, "tokens": report.kv_length, "restore_ms": report.restore_s * 1e3,
            "replay_ms": report.replay_s * 1e3}


def _summary(info: GenerationInfo) -> dict[str, Any]:
    """One stored generation as the inspect panel lists it."""
    sizes = dict(zip(info.chunk_keys, info.chunk_nbytes))
    return {"generation": info.generation, "error": info.error, "kv_tokens": info.seq_length,
            "bytes": sum(sizes.values()) + info.manifest_bytes, "created_ms": info.created_ms}


def _moved(result: SyncResult) -> str:
    """What a push or a pull moved: JSON ``{name, generation, apart_from, copied, chunks_sent, chunks_present,
    records_sent, bytes_sent, ms}`` (``copied`` false: the other side held that generation already, nothing but
    missing prefix index records moved). ``apart_from``: null, or the name the conversation was pushed or pulled
    as, when its copy there went apart from this one: it was kept beside it under ``name`` (nothing overwritten)."""
    name, generation = parse_manifest_key((result.copied or result.up_to_date)[0])
    apart_from = next(iter(result.kept_apart), None)
    return json.dumps({"name": name, "generation": generation, "apart_from": apart_from, "copied": bool(result.copied),
                       "chunks_sent": result.chunks_sent, "chunks_present": result.chunks_present,
                       "records_sent": result.records_sent, "bytes_sent": result.bytes_sent,
                       "ms": result.seconds * 1e3})


class BrowserEngine:
    """A worker's model, its engine, and the replies being streamed from it."""

    def __init__(self, emit: Callable[[str], None] | None = None) -> None:
        self.emit = emit or (lambda text: None)
        self.loaded: LoadedModel | None = None
        self.engine: Engine | None = None
        self.store_label = ""
        self._streams: dict[int, ChatStream] = {}
        self._issued = 0  # stream handles are 1, 2, ...: never reused

    def _event(self, kind: str, **fields: Any) -> None:
        self.emit(json.dumps({"type": kind, **fields}))

    def _engine(self) -> Engine:
        if self.engine is None:
            raise FieldError("engine", "an engine opened with open()", "none")
        return self.engine

    async def load_model(self, data: Any) -> str:
        """Load the GGUF file's bytes ``data`` (a Uint8Array) as the model, closing any engine and model before;
        JSON ``{identity, name, num_layers, vocab_size, max_context, chat_template, load_ms}`` (``name``: the file's
        ``general.name``, null if it has none; ``chat_template``: the family of its chat template, "ChatML", "Qwen3",
        "Gemma" or "Llama 3", null for a model that answers plain completions only)."""
        await self.close()
        started = time.perf_counter()
        f = parse_gguf(bytes(to_py(data)))  # a memoryview of the Uint8Array's bytes, copied once
        self.loaded = load_gguf(f, await device(), lambda done, total: self._event("upload", done=done, total=total))
        model, template = self.loaded.model, self.loaded.text.template
        name = f.metadata.get("general.name")
        return json.dumps({"identity": model.identity, "name": name if isinstance(name, str) and name.strip() else None,
                           "num_layers": model.kv_layout().num_layers,
                           "vocab_size": model.vocab_size, "max_context": model.max_context,
                           "chat_template": None if template is None else template.family,
                           "load_ms": (time.perf_counter() - started) * 1e3})

    async def open(self, options: Any = None) -> str:
        """Open the engine over the loaded model and the store ``options.store`` ("indexeddb" or "opfs") named
        ``options.store_name`` (see :data:`OPEN_OPTIONS`), its settings the ``browser`` preset's with those of
        :data:`ENGINE_SETTINGS` the options give, closing the one before; JSON ``{context, store, config}``
        (``config``: the settings it runs with, :meth:`~kvckpt_web.engine.EngineConfig.to_json`)."""
        o = _options(options, {**OPEN_OPTIONS, **dict.fromkeys(ENGINE_SETTINGS)})
        config = PRESETS["browser"].replace(**{key: o[key] for key in ENGINE_SETTINGS})
        if self.loaded is None:
            raise FieldError("model", "a model loaded with load_model()", "none")
        store = await open_store(o["store"], o["store_name"])
        await self._close_engine()
        self.engine = Engine(self.loaded, await device(), store=store, model_name=o["model_name"], config=config,
                             on_save=self._saved, on_save_error=self._save_failed)
        self.store_label = f"{STORE_LABELS[o['store']]} {o['store_name']!r}"
        return json.dumps({"context": self.engine.context, "store": self.store_label,
                           "config": self.engine.config.to_json()})

    async def warm_up(self) -> str:
        """Build the model's kernels now (see :meth:`Engine.warm_up`): JSON ``{ms}``."""
        started = time.perf_counter()
        await self._engine().warm_up()
        return json.dumps({"ms": (time.perf_counter() - started) * 1e3})

    def _saved(self, name: str, result: SaveResult) -> None:
        self._event("saved", conversation=name, generation=result.generation, tokens=result.seq_length,
                    bytes=result.bytes_written, ms=result.seconds * 1e3, store=self.store_label)

    def _save_failed(self, name: str, exc: Exception) -> None:
        self._event("save_failed", conversation=name, error=error_fields(exc), store=self.store_label)

    # ----- replies ------------------------------------------------------------------------------

    def _keep(self, stream: ChatStream) -> int:
        self._issued += 1
        self._streams[self._issued] = stream
        return self._issued

    async def create(self, body: Any, kind: str = "chat") -> str:
        """Start the reply to an OpenAI chat-completions ``body`` (with ``kind`` "completion", a plain completions
        body; JSON text or object; ``stream`` is ignored, the reply always streams): JSON ``{stream}``, the handle
        :meth:`next_chunk` reads. Bad input raises here, before anything changes."""
        request = _request(body, kind)
        return json.dumps({"stream": self._keep(await self._engine().create(request, stream=True))})

    async def complete(self, body: Any, kind: str = "chat") -> str:
        """The whole reply to ``body``: OpenAI's ``chat.completion`` JSON (``text_completion`` for ``kind``
        "completion")."""
        return json.dumps((await self._engine().create(_request(body, kind))).to_openai())

    async def resume(self, name: str, generation: int | None = None, stream: bool = True) -> str:
        """Continue conversation ``name``'s unfinished reply (from ``generation``, default its newest): JSON
        ``{stream, restored}`` (or without ``stream``, the whole reply: ``{completion, restored}``), ``restored``
        saying how its K/V came back from the store (null when its cache slot still held them):
        ``{kv_restored, reason, message, generation, tokens, restore_ms, replay_ms}``."""
        reply = await self._engine().resume(name, stream=stream, generation=generation)
        restored = _report(reply.resumed) if reply.resumed is not None else None
        if stream:
            return json.dumps({"stream": self._keep(reply), "restored": restored})
        return json.dumps({"completion": reply.to_openai(), "restored": restored})

    async def next_chunk(self, handle: int) -> str:
        """The next chunk of stream ``handle`` (OpenAI's ``chat.completion.chunk`` JSON, or a plain completion's
        ``text_completion``), "" once it ended."""
        stream = self._streams.get(handle)
        if stream is None:
            raise FieldError("stream", f"an open stream handle {sorted(self._streams)}", handle)
        try:
            chunk = await anext(stream)
        except StopAsyncIteration:
            del self._streams[handle]
            return ""
        except BaseException:
            del self._streams[handle]
            raise
        return json.dumps(chunk.to_openai())

    async def cancel(self, handle: int) -> None:
        """Stop reading stream ``handle``: its reply stops as an interrupt stops it (saved, resumable)."""
        stream = self._streams.pop(handle, None)
        if stream is not None:
            await stream.aclose()

    def interrupt(self, name: str | None = None) -> None:
        """Stop the reply being generated in conversation ``name`` (without it, every reply) after its current token
        (each stays resumable)."""
        if self.engine is not None:
            self.engine.interrupt(name)

    # ----- conversations --------------------------------------------------------------------------

    async def conversations(self) -> str:
        """Every conversation of the store, newest first: JSON list of ConversationInfo."""
        return json.dumps([i.to_json() for i in await self._engine().conversations()])

    async def unfinished(self) -> str:
        """The conversations of this model whose last reply was cut or stopped: JSON list of ConversationInfo."""
        return json.dumps([i.to_json() for i in await self._engine().unfinished()])

    async def conversation(self, name: str) -> str:
        """Conversation ``name`` (NotFoundError if none): JSON ConversationInfo."""
        return json.dumps((await self._engine().conversation(name)).to_json())

    async def inspect(self, name: str) -> str:
        """Every stored generation of conversation ``name``: JSON ``{name, store, generations: [{generation,
        error, kv_tokens, bytes, created_ms}]}``."""
        engine = self._engine()
        infos = await list_generations(engine.store, name)
        if not infos:
            raise NotFoundError(f"conversation: expected a conversation named {name!r}, got none")
        return json.dumps({"name": name, "store": self.store_label, "generations": [_summary(i) for i in infos]})

    async def delete(self, name: str) -> None:
        """Delete conversation ``name`` (ConflictError while a reply is being generated in it, here or in another
        tab)."""
        await self._engine().delete(name)

    async def release(self, name: str) -> None:
        """Let go of conversation ``name`` so another tab may continue it (see :meth:`Engine.release`)."""
        await self._engine().release(name)

    async def push(self, name: str, url: str, token: str | None) -> str:
        """Copy conversation ``name``'s newest committed generation to the store that ``kvckpt serve --store DIR
        --token T`` serves at ``url``, moving only the chunks it lacks (see :func:`kvckpt_web.engine.push`): JSON
        of what moved (:func:`_moved`; a copy that went apart from the remote's is kept there beside it under a
        name of its own). NotFoundError if this store holds no ``name``; ConflictError if the remote's copy goes on
        from this one (another device continued it: pull it); StoreError for a refused token (nothing written) or
        no answer."""
        remote = HTTPStore(url, token=token)
        return _moved(await push(self._engine(), name, remote))

    async def pull(self, name: str, url: str, token: str | None) -> str:
        """Copy conversation ``name``'s newest generation from the store served at ``url`` into this engine's store
        (see :func:`kvckpt_web.engine.pull`): JSON of what moved (:func:`_moved`). This engine lets go of a slot of
        the conversation first (its K/V stay in the store), so that a newer generation from another device can
        take its place; its next turn restores the K/V from the store. The remote's copy, if it went apart from
        this one, is kept here beside it under a name of its own (``name`` of the JSON). NotFoundError if the remote
        holds no ``name``; ConflictError while a reply is being generated in it, or if this store's copy goes on
        from the remote's; StoreError as :meth:`push`."""
        remote = HTTPStore(url, token=token, read_only=True)
        engine = self._engine()
        await engine.release(name)
        return _moved(await pull(engine, name, remote))

    async def measure_reprefill(self, name: str, tokens: int | None = None) -> str:
        """Run the first ``tokens`` (default: all) of the tokens whose K/V conversation ``name``'s newest checkpoint
        holds through the model into a scratch cache, timed once the device has finished (after a warm-up forward):
        JSON ``{tokens, ms}``."""
        engine = self._engine()
        record = await engine.sources.record(name)
        if record is None:
            raise NotFoundError(f"conversation: expected a readable conversation named {name!r}, got none")
        if record.saved.model != engine.model.identity:
            raise FieldError("conversation", "a conversation of this model", name, "it is another model's")
        held = record.saved.kv_length
        if tokens is not None and not is_int(tokens, 1, held):
            raise FieldError("tokens", f"an integer in [1, {held}] (the conversation's K/V tokens)", tokens)
        tokens = record.tokens[:held if tokens is None else tokens]
        async with engine.cache_lock.hold():
            ms = await _prefill_ms(engine, tokens)
        return json.dumps({"tokens": len(tokens), "ms": ms})

    async def _close_engine(self) -> None:
        for handle in list(self._streams):
            await self.cancel(handle)
        if self.engine is not None:
            await self.engine.close()
        self.engine = None

    async def close(self) -> None:
        """Stop every reply (each stays resumable), close the engine and release the model's GPU memory."""
        await self._close_engine()
        if self.loaded is not None:
            self.loaded.model.close()
        self.loaded = None


async def _prefill_ms(engine: Engine, tokens: list[int]) -> float:
    """Milliseconds to prefill ``tokens`` in the engine's prefill chunks into a scratch cache of its layout."""
    chunk = engine.prefill_chunk
    scratch = new_cache(engine.model, await device(), max_tokens=len(tokens) + chunk, prefill_chunk=chunk,
                        page_size=engine.config.page_size, num_seqs=2)
    try:
        scratch.add_sequence(1)  # warm-up: pipelines are built once per page, not per prefill
        await (await engine.model.forward(scratch, 1, tokens[:chunk])).argmax()
        scratch.remove_sequence(1)
        scratch.add_sequence(0)
        started = time.perf_counter()
        logits = None
        for at in range(0, len(tokens), chunk):
            logits = await engine.model.forward(scratch, 0, tokens[at:at + chunk])
        if logits is not None:
            await logits.argmax()  # waits for the device
        return (time.perf_counter() - started) * 1e3
    finally:
        scratch.close()


async def saved_conversations(kind: str, store_name: str) -> str:
    """The conversations of a store as a page without a model lists them (their messages, not the last reply,
    which only its model can decode), newest first: JSON list of ConversationInfo."""
    store = await open_store(kind, store_name)
    infos = []
    for name in await list_names(store):
        try:
            manifest, _ = await load_manifest(store, name)
            record: ChatRecord | None = ChatRecord.from_app_state(name, manifest.generation, manifest.created_ms,
                                                                  manifest.app_state)
        except KVCkptError:
            record = None
        infos.append(describe(name, record, "", lambda ids: ""))
    return json.dumps([i.to_json() for i in sorted(infos, key=lambda i: -(i.updated_ms or 0))])
