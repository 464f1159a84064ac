"""``make bench-peers``: kvckpt_web (lavapipe) and llama.cpp (llama-cpp-python, CPU) side by side on the same
machine, the same GGUF and the same token ids, in one run: SmolLM2 (the default model) and Gemma 3 270M (where
``make setup`` assembled it), or the GGUFs ``--model`` names.

llama.cpp runs in a worker process of its own venv (``peer_llama.py``, run by its path; ``make bench-peers``
builds llama-cpp-python 0.3.36 into ``build/peers-venv``), this project in this process. Every round runs each case on
both, one after the other, in an order that alternates from round to round, after a warm-up round; nothing of
the peer is quoted that was not measured in this run. Decode and prefill rows also give each process's CPU time a
token (all its threads), which moves less than wall time while other work shares the cores. Cases: greedy decode after a 9-token and after a 1024-token
context, prefill of 300 and of 1024 tokens, and resume of the 1024-token context: this project's restore (every
chunk's SHA-256 checked) + import, against llama.cpp's ``llama_state_load_file`` of the same context (which
checks nothing), ``llama_state_set_data`` and ``Llama.load_state``; and what the check costs (the same restore
without it, the SHA-256 alone). Each row prints both medians, the ratio of the rounds (llama.cpp's time over
this project's: 1.00 is parity, above is faster) with its range, the CPU's vector width (the widest of AVX2 and
AVX-512 in ``/proc/cpuinfo``, and the bits llvmpipe's adapter name says it computes with) and the 1-minute load
average over the rounds.

Run from the repository root:
``.venv/bin/python -m kvckpt_web.bench.peers --peer-python build/peers-venv/bin/python``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..gpu.open import open_device
from ..model.loader import default_model_path, load_model
from ..model.model_cache import gemma_path
from .generate import GenerationRunner, Timing
from .rows import load_average, load_range

SHORT = 8
"""Tokens of the short context (the decode after it starts from its 9th)."""
PROMPT = 300
DECODE = 32
WORKER = Path(__file__).with_name("peer_llama.py")


def vector_width(cpu_flags: set[str], adapter: str) -> str:
    """The CPU's widest vector instructions of AVX2 and AVX-512 (``cpu_flags``: /proc/cpuinfo's), and llvmpipe's
    vector width from its adapter name (``llvmpipe (LLVM 15.0.6, 256 bits)``) where it is llvmpipe."""
    cpu = cpu_width(cpu_flags)
    bits = re.search(r"llvmpipe \(.*?(\d+) bits\)", adapter)
    return f"{cpu}, llvmpipe {bits.group(1)} bits" if bits else f"{cpu}, {adapter}"


def cpu_width(cpu_flags: set[str]) -> str:
    """The CPU's widest vector instructions of AVX2 and AVX-512 (``cpu_flags``: /proc/cpuinfo's)."""
    return "AVX-512" if "avx512f" in cpu_flags else "AVX2" if "avx2" in cpu_flags else "no AVX2"


def cpu_description() -> str:
    """The CPU's model name in /proc/cpuinfo and its widest vector instructions: ``AMD EPYC, AVX-512``."""
    return f"{cpuinfo_field('model name') or 'unknown CPU'}, {cpu_width(cpu_flags())}"


