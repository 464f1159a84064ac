"""The crash-resume page's model runner: what its Web Worker (``examples/crash_resume/worker.mjs``) calls.

One model and one conversation at a time, on the worker's WebGPU device, autosaved every N tokens to
an IndexedDB or OPFS store under the conversation's name, which this worker holds (its Web Lock claim) until
it starts or resumes another conversation, deletes this one, or closes: another tab or worker cannot write
or delete it meanwhile (ConflictError). Each call returns JSON text (camelCase keys);
what happens while a call runs reaches JavaScript as events, JSON text given to the callback of
:func:`set_emit`:

* ``{"type": "upload", "done", "total"}`` -- weights uploaded to the GPU, in parts (a layer's, then the rest);
* ``{"type": "prefill", "done", "total"}`` and ``{"type": "replay", "done", "total"}`` -- tokens run;
* ``{"type": "token", "index", "text", "tokensPerS"}`` -- a generated token and the reply text it made final;
* ``{"type": "saved", "generation", "tokens", "bytes", "ms"}`` -- a committed checkpoint;
* ``{"type": "saveFailed", "error", "committed"}`` -- an autosave failed (the last committed generation stays,
  the generation goes on); the next autosave tries again, :func:`save_now` at once;
* ``{"type": "finished" or "paused", "finishReason", "text"}`` -- the generation stopped.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from ..durable.catalog import list_generations
from ..durable.results import GenerationInfo, SaveResult
from ..durable.retention import delete_name
from ..errors import FieldError, UnusableCheckpointError
from ..model.gguf import parse_gguf
from ..model.loader import load_gguf
from ..model.protocol import LoadedModel
from ..model.sampler import SamplingSettings
from ..model.app_state import StopRules
from ..model.generator import Autosave, Generator, TokenEvent, new_cache
from ..model.resume import resume
from .runtime import camel_json, device, error_fields, open_store, to_py

__all__ = ["close", "conversation", "conversations", "delete", "load_model", "pause", "resume_saved", "save_now",
           "set_emit", "start"]


class _Chat:
    """This worker's model, cache and generation."""

    def __init__(self) -> None:
        self.loaded: LoadedModel | None = None
        self.cache: Any = None
        self.gen: Generator | None = None
        self.writing: tuple[Any, str] | None = None  # the store and name the generation writes
        self.pausing = False
        self.running = False  # _run is stepping the generation
        self.emit: Callable[[str], None] = lambda text: None


_chat = _Chat()


def _json(**fields: Any) -> str:
    return camel_json(fields)


def _event(kind: str, **fields: Any) -> None:
    _chat.emit(_json(type=kind, **fields))


def _options(value: Any, known: dict[str, Any]) -> dict[str, Any]:
    """``value`` (a JS object) over the defaults ``known``; FieldError naming an unknown option."""
    given = to_py(value) or {}
    if not isinstance(given, dict):
        raise FieldError("options", "an object", type(given).__name__)
    for key in given:
        if key not in known:
            raise FieldError(f"options.{key}", f"one of {sorted(known)}", "an unknown option")
    return {**known, **given}


def _model() -> LoadedModel:
    if _chat.loaded is None:
        raise FieldError("model", "a model loaded with load_model()", "none")
    return _chat.loaded


def set_emit(callback: Callable[[str], None]) -> None:
    """Send events (JSON text) to ``callback`` from now on."""
    _chat.emit = callback


async def load_model(data: Any) -> str:
    """Load the GGUF file's bytes ``data`` (a Uint8Array) as the model, replacing any other; JSON
    ``{identity, numLayers, vocabSize, maxContext, loadMs}``."""
    await close()
    started = time.perf_counter()
    raw = to_py(data)  # a memoryview of the Uint8Array's bytes, copied once below
    f = parse_gguf(bytes(raw))
    _chat.loaded = load_gguf(f, await device(), lambda done, total: _event("upload", done=done, total=total))
    model = _chat.loaded.model
    return _json(identity=model.identity, num_layers=model.kv_layout().num_layers, vocab_size=model.vocab_size,
                 max_context=model.max_context, load_ms=(time.perf_counter() - started) * 1e3)


def _generator_hooks(started_at: int) -> dict[str, Any]:
    """The callbacks of a Generator that turn its tokens, saves, failed autosaves and progress into events."""
    clock = {"t0": time.perf_counter(), "first": started_at}

    def on_token(event: TokenEvent) -> None:
        made = event.index + 1 - clock["first"]
        elapsed = time.perf_counter() - clock["t0"]
        _event("token", index=event.index, text=event.text,
               tokens_per_s=made / elapsed if made > 0 and elapsed > 0 else None)

    def on_save(result: SaveResult) -> None:
        _event("saved", generation=result.generation, tokens=result.seq_length, bytes=result.bytes_written,
               ms=result.seconds * 1e3, name=result.name)

    def on_save_error(exc: Exception) -> None:
        _event("saveFailed", error=error_fields(exc),
               committed=_chat.gen.committed_generation if _chat.gen is not None else None)

    def progress(phase: str, done: int, total: int) -> None:
        if phase in ("prefill", "replay"):
            _event(phase, done=done, total=total)
            if done == total:  # decode speed counts from the first decoded token
                clock["t0"] = time.perf_counter()

    return {"on_token": on_token, "on_save": on_save, "on_save_error": on_save_error, "progress": progress}


