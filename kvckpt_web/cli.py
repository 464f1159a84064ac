"""The ``kvckpt`` command line: demo, inspect, convert, bench."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from .errors import KVCkptError


def _describe_tvm_export(path: Path) -> dict[str, Any]:
    from .layout import KVLayout
    from .metadata import limits_from_metadata, validate_import
    from .tvm_export import read_tvm_export

    export = read_tvm_export(path)
    meta = export.metadata
    layout = KVLayout.from_metadata(meta)
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


def cmd_inspect(args: argparse.Namespace) -> None:
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


async def _convert_to_tvm(src: Path, dst: Path, force: bool) -> dict[str, Any]:
    from .cache import PagedKVCache
    from .device import open_device
    from .tvm_export import read_tvm_export, write_tvm_export

    export = read_tvm_export(src)
    seq_id = export.metadata.get("seq_id")
    cache = PagedKVCache.from_metadata(open_device(), export.metadata_json)
    await cache.load_checkpoint(export.metadata_json, export.groups, seq_id=seq_id)
    metadata = cache.get_checkpoint_metadata(seq_id)
    groups = await cache.export_groups(seq_id)
    write_tvm_export(dst, metadata, groups, overwrite=force)
    return {"seq_length": cache.get_sequence_length(seq_id), "groups": len(groups)}


def cmd_convert(args: argparse.Namespace) -> None:
    result = asyncio.run(_convert_to_tvm(Path(args.src), Path(args.dst), args.force))
    print(f"converted {args.src} -> {args.dst} (tvm): {result['seq_length']} tokens, {result['groups']} page groups "
          "loaded into a GPU cache and exported again")


def cmd_demo(args: argparse.Namespace) -> None:
    from .demo import run_demo

    run_demo(args.tokens, args.seed, Path(args.dir) if args.dir else None)


def cmd_bench(args: argparse.Namespace) -> None:
    from .bench import run

    paths = ("kernel", "copy") if args.path == "both" else (args.path,)
    run(args.names, args.repeats, paths)


def cmd_demo_worker(args: argparse.Namespace) -> None:
    from .demo import worker_main

    worker_main("fill" if args.command == "_demo-worker" else "verify", args.path, args.tokens, args.seed)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``kvckpt``."""
    parser = argparse.ArgumentParser(prog="kvckpt", description="Crash-resumable, TVM-compatible KV cache checkpoints "
                                     "on WebGPU.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="fill a SmolLM2-layout cache in a worker, export, SIGKILL it, restore and verify")
    p.add_argument("--tokens", type=int, default=3000, help="tokens to fill (default 3000)")
    p.add_argument("--seed", type=int, default=0, help="seed of the K/V values (default 0)")
    p.add_argument("--dir", help="where to write the TVM export directory (default: a temporary directory)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("inspect", help="summarise and validate a TVM export directory")
    p.add_argument("path")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("convert", help="load a checkpoint into a GPU cache and export it again")
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--to", choices=["tvm"], required=True, help="output format")
    p.add_argument("--force", action="store_true", help="replace DST if it exists")
    p.set_defaults(func=cmd_convert)

    p = sub.add_parser("bench", help="throughput vs raw transfers of the same bytes, measured in the same run")
    p.add_argument("names", nargs="*", default=["export"], choices=["export"], help="benchmarks to run")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--path", choices=["auto", "kernel", "copy", "both"], default="both",
                   help="page-transfer path(s) to measure (default: both)")
    p.set_defaults(func=cmd_bench)

    for name in ("_demo-worker", "_demo-verify"):
        p = sub.add_parser(name)
        p.add_argument("path")
        p.add_argument("tokens", type=int)
        p.add_argument("seed", type=int)
        p.set_defaults(func=cmd_demo_worker)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``kvckpt``; returns the exit status (1 with a one-line error for any checkpoint error)."""
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except KVCkptError as exc:
        print(f"kvckpt: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
