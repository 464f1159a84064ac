"""Paged attention of one layer of SmolLM2-135M's shape (9 query heads, 3 KV heads, head_dim 64, float16 pages of
16 tokens): a decode step at a 1024-token context, and prefill chunks of 256 and 1024 tokens from position 0.

Each case times the attention dispatches (partial sums and merge, not RoPE) of several ways of cutting the work,
``rows_per_tile`` x ``keys_per_split`` of :class:`~kvckpt_web.model.attention.PagedAttention`, over the same
K/V: every round runs each variant once, in an order that alternates from round to round, after a warm-up
round; a decode round submits ``--decode-reps`` steps at once. Printed: the median and range of the rounds,
in ms per layer, and each variant's maximum difference from the first (all agree within float32 rounding).
Run from the repository root: ``.venv/bin/python -m kvckpt_web.bench.model_attention [--rounds N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import numpy as np

from ..gpu.device import Device, TextureCopy, Usage
from ..gpu.open import open_device
from ..kv.cache import PagedKVCache
from ..model import kernels
from ..model.attention import PagedAttention
from ..tvm.layout import CacheLimits, KVLayout

CONTEXT = 1024
LAYOUT = KVLayout(page_size=16, num_layers=1, num_qo_heads=9, num_kv_heads=3, qk_head_dim=64, rope_mode="normal",
                  rotary_theta=100000.0)
#: (label, PagedAttention options) per case; the first of each is the default.
DECODE = [("default", {}), ("keys 16", {"keys_per_split": 16}), ("keys 64", {"keys_per_split": 64}),
          ("keys 128", {"keys_per_split": 128}), ("keys 1025", {"keys_per_split": 1025})]
PREFILL = [("default", {}), ("rows 1", {"rows_per_tile": 1}), ("rows 2", {"rows_per_tile": 2}),
           ("rows 8", {"rows_per_tile": 8}), ("rows 4 keys 256", {"rows_per_tile": 4, "keys_per_split": 256})]


class Bench:
    """A cache holding one sequence of ``CONTEXT`` tokens, and buffers for a forward of up to ``CONTEXT`` tokens."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self.cache = PagedKVCache(device, LAYOUT, CacheLimits(2, 2 * CONTEXT + 16, CONTEXT))
        heads = LAYOUT.num_qo_heads + 2 * LAYOUT.num_kv_heads
        rng = np.random.default_rng(0)
        self.qkv = device.create_buffer(4 * CONTEXT * heads * LAYOUT.head_dim, Usage.STORAGE | Usage.COPY_DST, "qkv")
        device.write(self.qkv, 0, rng.standard_normal(CONTEXT * heads * LAYOUT.head_dim).astype(np.float32).tobytes())
        self.out = kernels.activation_texture(device, LAYOUT.num_qo_heads * LAYOUT.head_dim, CONTEXT, "out")
        self.staging = device.create_buffer(self.out.row_pitch * CONTEXT, Usage.MAP_READ | Usage.COPY_DST, "staging")
        self.writer = PagedAttention(self.cache)
        self.cache.add_sequence(0)
        self.forward(0, CONTEXT)
        self.cache.end_forward()

    def forward(self, seq_id: int, num_tokens: int) -> None:
        """Begin a forward of ``num_tokens`` tokens of ``seq_id`` and write their K/V."""
        self.cache.begin_forward([seq_id], [num_tokens])
        self.device.submit([self.writer.rope_append(0, self.qkv)])

    def read_out(self, num_tokens: int) -> np.ndarray:
        """The output rows of ``num_tokens`` tokens, once the work submitted so far is done."""
        self.device.submit([TextureCopy(self.out, self.staging)])

        async def read() -> bytes:
            return bytes(await self.device.read(self.staging, 0, self.staging.size))

        rows = np.frombuffer(asyncio.run(read()), np.float32).reshape(CONTEXT, -1)
        return rows[:num_tokens, :LAYOUT.num_qo_heads * LAYOUT.head_dim]

    def case(self, title: str, num_tokens: int, variants: list[tuple[str, dict]], rounds: int, reps: int) -> None:
        attentions = [(label, PagedAttention(self.cache, **options)) for label, options in variants]
        outputs, times = {}, {label: [] for label, _ in attentions}
        for r in range(rounds + 1):
            order = attentions if r % 2 else attentions[::-1]
            for label, attention in order:
                commands = attention.attend(0, self.qkv, self.out) * reps
                start = time.perf_counter()
                self.device.submit(commands)
                out = self.read_out(num_tokens)
                if r:
                    times[label].append((time.perf_counter() - start) * 1e3 / reps)
                else:
                    outputs[label] = out
        first = outputs[variants[0][0]]
        print(f"{title}  (ms per layer; {rounds} rounds of {reps})")
        for label, attention in attentions:
            t = times[label]
            print(f"  {label:16s} rows {attention._tile_rows} "
                  f"splits {attention._num_splits:3d}  median {statistics.median(t):8.2f}  "
                  f"range {min(t):8.2f}..{max(t):8.2f}  max diff {np.abs(outputs[label] - first).max():.1e}",
                  flush=True)
            attention.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--decode-reps", type=int, default=20)
    args = parser.parse_args()
    bench = Bench(open_device())
    bench.forward(0, 1)
    bench.case(f"decode at {CONTEXT}", 1, DECODE, args.rounds, args.decode_reps)
    bench.cache.end_forward()
    for chunk in (256, CONTEXT):
        bench.cache.add_sequence(1)
        bench.forward(1, chunk)
        bench.case(f"prefill {chunk} from position 0", chunk, PREFILL, args.rounds, 1)
        bench.cache.end_forward()
        bench.cache.remove_sequence(1)


if __name__ == "__main__":
    main()