def cpuinfo_field(name: str) -> str | None:
    """The value of ``name`` for the first processor in /proc/cpuinfo (None where there is no such file or field)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    found = re.search(rf"^{re.escape(name)}\s*:(.*)$", text, re.MULTILINE)
    return found.group(1).strip() if found else None


def cpu_flags() -> set[str]:
    """The flags of the first processor in /proc/cpuinfo (none where there is no such file)."""
    return set((cpuinfo_field("flags") or "").split())


def bench_models() -> list[Path]:
    """The models benchmarked by default: SmolLM2, and Gemma 3 270M where it is assembled."""
    return [default_model_path()] + [path for path in (gemma_path(),) if path.is_file()]


class PeerProcess:
    """The llama.cpp worker: requests and answers as JSON lines."""

    def __init__(self, python: str, model: Path, threads: int, n_ctx: int) -> None:
        env = dict(os.environ, OMP_WAIT_POLICY="passive")
        self.process = subprocess.Popen([python, str(WORKER), str(model), "--threads", str(threads), "--ctx",
                                         str(n_ctx)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                        env=env)
        self.hello = self._answer()

    def _answer(self) -> dict[str, Any]:
        while True:
            line = self.process.stdout.readline()
            if not line:
                raise SystemExit(f"the llama.cpp worker ended (exit status {self.process.wait()})")
            if line.startswith("{"):
                return json.loads(line)

    def ask(self, op: str, **args: Any) -> dict[str, Any]:
        self.process.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.process.stdin.flush()
        return self._answer()

    def close(self) -> None:
        try:
            self.process.stdin.write(json.dumps({"op": "quit"}) + "\n")
            self.process.stdin.close()
        except BrokenPipeError:
            pass
        self.process.wait()


class Rows:
    """Per case, the timings of each side in each counted round, and the load average of each round."""

    def __init__(self, width: str) -> None:
        self.width = width
        self.ours: dict[str, list[Timing]] = {}
        self.theirs: dict[str, list[Timing]] = {}
        self.loads: list[float] = []

    def add(self, case: str, ours: Timing, theirs: Timing) -> None:
        self.ours.setdefault(case, []).append(ours)
        self.theirs.setdefault(case, []).append(theirs)

    def line(self, what: str, case: str, tokens: int = 0) -> str:
        """A table row: rates (tokens/s) and CPU ms a token if ``tokens``, else milliseconds; the ratio their
        time / our time."""
        ours, theirs = self.ours[case], self.theirs[case]
        ratios = [t.seconds / o.seconds for o, t in zip(ours, theirs)]

        def show(timings: list[Timing]) -> str:
            seconds = statistics.median(t.seconds for t in timings)
            if not tokens:
                return f"{seconds * 1e3:.1f} ms"
            return f"{tokens / seconds:.1f} tokens/s, CPU {statistics.median(t.cpu for t in timings) / tokens * 1e3:.1f} ms"

        return (f"| {what} | {show(ours)} | {show(theirs)} | {statistics.median(ratios):.2f} "
                f"({min(ratios):.2f}-{max(ratios):.2f}) | {self.width} | {load_range(self.loads)} |")


def timing(answer: dict[str, Any]) -> Timing:
    """The Timing of a peer's answer (CPU 0 where it measured none)."""
    return Timing(answer["seconds"], answer.get("cpu", 0.0))


async def one_round(runner: GenerationRunner, peer: PeerProcess, root: Path, state_file: Path, ours_first: bool
                    ) -> dict[str, tuple[Timing, Timing]]:
    """Every case once on both sides; per case (our timing, theirs)."""
    context = runner.context
    got: dict[str, tuple[Timing, Timing]] = {}

    async def ours_short() -> Timing:
        _, token = await runner.prefill(context[:SHORT])
        return await runner.decode(token, DECODE)

    def theirs_short() -> Timing:
        token = peer.ask("prefill", tokens=context[:SHORT])["token"]
        return timing(peer.ask("decode", token=token, steps=DECODE))

    async def ours_prompt() -> Timing:
        return (await runner.prefill(context[:PROMPT]))[0]

    async def ours_long() -> tuple[Timing, Timing]:
        prefill, token = await runner.prefill(context)
        return prefill, await runner.decode(token, DECODE)

    def theirs_long() -> tuple[Timing, Timing]:
        answer = peer.ask("prefill", tokens=context)
        return timing(answer), timing(peer.ask("decode", token=answer["token"], steps=DECODE))

    async def ours_resume() -> tuple[Timing, Timing, Timing]:
        return (Timing(await runner.restore(root), 0.0), Timing(await runner.import_unverified(root), 0.0),
                Timing(await runner.hash_checkpoint(root), 0.0))

    def theirs_resume() -> tuple[Timing, Timing, Timing]:
        return (timing(peer.ask("load_file", path=str(state_file))), timing(peer.ask("set_data")),
                timing(peer.ask("load_state")))

    async def pair(ours: Callable[[], Any], theirs: Callable[[], Any]) -> tuple[Any, Any]:
        if ours_first:
            a = await ours()
            return a, theirs()
        b = theirs()
        return await ours(), b

    got["short"] = await pair(ours_short, theirs_short)
    got["prompt"] = await pair(ours_prompt, lambda: timing(peer.ask("prefill", tokens=context[:PROMPT])))
    (ours_prefill, ours_decode), (their_prefill, their_decode) = await pair(ours_long, theirs_long)
    got["context"] = (ours_prefill, their_prefill)
    got["long"] = (ours_decode, their_decode)
    (restored, unverified, hashed), (load_file, set_data, load_state) = await pair(ours_resume, theirs_resume)
    got["restore"] = (restored, load_file)
    got["unverified"] = (unverified, load_file)
    got["hash"] = (hashed, load_file)
    got["set_data"] = (restored, set_data)
    got["load_state"] = (restored, load_state)
    return got


