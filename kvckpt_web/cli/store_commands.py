"""The store commands of ``kvckpt``: inspect and verify a checkpoint store, gc, and convert to and from it.

A store here is a :class:`~kvckpt_web.stores.file.FileStore` directory or a store URL (object storage such as
``s3://bucket/prefix``, or a store ``kvckpt serve --store`` serves): :func:`~kvckpt_web.durable.locations.open_location`
opens either. Long operations report progress on stderr (after the first second, then about once a second).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..checks import check_int
from ..durable.catalog import list_generations, list_names, load_manifest, manifest_keys
from ..durable.container import Manifest
from ..durable.keys import CHUNKS, STORE_TOPS, validate_name
from ..durable.locations import is_url, open_location
from ..durable.prefix_index import count_records
from ..durable.restore import restore
from ..durable.results import Progress
from ..durable.retention import gc
from ..durable.save import save
from ..durable.tvm_export import METADATA_FILE, check_replaceable, read_tvm_export, write_tvm_export
from ..durable.verify import verify
from ..errors import ConflictError, FieldError, FormatError, KVCkptError, NotFoundError
from ..gpu.open import open_device
from ..kv.cache import PagedKVCache
from ..generation.conversation import check_owner, conversation_of
from ..stores.base import Store
from ..stores.file import FileStore
from ..tvm.metadata import layout_from_metadata, parse_metadata


def check_at_least(field: str, value: int, minimum: int) -> int:
    """``value`` if it is an integer >= ``minimum``, else :class:`FieldError` naming the option ``field``."""
    return check_int(field, value, minimum)


def check_context(value: int, max_context: int) -> int:
    """``--context`` ``value`` if the loaded model, of ``max_context`` tokens, can hold it: FieldError naming the
    flag and the model's context if not (never clamped silently)."""
    if value > max_context:
        raise FieldError("--context", f"at most {max_context} tokens (the model's context)", value)
    return value


def check_path(flag: str, path: str) -> str:
    """``path`` unless it is '' (which the file system takes for the current directory): FieldError naming
    ``flag``."""
    if not path:
        raise FieldError(flag, "a path", path, "'' would be the current directory")
    return path


def check_store_target(flag: str, path: str) -> None:
    """Refuse, before any work, a store directory ``flag`` names to write into unless it is a new path, an empty
    directory or a checkpoint store that this process may write: not '' (the current directory), a file, a
    directory of other files (a user's, a TVM export), or a read-only one. A store URL is refused only if it
    cannot be opened (its storage answers at the first write)."""
    if is_url(check_path(flag, path)):
        open_location(path, read_only=False, field=flag)
        return
    FileStore.check_directory(path, STORE_TOPS, new=True)
    existing = target = Path(path).absolute()
    while not os.path.lexists(existing):  # a new store is made in its nearest existing parent
        existing = existing.parent
    tops = [target / top for top in STORE_TOPS if (target / top).is_dir()]
    effective = os.access in os.supports_effective_ids
    for where in (existing, *tops):
        if not os.access(where, os.W_OK | os.X_OK, effective_ids=effective):
            raise FieldError(flag, "a directory this process may write into", path, f"{where} is read-only here")


def is_store(path: str | Path) -> bool:
    """Whether ``path`` is a checkpoint store directory (see :meth:`FileStore.check_directory`)."""
    try:
        FileStore.check_directory(path, STORE_TOPS)
    except FormatError:
        return False
    return True


def source_kind(path: str | Path) -> str:
    """``"store"`` or ``"tvm"``: what the checkpoint at ``path`` is (a TVM export directory is recognised by its
    metadata.json, and its reader says what else is wrong); FormatError naming the path if it is neither. A store
    URL is a store."""
    if is_url(str(path)):
        return "store"
    try:
        FileStore.check_directory(path, STORE_TOPS)
    except FormatError as exc:
        if os.path.lexists(Path(path) / METADATA_FILE):
            return "tvm"
        raise FormatError(exc.field, f"a TVM export directory ({METADATA_FILE}, group_<i>.bin) or {exc.expected}",
                          exc.got) from None
    return "store"


