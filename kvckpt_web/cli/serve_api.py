"""``kvckpt serve --api``: the OpenAI-compatible HTTP API over the chat engine (``kvckpt_web.server.api``).

It serves the API alone, not the browser runtime: the page runs a model of its own in the browser, and the
API needs neither Pyodide nor wheels (run a second ``kvckpt serve`` for the page). Every flag, the model file
and the store are checked before the model loads; the model loads before the server listens, and the API's
base URL (``http://127.0.0.1:PORT/v1``) is printed on stdout once it does.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..durable.locations import open_location
from ..checks import check_int
from ..engine.unnamed import (DEFAULT_UNNAMED_CHECK_EVERY_S, DEFAULT_UNNAMED_MAX_BYTES, DEFAULT_UNNAMED_TTL_S,
                              UnnamedRetention)
from ..errors import FieldError
from ..model.loader import default_model_path
from ..server.worker import DEFAULT_QUEUE
from ..stores.objects import SCHEMES as OBJECT_SCHEMES
from ..stores.leases import CLOCK_SKEW_SECONDS, DEFAULT_LEASE_SECONDS, check_lease_seconds
from .serving import serve_until_interrupted
from .engine_flags import DESKTOP, engine_config
from .store_commands import check_context, check_store_target

if TYPE_CHECKING:
    from ..engine import Engine, EngineConfig

RUNTIME_FLAGS = {"page": "--page", "pyodide": "--pyodide", "wheels": "--wheels", "open": "--open", "token": "--token"}
"""The flags of the browser runtime and of a served store, which ``--api`` does not serve."""
API_FLAGS = {"model_name": "--model-name", "context": "--context", "max_tokens": "--max-tokens", "lease": "--lease",
             "unnamed_ttl": "--unnamed-ttl", "unnamed_max_bytes": "--unnamed-max-bytes",
             "unnamed_check_every": "--unnamed-check-every",
             "queue": "--queue"}
"""The flags only ``--api`` takes."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--api`` and its flags to the ``serve`` parser."""
    parser.add_argument("--api", action="store_true", help="serve an OpenAI-compatible API (POST "
                        "/v1/chat/completions, GET /v1/models, /v1/kvckpt/conversations) over the chat engine "
                        "running --model, instead of the browser runtime")
    parser.add_argument("--model-name", default=None, help="with --api: the model's name in the API (default: the "
                        "model file's name without .gguf)")
    parser.add_argument("--context", type=int, default=None, help="with --api: most tokens of one conversation "
                        f"(default {DESKTOP.context}, or the model's context if smaller)")
    parser.add_argument("--max-tokens", type=int, default=None, help="with --api: most tokens of a reply whose "
                        f"request sets no max_tokens (default {DESKTOP.max_tokens}; never beyond the context)")
    parser.add_argument("--lease", type=float, default=None, help="with --api and an object storage --store URL "
                        "(replicas sharing one store): seconds a replica's claim of a conversation it writes runs "
                        f"unless renewed (default {DEFAULT_LEASE_SECONDS:g}; renewed while it writes); another "
                        f"replica takes over a killed one's conversations {CLOCK_SKEW_SECONDS:g} s after that")
    parser.add_argument("--unnamed-ttl", type=float, default=None, metavar="SECONDS", help="with --api: delete a "
                        "conversation no request named once it was last written this long ago (default "
                        f"{DEFAULT_UNNAMED_TTL_S:g}, a day), at start and then at the end of a reply (see "
                        "--unnamed-check-every)")
    parser.add_argument("--unnamed-max-bytes", type=int, default=None, metavar="N", help="with --api: then delete "
                        "the oldest conversations no request named while together they hold more than N bytes of "
                        f"the store (default {DEFAULT_UNNAMED_MAX_BYTES}, 1 GiB)")
    parser.add_argument("--unnamed-check-every", type=float, default=None, metavar="SECONDS", help="with --api: "
                        "after the check at start, check those two at the end of a reply only once this long passed "
                        f"since the last check (default {DEFAULT_UNNAMED_CHECK_EVERY_S:g}; each check reads every "
                        "manifest of the store)")
    parser.add_argument("--queue", type=int, default=None, help="with --api: requests that may wait while as many "
                        f"run as the cache holds conversations ({DESKTOP.sequences}); beyond them a request is "
                        f"answered 503 with Retry-After (default {DEFAULT_QUEUE})")


