"""What continuous batching buys: a decode step of 1, 2, 4 and 8 sequences in one forward (``forward_batch``).

Loads the default model (SmolLM2-135M-Instruct Q4_1), prefills 8 sequences of about ``--context`` tokens each,
then times, round by round (the order of the batch sizes alternating from round to round, after a warm-up
round), ``--steps`` greedy decode steps of the first n sequences in one forward each (each run's argmax read back,
as the engine reads it), and takes those tokens back off the sequences after each round so every round decodes
at the same lengths. Each row: the median wall ms of a step and its range, the aggregate tokens/s (n tokens a
step), the speed-up over one sequence, the median CPU ms of a step (the process's, lavapipe's threads
included), and the 1-minute load average over the rounds. Run from the repository root:
``.venv/bin/python -m kvckpt_web.bench.batched_decode [path/to/model.gguf] [--rounds N] [--steps N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from pathlib import Path

from ..gpu.open import open_device
from ..model.caches import new_cache
from ..model.loader import default_model_path, load_model
from .generate import TEXT, Timing
from .rows import load_average, load_range

BATCHES = (1, 2, 4, 8)


async def bench(path: Path, rounds: int, steps: int, context: int) -> None:
    device = open_device()
    loaded = load_model(path, device)
    model = loaded.model
    most = max(BATCHES)
    cache = new_cache(model, device, max_tokens=context + most + steps + 16, prefill_chunk=128, num_seqs=most)
    words = loaded.text.encode_text(TEXT * (context // 20 + 1))
    nexts = []
    for s in range(most):  # lengths context .. context + 7 (pages rounded up: room for a page more each)
        cache.add_sequence(s)
        nexts.append(await (await model.forward(cache, s, words[s:s + context + s])).argmax())
    times: dict[int, list[Timing]] = {n: [] for n in BATCHES}
    loads = []
    for r in range(rounds + 1):
        for n in BATCHES if r % 2 else BATCHES[::-1]:
            tokens = nexts[:n]
            start = Timing.now()
            for _ in range(steps):
                logits = await model.forward_batch(cache, [(s, [t]) for s, t in enumerate(tokens)])
                tokens = [await one.argmax() for one in logits]
            took = start.until_now()
            for s in range(n):
                cache.popn(s, steps)
            if r:
                times[n].append(Timing(took.seconds / steps, took.cpu / steps))
        loads.append(load_average())
    cache.close()
    model.close()
    one = statistics.median(t.seconds for t in times[1])
    print(f"{path.name}: {steps} decode steps a round at ~{context} tokens, {rounds} rounds, "
          f"load {load_range(loads[1:])}")
    print("| sequences | step ms (range) | tokens/s | vs 1 | CPU ms a step |")
    print("|---|---|---|---|---|")
    for n in BATCHES:
        wall = [t.seconds * 1e3 for t in times[n]]
        step = statistics.median(wall) / 1e3
        print(f"| {n} | {step * 1e3:.1f} ({min(wall):.1f}-{max(wall):.1f}) | {n / step:.1f} | "
              f"{one * n / step:.2f}x | {statistics.median(t.cpu for t in times[n]) * 1e3:.1f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--context", type=int, default=128)
    args = parser.parse_args()
    asyncio.run(bench(args.model or default_model_path(), args.rounds, args.steps, args.context))


if __name__ == "__main__":
    main()
