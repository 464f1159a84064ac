"""Crash consistency: a save interrupted at any point leaves exactly the previous or the new generation.

The subprocess soak (kvckpt_web.bench.soak) SIGKILLs real worker processes mid-save;
``kvckpt bench soak`` runs 200 trials, this suite ``KVCKPT_SOAK_TRIALS`` (default
20). The in-process tests fail every single step of a save in turn.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvckpt_web import PagedKVCache
from kvckpt_web.bench.soak import LAYOUT, LIMITS, NAME, PAGES_PER_CHUNK, SEQ, STAGES, apply_stage, run_soak
from kvckpt_web.durable.restore import restore
from kvckpt_web.durable.save import save
from kvckpt_web.durable.verify import verify
from kvckpt_web.stores.file import FAULT_STEPS, FileStore

from support.kvmodel import run

TRIALS = int(os.environ.get("KVCKPT_SOAK_TRIALS", "20"))


def test_processes_killed_while_saving_leave_the_previous_or_the_new_generation(device, tmp_path):
    result = run(run_soak(TRIALS, seed=1, jobs=2, device=device, directory=str(tmp_path)))
    assert result.ok, "\n".join(result.failures)
    assert result.trials == len(result.loads) == TRIALS  # and the load average after each trial
    assert result.kills["killed"] > 0
    assert result.restored[STAGES - 1] > 0 and result.restored[STAGES] > 0, result.restored


class Crash(Exception):
    pass


def saved_stages(device, directory: Path, seed: int, unnamed: bool = True
                 ) -> tuple[PagedKVCache, FileStore, dict[int, list[bytes]]]:
    """A cache and store after stages 1..STAGES-1 were saved, the cache then moved on to the last stage."""
    cache = PagedKVCache(device, LAYOUT, LIMITS)
    store = FileStore(directory, unnamed_files=unnamed)
    expected = {}
    for stage in range(1, STAGES + 1):
        apply_stage(cache, seed, stage)
        expected[stage] = [bytes(g) for g in run(cache.export_groups(SEQ))]
        if stage < STAGES:
            run(save(cache, SEQ, store, NAME, app_state={"stage": stage}, keep=2, pages_per_chunk=PAGES_PER_CHUNK))
    return cache, store, expected


@pytest.mark.parametrize("seed, unnamed", [(3, True), (4, False)], ids=["unnamed-files", "named-temp-files"])
def test_a_failure_at_any_write_fsync_or_link_leaves_a_restorable_generation(device, tmp_path, seed, unnamed):
    probe_cache, probe_store, _ = saved_stages(device, tmp_path / "probe", seed, unnamed)
    steps: list[str] = []
    probe_store.fault = steps.append
    run(save(probe_cache, SEQ, probe_store, NAME, keep=2, pages_per_chunk=PAGES_PER_CHUNK))
    probe_cache.close()
    # every key a save writes is new: an unnamed file is linked, a named temp file renamed
    assert set(steps) == {"write", "fsync", "link" if probe_store.unnamed_files else "rename", "dirsync"}
    assert set(steps) <= set(FAULT_STEPS) and len(steps) >= 8

    for k in range(len(steps)):
        cache, store, expected = saved_stages(device, tmp_path / f"s{k}", seed, unnamed)
        count = [0]

        def fault(step: str) -> None:
            count[0] += 1
            if count[0] == k + 1:
                raise Crash(f"step {k}: {step}")

        store.fault = fault
        with pytest.raises(Crash):
            run(save(cache, SEQ, store, NAME, app_state={"stage": STAGES}, keep=2, pages_per_chunk=PAGES_PER_CHUNK))
        store.fault = None
        target = PagedKVCache(device, LAYOUT, LIMITS)
        result = run(restore(FileStore(store.directory), NAME, target))
        stage = result.app_state["stage"]
        assert stage in (STAGES - 1, STAGES), f"failure at step {k} ({steps[k]})"
        assert [bytes(g) for g in run(target.export_groups(SEQ))] == expected[stage], f"step {k} ({steps[k]})"
        assert run(verify(store)).ok
        # a later save in the same process (its memory of the failed save is stale) still commits correctly
        run(save(cache, SEQ, store, NAME, app_state={"stage": STAGES}, keep=2, pages_per_chunk=PAGES_PER_CHUNK))
        target.remove_sequence(SEQ)
        run(restore(store, NAME, target))
        assert [bytes(g) for g in run(target.export_groups(SEQ))] == expected[STAGES], f"resave after step {k}"
        target.close()
        cache.close()
