"""``kvckpt bench generate``: the llama runner on the embedded model, and resume against re-prefill.

Greedy decode after a short context, the prefill of a 1024-token context, greedy decode after it, then that
context's checkpoint saved to a FileStore and restored (restore with every chunk's SHA-256 checked + import into
the cache, a fresh FileStore object per round as a new process has), the same reads and import without the
SHA-256 check, and the SHA-256 of the checkpoint's bytes alone: what verification costs. Resume is set against
the prefill of the same context measured in this run. Every row ends with the load average it ran at. Peers
(llama.cpp) are measured by ``bench/peers.py`` (``make bench-peers``) in the same run as this project, or not
quoted at all. :class:`GenerationRunner` is what both time.
"""

from __future__ import annotations

import asyncio
import hashlib
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..durable.catalog import load_manifest
from ..durable.restore import restore
from ..durable.save import save
from ..gpu.device import Device
from ..gpu.open import open_device
from ..model.loader import default_model_path, load_model
from ..model.caches import new_cache
from ..model.protocol import LoadedModel, choose
from ..model.sampler import Sampler, SamplingSettings
from ..stores.file import FileStore
from .rows import Probe, cpu_flags, load_average, vector_width

CONTEXT = 1024
DECODE_TOKENS = 32
PREFILL_CHUNK = 512
"""Tokens per forward of a prefill (the session's default)."""
TEXT = ("The lighthouse keeper climbed the stairs every evening, counted the ships on the horizon, and wrote "
        "their names in a book that nobody else would ever read. ")
CHECKPOINT = "context"
"""Name the benchmarked context is saved under."""


@dataclass(frozen=True)
class Timing:
    """Wall seconds and the CPU seconds this process used meanwhile (all its threads: the adapter's too, where
    it computes on the CPU), or a point in time to measure from."""

    seconds: float
    cpu: float

    @classmethod
    def now(cls) -> "Timing":
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return cls(time.perf_counter(), usage.ru_utime + usage.ru_stime)

    def until_now(self) -> "Timing":
        """The time from this point until now."""
        now = Timing.now()
        return Timing(now.seconds - self.seconds, now.cpu - self.cpu)


