"""Crash-consistency soak: SIGKILL processes while they save checkpoints, then restore what they left.

Each trial runs a worker process that fills a small cache in three deterministic
stages (seeded appends and pops) and saves generation 1, 2 and 3 of one name in
a :class:`~kvckpt_web.stores.file.FileStore`. During the third save it dies by
SIGKILL: either at a chosen step of the store's ``fault`` hook (before a write,
fsync, link, rename or directory fsync) or at a random instant chosen by the
parent while every step sleeps a random moment. Trials alternate the store's two
ways to write a file: unnamed and linked (Linux), or a named temp file renamed.
The parent then restores the newest generation into its own cache; it must be
exactly stage 2 or stage 3 (checked byte for byte against a reference cache
driven through the same stages), the store must verify with no problem, and a
new save on top must restore intact.

Desktop only (subprocesses, signals). ``kvckpt bench soak`` runs 200 trials; the
test suite runs a few.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from ..durable.restore import restore
from ..durable.save import save
from ..durable.verify import verify
from ..gpu.device import Device
from ..gpu.open import open_device
from ..kv.cache import PagedKVCache
from ..stores.file import FileStore
from ..tvm.layout import CacheLimits, KVLayout
from .rows import load_average

LAYOUT = KVLayout(page_size=4, num_layers=2, num_qo_heads=4, num_kv_heads=2, qk_head_dim=8, dtype="float16",
                  rope_mode="none")
LIMITS = CacheLimits(reserved_num_seqs=2, max_total_seq_len=256, prefill_chunk_size=256)
PAGES_PER_CHUNK = 2
NAME = "soak"
SEQ = 0
STAGES = 3
OVERSHOOT = 1.1
"""Kill points are drawn from [0, OVERSHOOT x the last save's length], so about 1 trial in 11 completes its save."""
STEP_SECONDS = 0.0015
"""Rough time of one fault step in timer mode (a random sleep of up to 3 ms, then the step itself)."""


def _stage_ops(seed: int, stage: int) -> list[tuple[str, int]]:
    """The operations of one stage: ("append", n) / ("popn", n), deterministic in (seed, stage)."""
    rng = random.Random(f"ops:{seed}:{stage}")
    if stage == 1:
        return [("append", rng.randint(16, 96))]
    ops = []
    if stage == 3 and rng.random() < 0.5:
        ops.append(("popn", rng.randint(1, 12)))
    ops.append(("append", rng.randint(1, 24)))
    return ops


def apply_stage(cache: PagedKVCache, seed: int, stage: int, seq: int = SEQ) -> None:
    """Drive ``cache`` through stage ``stage`` of trial ``seed`` (stage 1 adds the sequence)."""
    lay = cache.layout
    token_bytes = lay.num_kv_heads * lay.head_dim * lay.elem_bytes
    rng = random.Random(f"kv:{seed}:{stage}")
    if stage == 1:
        cache.add_sequence(seq)
    for op, n in _stage_ops(seed, stage):
        if op == "popn":
            cache.popn(seq, min(n, cache.get_sequence_length(seq)))
            continue
        cache.begin_forward([seq], [n])
        for layer in range(lay.num_layers):
            cache.append_kv(layer, rng.randbytes(n * token_bytes), rng.randbytes(n * token_bytes))
        cache.end_forward()


# ----- the worker process ---------------------------------------------------------------------------


def _sigkill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


async def _worker(directory: str, seed: int, mode: str, kill_step: int, naming: str) -> None:
    cache = PagedKVCache(open_device(), LAYOUT, LIMITS)
    store = FileStore(directory, unnamed_files=naming == "unnamed")
    for stage in range(1, STAGES + 1):
        apply_stage(cache, seed, stage)
        if stage == STAGES:
            rng = random.Random(f"delay:{seed}")
            steps = [0]

            def fault(step: str) -> None:
                steps[0] += 1
                if mode == "step" and steps[0] == kill_step:
                    _sigkill()
                if mode == "timer":
                    time.sleep(rng.random() * 0.003)

            store.fault = fault
            print("ARMED", flush=True)
        await save(cache, SEQ, store, NAME, app_state={"seed": seed, "stage": stage}, keep=2,
                   pages_per_chunk=PAGES_PER_CHUNK)
    print("DONE", flush=True)


# ----- the parent -----------------------------------------------------------------------------------


@dataclass
class SoakResult:
    """Outcome of :func:`run_soak`: per trial, which stage was restored; failures say what went wrong."""

    trials: int = 0
    restored: Counter = field(default_factory=Counter)
    """How often the newest generation after the kill was stage 2 (previous) or 3 (new)."""
    kills: Counter = field(default_factory=Counter)
    """"killed" (SIGKILL arrived while saving) or "completed" (the save finished first), also per mode
    ("step killed", "timer completed", ...)."""
    failures: list[str] = field(default_factory=list)
    loads: list[float] = field(default_factory=list)
    """The 1-minute load average after each trial."""

    @property
    def ok(self) -> bool:
        return not self.failures


async def _reference(device: Device, seed: int, directory: str) -> tuple[dict[int, list[bytes]], int]:
    """The exported page groups after stages 2 and 3 of trial ``seed``, and the fault steps of the last save."""
    cache = PagedKVCache(device, LAYOUT, LIMITS)
    store = FileStore(directory)
    steps = [0]
    try:
        out = {}
        for stage in range(1, STAGES + 1):
            apply_stage(cache, seed, stage)
            if stage == STAGES:
                store.fault = lambda step: steps.__setitem__(0, steps[0] + 1)
            await save(cache, SEQ, store, NAME, keep=2, pages_per_chunk=PAGES_PER_CHUNK)
            if stage >= STAGES - 1:
                out[stage] = [bytes(g) for g in await cache.export_groups(SEQ)]
        return out, steps[0]
    finally:
        cache.close()
        shutil.rmtree(directory, ignore_errors=True)


async def _run_worker(directory: str, seed: int, mode: str, kill_step: int, delay: float, naming: str
                      ) -> tuple[str, str]:
    """Run one worker to its end; (how it ended, its output)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kvckpt_web.bench.soak", "worker", directory, str(seed), mode, str(kill_step), naming,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    lines = []
    if mode == "timer":
        while True:
            line = await proc.stdout.readline()
            if not line:
                break
            lines.append(line.decode(errors="replace").strip())
            if lines[-1] == "ARMED":
                await asyncio.sleep(delay)
                if proc.returncode is None:
                    try:
                        proc.send_signal(signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                break
    out, err = await proc.communicate()
    text = "\n".join(lines) + out.decode(errors="replace") + err.decode(errors="replace")
    if proc.returncode == -signal.SIGKILL:
        return ("completed" if "DONE" in text else "killed"), text
    if proc.returncode == 0 and "DONE" in text:
        return "completed", text
    return f"exit status {proc.returncode}", text


async def _check_trial(device: Device, directory: str, seed: int, expected: dict[int, list[bytes]]) -> int:
    """Restore, compare, verify, save again and restore again; the stage restored. AssertionError if anything is off."""
    store = FileStore(directory)
    target = PagedKVCache(device, LAYOUT, LIMITS)
    try:
        result = await restore(store, NAME, target)
        stage = result.app_state.get("stage")
        assert stage in (STAGES - 1, STAGES), f"restored stage {stage!r}, expected {STAGES - 1} or {STAGES}"
        assert result.app_state.get("seed") == seed, f"restored app_state {result.app_state}"
        got = [bytes(g) for g in await target.export_groups(SEQ)]
        assert got == expected[stage], f"generation {result.generation} (stage {stage}) differs from the reference"
        report = await verify(store)
        assert report.ok, f"verify after the kill: {report.problems}"
        # the store stays usable: save the other stage's state on top and restore it
        other = STAGES - 1 if stage == STAGES else STAGES
        fresh = PagedKVCache(device, LAYOUT, LIMITS)
        try:
            for s in range(1, other + 1):
                apply_stage(fresh, seed, s)
            await save(fresh, SEQ, store, NAME, app_state={"seed": seed, "stage": other},
                       pages_per_chunk=PAGES_PER_CHUNK)
        finally:
            fresh.close()
        target.remove_sequence(SEQ)
        again = await restore(store, NAME, target)
        assert again.app_state["stage"] == other
        assert [bytes(g) for g in await target.export_groups(SEQ)] == expected[other], "save after the kill differs"
        return stage
    finally:
        target.close()


async def run_soak(trials: int = 200, *, seed: int = 0, jobs: int = 2, device: Device | None = None,
                   directory: str | None = None, echo: Callable[[str], None] | None = None) -> SoakResult:
    """Run ``trials`` kill trials (``jobs`` workers at a time); half kill at a fault step, half at a random
    instant, each half writing files unnamed and named in turns."""
    device = device or open_device()
    root = tempfile.mkdtemp(prefix="kvckpt-soak.", dir=directory)
    result = SoakResult()
    rng = random.Random(f"soak:{seed}")
    plans = [(seed * 100_000 + t, "step" if t % 2 == 0 else "timer", "named" if t // 2 % 2 else "unnamed", rng.random())
             for t in range(trials)]
    semaphore = asyncio.Semaphore(max(1, jobs))
    started = time.perf_counter()

    async def trial(trial_seed: int, mode: str, naming: str, point: float) -> None:
        directory = os.path.join(root, f"t{trial_seed}")
        expected, steps = await _reference(device, trial_seed, directory + ".ref")
        kill_step = 1 + int(point * steps * OVERSHOOT)
        delay = point * steps * STEP_SECONDS * OVERSHOOT
        where = (f"trial seed {trial_seed} ({mode}, {naming} files, step {kill_step} of {steps}, "
                 f"delay {delay * 1e3:.1f} ms)")
        try:
            async with semaphore:
                ended, text = await _run_worker(directory, trial_seed, mode, kill_step, delay, naming)
            if ended not in ("killed", "completed"):
                raise AssertionError(f"worker {ended}:\n{text[-2000:]}")
            result.kills[ended] += 1
            result.kills[f"{mode} {ended}"] += 1
            result.restored[await _check_trial(device, directory, trial_seed, expected)] += 1
        except Exception as exc:  # noqa: BLE001 - every failure is reported, the soak goes on
            result.failures.append(f"{where}: {type(exc).__name__}: {exc}")
        finally:
            shutil.rmtree(directory, ignore_errors=True)
            result.trials += 1
            result.loads.append(load_average())
            if echo is not None:
                echo(f"soak: {result.trials}/{trials} trials, {len(result.failures)} failures, "
                     f"{time.perf_counter() - started:.0f} s")

    try:
        await asyncio.gather(*(trial(*plan) for plan in plans))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return result


if __name__ == "__main__":
    if len(sys.argv) != 7 or sys.argv[1] != "worker":
        sys.exit("usage: python -m kvckpt_web.bench.soak worker DIR SEED step|timer KILL_STEP unnamed|named")
    asyncio.run(_worker(sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), sys.argv[6]))