async def _release() -> None:
    """End this worker's generation, if any, releasing the name it holds."""
    gen, _chat.gen, _chat.writing = _chat.gen, None, None
    if gen is not None:
        await gen.close()


async def _new_cache(context: int) -> Any:
    if _chat.cache is not None:
        _chat.cache.close()
        _chat.cache = None
    loaded = _model()
    _chat.cache = new_cache(loaded.model, await device(), max_tokens=min(context, loaded.model.max_context),
                            prefill_chunk=64)
    return _chat.cache


START_OPTIONS = {"store": "indexeddb", "storeName": "kvckpt-demo", "name": None, "every": 16, "maxTokens": 128,
                 "context": 1024, "temperature": 0.0, "seed": 0, "topK": 0, "topP": 1.0}


async def start(prompt: str, options: Any = None) -> str:
    """Generate the model's reply to ``prompt`` as conversation ``options.name``, autosaving every
    ``options.every`` tokens; runs until the reply ends or :func:`pause`; JSON ``{finishReason, text, tokens}``
    (the generated token ids)."""
    o = _options(options, START_OPTIONS)
    loaded = _model()
    if not isinstance(prompt, str) or not prompt.strip():
        raise FieldError("prompt", "a non-empty text", prompt if isinstance(prompt, str) else type(prompt).__name__)
    settings = SamplingSettings(temperature=o["temperature"], seed=o["seed"], top_k=o["topK"], top_p=o["topP"])
    stop = StopRules(o["maxTokens"], loaded.text.eos_ids)
    autosave = Autosave(await open_store(o["store"], o["storeName"]), o["name"], o["every"])
    tokens = loaded.text.encode_chat([{"role": "user", "content": prompt}],
                                     max_tokens=min(o["context"], loaded.model.max_context))
    await _release()
    cache = await _new_cache(o["context"])
    _chat.gen = await Generator.start(loaded.model, cache, tokens, settings, stop=stop, autosave=autosave,
                                      decode=loaded.text.decode, **_generator_hooks(0))
    _chat.writing = autosave.store, autosave.name
    return await _run()


RESUME_OPTIONS = {"store": "indexeddb", "storeName": "kvckpt-demo", "name": None, "generation": None, "every": None,
                  "context": 1024, "replay": False, "measure": False}


async def resume_saved(options: Any = None) -> str:
    """Continue conversation ``options.name`` from its newest checkpoint (or ``options.generation``), then run
    it like :func:`start`, autosaving every ``options.every`` tokens (default: as the checkpoint did).

    JSON ``{problem: {reason, message}}`` if its K/V cannot be used and ``options.replay`` is false (nothing
    changed); else, once the generation stops, what :func:`start` returns. A ``restored`` event says first how
    the K/V came back: ``{kvRestored, reason, message, generation, tokens, restoreMs, replayMs, reprefillMs,
    prompt, text}``, ``reprefillMs`` being a re-prefill of the same tokens into a scratch cache, timed, when
    ``options.measure`` (else null).
    """
    o = _options(options, RESUME_OPTIONS)
    loaded = _model()
    store = await open_store(o["store"], o["storeName"])
    autosave = Autosave(store, o["name"], o["every"])
    await _release()
    cache = await _new_cache(o["context"])
    try:
        _chat.gen = gen = await resume(store, o["name"], loaded.model, cache, generation=o["generation"],
                                       autosave=autosave, decode=loaded.text.decode, replay=bool(o["replay"]),
                                       **_generator_hooks(0))
    except UnusableCheckpointError as exc:
        return _json(problem=error_fields(exc))
    _chat.writing = store, o["name"]
    gen.on_token = _generator_hooks(len(gen.generated_tokens))["on_token"]
    report = gen.resume_report
    reprefill_ms = await _reprefill_ms(gen.tokens[:gen.kv_length]) if o["measure"] else None
    _event("restored", kv_restored=report.kv_restored, reason=report.reason, message=report.message,
           generation=report.generation, tokens=report.kv_length, restore_ms=report.restore_s * 1e3,
           replay_ms=report.replay_s * 1e3, reprefill_ms=reprefill_ms,
           prompt=loaded.text.decode(gen.prompt_tokens), text=gen.text)
    return await _run()


