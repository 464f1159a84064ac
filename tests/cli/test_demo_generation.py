"""``kvckpt demo``: a reply's worker SIGKILLed mid-reply and resumed in a fresh process gives the uninterrupted
reply's tokens, and says so.

Workers are real processes (:mod:`kvckpt_web.cli.chat_worker`, a chat engine each) running the test double
(``lm_double:load``), the tiny random llama GGUF (``tiny_llama:load``, or as a base model), SmolLM2 or Gemma 3 270M;
the demo SIGKILLs them. A base model's demo continues its prompt as a plain completion.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, replace

import pytest

from kvckpt_web.cli import chat_worker
from kvckpt_web.cli.chat_worker import WorkerConfig
from kvckpt_web.cli.demo_generation import DemoConfig, run_generation_demo
from kvckpt_web.cli.main import main

DOUBLE = DemoConfig(factory="lm_double:load", prompt="tell me a long story about the sea and its ships.",
                    max_tokens=40, sampler={"temperature": 0.9, "top_p": 0.85, "seed": 11},
                    engine={"context": 96, "sequences": 1, "cache_tokens": 96, "prefill_chunk": 8, "page_size": 4,
                            "autosave_every": 5})
TINY = DemoConfig(factory="tiny_llama:load", prompt="tell me a long story about the sea and its ships.",
                  max_tokens=32, sampler={"temperature": 0.7, "top_k": 40, "top_p": 0.9, "seed": 3},
                  engine={"context": 160, "sequences": 1, "cache_tokens": 160, "prefill_chunk": 16, "page_size": 16,
                          "autosave_every": 8})


@pytest.fixture(autouse=True)
def workers(test_model_workers):
    """Workers import the test models."""


def test_the_demo_joins_the_killed_and_resumed_top_p_reply_into_the_uninterrupted_one(device, tmp_path):
    lines = []
    report = run_generation_demo(DOUBLE, kill_after=12, directory=tmp_path / "store", echo=lines.append)
    assert report.identical
    assert report.killed_after["generated"] == 12 and report.killed_after["saved_generated"] <= 12
    assert report.resumed["generated"] == report.killed_after["saved_generated"]
    assert report.resumed["kv_restored"] and report.resumed["restore_s"] > 0 and report.result["prefill_s"] > 0
    out = "\n".join(lines)
    assert "killed with SIGKILL" in out and "identical" in out
    assert "restore + import" in out and "cold prefill of the" in out
    assert f"reply: {report.result['text']}" in out


def test_the_demo_on_the_llama_runner_joins_the_killed_and_resumed_top_k_reply(device, tmp_path):
    lines: list[str] = []
    report = run_generation_demo(TINY, kill_after=10, directory=tmp_path / "store", echo=lines.append)
    assert report.identical and report.resumed["kv_restored"]
    assert any(line.startswith("identical:") for line in lines)


def test_the_demo_on_a_base_model_joins_the_killed_and_resumed_plain_completion(device, tiny_base_path, tmp_path):
    lines: list[str] = []
    config = replace(TINY, model=str(tiny_base_path), raw=True, prompt="the sea and its ships")
    report = run_generation_demo(config, kill_after=10, directory=tmp_path / "store", echo=lines.append)
    assert report.identical and report.resumed["kv_restored"] and len(report.result["token_ids"]) > 10
    assert any(line.startswith("identical:") for line in lines)


def test_a_demo_model_that_is_not_a_file_is_refused_in_one_line_naming_the_flag(tmp_path, capsys):
    assert main(["demo", "--model", str(tmp_path / "none.gguf")]) == 1
    assert capsys.readouterr().err.splitlines()[-1].startswith("kvckpt: error: --model: expected a GGUF model file")


def test_a_worker_interrupted_by_ctrl_c_exits_130_without_a_traceback(monkeypatch, capsys):
    def interrupted(device):
        raise KeyboardInterrupt  # Ctrl-C in the demo's terminal reaches its workers too
    monkeypatch.setattr(chat_worker, "open_device", lambda: None)
    monkeypatch.setattr(chat_worker, "resolve_factory", lambda spec: interrupted)
    assert chat_worker.chat_worker_main([json.dumps(asdict(WorkerConfig()))]) == 130
    assert capsys.readouterr() == ("", "")


def test_a_worker_whose_factory_cannot_be_imported_fails_with_one_error_event(capsys):
    config = replace(WorkerConfig(), factory="no_such_module:load")
    assert chat_worker.chat_worker_main([json.dumps(asdict(config))]) == 1
    event = json.loads(capsys.readouterr().out)
    assert event["event"] == "error" and "no_such_module:load" in event["message"]


@pytest.mark.real_model
def test_kvckpt_demo_resumes_smollm2_identically_after_sigkill(smollm_path):
    result = subprocess.run([sys.executable, "-m", "kvckpt_web.cli.main", "demo", "--max-tokens", "20", "--kill-after",
                             "8"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "killed with SIGKILL" in result.stdout and "(K/V restored)" in result.stdout
    assert "identical: the " in result.stdout, result.stdout


@pytest.mark.real_model
def test_kvckpt_demo_model_resumes_the_gemma_base_models_completion_identically_after_sigkill(gemma_path):
    result = subprocess.run([sys.executable, "-m", "kvckpt_web.cli.main", "demo", "--model", str(gemma_path),
                             "--max-tokens", "12", "--kill-after", "5"], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr
    assert "killed with SIGKILL" in result.stdout and "(K/V restored)" in result.stdout
    assert "identical: the 12 tokens" in result.stdout, result.stdout