def _open_store(path: str | Path, *, read_only: bool) -> Store:
    """The store at ``path`` (a directory or a URL); FormatError naming a directory and what it holds if it is no
    checkpoint store."""
    return open_location(str(path), read_only=read_only)


def progress_printer(stream: Any = None, delay: float = 1.0, every: float = 1.0) -> Progress:
    """A progress callback writing ``phase: done/total`` lines to stderr, only for operations that last."""
    stream = stream or sys.stderr
    start = time.monotonic()
    state = {"last": 0.0, "shown": False}

    def show(phase: str, done: int, total: int) -> None:
        now = time.monotonic()
        final = done >= total
        if now - start < delay or (now - state["last"] < every and not (final and state["shown"])):
            return
        state["last"], state["shown"] = now, True
        print(f"{phase}: {done}/{total}", file=stream, flush=True)

    return show


def _when(ms: int | None) -> str:
    if ms is None:
        return "?"
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def mib(n: int) -> str:
    """``n`` bytes for people: B, KiB, MiB or GiB."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


async def describe_store(path: str | Path) -> dict[str, Any]:
    """Names, generations, sizes and chunk sharing of the store at ``path`` (JSON-ready)."""
    store = _open_store(path, read_only=True)
    gens = await list_generations(store)
    users: dict[str, set[str]] = {}
    sizes: dict[str, int] = {}
    for info in gens:
        for key, nbytes in zip(info.chunk_keys, info.chunk_nbytes):
            users.setdefault(key, set()).add(info.key)
            sizes[key] = nbytes
    listed = await store.list_prefix(CHUNKS)
    unreferenced = [k for k in listed if k not in users]
    names: dict[str, list[dict[str, Any]]] = {}
    for info in gens:
        keys = set(info.chunk_keys)
        shared = {k for k in keys if len(users[k]) > 1}
        entry: dict[str, Any] = {"generation": info.generation, "key": info.key, "manifest_bytes": info.manifest_bytes}
        if info.error is not None:
            entry["error"] = info.error
        else:
            entry.update({
                "created_ms": info.created_ms, "created": _when(info.created_ms), "seq_id": info.seq_id,
                "seq_length": info.seq_length, "num_groups": info.num_groups,
                "num_logical_pages": info.num_logical_pages, "pages_per_chunk": info.pages_per_chunk,
                "nbytes": info.nbytes, "num_chunks": len(info.chunk_keys), "distinct_chunks": len(keys),
                "shared_chunks": len(shared), "shared_nbytes": sum(sizes.get(k, 0) for k in shared),
                "own_nbytes": sum(sizes.get(k, 0) for k in keys - shared), "app_state": info.app_state,
            })
        names.setdefault(info.name, []).append(entry)
    referenced_bytes = sum(sizes.get(k, 0) for k in users)
    logical = sum(info.nbytes for info in gens if info.error is None)
    return {
        "kind": "kvckpt-store", "path": str(path) if is_url(str(path)) else str(Path(path)), "names": names,
        "manifests": len(gens), "damaged_manifests": [i.key for i in gens if i.error is not None],
        "chunks": {"stored": len(listed), "referenced": len(users), "referenced_nbytes": referenced_bytes,
                   "logical_nbytes": logical, "unreferenced": len(unreferenced)},
        "prefix_records": await count_records(store),
    }


def cmd_inspect_store(args: argparse.Namespace) -> int:
    """Print the summary of a store; exit status 1 if a manifest is damaged."""
    info = asyncio.run(describe_store(args.path))
    status = 1 if info["damaged_manifests"] else 0
    if args.json:
        print(json.dumps(info, indent=2))
        return status
    chunks = info["chunks"]
    print(f"kvckpt store {info['path']}: {len(info['names'])} names, {info['manifests']} manifests, "
          f"{chunks['stored']} chunks")
    for name, entries in info["names"].items():
        print(f"  {name}:")
        for e in reversed(entries):
            if "error" in e:
                print(f"    generation {e['generation']}: DAMAGED: {e['error']}")
                continue
            print(f"    generation {e['generation']} ({e['created']}): seq {e['seq_id']}, {e['seq_length']} tokens, "
                  f"{e['num_logical_pages']} pages x {e['num_groups']} groups = {mib(e['nbytes'])} in "
                  f"{e['num_chunks']} chunks of {e['pages_per_chunk']} pages; {e['shared_chunks']} chunks "
                  f"({mib(e['shared_nbytes'])}) shared with other manifests, {mib(e['own_nbytes'])} its own")
    saved = chunks["logical_nbytes"] - chunks["referenced_nbytes"]
    print(f"  data: {mib(chunks['logical_nbytes'])} in all checkpoints, {mib(chunks['referenced_nbytes'])} stored "
          f"({mib(saved)} saved by sharing); {chunks['unreferenced']} unreferenced chunks (kvckpt gc removes them)")
    records = info["prefix_records"]
    if records["records"] or records["other_keys"]:
        print(f"  prefix index: {records['records']} records in {records['scopes']} scopes, "
              f"{records['without_checkpoint']} of them of checkpoints no longer stored (kvckpt gc removes them)"
              + (f"; {records['other_keys']} other keys under prefixes/" if records["other_keys"] else ""))
    if info["damaged_manifests"]:
        print(f"  damaged manifests: {', '.join(info['damaged_manifests'])} (run kvckpt verify)")
    return status


def cmd_verify(args: argparse.Namespace) -> int:
    if args.name is not None:
        validate_name(args.name)
    store = _open_store(args.store, read_only=True)
    device = None if args.no_load else open_device()
    report = asyncio.run(verify(store, name=args.name, device=device, progress=progress_printer()))
    print(f"checked {len(report.manifests_checked)} manifests, {report.chunks_checked} chunks "
          f"({mib(report.bytes_checked)} re-hashed)"
          + ("" if args.no_load else f", {len(report.loaded)} checkpoints loaded into a GPU cache and read back"))
    if report.unreferenced_chunks:
        print(f"{len(report.unreferenced_chunks)} unreferenced chunks (not an error; kvckpt gc removes them)")
    for warning in report.warnings:
        print(f"warning: {warning}")
    if not report.manifests_checked and args.name is not None:
        report.problems.append(f"no checkpoint named {args.name!r} in {args.store}")
    for problem in report.problems:
        print(f"PROBLEM: {problem}")
    print("intact" if report.ok else f"DAMAGED: {len(report.problems)} problems")
    return 0 if report.ok else 1


def cmd_gc(args: argparse.Namespace) -> int:
    keep = None if check_at_least("--keep", args.keep, 0) == 0 else args.keep
    for name in args.name or ():
        validate_name(name)
    store = _open_store(args.store, read_only=False)
    missing = sorted(set(args.name or ()) - set(asyncio.run(list_names(store))))
    if missing:
        raise NotFoundError(f"{args.store}: no checkpoint named {', '.join(map(repr, missing))} (--name)")
    result = asyncio.run(gc(store, keep=keep, names=args.name, progress=progress_printer()))
    print(f"kept {len(result.kept_manifests)} manifests, deleted {len(result.deleted_manifests)} manifests and "
          f"{result.deleted_chunks} unreferenced chunks ({mib(result.freed_bytes)})")
    if result.deleted_records:
        print(f"deleted {result.deleted_records} prefix index records of checkpoints no longer stored")
    for key, why in result.kept_reasons.items():
        print(f"  kept {key}: {why}")
    if result.damaged_manifests:
        print(f"no chunk deleted: cannot tell which chunks these damaged manifests use: "
              f"{', '.join(result.damaged_manifests)}", file=sys.stderr)
        return 1
    return 0


async def _source_manifest(src: str, name: str | None, generation: int | None) -> tuple[Store, Manifest] | None:
    """The store SRC and the manifest of its checkpoint to convert (``name``: needed if it holds several); None for
    a TVM export directory (FormatError naming SRC if it is neither)."""
    if source_kind(src) == "tvm":
        if generation is not None:
            raise FieldError("--generation", "a store as SRC (a TVM export directory has one checkpoint)", src)
        return None
    store = _open_store(src, read_only=True)
    if name is None:
        names = await list_names(store)
        if len(names) != 1:
            raise NotFoundError(f"{src}: pass --name, the store holds {len(names)} names {names}")
        name = names[0]
    manifest, _ = await load_manifest(store, name, generation)
    return store, manifest


async def _load_source(src: str, source: tuple[Store, Manifest] | None, device: Any) -> tuple[Any, int]:
    """Load SRC (a TVM export directory, or ``source``: a store's checkpoint) into a new GPU cache: (cache,
    seq_id)."""
    if source is None:
        export = read_tvm_export(src)
        seq_id = export.metadata.get("seq_id")
        cache = PagedKVCache.from_metadata(device, export.metadata_json)
        await cache.load_checkpoint(export.metadata_json, export.groups, seq_id=seq_id)
        return cache, seq_id
    store, manifest = source
    cache = PagedKVCache.from_metadata(device, manifest.tvm_metadata)
    try:
        result = await restore(store, manifest.name, cache, generation=manifest.generation,
                               progress=progress_printer())
    except BaseException:
        cache.close()
        raise
    return cache, result.seq_id


def check_convert(src: str, dst: str, to: str, *, name: str | None = None, generation: int | None = None,
                  force: bool = False, keep: int | None = None) -> None:
    """Refuse, before any work, arguments :func:`convert` cannot use and a DST it must not touch: SRC itself
    (also through a symbolic link) or a path inside or around it, an existing path without ``force``, and
    anything but a TVM export directory (``to="tvm"``) or a store (``to="kvckpt"``) or a new or empty
    directory."""
    if name is not None:
        validate_name(name)
    if generation is not None:
        check_at_least("--generation", generation, 1)
    if keep is not None:
        check_at_least("--keep", keep, 1)
    if is_url(src) or is_url(dst):
        if src.rstrip("/") == dst.rstrip("/"):
            raise FieldError("DST", f"a store apart from SRC {src}", dst)
    else:
        source, target = Path(src).resolve(), Path(dst).resolve()
        same = target == source or (os.path.exists(src) and os.path.exists(dst) and os.path.samefile(src, dst))
        if same or target in source.parents or source in target.parents:
            raise FieldError("DST", f"a path apart from SRC {src} (not it, not inside it, not holding it)", dst)
    if to == "kvckpt":
        if is_url(dst):
            open_location(dst, read_only=False, field="DST")
        else:
            FileStore.check_directory(dst, STORE_TOPS, new=True)
        return
    if is_url(dst):
        raise FieldError("DST", "a TVM export directory to write (a path, not a store URL)", dst)
    if os.path.lexists(dst) and not force:
        raise FieldError(dst, "a path that does not exist yet (replace it with --force)", "existing")
    check_replaceable(dst)


async def convert(src: str, dst: str, to: str, *, name: str | None = None, generation: int | None = None,
                  force: bool = False, keep: int | None = None) -> dict[str, Any]:
    """Convert between TVM export directories and stores through a GPU cache (see ``kvckpt convert --help``).

    Arguments are checked (:func:`check_convert`) before the GPU is touched. Into a store, the checkpoint
    becomes the next generation of its name, written under the name's claim, and only ``keep`` (default
    None: no retention) drops older ones; a name that holds another conversation (a TVM export is a new
    one) or that another writer holds is refused before the GPU is touched (ConflictError naming --name). If
    the conversion fails, what it wrote into a store directory DST it created is removed, and DST too unless
    another process stored a checkpoint there meanwhile (which stays).
    """
    check_convert(src, dst, to, name=name, generation=generation, force=force, keep=keep)
    source = await _source_manifest(src, name, generation)
    if to == "tvm":
        if source is not None:  # before the GPU is touched
            layout_from_metadata(parse_metadata(source[1].tvm_metadata)).check_tvm_checkpointable()
        cache, seq_id = await _load_source(src, source, open_device())
        try:
            groups = await cache.export_groups(seq_id)
            write_tvm_export(dst, cache.get_checkpoint_metadata(seq_id), groups, overwrite=force)
            return {"seq_length": cache.get_sequence_length(seq_id), "groups": len(groups), "to": "tvm"}
        finally:
            cache.close()
    target_name = name or (source[1].name if source is not None else "seq0")
    app_state = source[1].app_state if source is not None else {}
    created = not is_url(dst) and not os.path.lexists(dst)
    store = open_location(dst, read_only=False, new=True, field="DST")
    async with store.claim(target_name):
        before = {key for _, _, key in await manifest_keys(store, target_name)}
        try:
            try:
                await check_owner(store, target_name, conversation_of(app_state))
            except ConflictError as exc:
                new = " (a TVM export is a new conversation)" if source is None else ""
                raise ConflictError(f"--name: {exc}{new}") from None
            cache, seq_id = await _load_source(src, source, open_device())
            try:
                result = await save(cache, seq_id, store, target_name, app_state=app_state, keep=keep,
                                    progress=progress_printer())
                groups = cache.layout.num_layers
            finally:
                cache.close()
        except BaseException:
            if created:
                with contextlib.suppress(KVCkptError):  # the error to report is the conversion's
                    await _remove_written(store, dst, target_name, before)
            raise
    return {"seq_length": result.seq_length, "groups": groups, "to": "kvckpt",
            "name": target_name, "generation": result.generation, "chunks_written": result.chunks_written}


async def _remove_written(store: Store, dst: str, name: str, before: set[str]) -> None:
    """Remove what a failed convert wrote into the store directory ``dst`` it created, holding ``name``'s claim
    (so no one else committed a generation of ``name`` since the manifest keys ``before`` were listed): the
    generations of ``name`` it committed, then the chunks and records no manifest uses; and the directory,
    only if it then holds no key. Whatever another process committed there meanwhile stays."""
    async with store.lock():
        async with store.batch():
            for _, _, key in await manifest_keys(store, name):
                if key not in before:
                    await store.delete(key)
    await gc(store, keep=None)
    async with store.lock():
        if not await store.list_prefix(""):
            shutil.rmtree(dst, ignore_errors=True)


def cmd_convert(args: argparse.Namespace) -> None:
    result = asyncio.run(convert(args.src, args.dst, args.to, name=args.name, generation=args.generation,
                                 force=args.force, keep=args.keep))
    where = (f" as {result['name']!r} generation {result['generation']} ({result['chunks_written']} chunks written)"
             if result["to"] == "kvckpt" else "")
    print(f"converted {args.src} -> {args.dst} ({result['to']}){where}: {result['seq_length']} tokens, "
          f"{result['groups']} page groups loaded into a GPU cache and exported again")


def add_parsers(sub: Any) -> None:
    """Add ``verify`` and ``gc`` to the ``kvckpt`` subcommands."""
    p = sub.add_parser("verify", help="re-hash every chunk of a store and load its checkpoints into a GPU cache; "
                       "exit 0 only if all is intact")
    p.add_argument("store")
    p.add_argument("--name", help="check only this sequence name (and its chunks)")
    p.add_argument("--no-load", action="store_true", help="only re-hash, do not load into a GPU cache")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("gc", help="keep the newest generations of each name and delete unreferenced chunks")
    p.add_argument("store")
    p.add_argument("--keep", type=int, default=2, help="generations to keep per name (default 2; 0 keeps all)")
    p.add_argument("--name", action="append", help="apply --keep only to this name (repeatable)")
    p.set_defaults(func=cmd_gc)

