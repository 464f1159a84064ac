"""kill -9 of a generating process, then resume in a fresh one: the joined tokens are an uninterrupted run's.

Workers are real processes (``python -m kvckpt_web.model.demo``) running the test double
(``lm_double:load``) with a FileStore; the parent SIGKILLs them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from kvckpt_web.model import demo
from kvckpt_web.model.demo import WorkerConfig, run_generation_demo, run_until_killed, run_worker

HERE = Path(__file__).parent
CONFIG = WorkerConfig(factory="lm_double:load", prompt="tell me a long story about the sea and its ships.",
                      max_tokens=40, sampler={"temperature": 0.9, "top_p": 0.85, "seed": 11}, context=96,
                      prefill_chunk=8, page_size=4, autosave_every=5)


@pytest.fixture(autouse=True)
def double_on_path(monkeypatch):
    """Workers import the test double from this folder."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))


def reference(config: WorkerConfig) -> list[int]:
    return run_worker("generate", config)[-1]["generated_tokens"]


def test_a_greedy_worker_killed_after_an_autosave_resumes_to_the_uninterrupted_tokens(device, tmp_path):
    config = replace(CONFIG, sampler={})
    want = reference(config)
    crashing = replace(config, store=str(tmp_path / "store"))
    events = run_until_killed(crashing, lambda e: e["event"] == "saved" and e["generated"] >= 10)
    assert events[-1]["generated"] < len(want)  # killed mid-reply, still working
    events = run_worker("resume", crashing)
    resumed = next(e for e in events if e["event"] == "resumed")
    assert resumed["kv_restored"] and resumed["generated"] >= 10
    assert events[-1]["generated_tokens"] == want


def test_a_worker_killed_during_prefill_resumes_to_the_uninterrupted_tokens(device, tmp_path):
    want = reference(CONFIG)
    crashing = replace(CONFIG, store=str(tmp_path / "store"), autosave_every=8, hold_after_saves=2)
    events = run_until_killed(crashing, lambda e: e["event"] == "saved" and e["kv_length"] == 16)
    assert events[-1]["generated"] == 0  # killed in the prefill of the prompt (of more than 16 tokens)
    events = run_worker("resume", replace(crashing, hold_after_saves=None))
    resumed = next(e for e in events if e["event"] == "resumed")
    assert resumed["kv_restored"] and resumed["kv_length"] == 16 and resumed["generated"] == 0
    assert events[-1]["generated_tokens"] == want


def test_the_demo_joins_the_killed_and_resumed_top_p_reply_into_the_uninterrupted_one(device, tmp_path):
    lines = []
    report = run_generation_demo(CONFIG, kill_after=12, directory=tmp_path / "store", echo=lines.append)
    assert report.identical
    assert report.killed_after["generated"] >= 12
    assert report.resumed["kv_restored"] and report.resumed["restore_s"] > 0 and report.result["prefill_s"] > 0
    out = "\n".join(lines)
    assert "killed with SIGKILL" in out and "identical" in out
    assert "restore + import" in out and "prefill of the same" in out
    assert f"reply: {report.result['text']}" in out


def test_a_worker_interrupted_by_ctrl_c_exits_130_without_a_traceback(monkeypatch, capsys):
    def interrupted(device):
        raise KeyboardInterrupt  # Ctrl-C in the demo's terminal reaches its workers too
    monkeypatch.setattr(demo, "open_device", lambda: None)
    monkeypatch.setattr(demo, "resolve_factory", lambda spec: interrupted)
    assert demo.worker_main(["generate", json.dumps(asdict(CONFIG))]) == 130
    assert capsys.readouterr() == ("", "")


@pytest.mark.real_model
def test_kvckpt_demo_resumes_smollm2_identically_after_sigkill(smollm_path):
    result = subprocess.run([sys.executable, "-m", "kvckpt_web.cli.main", "demo", "--max-tokens", "20", "--kill-after",
                             "8"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "killed with SIGKILL" in result.stdout and "(K/V restored)" in result.stdout
    assert "identical: the " in result.stdout, result.stdout
