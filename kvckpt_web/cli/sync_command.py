"""``kvckpt sync SRC DST``: conversations copied between two stores (directories, object storage, served stores),
moving only the chunks DST lacks, manifests after their chunks and prefix index records after their manifests."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from ..durable.keys import parse_manifest_key
from ..durable.locations import open_location
from ..durable.sync import sync
from ..errors import FieldError
from .store_commands import check_store_target, mib, progress_printer


def cmd_sync(args: argparse.Namespace) -> int:
    """Sync; exit status 1 (each conflict one line on stderr) if a name was not copied. A name whose copy went
    apart from DST's is copied beside it under a name of its own, said in one line on stdout."""
    if args.src == args.dst:
        raise FieldError("DST", f"a store apart from SRC {args.src}", args.dst)
    source = open_location(args.src, read_only=True, field="SRC")
    check_store_target("DST", args.dst)
    target = open_location(args.dst, read_only=False, new=True, field="DST")
    result = asyncio.run(sync(source, target, names=args.name, progress=progress_printer()))
    for key in result.copied:
        print(f"copied {key}")
    for key in result.up_to_date:
        print(f"up to date {key}")
    for name, kept in result.kept_apart.items():
        generation = next(g for n, g in map(parse_manifest_key, result.copied + result.up_to_date) if n == kept)
        print(f"kept {name} as {kept} (generation {generation}) in {args.dst}: it went apart from the {name} there, "
              "which stays as it was")
    print(f"synced {args.src} -> {args.dst}: {len(result.copied)} generations copied, {len(result.up_to_date)} "
          f"up to date; {result.chunks_sent} chunks sent, {result.chunks_present} already there, "
          f"{result.records_sent} prefix index records; {result.bytes_sent} bytes ({mib(result.bytes_sent)}) "
          f"moved in {result.seconds:.2f} s")
    for conflict in result.conflicts:
        print(f"kvckpt: error: sync: {conflict}", file=sys.stderr)
    return 1 if result.conflicts else 0


def add_parsers(sub: Any) -> None:
    """Add ``sync`` to the ``kvckpt`` subcommands."""
    p = sub.add_parser("sync", help="copy the newest generation of conversations from one store to another "
                       "(directories or URLs: s3://bucket/prefix, http://host:port/ of kvckpt serve --store), "
                       "moving only missing chunks; a rerun after a crash moves only what is still missing; "
                       "nothing is overwritten: a copy that went apart from DST's is kept beside it as NAME.apart-ID")
    p.add_argument("src", help="the store to copy from (a directory or a URL)")
    p.add_argument("dst", help="the store to copy into (a directory, made if missing, or a URL)")
    p.add_argument("--name", action="append", help="copy only this conversation (repeatable; default: all)")
    p.set_defaults(func=cmd_sync)