async def _reprefill_ms(tokens: list[int]) -> float:
    """Milliseconds to run ``tokens`` through the model into a scratch cache of the same layout and limits,
    after a warm-up forward of the first prefill chunk (pipelines are built once per page, not per prefill)."""
    loaded = _model()
    limits = _chat.cache.limits
    scratch = new_cache(loaded.model, await device(), max_tokens=limits.max_total_seq_len,
                        prefill_chunk=limits.prefill_chunk_size, num_seqs=2)
    try:
        scratch.add_sequence(1)
        await (await loaded.model.forward(scratch, 1, tokens[:limits.prefill_chunk_size])).argmax()
        scratch.remove_sequence(1)
        scratch.add_sequence(0)
        started = time.perf_counter()
        logits = await loaded.model.forward(scratch, 0, tokens)
        await logits.argmax()  # waits for the GPU
        return (time.perf_counter() - started) * 1e3
    finally:
        scratch.close()


async def _run() -> str:
    """Step the generation until it finishes or :func:`pause` asks (a failed autosave is an event, and
    generation goes on)."""
    gen = _chat.gen
    _chat.pausing, _chat.running = False, True
    try:
        while gen.finish_reason is None and not _chat.pausing:
            await gen.step()
    finally:
        _chat.running = False
    _event("finished" if gen.finish_reason else "paused", finish_reason=gen.finish_reason, text=gen.text)
    return _json(finish_reason=gen.finish_reason, text=gen.text, tokens=gen.generated_tokens)


def pause() -> None:
    """Stop the running generation after its current token (it stays resumable from its last checkpoint)."""
    _chat.pausing = True


async def save_now() -> str:
    """Save the current generation now (after a failed autosave: without waiting for the next); the saved
    event's JSON."""
    gen = _chat.gen
    if gen is None:
        raise FieldError("generation", "a started or resumed generation", "none")
    result = await gen.save()
    return _json(generation=result.generation, tokens=result.seq_length, bytes=result.bytes_written,
                 ms=result.seconds * 1e3)


def _summary(info: GenerationInfo, identity: str | None) -> dict[str, Any]:
    """One stored generation as the storage panel lists it."""
    app = info.app_state or {}
    tokens = app.get("prompt_tokens"), app.get("generated_tokens")
    sizes = dict(zip(info.chunk_keys, info.chunk_nbytes))
    return {"name": info.name, "generation": info.generation, "error": info.error,
            "tokens": sum(len(t) for t in tokens if isinstance(t, list)) or info.seq_length,
            "kvTokens": info.seq_length, "bytes": sum(sizes.values()) + info.manifest_bytes,
            "createdMs": info.created_ms, "finishReason": app.get("finish_reason"),
            "sameModel": identity is not None and app.get("model") == identity}


async def conversations(store: str = "indexeddb", store_name: str = "kvckpt-demo") -> str:
    """The conversations saved in the store, newest first: JSON list of the newest generation of each
    (``name, generation, tokens, kvTokens, bytes, createdMs, finishReason, sameModel, error``)."""
    identity = _chat.loaded.model.identity if _chat.loaded is not None else None
    newest: dict[str, GenerationInfo] = {}
    for info in await list_generations(await open_store(store, store_name)):
        newest[info.name] = info  # listed by name, then generation
    rows = [_summary(info, identity) for info in newest.values()]
    return json.dumps(sorted(rows, key=lambda r: -(r["createdMs"] or 0)))


async def conversation(store: str, store_name: str, name: str) -> str:
    """Every generation of conversation ``name``, and its prompt and reply as text when this model wrote it:
    JSON ``{generations: [...], prompt, reply, sampler}``."""
    identity = _chat.loaded.model.identity if _chat.loaded is not None else None
    infos = await list_generations(await open_store(store, store_name), name)
    if not infos:
        raise FieldError("name", "a conversation in the store", name)
    app = infos[-1].app_state or {}
    same = identity is not None and app.get("model") == identity
    decode = _chat.loaded.text.decode if same else None
    return json.dumps({"generations": [_summary(i, identity) for i in infos], "model": app.get("model"),
                       "prompt": decode(app.get("prompt_tokens", [])) if decode else None,
                       "reply": decode(app.get("generated_tokens", [])) if decode else None,
                       "sampler": app.get("sampler")})


async def delete(store: str, store_name: str, name: str) -> str:
    """Delete every generation of conversation ``name`` and the chunks only it used; the GcResult as JSON.

    This worker's own conversation is deleted once it is paused or finished (its generation ends); while it
    generates, or while another tab or worker writes it, the delete is refused (ConflictError)."""
    target = await open_store(store, store_name)
    if _chat.writing == (target, name) and not _chat.running:
        await _release()
    result = await delete_name(target, name)
    return _json(deleted_manifests=list(result.deleted_manifests), deleted_chunks=result.deleted_chunks,
                 freed_bytes=result.freed_bytes)


async def close() -> None:
    """End the generation (releasing its conversation's name) and release the cache's and the model's GPU
    memory."""
    await _release()
    if _chat.cache is not None:
        _chat.cache.close()
    if _chat.loaded is not None:
        _chat.loaded.model.close()
    _chat.cache = _chat.loaded = _chat.gen = None