async def bench_peers(peer_python: str, rounds: int, threads: int, models: list[Path],
                      echo: Callable[[str], None] = print) -> None:
    """The table of each model in ``models``, one after the other on one device."""
    device = open_device()
    for model in models:
        await bench_model(GenerationRunner(load_model(model, device), device), model, peer_python, rounds, threads,
                          echo)


async def bench_model(runner: GenerationRunner, model: Path, peer_python: str, rounds: int, threads: int,
                      echo: Callable[[str], None]) -> None:
    """One model's table: every case on both sides, ``rounds`` times after a warm-up round."""
    peer = PeerProcess(peer_python, model, threads, n_ctx=2 * len(runner.context) + DECODE)
    width = vector_width(cpu_flags(), runner.device.info.adapter)
    echo(f"\nmodel {model.name}; kvckpt_web on {runner.device.info.adapter} ({runner.device.info.backend}); "
         f"llama-cpp-python {peer.hello['ready']}, {threads} threads, OMP_WAIT_POLICY=passive "
         f"({peer.hello['system'].strip()}); {os.cpu_count()} CPUs ({width})")
    rows = Rows(width)
    try:
        with tempfile.TemporaryDirectory(prefix="kvckpt-bench-peers-") as folder:
            root, state_file = Path(folder) / "store", Path(folder) / "llama.state"
            nbytes = await runner.save_context(root)
            peer.ask("prefill", tokens=runner.context)
            saved = peer.ask("save", path=str(state_file))
            first_load_state = peer.ask("load_state")["seconds"]  # its first call in the process (cold)
            echo(f"state of the {len(runner.context)}-token context: kvckpt_web {nbytes / 1e6:.1f} MB (chunks), "
                 f"llama.cpp {saved['state_bytes'] / 1e6:.1f} MB; llama.cpp's first Llama.load_state in its "
                 f"process took {first_load_state * 1e3:.0f} ms (one call, not in the rows)\n")
            for r in range(rounds + 1):  # round 0 warms up: compiles the pipelines, faults the peer's buffers in
                load = load_average()
                got = await one_round(runner, peer, root, state_file, ours_first=bool(r % 2))
                if r:
                    rows.loads.append(load)
                    for case, (ours, theirs) in got.items():
                        rows.add(case, ours, theirs)
                print(f"round {r} done (load {load:.1f})", file=sys.stderr, flush=True)
    finally:
        peer.close()
        runner.close()
    n = len(runner.context)
    echo(f"| {rounds} rounds, medians (CPU: all threads of the process, a token) | kvckpt_web | llama.cpp | "
         "llama.cpp time / kvckpt_web time (range) | CPU vector width | load average |\n|---|---|---|---|---|---|")
    echo(rows.line(f"decode after {SHORT + 1} tokens ({DECODE} greedy tokens)", "short", tokens=DECODE))
    echo(rows.line(f"decode after {n} tokens ({DECODE} greedy tokens)", "long", tokens=DECODE))
    echo(rows.line(f"prefill of {PROMPT} tokens", "prompt", tokens=PROMPT))
    echo(rows.line(f"prefill of {n} tokens", "context", tokens=n))
    echo(rows.line(f"resume of the {n}-token context: restore, every chunk verified, + import / "
                   "`llama_state_load_file`", "restore"))
    echo(rows.line("same, restore without the SHA-256 check / `llama_state_load_file`", "unverified"))
    echo(rows.line("the SHA-256 alone (one thread) / `llama_state_load_file`", "hash"))
    echo(rows.line("resume, verified / `llama_state_set_data` (from memory)", "set_data"))
    echo(rows.line("resume, verified / `Llama.load_state` (warm)", "load_state"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer-python", default="build/peers-venv/bin/python",
                        help="python of the venv llama-cpp-python is installed in (default build/peers-venv)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads (default 2)")
    parser.add_argument("--model", action="append", type=Path,
                        help="a GGUF to benchmark, repeatable (default: SmolLM2, and Gemma 3 270M where assembled)")
    args = parser.parse_args()
    asyncio.run(bench_peers(args.peer_python, args.rounds, args.threads, args.model or bench_models()))


if __name__ == "__main__":
    main()