class GenerationRunner:
    """The model on a device with a cache of three sequences: 0 generates, 1 is the checkpoint's, restored."""

    GENERATE, RESTORED = 0, 1

    def __init__(self, loaded: LoadedModel, device: Device, context: int = CONTEXT,
                 decode_tokens: int = DECODE_TOKENS) -> None:
        self.loaded = loaded
        self.model = loaded.model
        self.device = device
        self.context = loaded.text.tokenizer.encode(TEXT * (4 * context // len(TEXT.split()) + 1))[:context]
        self.cache = new_cache(self.model, device, max_tokens=context + decode_tokens + 1,
                               prefill_chunk=PREFILL_CHUNK, num_seqs=3)
        self.probe = Probe(device)

    @classmethod
    def open(cls, device: Device | None = None, **options: int) -> "GenerationRunner":
        """The default model loaded on ``device`` (the default adapter if None)."""
        device = device or open_device()
        return cls(load_model(default_model_path(), device), device, **options)

    def close(self) -> None:
        self.cache.close()
        self.probe.close()

    async def prefill(self, tokens: list[int], seq_id: int = GENERATE) -> tuple[Timing, int]:
        """The time to run ``tokens`` as a fresh sequence ``seq_id`` and pick the next token; and that token."""
        if seq_id in self.cache.sequence_ids():
            self.cache.remove_sequence(seq_id)
        self.cache.add_sequence(seq_id)
        start = Timing.now()
        token = await (await self.model.forward(self.cache, seq_id, tokens)).argmax()
        return start.until_now(), token

    async def decode(self, token: int, steps: int) -> Timing:
        """The time of ``steps`` greedy decode steps of sequence 0 from ``token``."""
        start = Timing.now()
        for _ in range(steps):
            token = await (await self.model.forward(self.cache, self.GENERATE, [token])).argmax()
        return start.until_now()

    async def decode_sampled(self, token: int, steps: int) -> Timing:
        """The time of ``steps`` decode steps of sequence 0 from ``token`` after the short context, each token drawn
        at OpenAI's default temperature 1 with top_p 0.9, no top_k (seed 7)."""
        sampler = Sampler(SamplingSettings(temperature=1.0, top_p=0.9, seed=7))
        tokens = list(self.context[:8]) + [token]
        start = Timing.now()
        for _ in range(steps):
            token = await choose(await self.model.forward(self.cache, self.GENERATE, [token]), sampler, tokens,
                                 tokens[9:])
            tokens.append(token)
        return start.until_now()

    async def save_context(self, root: Path) -> int:
        """Prefill the context as sequence 1, save it as :data:`CHECKPOINT` in a FileStore at ``root`` and drop
        the sequence; the bytes written."""
        await self.prefill(self.context, self.RESTORED)
        saved = await save(self.cache, self.RESTORED, FileStore(root), CHECKPOINT)
        self.cache.remove_sequence(self.RESTORED)
        return saved.bytes_written

    async def restore(self, root: Path) -> float:
        """Seconds of a restore of the checkpoint (every chunk's SHA-256 checked) and its import, until the
        device is done; the restored sequence is dropped after."""
        start = time.perf_counter()
        await restore(FileStore(root), CHECKPOINT, self.cache)
        await self.probe.sync()
        seconds = time.perf_counter() - start
        self.cache.remove_sequence(self.RESTORED)
        return seconds

    async def import_unverified(self, root: Path) -> float:
        """Seconds of :meth:`restore` without the SHA-256 check: the manifest, the same chunk reads into the
        same host buffer and the same import."""
        start = time.perf_counter()
        store = FileStore(root)
        manifest, _ = await load_manifest(store, CHECKPOINT)
        groups = self.cache.host_groups(manifest.num_logical_pages)
        pb = manifest.page_bytes
        await asyncio.gather(*(store.get_into(ref.key, groups[ref.group][ref.first_page * pb:
                                                                         ref.first_page * pb + ref.nbytes])
                               for ref in manifest.chunk_refs()))
        self.cache.prepare_import(self.RESTORED, manifest.tvm_metadata, exclusive=False)
        await self.cache.import_groups(self.RESTORED, groups)
        self.cache.finish_import(self.RESTORED)
        await self.probe.sync()
        seconds = time.perf_counter() - start
        self.cache.remove_sequence(self.RESTORED)
        return seconds

    async def hash_checkpoint(self, root: Path) -> float:
        """Seconds of the SHA-256 of the checkpoint's chunks alone, on one thread, read into memory first."""
        store = FileStore(root)
        manifest, _ = await load_manifest(store, CHECKPOINT)
        chunks = [await store.get(ref.key) for ref in manifest.chunk_refs()]
        start = time.perf_counter()
        for chunk in chunks:
            hashlib.sha256(chunk).digest()
        return time.perf_counter() - start


def spread(values: list[float], scale: float = 1.0, digits: int = 1) -> str:
    """``median (min-max)`` of ``values`` times ``scale``."""
    v = [x * scale for x in values]
    return f"{statistics.median(v):.{digits}f} ({min(v):.{digits}f}-{max(v):.{digits}f})"


async def bench_generate(device: Device | None = None, repeats: int = 5, paths: tuple[str, ...] = (),
                         echo: Callable[[str], None] = print) -> list[str]:
    """Run the benchmark (``repeats`` rounds after a warm-up one) and print its rows; the printed lines."""
    lines: list[str] = []

    def out(line: str) -> None:
        lines.append(line)
        echo(line)

    start = time.perf_counter()
    runner = GenerationRunner.open(device)
    dev = runner.device
    out(f"model {default_model_path().name}: loaded and uploaded in {time.perf_counter() - start:.1f} s "
        f"on {dev.info.adapter} ({dev.info.backend}), CPU {vector_width(cpu_flags(), dev.info.adapter)}; medians "
        f"(ranges) of {repeats} rounds\n")
    out("| what | tokens | median (range) | load average |\n|---|---|---|---|")
    try:
        with tempfile.TemporaryDirectory(prefix="kvckpt-bench-generate-") as folder:
            root = Path(folder)
            nbytes = await runner.save_context(root)
            rows: dict[str, list[float]] = {k: [] for k in ("short", "sampled", "prefill", "long", "restore",
                                                              "unverified", "hash", "load")}
            for round_ in range(repeats + 1):  # round 0 warms up (compiles every pipeline)
                load = load_average()
                short = sampled = 0.0
                for greedy in (True, False) if round_ % 2 else (False, True):  # which goes first alternates
                    _, token = await runner.prefill(runner.context[:8])
                    if greedy:
                        short = (await runner.decode(token, DECODE_TOKENS)).seconds
                    else:
                        sampled = (await runner.decode_sampled(token, DECODE_TOKENS)).seconds
                timing, token = await runner.prefill(runner.context)
                prefill = timing.seconds
                long = (await runner.decode(token, DECODE_TOKENS)).seconds
                restored = await runner.restore(root)
                unverified = await runner.import_unverified(root)
                hashed = await runner.hash_checkpoint(root)
                if round_:
                    for key, value in (("short", short), ("sampled", sampled), ("prefill", prefill), ("long", long),
                                       ("restore", restored), ("unverified", unverified), ("hash", hashed),
                                       ("load", load)):
                        rows[key].append(value)
        load = f"{min(rows['load']):.1f}-{max(rows['load']):.1f}"
        rate = lambda n, key: [n / s for s in rows[key]]  # noqa: E731
        context = len(runner.context)
        out(f"| decode (greedy) after 9 tokens of context, tokens/s | {DECODE_TOKENS} | "
            f"{spread(rate(DECODE_TOKENS, 'short'))} | {load} |")
        out(f"| decode (temperature 1, top_p 0.9, no top_k, seeded) after 9 tokens of context, tokens/s | "
            f"{DECODE_TOKENS} | {spread(rate(DECODE_TOKENS, 'sampled'))} | {load} |")
        out(f"| prefill of a {context}-token context, tokens/s | {context} | {spread(rate(context, 'prefill'))} | "
            f"{load} |")
        out(f"| decode (greedy) after the {context}-token context, tokens/s | {DECODE_TOKENS} | "
            f"{spread(rate(DECODE_TOKENS, 'long'))} | {load} |")
        out(f"| restore (every chunk's SHA-256 checked) + import, ms | {context}, {nbytes / 1e6:.1f} MB | "
            f"{spread(rows['restore'], 1e3)} | {load} |")
        out(f"| the same reads + import without the SHA-256 check, ms | {context} | "
            f"{spread(rows['unverified'], 1e3)} | {load} |")
        out(f"| SHA-256 of the checkpoint's chunks alone, one thread, ms | {context} | {spread(rows['hash'], 1e3)} | "
            f"{load} |")
        ratios = [g / s for g, s in zip(rows["short"], rows["sampled"])]
        out(f"\nsampled vs greedy decode after 9 tokens, same rounds: {spread(ratios, digits=2)}x greedy's tokens/s")
        ratios = [p / r for p, r in zip(rows["prefill"], rows["restore"])]
        out(f"\nresume vs re-prefill of the same {context}-token context, same rounds: {spread(ratios, digits=0)}x "
            "faster")
    finally:
        runner.close()
    return lines