def check_flags(args: argparse.Namespace) -> None:
    """Refuse (FieldError naming the flag) an API flag without ``--api``, and a runtime flag with it."""
    if args.api:
        given = [flag for key, flag in RUNTIME_FLAGS.items() if getattr(args, key)]
        if given:
            raise FieldError(given[0], "no browser runtime flag with --api (the API server serves no page: run "
                             "another kvckpt serve for it)", getattr(args, given[0].lstrip("-")))
    else:
        given = [flag for key, flag in API_FLAGS.items() if getattr(args, key) is not None]
        if given:
            raise FieldError(given[0], "--api (it is a flag of the API server)",
                             getattr(args, given[0].lstrip("-").replace("-", "_")))


def _retention(args: argparse.Namespace) -> UnnamedRetention:
    """The policy for conversations nobody named that ``--unnamed-ttl``, ``--unnamed-max-bytes`` and
    ``--unnamed-check-every`` give; FieldError naming the flag."""
    given = {"ttl_s": args.unnamed_ttl, "max_bytes": args.unnamed_max_bytes,
             "check_every_s": args.unnamed_check_every}
    try:
        return UnnamedRetention(**{key: value for key, value in given.items() if value is not None})
    except FieldError as exc:
        flag = {"ttl_s": "--unnamed-ttl", "max_bytes": "--unnamed-max-bytes",
                "check_every_s": "--unnamed-check-every"}[exc.field]
        raise FieldError(flag, exc.expected, exc.got) from None


def _model_name(args: argparse.Namespace, path: Path) -> str:
    name = args.model_name if args.model_name is not None else path.name.removesuffix(".gguf")
    if not name or not name.isprintable() or any(c.isspace() for c in name) or len(name) > 256:
        raise FieldError("--model-name", "1 to 256 printable characters without spaces", name)
    return name


def _build(path: Path, store: str | None, name: str, config: "EngineConfig", context: int | None,
           lease: float | None) -> "Engine":
    """The engine of ``config`` (run on the engine's own thread): the device opened, the model loaded (``--context``
    ``context`` no more than its context), the store opened."""
    from ..engine import Engine
    from ..gpu.open import open_device
    from ..model.loader import load_model

    start = time.perf_counter()
    device = open_device()
    loaded = load_model(path, device)
    if context is not None:
        check_context(context, loaded.model.max_context)
    opened = (open_location(store, read_only=False, new=True, field="--store", lease_seconds=lease)
              if store is not None else None)
    engine = Engine(loaded, device, store=opened, model_name=name, config=config)
    print(f"model loaded in {time.perf_counter() - start:.2f} s", file=sys.stderr, flush=True)
    return engine


def _exposure(host: str, port: int) -> str:
    return (f"kvckpt serve: WARNING: listening on {host} port {port}, beyond this machine: anyone who can reach "
            "it over the network can run the model and read, resume and delete the conversations it keeps, with "
            "no authentication and no encryption (plain HTTP)")


def cmd_serve_api(args: argparse.Namespace) -> None:
    """Serve the API until Ctrl-C or SIGTERM; the reply being generated then stops, saved and resumable."""
    from ..server import hosts, worker
    from ..server.api import make_api_server
    from ..server.static import check_model_file

    config = engine_config(args, ("context", "max_tokens"))
    queue = DEFAULT_QUEUE if args.queue is None else check_int("--queue", args.queue, 0)
    path = check_model_file(args.model, "--model") if args.model is not None else default_model_path()
    name = _model_name(args, path)
    if args.lease is not None:
        check_lease_seconds("--lease", args.lease)
        if args.store is None or args.store.partition("://")[0].lower() not in OBJECT_SCHEMES:
            raise FieldError("--lease", "an object storage --store URL beside it (s3://bucket/prefix: the claims of a "
                             "directory store are locks, held until released)", args.lease)
    retention = _retention(args)
    if args.store is not None:
        check_store_target("--store", args.store)
    address = hosts.bind_address(args.host, args.port, args.allow_remote, field="--host", consent="--allow-remote")
    print(f"loading model {path} ...", file=sys.stderr, flush=True)
    engine = worker.EngineWorker(lambda: _build(path, args.store, name, config, args.context, args.lease),
                                 queue=queue)
    try:
        server = make_api_server(engine, host=args.host, port=args.port, allow_remote=args.allow_remote,
                                 retention=retention)
        announce = f"kvckpt_web OpenAI-compatible API on {server.url}v1 (model {name!r}, Ctrl-C to stop)"
        serve_until_interrupted(server, address, lambda: print(announce, flush=True),
                                exposure=lambda port: _exposure(args.host, port))
    finally:
        engine.close()

