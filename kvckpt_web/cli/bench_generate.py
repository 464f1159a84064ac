"""``kvckpt bench generate``: the llama runner on the embedded model, and resume against re-prefill.

Prefill of a 1024-token context (tokens/s), greedy decode after it (tokens/s), then that context's
checkpoint saved to a FileStore and restored (restore + import into the cache, a fresh FileStore
object per round as a new process has) against the prefill of the same context measured in this
run: the ratio is what resuming saves. The restore is also set against llama.cpp's ``load_state``
of the same context on this machine class (a 23.6 MB state, as this cache's K/V is).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ..durable.restore import restore
from ..durable.save import save
from ..gpu.device import Copy, Device, Usage
from ..gpu.open import open_device
from ..model.loader import default_model_path, load_model
from ..model.generator import new_cache
from ..stores.file import FileStore

CONTEXT = 1024
DECODE_TOKENS = 32
RESUME_TARGET = 100
"""Resume must be at least this many times faster than re-prefilling the context."""
LLAMA_CPP_LOAD_STATE_S = 0.54
"""llama.cpp (llama-cpp-python 0.3.36, CPU, 2 threads) ``load_state`` of this model's 1024-token state here."""
RESTORE_TARGET = 0.1
"""Restore must take under this fraction of llama.cpp's ``load_state``."""
DECODE_TARGET = 10.0
"""Decode tokens/s wanted on lavapipe."""
TEXT = ("The lighthouse keeper climbed the stairs every evening, counted the ships on the horizon, and wrote "
        "their names in a book that nobody else would ever read. ")


async def bench_generate(device: Device | None = None, repeats: int = 5, paths: tuple[str, ...] = (),
                         echo: Callable[[str], None] = print) -> list[str]:
    """Run the benchmark and print its rows and verdicts; the printed lines."""

    lines: list[str] = []

    def out(line: str) -> None:
        lines.append(line)
        echo(line)

    device = device or open_device()
    start = time.perf_counter()
    loaded = load_model(default_model_path(), device)
    model = loaded.model
    out(f"model {default_model_path().name}: loaded and uploaded in {time.perf_counter() - start:.1f} s "
        f"on {device.info.adapter} ({device.info.backend})\n")
    out("| what | tokens | time | rate |\n|---|---|---|---|")
    context = loaded.text.tokenizer.encode(TEXT * (4 * CONTEXT // len(TEXT.split()) + 1))[:CONTEXT]
    cache = new_cache(model, device, max_tokens=CONTEXT + DECODE_TOKENS + 1, prefill_chunk=256, num_seqs=2)
    probe = (device.create_buffer(4, Usage.COPY_SRC | Usage.STORAGE, "bench.probe_src"),
             device.create_buffer(4, Usage.MAP_READ | Usage.COPY_DST, "bench.probe_dst"))

    async def decode(token: int) -> float:
        """Seconds of DECODE_TOKENS greedy decode steps of sequence 0 from ``token``."""
        start = time.perf_counter()
        for _ in range(DECODE_TOKENS):
            token = await (await model.forward(cache, 0, [token])).argmax()
        return time.perf_counter() - start

    def row(what: str, tokens: int, seconds: float) -> float:
        out(f"| {what} | {tokens} tokens | {seconds:.2f} s | {tokens / seconds:.1f} tokens/s |")
        return tokens / seconds

    try:
        cache.add_sequence(0)
        token = await (await model.forward(cache, 0, context[:8])).argmax()
        await (await model.forward(cache, 0, [token])).argmax()  # both compile every pipeline
        short_rate = row("decode (greedy) after 9 tokens of context", DECODE_TOKENS, await decode(token))
        cache.remove_sequence(0)
        cache.add_sequence(0)
        start = time.perf_counter()
        token = await (await model.forward(cache, 0, context)).argmax()
        prefill_s = time.perf_counter() - start
        row(f"prefill of a {CONTEXT}-token context", CONTEXT, prefill_s)
        long_rate = row(f"decode (greedy) after the {CONTEXT}-token context", DECODE_TOKENS, await decode(token))
        cache.popn(0, DECODE_TOKENS)  # the checkpoint holds exactly the prefilled context
        with tempfile.TemporaryDirectory(prefix="kvckpt-bench-generate-") as root:
            saved = await save(cache, 0, FileStore(Path(root)), "context")
            restores = []
            for _ in range(repeats + 1):  # round 0 warms up
                start = time.perf_counter()
                await restore(FileStore(Path(root)), "context", cache, seq_id=1)
                device.submit([Copy(probe[0], 0, probe[1], 0, 4)])
                await device.read(probe[1], 0, 4)
                restores.append(time.perf_counter() - start)
                cache.remove_sequence(1)
        restore_s = statistics.median(restores[1:])
        out(f"| restore + import from a FileStore (median of {repeats}) | {CONTEXT} tokens, "
            f"{saved.bytes_written / 1e6:.1f} MB | {restore_s * 1e3:.1f} ms | range {min(restores[1:]) * 1e3:.1f}-"
            f"{max(restores[1:]) * 1e3:.1f} ms |")
        ratio = prefill_s / restore_s
        out(f"\nresume vs re-prefill of the same {CONTEXT}-token context: {ratio:.0f}x faster "
            f"(target >= {RESUME_TARGET}x: {'met' if ratio >= RESUME_TARGET else 'NOT met'})")
        share = restore_s / LLAMA_CPP_LOAD_STATE_S
        out(f"restore vs llama.cpp load_state ({LLAMA_CPP_LOAD_STATE_S} s here): {share:.3f} of it "
            f"(target < {RESTORE_TARGET}: {'met' if share < RESTORE_TARGET else 'NOT met'})")
        out(f"decode: {short_rate:.1f} tokens/s after a short context, {long_rate:.1f} after {CONTEXT} tokens (target "
            f">= {DECODE_TARGET:g} on lavapipe: {'met' if min(short_rate, long_rate) >= DECODE_TARGET else 'NOT met'})")
    finally:
        cache.close()
        for buf in probe:
            device.destroy(buf)
    return lines
