"""kill -9 of a process generating with the real llama runner (the tiny random GGUF), resume in a fresh process:
the joined tokens are an uninterrupted run's, for greedy and for seeded sampling, also after a kill in prefill.

Workers are real processes (``python -m kvckpt_web.model.demo``, the model factory ``tiny_llama:load``) with a
FileStore; the parent SIGKILLs them. The machinery is the session's (kvckpt_web.model.demo).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from kvckpt_web.model.demo import WorkerConfig, run_generation_demo, run_until_killed, run_worker

HERE = Path(__file__).parent
CONFIG = WorkerConfig(factory="tiny_llama:load", prompt="tell me a long story about the sea and its ships.",
                      max_tokens=32, sampler={}, context=160, prefill_chunk=16, page_size=16, autosave_every=8)
TOP_P = {"temperature": 0.9, "top_p": 0.9, "seed": 11}


@pytest.fixture(autouse=True)
def tiny_worker_env(monkeypatch, tiny_llama_path):
    """Workers import the tiny model's factory from this folder and load the session's tiny GGUF."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("TINY_LLAMA_GGUF", str(tiny_llama_path))


def uninterrupted(config: WorkerConfig) -> list[int]:
    tokens = run_worker("generate", config)[-1]["generated_tokens"]
    assert len(tokens) == config.max_tokens  # no early EOS: the kill lands mid-reply
    return tokens


@pytest.mark.parametrize("sampler", [{}, TOP_P], ids=["greedy", "seeded-top-p"])
def test_a_worker_killed_after_an_autosave_resumes_to_the_uninterrupted_tokens(device, tmp_path, sampler):
    config = replace(CONFIG, sampler=sampler)
    want = uninterrupted(config)
    crashing = replace(config, store=str(tmp_path / "store"))
    events = run_until_killed(crashing, lambda e: e["event"] == "saved" and e["generated"] >= 12)
    killed_at = events[-1]["generated"]
    assert 12 <= killed_at < len(want)
    events = run_worker("resume", crashing)
    resumed = next(e for e in events if e["event"] == "resumed")
    assert resumed["kv_restored"] and resumed["generated"] == killed_at
    assert events[-1]["generated_tokens"] == want


def test_a_worker_killed_during_prefill_resumes_to_the_uninterrupted_tokens(device, tmp_path):
    config = replace(CONFIG, sampler=TOP_P)
    want = uninterrupted(config)
    crashing = replace(config, store=str(tmp_path / "store"), autosave_every=16, hold_after_saves=2)
    events = run_until_killed(crashing, lambda e: e["event"] == "saved" and e["kv_length"] == 32)
    assert events[-1]["generated"] == 0  # the prompt is longer than 32 tokens: killed inside its prefill
    events = run_worker("resume", replace(crashing, hold_after_saves=None))
    resumed = next(e for e in events if e["event"] == "resumed")
    assert resumed["kv_restored"] and resumed["kv_length"] == 32 and resumed["generated"] == 0
    assert events[-1]["generated_tokens"] == want


def test_the_demo_on_the_llama_runner_joins_the_killed_and_resumed_top_k_reply(device, tmp_path):
    config = replace(CONFIG, sampler={"temperature": 0.7, "top_k": 40, "top_p": 0.9, "seed": 3})
    lines: list[str] = []
    report = run_generation_demo(config, kill_after=10, directory=tmp_path / "store", echo=lines.append)
    assert report.identical and report.resumed["kv_restored"]
    assert any(line.startswith("identical:") for line in lines)
